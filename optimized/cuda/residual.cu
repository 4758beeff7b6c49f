// residual add and sum_round on the GPU (SPEC.md §5.3): elementwise, one
// grid-stride thread per 8 elements (16-byte loads and stores) where every
// pointer is 16-byte aligned, one per element for the tail and otherwise.
#include <stdexcept>
#include <string>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/residual.h"

namespace bp::cuda {
namespace {

__device__ bf16 residual_value(bf16 h, bf16 o) { return round_bf16(add_rn(widen(h), widen(o))); }

// Each element is read before it is written by the same thread, and no other thread
// touches it: in place is safe.
__global__ void residual_kernel(const bf16* h, const bf16* o, bf16* out, size_t n, bool packed) {
  for_each_packed(
      n, packed,
      [&](size_t i) {
        const Bf16x8 a = load8(h + i), b = load8(o + i);
        store8(out + i, Bf16x8::of([&](int j) { return residual_value(a[j], b[j]); }));
      },
      [&](size_t i) { out[i] = residual_value(h[i], o[i]); });
}

struct Parts {
  const float* p[kMaxSumParts];
};

// Each element's sum runs over the parts in order from +0, whichever width loads it.
__global__ void sum_round_kernel(Parts parts, int count, bf16* __restrict__ out, size_t n, bool packed) {
  for_each_packed(
      n, packed,
      [&](size_t i) {
        float acc[kPack] = {};
        for (int k = 0; k < count; ++k) {
          const F32x8 part = load8(parts.p[k] + i);
#pragma unroll
          for (int j = 0; j < kPack; ++j) acc[j] = add_rn(acc[j], part.v[j]);
        }
        store8(out + i, Bf16x8::of([&](int j) { return round_bf16(acc[j]); }));
      },
      [&](size_t i) {
        float acc = 0.0f;
        for (int k = 0; k < count; ++k) acc = add_rn(acc, parts.p[k][i]);
        out[i] = round_bf16(acc);
      });
}

}  // namespace

void residual_fwd(const Knobs&, const bf16* h, const bf16* o, bf16* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool packed = aligned16(h) && aligned16(o) && aligned16(out);
  residual_kernel<<<grid_for_packed(n, packed), kBlockThreads, 0, stream>>>(h, o, out, n, packed);
  BP_CUDA_CHECK_LAUNCH();
}

void sum_round(const float* const* parts, int count, bf16* out, size_t n, cudaStream_t stream) {
  if (count < 0 || count > kMaxSumParts)
    throw std::invalid_argument("sum_round: " + std::to_string(count) + " parts; the CUDA backend takes 0 to " +
                                std::to_string(kMaxSumParts));
  if (n == 0) return;
  Parts p{};
  bool packed = aligned16(out);
  for (int k = 0; k < count; ++k) {
    p.p[k] = parts[k];
    packed = packed && aligned16(parts[k]);
  }
  sum_round_kernel<<<grid_for_packed(n, packed), kBlockThreads, 0, stream>>>(p, count, out, n, packed);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace bp::cuda
