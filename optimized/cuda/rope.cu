// rope on the GPU (SPEC.md §5.5): one grid-stride thread per (token, head, pair),
// reading its token's two table entries.
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

// The pair (x1, x2) = (x[j], x[j + D/2]) rotated by (c, s), or by (c, −s) for the
// transpose. Each thread reads its pair before writing it: out may be x.
__global__ void rope_kernel(const bf16* __restrict__ cos_table, const bf16* __restrict__ sin_table,
                            const int32_t* __restrict__ pos, const bf16* x, bf16* out, int T, int H, int D,
                            bool transpose) {
  const int half = D / 2;
  for_each_index(static_cast<size_t>(T) * H * half, [&](size_t idx) {
    const int j = static_cast<int>(idx % half);
    const size_t head = idx / half;  // t·H + h
    const int t = static_cast<int>(head / H);
    const size_t row = static_cast<size_t>(pos[t]) * half + j;
    const bf16 c = cos_table[row];
    const bf16 s = transpose ? bf16{static_cast<uint16_t>(sin_table[row].bits ^ 0x8000u)} : sin_table[row];
    const size_t at = head * D + j;
    const bf16 x1 = x[at], x2 = x[at + half];
    out[at] = round_bf16(sub_rn(rounded_product(x1, c), rounded_product(x2, s)));
    out[at + half] = round_bf16(add_rn(rounded_product(x2, c), rounded_product(x1, s)));
  });
}

void rotate(const RopeTable& table, const int32_t* pos, const bf16* x, bf16* out, int T, int H, bool transpose,
            cudaStream_t stream) {
  check_positions(table, pos, T, stream);
  const size_t pairs = static_cast<size_t>(T) * H * (table.head_dim / 2);
  if (pairs == 0) return;
  rope_kernel<<<grid_for(pairs), kBlockThreads, 0, stream>>>(table.cos, table.sin, pos, x, out, T, H, table.head_dim,
                                                             transpose);
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
