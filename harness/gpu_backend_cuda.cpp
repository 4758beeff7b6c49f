// The `cuda` backend in a CUDA build.
#include <string>

#include "harness/gpu_backend.h"
#include "optimized/layouts/virtual_ranks.h"
#include "optimized/model/qwen3.h"

namespace bp::harness {

namespace {

GpuCaseResult run_unsharded(const GpuCaseInput& in) {
  GpuCaseResult r;
  const cuda::Model model(in.cfg, in.weights, in.knobs);
  r.forward = model.forward(in.seqs, in.path, in.options);
  if (in.grads) r.backward = model.backward(in.seqs, in.coef_seed, in.options.temperature);
  return r;
}

GpuCaseResult run_virtual_ranks(const GpuCaseInput& in) {
  GpuCaseResult r;
  r.forward = cuda::layouts::forward(in.cfg, in.weights, in.knobs, in.layout, in.seqs, in.path, in.options);
  if (in.grads)
    r.backward = cuda::layouts::backward(in.cfg, in.weights, in.knobs, in.layout, in.seqs, in.coef_seed,
                                         in.options.temperature);
  return r;
}

}  // namespace

GpuCaseResult run_gpu_case(const GpuCaseInput& in) {
  if (const std::string why = cuda::no_hopper_reason(); !why.empty()) throw CannotTest(why);
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  cuda::reset_pool_peak();
  GpuCaseResult r = in.layout == layouts::Layout{} ? run_unsharded(in) : run_virtual_ranks(in);
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  r.peak_device_bytes = cuda::pool_peak_bytes();
  return r;
}

}  // namespace bp::harness
