// rope on the GPU (SPEC.md §5.5): one grid-stride thread per (token, head, 8
// pairs) with 16-byte accesses, or per pair where the shape or the pointers do
// not allow that, reading its token's table entries.
#include <stdexcept>
#include <string>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/rope.h"

namespace bp::cuda {
namespace {

// ref::rope_fwd's refusal, message included, on a host copy of the positions.
void check_positions(const RopeTable& table, const int32_t* pos, int T, cudaStream_t stream) {
  const std::vector<int32_t> host = copy_to_host(pos, T, stream);
  for (int t = 0; t < T; ++t)
    if (host[t] < 0 || host[t] >= table.max_pos)
      throw std::invalid_argument("rope: position " + std::to_string(host[t]) + " of token " + std::to_string(t) +
                                  " is outside the table [0, " + std::to_string(table.max_pos) + ")");
}

// R(f(a)·f(b)) widened back: one rounding of an exact product.
__device__ float rounded_product(bf16 a, bf16 b) { return widen(round_bf16(mul_rn(widen(a), widen(b)))); }

// The pair (x1, x2) = (x[j], x[j + D/2]) rotated by (c, s): out[j] and out[j + D/2].
__device__ bf16 rotated_first(bf16 x1, bf16 x2, bf16 c, bf16 s) {
  return round_bf16(sub_rn(rounded_product(x1, c), rounded_product(x2, s)));
}
__device__ bf16 rotated_second(bf16 x1, bf16 x2, bf16 c, bf16 s) {
  return round_bf16(add_rn(rounded_product(x2, c), rounded_product(x1, s)));
}

// The sine, or its negation for the transpose.
__device__ bf16 sine(bf16 s, bool transpose) {
  return transpose ? bf16{static_cast<uint16_t>(s.bits ^ 0x8000u)} : s;
}

// One thread per (token, head, kStep consecutive pairs j .. j + kStep): kStep = 8
// (16-byte loads of x1, x2, cos and sin, 16-byte stores) where half = D/2 is a
// multiple of 8 and every pointer 16-byte aligned, else 1. Each thread reads its
// pairs before writing them: out may be x.
template <int kStep>
__global__ void rope_kernel(const bf16* __restrict__ cos_table, const bf16* __restrict__ sin_table,
                            const int32_t* __restrict__ pos, const bf16* x, bf16* out, int T, int H, int D,
                            bool transpose) {
  const int half = D / 2, steps = half / kStep;
  for_each_index(static_cast<size_t>(T) * H * steps, [&](size_t idx) {
    const int j = static_cast<int>(idx % steps) * kStep;
    const size_t head = idx / steps;  // t·H + h
    const int t = static_cast<int>(head / H);
    const size_t row = static_cast<size_t>(pos[t]) * half + j;
    const size_t at = head * D + j;
    if constexpr (kStep == kPack) {
      const Bf16x8 c = load8(cos_table + row), s = load8(sin_table + row), x1 = load8(x + at),
                   x2 = load8(x + at + half);
      store8(out + at, Bf16x8::of([&](int k) { return rotated_first(x1[k], x2[k], c[k], sine(s[k], transpose)); }));
      store8(out + at + half,
             Bf16x8::of([&](int k) { return rotated_second(x1[k], x2[k], c[k], sine(s[k], transpose)); }));
    } else {
      const bf16 c = cos_table[row], s = sine(sin_table[row], transpose), x1 = x[at], x2 = x[at + half];
      out[at] = rotated_first(x1, x2, c, s);
      out[at + half] = rotated_second(x1, x2, c, s);
    }
  });
}

void rotate(const RopeTable& table, const int32_t* pos, const bf16* x, bf16* out, int T, int H, bool transpose,
            cudaStream_t stream) {
  check_positions(table, pos, T, stream);
  const int half = table.head_dim / 2;
  const size_t pairs = static_cast<size_t>(T) * H * half;
  if (pairs == 0) return;
  const bool packed =
      half % kPack == 0 && aligned16(table.cos) && aligned16(table.sin) && aligned16(x) && aligned16(out);
  if (packed)
    rope_kernel<kPack><<<grid_for(pairs / kPack), kBlockThreads, 0, stream>>>(table.cos, table.sin, pos, x, out, T, H,
                                                                              table.head_dim, transpose);
  else
    rope_kernel<1><<<grid_for(pairs), kBlockThreads, 0, stream>>>(table.cos, table.sin, pos, x, out, T, H,
                                                                  table.head_dim, transpose);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_fwd(const Knobs&, const RopeTable& table, const int32_t* pos, const bf16* x, bf16* out, int T, int H,
              cudaStream_t stream) {
  rotate(table, pos, x, out, T, H, false, stream);
}

void rope_bwd(const Knobs&, const RopeTable& table, const int32_t* pos, const bf16* dout, bf16* dx, int T, int H,
              cudaStream_t stream) {
  rotate(table, pos, dout, dx, T, H, true, stream);
}

}  // namespace bp::cuda
