// rmsnorm on the GPU (SPEC.md §5.2): the row sums by the contract's lane tree
// (device_util.cuh); dw as the token-chunked dot of the reference: its chunk
// partials by mma.sync under sm90-tc (a warp per 16 features and token chunk), else
// one thread per (feature, token chunk), and one thread per feature for the pairwise
// tree over the chunk partials. Three ways to hold a row, all giving the same bits (the same
// per-element functions below; every lane adds its terms in the same order and the
// lanes meet in the same tree):
//  - a warp per row (WarpRow) for packed rows with vec = 8 that fit its registers
//    (n <= 4096 at 256 x 8): each thread holds 8 of the 256 lanes, loads its packs
//    with 16-byte loads and keeps them from the sum to the per-element pass. No
//    block barrier: each warp's load -> tree -> store runs on its own, and at
//    n = 2048 the 4096 rows of a 4096-token batch are all resident at once.
//  - a block per row (RowTeam; a warp when the row has at most 32 runs) for the
//    other packed rows (vec and n multiples of 8, 16-byte aligned pointers, at most
//    kMaxCachedPacks packs per lane): the same 16-byte loads and register cache,
//    the tree over the warp totals in shared memory behind __syncthreads.
//  - the same teams' scalar path (kPacks = 0) for the rest, reading the row twice.
#include <initializer_list>
#include <type_traits>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/ptx.cuh"
#include "optimized/cuda/rmsnorm.h"
#include "reference/numerics/chunked.h"
#include "reference/numerics/math.h"

namespace bp::cuda {
namespace {

// Most packs of a row one lane holds in registers (uint4 each: x, and dy in the backward).
constexpr int kMaxCachedPacks = 4;
// Most packs of a row one warp-per-row thread holds (dx: x and dy, 2 x 16 x 4
// registers at n = 4096 with 256 x 8).
constexpr int kMaxWarpPacks = 16;

// t = R(f(x)·r): the normalised value before the weight (forward and dw).
__device__ bf16 normed(bf16 x, float r) { return round_bf16(mul_rn(widen(x), r)); }

// g = f(dy)·f(w): the gradient with respect to t.
__device__ float grad_t(bf16 dy, bf16 w) { return mul_rn(widen(dy), widen(w)); }

// The forward's term f(x)·f(x), its r from the row sum, and its output R(f(w)·f(t)).
__device__ float square(bf16 x) { return mul_rn(widen(x), widen(x)); }
__device__ float rstd_of(float ss, int n, float eps) {
  return math::rsqrt(add_rn(div_rn(ss, static_cast<float>(n)), eps));
}
__device__ bf16 fwd_value(bf16 x, bf16 w, float r) { return round_bf16(mul_rn(widen(w), widen(normed(x, r)))); }

// The backward's term g·f(x), its coefficient c = r³·(s/n) and dx = R(r·g − f(x)·c).
__device__ float bwd_term(bf16 x, bf16 w, bf16 dy) { return mul_rn(grad_t(dy, w), widen(x)); }
__device__ float bwd_coef(float s, int n, float r) {
  return mul_rn(mul_rn(mul_rn(r, r), r), div_rn(s, static_cast<float>(n)));
}
__device__ bf16 dx_value(bf16 x, bf16 w, bf16 dy, float r, float coef) {
  return round_bf16(sub_rn(mul_rn(r, grad_t(dy, w)), mul_rn(widen(x), coef)));
}


// The packs per lane the block-team kernels keep for rows of n at these addresses:
// 1, 2 or 4 (at least lane_packs_max), or 0 for the scalar path.
int cached_packs(int n, LaneShape shape, std::initializer_list<const void*> rows) {
  if (!all_aligned16(rows) || !row_packed(n, shape)) return 0;
  const int packs = lane_packs_max(n, shape);
  return packs <= 1 ? 1 : packs <= 2 ? 2 : packs <= kMaxCachedPacks ? kMaxCachedPacks : 0;
}

// Launches kernel<kWarpPerRow, kPacks> on `rows` row teams, kPacks = cached_packs(...).
template <class Launch>
void launch_row_teams(int rows, int n, LaneShape shape, int packs, Launch launch) {
  with_row_team(n, shape, [&](auto warp_per_row) {
    using Team = RowTeam<decltype(warp_per_row)::value>;
    const auto go = [&](auto cached) { launch(warp_per_row, cached, Team::grid(rows), Team::block(shape)); };
    switch (packs) {
      case 0: go(std::integral_constant<int, 0>{}); break;
      case 1: go(std::integral_constant<int, 1>{}); break;
      case 2: go(std::integral_constant<int, 2>{}); break;
      default: go(std::integral_constant<int, kMaxCachedPacks>{}); break;
    }
  });
  BP_CUDA_CHECK_LAUNCH();
}

// Where a warp per row takes rows of n (vec = kPack, n a multiple of kPack, every
// pointer 16-byte aligned, at most kMaxWarpPacks packs and 2 sweeps per thread):
// launch(groups, sweeps), WarpRow's arguments as integral constants, on
// RowTeam<true>::grid(rows) blocks of kBlockThreads, and true; else false.
template <class Launch>
bool launch_warp_rows(int rows, int n, LaneShape shape, std::initializer_list<const void*> pointers,
                      Launch launch) {
  if (shape.vec != kPack || n % kPack != 0 || !all_aligned16(pointers)) return false;
  const WarpRowShape ws = warp_row_shape(n, shape);
  if (ws.sweeps > 2 || ws.groups * ws.sweeps > kMaxWarpPacks) return false;
  const dim3 grid = RowTeam<true>::grid(rows);
  const auto go = [&](auto groups) {
    constexpr int kGroups = decltype(groups)::value;
    if constexpr (kGroups * 2 <= kMaxWarpPacks) {
      if (ws.sweeps == 2) {
        launch(groups, std::integral_constant<int, 2>{}, grid);
        return;
      }
    }
    launch(groups, std::integral_constant<int, 1>{}, grid);
  };
  switch (ws.groups) {
    case 1: go(std::integral_constant<int, 1>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    case 8: go(std::integral_constant<int, 8>{}); break;
    default: go(std::integral_constant<int, 16>{}); break;  // groups * sweeps <= kMaxWarpPacks
  }
  BP_CUDA_CHECK_LAUNCH();
  return true;
}

// x and out may be the same buffer: the warp's tree needs every thread's loads,
// and every store needs the tree's total.
template <int kGroups, int kSweeps>
__global__ void __launch_bounds__(kBlockThreads)
    rmsnorm_fwd_warp_kernel(const bf16* x, const bf16* __restrict__ w, float eps, bf16* out,
                            float* __restrict__ rstd, int rows, int n) {
  const auto team = RowTeam<true>::here();
  if (team.row >= rows) return;  // uniform over the warp
  const size_t at = static_cast<size_t>(team.row) * n;
  using Row = WarpRow<kGroups, kSweeps>;
  const Row row{team.lane, n};
  Bf16x8 xs[Row::kPacks];
  row.load(x + at, xs);
  const float ss = row.sum([&](int q, int, auto add) {
#pragma unroll
    for (int j = 0; j < kPack; ++j) add(square(xs[q][j]));
  });
  const float r = rstd_of(ss, n, eps);
  if (team.lane == 0) rstd[team.row] = r;
  row.for_each([&](int q, int i) {
    const Bf16x8 ws = load8(w + i);
    store8(out + at + i, Bf16x8::of([&](int j) { return fwd_value(xs[q][j], ws[j], r); }));
  });
}

// x and out may be the same buffer: every read of the row precedes the team's
// tree, every write follows it.
template <bool kWarpPerRow, int kPacks>
__global__ void __launch_bounds__(kMaxTeamThreads)
    rmsnorm_fwd_kernel(const bf16* x, const bf16* __restrict__ w, float eps, bf16* out, float* __restrict__ rstd,
                       int rows, int n, LaneShape shape) {
  __shared__ float warp_totals[kWarp];
  const auto team = RowTeam<kWarpPerRow>::here();
  if (team.row >= rows) return;  // uniform over the team
  const size_t at = static_cast<size_t>(team.row) * n;
  const bf16* xr = x + at;
  bf16* outr = out + at;
  if constexpr (kPacks > 0) {
    const LanePacks packs{team.lane, n, shape};
    Bf16x8 xs[kPacks];
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (packs.has(k)) xs[k] = load8(xr + packs.start(k));  // all loads in flight before the first add
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (packs.has(k))
#pragma unroll
        for (int j = 0; j < kPack; ++j) acc = add_rn(acc, square(xs[k][j]));
    const float r = rstd_of(team.tree(acc, warp_totals), n, eps);
    if (team.lane == 0) rstd[team.row] = r;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (packs.has(k)) {
        const int i = packs.start(k);
        const Bf16x8 ws = load8(w + i);
        store8(outr + i, Bf16x8::of([&](int j) { return fwd_value(xs[k][j], ws[j], r); }));
      }
  } else {
    const float r = rstd_of(team.tree(lane_partial(team.lane, n, shape, [&](int i) { return square(xr[i]); }),
                                      warp_totals),
                            n, eps);
    if (team.lane == 0) rstd[team.row] = r;
    for (int i = team.lane; i < n; i += team.size) outr[i] = fwd_value(xr[i], w[i], r);
  }
}

// dx = R(r·g − f(x)·c) with c = r³·(lane_sum(g·f(x))/n); also t = R(f(x)·r) for dw.
template <int kGroups, int kSweeps>
__global__ void __launch_bounds__(kBlockThreads)
    rmsnorm_dx_warp_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ rstd,
                           const bf16* __restrict__ dy, bf16* __restrict__ dx, bf16* __restrict__ t, int rows,
                           int n) {
  const auto team = RowTeam<true>::here();
  if (team.row >= rows) return;  // uniform over the warp
  const size_t at = static_cast<size_t>(team.row) * n;
  using Row = WarpRow<kGroups, kSweeps>;
  const Row row{team.lane, n};
  Bf16x8 xs[Row::kPacks], dys[Row::kPacks];
  row.load(x + at, xs);
  row.load(dy + at, dys);
  const float r = rstd[team.row];
  const float s = row.sum([&](int q, int i, auto add) {
    const Bf16x8 ws = load8(w + i);
#pragma unroll
    for (int j = 0; j < kPack; ++j) add(bwd_term(xs[q][j], ws[j], dys[q][j]));
  });
  const float coef = bwd_coef(s, n, r);
  row.for_each([&](int q, int i) {
    const Bf16x8 ws = load8(w + i);
    store8(dx + at + i, Bf16x8::of([&](int j) { return dx_value(xs[q][j], ws[j], dys[q][j], r, coef); }));
    store8(t + at + i, Bf16x8::of([&](int j) { return normed(xs[q][j], r); }));
  });
}

template <bool kWarpPerRow, int kPacks>
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
  if constexpr (kPacks > 0) {
    const LanePacks packs{team.lane, n, shape};
    Bf16x8 xs[kPacks], dys[kPacks];
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (packs.has(k)) {
        xs[k] = load8(xr + packs.start(k));
        dys[k] = load8(dyr + packs.start(k));
      }
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (packs.has(k)) {
        const Bf16x8 ws = load8(w + packs.start(k));
#pragma unroll
        for (int j = 0; j < kPack; ++j) acc = add_rn(acc, bwd_term(xs[k][j], ws[j], dys[k][j]));
      }
    const float coef = bwd_coef(team.tree(acc, warp_totals), n, r);
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (packs.has(k)) {
        const int i = packs.start(k);
        const Bf16x8 ws = load8(w + i);
        store8(dx + at + i, Bf16x8::of([&](int j) { return dx_value(xs[k][j], ws[j], dys[k][j], r, coef); }));
        store8(t + at + i, Bf16x8::of([&](int j) { return normed(xs[k][j], r); }));
      }
  } else {
    const float s = team.tree(
        lane_partial(team.lane, n, shape, [&](int i) { return bwd_term(xr[i], w[i], dyr[i]); }), warp_totals);
    const float coef = bwd_coef(s, n, r);
    for (int i = team.lane; i < n; i += team.size) {
      dx[at + i] = dx_value(xr[i], w[i], dyr[i], r, coef);
      t[at + i] = normed(xr[i], r);
    }
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

// The same partials on the tensor cores (sm90-tc, n a multiple of 8, 16-byte aligned
// rows): a warp takes 16 columns i0.. and one chunk, and forms D = A·B by mma.sync
// over the chunk's rows in groups of 16 from +0, with A[m][k] = dy[k][i0 + m] and
// B[k][n] = t[k][i0 + n]. Every output of mma.sync is its own chain of k16 groups
// (the sm90-tc model, SPEC.md §2.3), so D[m][m] is column i0 + m's partial; the 15
// other products of each output are discarded work (the op reads 2 bytes per
// product either way). The rows past the chunk and the columns past n arrive as
// zeros: zero products take no part, and the padded columns only reach outputs
// that are dropped. Each warp streams its 16-row steps through its own ring of
// cp.async stages, 48-byte rows (conflict-free ldmatrix).
constexpr int kDwWarps = 2, kDwStages = 12, kDwLd = 24;  // bf16 per staged row: 16 + 8 pad
struct DwStage {
  bf16 dy[16 * kDwLd], t[16 * kDwLd];
};

__global__ void __launch_bounds__(kDwWarps* kWarp)
    rmsnorm_dw_partials_mma_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ t, int rows, int n,
                                   int chunk_rows, int chunks, float* __restrict__ partials) {
  __shared__ DwStage ring[kDwWarps][kDwStages];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int groups = (n + 15) / 16, unit = static_cast<int>(blockIdx.x) * kDwWarps + warp;
  if (unit >= groups * chunks) return;  // no block barrier below
  const int i0 = (unit % groups) * 16, c = unit / groups;
  const int len = min(chunk_rows, rows - c * chunk_rows), steps = (len + 15) / 16;
  DwStage* st = ring[warp];

  // Step s's rows to its stage: lane = (row, half of the 16 columns), both operands.
  const int row = lane / 2, col = i0 + (lane % 2) * 8;
  auto issue = [&](int s) {
    const int k = s * 16 + row;
    const bool in = k < len && col < n;
    const size_t at = (static_cast<size_t>(c) * chunk_rows + (in ? k : 0)) * n + (in ? col : 0);
    DwStage& d = st[s % kDwStages];
    cp_async16(d.dy + row * kDwLd + (lane % 2) * 8, dy + at, in ? 16 : 0);
    cp_async16(d.t + row * kDwLd + (lane % 2) * 8, t + at, in ? 16 : 0);
  };
  for (int s = 0; s < kDwStages - 1; ++s) {
    if (s < steps) issue(s);
    cp_async_commit();  // empty past the last step: the count stays uniform
  }
  // ldmatrix.trans rows of this lane: matrix j = lane / 8, its row lane % 8. A's four
  // matrices are (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15);
  // B's (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
  const int j = lane / 8, r = lane % 8;
  const int a_at = (r + 8 * (j / 2)) * kDwLd + 8 * (j % 2), b_at = (r + 8 * (j % 2)) * kDwLd + 8 * (j / 2);
  float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s = 0; s < steps; ++s) {
    cp_async_wait<kDwStages - 2>();
    __syncwarp();  // step s landed for every lane; every lane is done with step s - 1's stage
    if (s + kDwStages - 1 < steps) issue(s + kDwStages - 1);
    cp_async_commit();
    const DwStage& d = st[s % kDwStages];
    uint32_t a[4], b[4];
    ldmatrix_x4_trans(a, d.dy + a_at);
    ldmatrix_x4_trans(b, d.t + b_at);
    mma_m16n8k16(d0, a, b[0], b[1]);
    mma_m16n8k16(d1, a, b[2], b[3]);
  }
  for_diagonal(d0, d1, lane, [&](int g, float lo, float hi) {
    if (i0 + g < n) partials[static_cast<size_t>(i0 + g) * chunks + c] = lo;
    if (i0 + 8 + g < n) partials[static_cast<size_t>(i0 + 8 + g) * chunks + c] = hi;
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
  if (launch_warp_rows(rows, n, kn.row_reduce, {x, w, out}, [&](auto groups, auto sweeps, dim3 grid) {
        rmsnorm_fwd_warp_kernel<decltype(groups)::value, decltype(sweeps)::value>
            <<<grid, kBlockThreads, 0, stream>>>(x, w, eps, out, rstd, rows, n);
      }))
    return;
  const int packs = cached_packs(n, kn.row_reduce, {x, w, out});
  launch_row_teams(rows, n, kn.row_reduce, packs, [&](auto warp_per_row, auto cached, dim3 grid, dim3 block) {
    rmsnorm_fwd_kernel<decltype(warp_per_row)::value, decltype(cached)::value>
        <<<grid, block, 0, stream>>>(x, w, eps, out, rstd, rows, n, kn.row_reduce);
  });
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
  if (!launch_warp_rows(rows, n, kn.row_reduce, {x, w, dy, dx, t.get()}, [&](auto groups, auto sweeps, dim3 grid) {
        rmsnorm_dx_warp_kernel<decltype(groups)::value, decltype(sweeps)::value>
            <<<grid, kBlockThreads, 0, stream>>>(x, w, rstd, dy, dx, t.get(), rows, n);
      })) {
    const int packs = cached_packs(n, kn.row_reduce, {x, w, dy, dx, t.get()});
    launch_row_teams(rows, n, kn.row_reduce, packs, [&](auto warp_per_row, auto cached, dim3 grid, dim3 block) {
      rmsnorm_dx_kernel<decltype(warp_per_row)::value, decltype(cached)::value>
          <<<grid, block, 0, stream>>>(x, w, rstd, dy, dx, t.get(), rows, n, kn.row_reduce);
    });
  }

  const int chunk_rows = kn.grad_token_chunk * heads;
  const int chunks = (rows + chunk_rows - 1) / chunk_rows;
  DeviceBuffer<float> partials(static_cast<size_t>(n) * chunks, stream);
  if (kn.dot == DotModel::Sm90Tc && n % 8 == 0 && all_aligned16({dy, t.get()})) {
    const size_t units = static_cast<size_t>((n + 15) / 16) * chunks;
    rmsnorm_dw_partials_mma_kernel<<<static_cast<unsigned>((units + kDwWarps - 1) / kDwWarps), kDwWarps * kWarp, 0,
                                     stream>>>(dy, t.get(), rows, n, chunk_rows, chunks, partials.get());
  } else {
    with_dot_model(kn.dot, [&](auto model) {
      rmsnorm_dw_partials_kernel<decltype(model)>
          <<<grid_for(static_cast<size_t>(n) * chunks), kBlockThreads, 0, stream>>>(dy, t.get(), rows, n, chunk_rows,
                                                                                    chunks, partials.get());
    });
  }
  BP_CUDA_CHECK_LAUNCH();
  rmsnorm_dw_tree_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(partials.get(), n, chunks, dw);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace bp::cuda
