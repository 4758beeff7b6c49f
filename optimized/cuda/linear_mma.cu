// The mma.sync / SIMT engine of linear (linear_gemm.cuh says what every GEMM
// computes): one CTA per output tile over the whole reduction, where
//   - tiles of kBK reduction elements (32; 256 for the narrow decode tile) stream
//     through a cp.async pipeline into padded shared memory; a tile never
//     straddles two chunks, and the part of a tile past its chunk's end is
//     zero-filled on both operands. Operand rows past the problem's edge are never
//     copied: their stale shared memory reaches only outputs that are not stored;
//   - sm90-tc: per warp, mma.sync.m16n8k16 on ldmatrix fragments, one mma per
//     16-element group in increasing order. A group is one G step of the model;
//     zero products (the padding) take no part, and a step with no non-zero
//     product returns its accumulator unchanged, so padding is exact;
//   - fma-seq: per thread, a micro-tile of outputs, one fmaf per valid reduction
//     element in increasing order (padding is skipped: fma(0, 0, -0) would be +0);
//   - the chunk partials fold into the tree as they finish (ChunkTree,
//     linear_gemm.cuh).
// It runs every fma-seq GEMM, and sm90-tc where neither the warpgroup engine
// (linear_wgmma.cu) nor the decode engine (linear_decode.cu: decode-sized forwards
// in 16-byte runs) does: decode-sized input gradients, grouped launches and
// unaligned operands, operands TMA cannot read, chunks that are not whole k16
// groups, grids too small for its tiles.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/linear_gemm.cuh"
#include "optimized/cuda/ptx.cuh"
#include "reference/numerics/bf16.h"
#include "reference/numerics/fp.h"

namespace bp::cuda::gemm {
namespace {

constexpr int kPad = 8;  // bf16 padding per shared-memory row: ldmatrix rows land in distinct banks

// A CTA of kWarpsM × kWarpsN warps, each owning kMTiles × kNTiles mma tiles
// (16 × 8 outputs each); kStages shared-memory stages of kBK reduction elements;
// kRegSlots levels of the chunk tree kept in registers (deeper levels go to a
// global scratch).
template <int WarpsM, int WarpsN, int MTiles, int NTiles, int Stages, int RegSlots, int BK = 32>
struct TileConfig {
  static constexpr int kWarpsN = WarpsN, kMTiles = MTiles, kNTiles = NTiles;
  static constexpr int kStages = Stages, kRegSlots = RegSlots, kBK = BK;
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kBM = WarpsM * MTiles * 16, kBN = WarpsN * NTiles * 8;
  static constexpr int kAcc = MTiles * NTiles * 4;  // accumulators per thread
  static_assert(NTiles % 2 == 0, "B fragments are loaded two n8 tiles at a time");
  static_assert(BK % 32 == 0, "a stage is whole k16 groups and whole 16-byte runs");
};
// Large outputs with a single chunk: 128 × 128, 64 accumulators per thread.
using WideTile = TileConfig<2, 4, 4, 4, 4, 0>;
// Chunked reductions (the tree's first three levels in registers), or fewer CTAs.
using NarrowTile = TileConfig<4, 2, 2, 4, 4, 3>;
using MidTile = TileConfig<2, 2, 2, 4, 4, 3>;
// Decode-sized M (<= 16): the GEMM streams the weight, and K is never split, so
// the grid is parallel over N only. Where N gives two waves of 16 × 64 tiles
// (lm_head), 16 × 64 per CTA with a deep pipeline; below that (N < 16896 on 132
// SMs), one warp per 16 × 16 tile for 4× the CTAs, over stages of 256 reduction
// elements that keep 5 × 8 KB of weight in flight per CTA (two CTAs per SM). On
// lm_head the narrow tile is slower (one warp's serial ldmatrix → mma chain and a
// pipeline fill per short-lived CTA; bench/DECISIONS.md, linear: one-warp 16 × 16 tiles).
using DecodeTile = TileConfig<1, 4, 1, 2, 8, 5>;
using DecodeNarrowTile = TileConfig<1, 1, 1, 2, 6, 5, 256>;
static_assert(DecodeTile::kBM == kDecodeRows && DecodeNarrowTile::kBM == kDecodeRows,
              "decode-sized M is what the 16-row tiles take");

// Shared-memory layout of one operand's stage: Rows rows × BK reduction
// elements, stored along the operand's contiguous index, rows padded.
template <Major M, int Rows, int BK>
struct SmemTile {
  static constexpr int kLd = M == Major::Red ? BK + kPad : Rows + kPad;
  static constexpr int kElems = M == Major::Red ? Rows * kLd : BK * kLd;
  __device__ static int offset(int row, int j) { return M == Major::Red ? row * kLd + j : j * kLd + row; }
};

// --- global -> shared -----------------------------------------------------------
// Copies 8 contiguous elements (the first `valid` of them real, the rest zero).
// vec: one cp.async (valid is 0 or 8); otherwise element loads and one 16-byte store.
__device__ inline void copy8(bf16* dst, const bf16* src, int valid, bool vec) {
  if (vec) {
    cp_async16(dst, src, valid > 0 ? 16 : 0);
    return;
  }
  uint16_t v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = e < valid ? src[e].bits : uint16_t{0};
  uint4 packed;
  packed.x = v[0] | (static_cast<uint32_t>(v[1]) << 16);
  packed.y = v[2] | (static_cast<uint32_t>(v[3]) << 16);
  packed.z = v[4] | (static_cast<uint32_t>(v[5]) << 16);
  packed.w = v[6] | (static_cast<uint32_t>(v[7]) << 16);
  *reinterpret_cast<uint4*>(dst) = packed;
}

// One stage of one operand: rows [row0, row0 + Rows) × reduction [j0, j0 + BK),
// of which the first `jvalid` reduction elements belong to the current chunk.
// Rows at or past op.rows are not copied (a decode tile of one token copies one
// row of 16): each reaches only its own output row or column, which is not stored.
template <Major M, int Rows, int BK, int Threads>
__device__ void load_stage(const Operand op, int row0, int j0, int jvalid, bf16* tile) {
  using T = SmemTile<M, Rows, BK>;
  const int live_rows = min(Rows, op.rows - row0);
  if constexpr (M == Major::Red) {
    const int runs = live_rows * (BK / 8);
    for (int v = threadIdx.x; v < runs; v += Threads) {
      const int r = v / (BK / 8), j = (v % (BK / 8)) * 8;
      const int valid = max(0, min(8, jvalid - j));
      const bf16* src = valid > 0 ? op.p + static_cast<size_t>(row0 + r) * op.ld + j0 + j : op.p;
      copy8(tile + T::offset(r, j), src, valid, op.vec);
    }
  } else {
    const int row_runs = (live_rows + 7) / 8, runs = BK * row_runs;
    for (int v = threadIdx.x; v < runs; v += Threads) {
      const int j = v / row_runs, r = (v % row_runs) * 8, gr = row0 + r;
      const int valid = j < jvalid ? min(8, op.rows - gr) : 0;
      const bf16* src = valid > 0 ? op.p + static_cast<size_t>(j0 + j) * op.ld + gr : op.p;
      copy8(tile + T::offset(r, j), src, valid, op.vec);
    }
  }
}

// --- the two dot models ---------------------------------------------------------
// Both keep kAcc accumulators per thread; accumulator i is output (row(i), col(i))
// of the CTA tile.

// sm90-tc: mma.sync fragments (PTX ISA, mma.m16n8k16 with .bf16), g = lane / 4,
// t = lane % 4. A 16×16: a0a1 (g, 2t..), a2a3 (g+8, 2t..), a4a5 (g, 2t+8..),
// a6a7 (g+8, 2t+8..); B 16×8: b0b1 (k 2t.., n g), b2b3 (k 2t+8.., n g); C 16×8:
// c0c1 (g, 2t..2t+1), c2c3 (g+8, 2t..2t+1) — the layouts tools/hw_truth/hw_truth.cu
// proved against the model. Accumulator i = (mt·kNTiles + nt)·4 + e.
template <class Cfg, Major MA, Major MB>
struct TensorCoreDot {
  using PairedColumns = void;  // accumulators 2i and 2i + 1 are adjacent columns
  using TA = SmemTile<MA, Cfg::kBM, Cfg::kBK>;
  using TB = SmemTile<MB, Cfg::kBN, Cfg::kBK>;
  float acc[Cfg::kAcc];
  int warp_row, warp_col, lane;

  __device__ TensorCoreDot() {
    const int warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    warp_row = (warp / Cfg::kWarpsN) * Cfg::kMTiles * 16;
    warp_col = (warp % Cfg::kWarpsN) * Cfg::kNTiles * 8;
    clear();
  }
  __device__ void clear() {
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.0f;
  }
  __device__ int row(int i) const { return warp_row + (i / (4 * Cfg::kNTiles)) * 16 + lane / 4 + 8 * ((i % 4) / 2); }
  __device__ int col(int i) const { return warp_col + ((i / 4) % Cfg::kNTiles) * 8 + 2 * (lane % 4) + i % 2; }

  // x4 registers: A rows m0..m0+15 × group k0..k0+15, in a0..a7 order
  // (rows 0-7 k 0-7, rows 8-15 k 0-7, rows 0-7 k 8-15, rows 8-15 k 8-15).
  __device__ void load_a(uint32_t (&r)[4], const bf16* tile, int m0, int k0) const {
    if constexpr (MA == Major::Red) {
      ldmatrix_x4(r, tile + TA::offset(m0 + lane % 8 + 8 * ((lane / 8) % 2), k0 + 8 * (lane / 16)));
    } else {  // stored [k][m]: transposed 8×8 blocks
      ldmatrix_x4_trans(r, tile + TA::offset(m0 + 8 * ((lane / 8) % 2), k0 + lane % 8 + 8 * (lane / 16)));
    }
  }
  // x4 registers: B columns n0..n0+15 × group k0..k0+15 as (b0b1, b2b3) of the
  // n8 tile n0 followed by (b0b1, b2b3) of the n8 tile n0 + 8.
  __device__ void load_b(uint32_t (&r)[4], const bf16* tile, int n0, int k0) const {
    if constexpr (MB == Major::Red) {
      ldmatrix_x4(r, tile + TB::offset(n0 + lane % 8 + 8 * (lane / 16), k0 + 8 * ((lane / 8) % 2)));
    } else {  // stored [k][n]: transposed 8×8 blocks
      ldmatrix_x4_trans(r, tile + TB::offset(n0 + 8 * (lane / 16), k0 + lane % 8 + 8 * ((lane / 8) % 2)));
    }
  }

  // The stage's groups in increasing order; groups wholly past the chunk's end
  // would only add G steps without terms, which leave the accumulator unchanged.
  __device__ void step(const bf16* ta, const bf16* tb, int jvalid) {
#pragma unroll
    for (int k0 = 0; k0 < Cfg::kBK; k0 += 16) {
      if (k0 >= jvalid) break;
      uint32_t a[Cfg::kMTiles][4], b[Cfg::kNTiles / 2][4];
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) load_a(a[mt], ta, warp_row + mt * 16, k0);
#pragma unroll
      for (int np = 0; np < Cfg::kNTiles / 2; ++np) load_b(b[np], tb, warp_col + np * 16, k0);
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < Cfg::kNTiles; ++nt)
          mma_m16n8k16(&acc[(mt * Cfg::kNTiles + nt) * 4], a[mt], b[nt / 2][2 * (nt % 2)],
                       b[nt / 2][2 * (nt % 2) + 1]);
    }
  }
};

// fma-seq: thread (tr, tc) owns rows tr + i·kRowThreads (i < kTM) and columns
// tc + j·kColThreads (j < 4); accumulator i·4 + j. Strided so that a warp's
// shared-memory reads spread over the banks.
template <class Cfg, Major MA, Major MB>
struct SimtFmaDot {
  using TA = SmemTile<MA, Cfg::kBM, Cfg::kBK>;
  using TB = SmemTile<MB, Cfg::kBN, Cfg::kBK>;
  static constexpr int kColThreads = Cfg::kBN / 4;
  static constexpr int kRowThreads = Cfg::kThreads / kColThreads;
  static constexpr int kTM = Cfg::kAcc / 4;
  static_assert(kRowThreads * kTM == Cfg::kBM, "the micro-tiles cover the CTA tile");
  float acc[Cfg::kAcc];
  int tr, tc;

  __device__ SimtFmaDot() : tr(threadIdx.x / kColThreads), tc(threadIdx.x % kColThreads) { clear(); }
  __device__ void clear() {
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.0f;
  }
  __device__ int row(int i) const { return tr + (i / 4) * kRowThreads; }
  __device__ int col(int i) const { return tc + (i % 4) * kColThreads; }

  // acc = fma(a_j, b_j, acc) for the stage's valid elements, j increasing.
  __device__ void step(const bf16* ta, const bf16* tb, int jvalid) {
    const int end = min(jvalid, Cfg::kBK);
    for (int j = 0; j < end; ++j) {
      float a[kTM], b[4];
#pragma unroll
      for (int i = 0; i < kTM; ++i) a[i] = widen(ta[TA::offset(tr + i * kRowThreads, j)]);
#pragma unroll
      for (int c = 0; c < 4; ++c) b[c] = widen(tb[TB::offset(tc + c * kColThreads, j)]);
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i * 4 + c] = fma_rn(a[i], b[c], acc[i * 4 + c]);
    }
  }
};

// --- the kernel -----------------------------------------------------------------
// The CTA's output tile at (row0, col0) of problem p, over the whole reduction.
template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
__device__ void gemm_tile(const Problem& p, const int row0, const int col0) {
  using Dot = DotT<Cfg, MA, MB>;
  using TA = SmemTile<MA, Cfg::kBM, Cfg::kBK>;
  using TB = SmemTile<MB, Cfg::kBN, Cfg::kBK>;
  constexpr int kStageElems = TA::kElems + TB::kElems;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);

  constexpr int kBK = Cfg::kBK;
  const int stages_per_chunk = (p.chunk + kBK - 1) / kBK;
  const int stages = p.chunks * stages_per_chunk;
  auto valid_of = [&](int s) { return stage_valid(p, s, stages_per_chunk, kBK); };
  auto issue = [&](int s) {
    if (s < stages) {
      const int j0 = (s / stages_per_chunk) * p.chunk + (s % stages_per_chunk) * kBK;
      bf16* tile = smem + (s % Cfg::kStages) * kStageElems;
      load_stage<MA, Cfg::kBM, kBK, Cfg::kThreads>(p.a, row0, j0, valid_of(s), tile);
      load_stage<MB, Cfg::kBN, kBK, Cfg::kThreads>(p.b, col0, j0, valid_of(s), tile + TA::kElems);
    }
    cp_async_commit();  // one group per stage, empty or not, so the wait count is fixed
  };

  Dot dot;
  ChunkTree<Cfg, Dot> tree(p, row0, col0, threadIdx.x, tile_index<Cfg>(p, row0, col0), tile_count<Cfg>(p));
  for (int s = 0; s < Cfg::kStages - 1; ++s) issue(s);
  for (int s = 0; s < stages; ++s) {
    cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();  // stage s is visible to all; stage s - 1 is free again
    issue(s + Cfg::kStages - 1);
    const bf16* tile = smem + (s % Cfg::kStages) * kStageElems;
    dot.step(tile, tile + TA::kElems, valid_of(s));
    if (s % stages_per_chunk == stages_per_chunk - 1) {
      const int c = s / stages_per_chunk;
      if (tree.finish_chunk(dot, c, valid_of(c * stages_per_chunk) <= 0)) tree.store_root(p, dot);
      else dot.clear();
    }
  }
}

template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
__global__ void __launch_bounds__(Cfg::kThreads) linear_kernel(const Problem p) {
  gemm_tile<Cfg, DotT, MA, MB>(p, blockIdx.y * Cfg::kBM, blockIdx.x * Cfg::kBN);
}

template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
__global__ void __launch_bounds__(Cfg::kThreads)
    grouped_kernel(const Problem* __restrict__ problems, const GroupTile* __restrict__ tiles) {
  const GroupTile tile = tiles[blockIdx.x];
  const Problem p = problems[tile.problem];
  gemm_tile<Cfg, DotT, MA, MB>(p, tile.row0, tile.col0);
}

// --- host side ------------------------------------------------------------------
template <class Cfg, Major MA, Major MB>
constexpr size_t kSmemBytes =
    sizeof(bf16) * Cfg::kStages *
    (SmemTile<MA, Cfg::kBM, Cfg::kBK>::kElems + SmemTile<MB, Cfg::kBN, Cfg::kBK>::kElems);

// One launch over all tiles of p (its tree scratch freed in stream order after it).
template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
void launch(Problem p, cudaStream_t stream) {
  constexpr size_t kSmem = kSmemBytes<Cfg, MA, MB>;
  const auto kernel = linear_kernel<Cfg, DotT, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, kSmem);
  BP_CUDA_CHECK(opt_in);
  DeviceBuffer<float> spill(spill_elems<Cfg>(p, tile_count<Cfg>(p)), stream);
  p.spill = spill.get();
  const dim3 grid((p.n + Cfg::kBN - 1) / Cfg::kBN, (p.m + Cfg::kBM - 1) / Cfg::kBM);
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  BP_CUDA_CHECK_LAUNCH();
}

// Runs the GEMM with the mma.sync tile that fills the GPU best: decode-sized M
// gets a decode tile, a single chunk the 128 × 128 tile if it alone gives a
// wave, else the narrower tiles (which keep three tree levels in registers).
template <template <class, Major, Major> class DotT, Major MA, Major MB>
void run_with_dot(const Problem& p, cudaStream_t stream) {
  const int sms = multiprocessors();
  if (p.m <= DecodeTile::kBM) {
    if (tile_count<DecodeTile>(p) >= 2 * sms) return launch<DecodeTile, DotT, MA, MB>(p, stream);
    return launch<DecodeNarrowTile, DotT, MA, MB>(p, stream);
  }
  if (p.chunks == 1 && tile_count<WideTile>(p) >= sms) return launch<WideTile, DotT, MA, MB>(p, stream);
  if (tile_count<NarrowTile>(p) >= sms) return launch<NarrowTile, DotT, MA, MB>(p, stream);
  launch<MidTile, DotT, MA, MB>(p, stream);
}

template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
void launch_grouped(std::vector<Problem> problems, cudaStream_t stream) {
  constexpr size_t kSmem = kSmemBytes<Cfg, MA, MB>;
  const auto kernel = grouped_kernel<Cfg, DotT, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, kSmem);
  BP_CUDA_CHECK(opt_in);
  GroupPlan<Cfg> plan(std::move(problems), stream);
  const DeviceBuffer<Problem> d_problems(plan.problems, stream);
  const DeviceBuffer<GroupTile> d_tiles(plan.tiles, stream);
  kernel<<<plan.ctas, Cfg::kThreads, kSmem, stream>>>(d_problems.get(), d_tiles.get());
  BP_CUDA_CHECK_LAUNCH();
}

// Problems of one grouped launch on the mma.sync/SIMT tiles: the decode tile when
// every problem is decode-sized, else the 64 × 64 tile, whose many CTAs fill the
// GPU over small groups.
template <template <class, Major, Major> class DotT, Major MA, Major MB>
void run_grouped_with_dot(std::vector<Problem> problems, cudaStream_t stream) {
  int max_m = 0;
  for (const Problem& p : problems) max_m = std::max(max_m, p.m);
  if (max_m <= DecodeTile::kBM) launch_grouped<DecodeTile, DotT, MA, MB>(std::move(problems), stream);
  else launch_grouped<MidTile, DotT, MA, MB>(std::move(problems), stream);
}

}  // namespace

void run_mma(DotModel model, Major ma, Major mb, const Problem& p, cudaStream_t stream) {
  with_majors(ma, mb, [&](auto a, auto b) {
    constexpr Major MA = decltype(a)::value, MB = decltype(b)::value;
    if (model == DotModel::Sm90Tc) run_with_dot<TensorCoreDot, MA, MB>(p, stream);
    else run_with_dot<SimtFmaDot, MA, MB>(p, stream);
  });
}

void run_mma_grouped(DotModel model, Major ma, Major mb, std::vector<Problem> problems, cudaStream_t stream) {
  with_majors(ma, mb, [&](auto a, auto b) {
    constexpr Major MA = decltype(a)::value, MB = decltype(b)::value;
    if (model == DotModel::Sm90Tc) run_grouped_with_dot<TensorCoreDot, MA, MB>(std::move(problems), stream);
    else run_grouped_with_dot<SimtFmaDot, MA, MB>(std::move(problems), stream);
  });
}

}  // namespace bp::cuda::gemm
