// rmsnorm on the GPU (SPEC.md §5.2): one team per row (a block of row_reduce.lanes
// threads, or a warp for rows of at most 32 runs, as the q/k norms over head_dim
// 128), the row sums by the contract's lane tree (row_reduce.cuh); dw as the
// token-chunked dot of the reference, one thread per (feature, token chunk) and
// one per feature for the pairwise tree over the chunk partials.
#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/rmsnorm.h"
#include "reference/numerics/chunked.h"
#include "reference/numerics/math.h"

namespace bp::cuda {
namespace {

// t = R(f(x)·r): the normalised value before the weight (forward and dw).
__device__ bf16 normed(bf16 x, float r) { return round_bf16(mul_rn(widen(x), r)); }

// g = f(dy)·f(w): the gradient with respect to t.
__device__ float grad_t(bf16 dy, bf16 w) { return mul_rn(widen(dy), widen(w)); }

// x and out may be the same buffer: every read of the row precedes the team's
// tree, every write follows it.
template <bool kWarpPerRow>
__global__ void __launch_bounds__(kMaxTeamThreads)
    rmsnorm_fwd_kernel(const bf16* x, const bf16* __restrict__ w, float eps, bf16* out, float* __restrict__ rstd,
                       int rows, int n, LaneShape shape) {
  __shared__ float warp_totals[kWarp];
  const auto team = RowTeam<kWarpPerRow>::here();
  if (team.row >= rows) return;  // uniform over the team
  const size_t at = static_cast<size_t>(team.row) * n;
  const bf16* xr = x + at;
  const float ss = team.tree(
      lane_partial(team.lane, n, shape, [&](int i) { return mul_rn(widen(xr[i]), widen(xr[i])); }), warp_totals);
  const float r = math::rsqrt(add_rn(div_rn(ss, static_cast<float>(n)), eps));
  if (team.lane == 0) rstd[team.row] = r;
  for (int i = team.lane; i < n; i += team.size) out[at + i] = round_bf16(mul_rn(widen(w[i]), widen(normed(xr[i], r))));
}

// dx = R(r·g − f(x)·c) with c = r³·(lane_sum(g·f(x))/n); also t = R(f(x)·r) for dw.
template <bool kWarpPerRow>
__global__ void __launch_bounds__(kMaxTeamThreads)
    rmsnorm_dx_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ rstd,
                      const bf16* __restrict__ dy, bf16* __restrict__ dx, bf16* __restrict__ t, int rows, int n,
                      LaneShape shape) {
  __shared__ float warp_totals[kWarp];
  const auto team = RowTeam<kWarpPerRow>::here();
  if (team.row >= rows) return;
  const size_t at = static_cast<size_t>(team.row) * n;
  const bf16 *xr = x + at, *dyr = dy + at;
  const float r = rstd[team.row];
  const float s =
      team.tree(lane_partial(team.lane, n, shape, [&](int i) { return mul_rn(grad_t(dyr[i], w[i]), widen(xr[i])); }),
                warp_totals);
  const float coef = mul_rn(mul_rn(mul_rn(r, r), r), div_rn(s, static_cast<float>(n)));
  for (int i = team.lane; i < n; i += team.size) {
    dx[at + i] = round_bf16(sub_rn(mul_rn(r, grad_t(dyr[i], w[i])), mul_rn(widen(xr[i]), coef)));
    t[at + i] = normed(xr[i], r);
  }
}

// partials[i][c] = the dot of column i of dy and t over the rows of token chunk c,
// from +0 by the dot model: token_chunked_dot's loop body (chunked.h).
template <class Model>
__global__ void rmsnorm_dw_partials_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ t, int rows, int n,
                                           int chunk_rows, int chunks, float* __restrict__ partials) {
  for_each_index(static_cast<size_t>(n) * chunks, [&](size_t idx) {
    const int i = static_cast<int>(idx % n), c = static_cast<int>(idx / n);  // neighbours read neighbouring columns
    const int len = (c + 1) * chunk_rows <= rows ? chunk_rows : rows - c * chunk_rows;
    const size_t first = static_cast<size_t>(c) * chunk_rows * n + i;
    partials[static_cast<size_t>(i) * chunks + c] = Model::chain(0.0f, dy + first, n, t + first, n, len);
  });
}

__global__ void rmsnorm_dw_tree_kernel(float* __restrict__ partials, int n, int chunks, float* __restrict__ dw) {
  for_each_index(n, [&](size_t i) { dw[i] = pairwise_tree(partials + i * chunks, chunks); });
}

}  // namespace

void rmsnorm_fwd(const Knobs& kn, const bf16* x, const bf16* w, float eps, bf16* out, float* rstd, int T, int heads,
                 int n, cudaStream_t stream) {
  check_lane_shape(kn.row_reduce, "rmsnorm");
  const int rows = T * heads;
  if (rows == 0 || n == 0) return;
  with_row_team(n, kn.row_reduce, [&](auto warp_per_row) {
    constexpr bool kWarpPerRow = decltype(warp_per_row)::value;
    using Team = RowTeam<kWarpPerRow>;
    rmsnorm_fwd_kernel<kWarpPerRow>
        <<<Team::grid(rows), Team::block(kn.row_reduce), 0, stream>>>(x, w, eps, out, rstd, rows, n, kn.row_reduce);
  });
  BP_CUDA_CHECK_LAUNCH();
}

void rmsnorm_bwd(const Knobs& kn, const bf16* x, const bf16* w, const float* rstd, const bf16* dy, bf16* dx, float* dw,
                 int T, int heads, int n, cudaStream_t stream) {
  check_lane_shape(kn.row_reduce, "rmsnorm");
  const int rows = T * heads;
  if (n == 0) return;
  if (rows == 0) {  // an empty token sum: every dw is +0
    BP_CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * n, stream));
    return;
  }
  DeviceBuffer<bf16> t(static_cast<size_t>(rows) * n, stream);
  with_row_team(n, kn.row_reduce, [&](auto warp_per_row) {
    constexpr bool kWarpPerRow = decltype(warp_per_row)::value;
    using Team = RowTeam<kWarpPerRow>;
    rmsnorm_dx_kernel<kWarpPerRow><<<Team::grid(rows), Team::block(kn.row_reduce), 0, stream>>>(
        x, w, rstd, dy, dx, t.get(), rows, n, kn.row_reduce);
  });
  BP_CUDA_CHECK_LAUNCH();

  const int chunk_rows = kn.grad_token_chunk * heads;
  const int chunks = (rows + chunk_rows - 1) / chunk_rows;
  DeviceBuffer<float> partials(static_cast<size_t>(n) * chunks, stream);
  with_dot_model(kn.dot, [&](auto model) {
    rmsnorm_dw_partials_kernel<decltype(model)>
        <<<grid_for(static_cast<size_t>(n) * chunks), kBlockThreads, 0, stream>>>(dy, t.get(), rows, n, chunk_rows,
                                                                                  chunks, partials.get());
  });
  BP_CUDA_CHECK_LAUNCH();
  rmsnorm_dw_tree_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(partials.get(), n, chunks, dw);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace bp::cuda
