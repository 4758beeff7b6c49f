// swiglu on the GPU (SPEC.md §5.7): the reference's own per-element functions
// (swiglu_value, swiglu_grads in reference/ops/swiglu.h are __host__ __device__),
// one grid-stride thread per element.
#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/swiglu.h"
#include "reference/ops/swiglu.h"

namespace bp::cuda {
namespace {

__global__ void swiglu_fwd_kernel(const bf16* __restrict__ g, const bf16* __restrict__ u, bf16* __restrict__ m,
                                  size_t n) {
  for_each_index(n, [&](size_t i) { m[i] = ref::swiglu_value(g[i], u[i]); });
}

__global__ void swiglu_bwd_kernel(const bf16* __restrict__ g, const bf16* __restrict__ u, const bf16* __restrict__ dm,
                                  bf16* __restrict__ dg, bf16* __restrict__ du, size_t n) {
  for_each_index(n, [&](size_t i) { ref::swiglu_grads(g[i], u[i], dm[i], dg[i], du[i]); });
}

}  // namespace

void swiglu_fwd(const bf16* g, const bf16* u, bf16* m, int n, cudaStream_t stream) {
  if (n <= 0) return;
  swiglu_fwd_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(g, u, m, n);
  BP_CUDA_CHECK_LAUNCH();
}

void swiglu_bwd(const bf16* g, const bf16* u, const bf16* dm, bf16* dg, bf16* du, int n, cudaStream_t stream) {
  if (n <= 0) return;
  swiglu_bwd_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(g, u, dm, dg, du, n);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace bp::cuda
