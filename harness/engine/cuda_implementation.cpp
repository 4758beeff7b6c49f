// The `cuda` implementation in a CUDA build.
#include <cuda_runtime_api.h>

#include <cctype>
#include <map>
#include <memory>
#include <fstream>
#include <sstream>
#include <string>

#include "harness/engine/cuda_implementation.h"
#include "gpu/virtual_ranks.h"
#include "gpu/cuda_model.h"
#include "optimized/cuda/attention.h"
#include "optimized/cuda/tensor_digest.h"

namespace bp::harness {

struct GpuRunner::Kept {
  explicit Kept(const GpuModelSource& m)
      : model(&m.model), contract(&m.contract), gpu(m.model.config, m.weights, m.contract.knobs) {}
  bool is(const GpuModelSource& m) const { return model == &m.model && contract == &m.contract; }

  const ModelEntry* model;
  const Contract* contract;
  const gpu::Model gpu;
};

namespace {

// Each gradient digested where it lies, and kept there (shared by its fetch) until
// the comparison lets it go.
std::map<std::string, GpuTensor> left_on_gpu(std::map<std::string, cuda::DeviceBuffer<float>>&& grads,
                                             cudaStream_t stream) {
  std::map<std::string, GpuTensor> out;
  for (auto& [name, buf] : grads) {
    auto kept = std::make_shared<cuda::DeviceBuffer<float>>(std::move(buf));
    out[name] = {cuda::tensor_digest(kept->get(), kept->size(), stream), [kept] { return kept->download(); }};
  }
  return out;
}

GpuCaseResult run_model(const gpu::Model& model, const GpuCaseInput& in) {
  GpuCaseResult r;
  r.forward = model.forward(in.seqs, in.path, in.options);
  if (!in.grads) return r;
  if (!in.grads_stay_on_gpu) {
    r.backward = model.backward(in.seqs, in.coefs, in.options.temperature, in.backward_options);
    return r;
  }
  auto resident = model.backward_resident(in.seqs, in.coefs, in.options.temperature, in.backward_options);
  r.backward = std::move(resident.result);
  r.gpu_grads = left_on_gpu(std::move(resident.grads), model.backend().stream());
  return r;
}

GpuCaseResult run_virtual_ranks(const GpuCaseInput& in) {
  const GpuModelSource& m = in.model;
  GpuCaseResult r;
  const Knobs& kn = m.contract.knobs;
  r.forward = gpu::sharded_forward(m.model.config, m.weights, kn, in.layout, in.seqs, in.path, in.options);
  if (in.grads)
    r.backward = gpu::sharded_backward(m.model.config, m.weights, kn, in.layout, in.seqs, in.coefs,
                                         in.options.temperature);
  return r;
}

// "12.8" from CUDA's 12080.
std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// What a failed CUDA query says in its field. The error is cleared: it is not the next call's.
std::string failed(const char* query, cudaError_t e) {
  cudaGetLastError();
  return std::string("unknown (") + query + ": " + cudaGetErrorString(e) + ")";
}

// The kernel driver's version, the first word of digits and dots on the first line of
// /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
// 570.133.20  Tue Mar ..."): the runtime API tells only the CUDA version it supports.
std::string kernel_driver_version() {
  constexpr const char* kFile = "/proc/driver/nvidia/version";
  std::ifstream in(kFile);
  std::string line;
  if (!std::getline(in, line)) return std::string("unknown (cannot read ") + kFile + ")";
  std::istringstream words(line);
  for (std::string w; words >> w;)
    if (std::isdigit(static_cast<unsigned char>(w[0])) && w.find('.') != std::string::npos &&
        w.find_first_not_of("0123456789.") == std::string::npos)
      return w;
  return std::string("unknown (no version in ") + kFile + ")";
}

}  // namespace

std::optional<GpuIdentity> gpu_identity() {
  GpuIdentity g;
  int device = 0;
  cudaDeviceProp p{};
  const char* query = "cudaGetDevice";
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) {
    query = "cudaGetDeviceProperties";
    e = cudaGetDeviceProperties(&p, device);
  }
  g.name = e == cudaSuccess ? std::string(p.name) : failed(query, e);
  int v = 0;
  e = cudaDriverGetVersion(&v);
  // v == 0: no driver is installed (the call itself succeeds).
  g.driver = kernel_driver_version() + " (CUDA " +
             (e != cudaSuccess ? failed("cudaDriverGetVersion", e)
              : v == 0         ? "unknown (cudaDriverGetVersion: no driver)"
                               : cuda_version_text(v)) +
             ")";
  e = cudaRuntimeGetVersion(&v);
  g.runtime = e == cudaSuccess ? cuda_version_text(v) : failed("cudaRuntimeGetVersion", e);
  return g;
}

const char* cuda_implementation_summary() {
  return "the model on a Hopper GPU: tp1-ep1-cp1 on the GPU model, other layouts on virtual GPU ranks (its cases "
         "exit 125 where there is no such GPU: cannot test here)";
}

std::optional<std::string> cuda_unavailable_reason() {
  if (std::string why = cuda::no_hopper_reason(); !why.empty()) return why;
  return std::nullopt;
}

std::optional<std::string> cuda_model_problem(const ModelConfig& config) {
  if (!cuda::attention_takes_head_dim(static_cast<int>(config.head_dim)))
    return "the CUDA attention takes head_dim " + cuda::attention_head_dims_text() + "; this model's is " +
           std::to_string(config.head_dim);
  return std::nullopt;
}

GpuRunner::GpuRunner() = default;
GpuRunner::~GpuRunner() = default;

void GpuRunner::prepare(const GpuModelSource& m, const layouts::Layout& layout) {
  if (const auto why = cuda_unavailable_reason()) throw CannotTest(*why);
  const bool unsharded = layout == layouts::Layout{};
  if (unsharded && kept_ && kept_->is(m)) return;
  kept_.reset();  // first: one copy of a model's weights on the device at a time
  if (!unsharded) return;  // virtual ranks upload their own shards in the case
  kept_ = std::make_unique<Kept>(m);
  BP_CUDA_CHECK(cudaDeviceSynchronize());  // the upload ends here, not in the case's time
}

void GpuRunner::release() { kept_.reset(); }

GpuCaseResult GpuRunner::run(const GpuCaseInput& in) {
  prepare(in.model, in.layout);
  // The watermark restarts at the memory in use (the kept weights).
  cuda::start_case_memory();
  // prepare() keeps a model exactly when the layout is the unsharded one.
  GpuCaseResult r = kept_ ? run_model(kept_->gpu, in) : run_virtual_ranks(in);
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  r.peak_device_bytes = cuda::pool_peak_bytes();
  return r;
}

}  // namespace bp::harness
