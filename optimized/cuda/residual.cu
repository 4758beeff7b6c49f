// residual add and sum_round on the GPU (SPEC.md §5.3): elementwise, one
// grid-stride thread per element.
#include <stdexcept>
#include <string>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/residual.h"

namespace bp::cuda {
namespace {

// Each element is read before it is written by the same thread: in place is safe.
__global__ void residual_kernel(const bf16* h, const bf16* o, bf16* out, size_t n) {
  for_each_index(n, [&](size_t i) { out[i] = round_bf16(add_rn(widen(h[i]), widen(o[i]))); });
}

struct Parts {
  const float* p[kMaxSumParts];
};

__global__ void sum_round_kernel(Parts parts, int count, bf16* __restrict__ out, size_t n) {
  for_each_index(n, [&](size_t i) {
    float acc = 0.0f;
    for (int k = 0; k < count; ++k) acc = add_rn(acc, parts.p[k][i]);
    out[i] = round_bf16(acc);
  });
}

}  // namespace

void residual_fwd(const Knobs&, const bf16* h, const bf16* o, bf16* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  residual_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(h, o, out, n);
  BP_CUDA_CHECK_LAUNCH();
}

void sum_round(const float* const* parts, int count, bf16* out, size_t n, cudaStream_t stream) {
  if (count < 0 || count > kMaxSumParts)
    throw std::invalid_argument("sum_round: " + std::to_string(count) + " parts; the CUDA backend takes 0 to " +
                                std::to_string(kMaxSumParts));
  if (n == 0) return;
  Parts p{};
  for (int k = 0; k < count; ++k) p.p[k] = parts[k];
  sum_round_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(p, count, out, n);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace bp::cuda
