// linear on the GPU (SPEC.md §5.4), bit-identical to reference/ops/linear.cpp.
//
// Every linear op is one GEMM  out[r][c] = chunked dot over j of A(r, j) · B(c, j):
// the reduction (K, N or tokens) is cut into chunks of `chunk` elements (the last
// may be shorter), each chunk's dot starts at +0 and walks the reduction upward,
// and the chunk partials go through reduce.h's pairwise_tree — exactly
// chunked_dot / token_chunked_dot. One CTA owns an output tile for the whole
// reduction (no split across CTAs, no atomics):
//   - tiles of kBK = 32 reduction elements stream through a cp.async pipeline
//     into padded shared memory; a tile never straddles two chunks, and the part
//     of a tile past its chunk's end is zero-filled on both operands;
//   - sm90-tc: per warp, mma.sync.m16n8k16 on ldmatrix fragments, one mma per
//     16-element group in increasing order. A group is one G step of the model;
//     zero products (the padding) take no part, and a step with no non-zero
//     product returns its accumulator unchanged, so padding is exact;
//   - fma-seq: per thread, a micro-tile of outputs, one fmaf per valid reduction
//     element in increasing order (padding is skipped: fma(0, 0, -0) would be +0);
//   - the chunk partials fold into the tree as they finish (ChunkTree).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/ptx.cuh"
#include "optimized/cuda/linear.h"
#include "reference/numerics/bf16.h"
#include "reference/numerics/fp.h"

namespace bp::cuda {
namespace {

constexpr int kBK = 32;  // reduction elements per pipeline stage: two mma k16 groups
constexpr int kPad = 8;  // bf16 padding per shared-memory row: ldmatrix rows land in distinct banks

// Which index of an operand is contiguous in memory: the reduction index (Red:
// x and w in the forward) or the row index (Row: w in dgrad, dy and x in wgrad).
enum class Major { Red, Row };

// A CTA of kWarpsM × kWarpsN warps, each owning kMTiles × kNTiles mma tiles
// (16 × 8 outputs each); kStages shared-memory stages; kRegSlots levels of the
// chunk tree kept in registers (deeper levels go to a global scratch).
template <int WarpsM, int WarpsN, int MTiles, int NTiles, int Stages, int RegSlots>
struct TileConfig {
  static constexpr int kWarpsN = WarpsN, kMTiles = MTiles, kNTiles = NTiles;
  static constexpr int kStages = Stages, kRegSlots = RegSlots;
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kBM = WarpsM * MTiles * 16, kBN = WarpsN * NTiles * 8;
  static constexpr int kAcc = MTiles * NTiles * 4;  // accumulators per thread
  static_assert(NTiles % 2 == 0, "B fragments are loaded two n8 tiles at a time");
};
// Large outputs with a single chunk: 128 × 128, 64 accumulators per thread.
using WideTile = TileConfig<2, 4, 4, 4, 4, 0>;
// Chunked reductions (the tree's first three levels in registers), or fewer CTAs.
using NarrowTile = TileConfig<4, 2, 2, 4, 4, 3>;
using MidTile = TileConfig<2, 2, 2, 4, 4, 3>;
// Decode-sized M (<= 16): 16 × 64 per CTA, a deep pipeline to keep weight bytes in flight.
using SmallTile = TileConfig<1, 4, 1, 2, 8, 5>;

// Shared-memory layout of one operand's stage: kRows rows × kBK reduction
// elements, stored along the operand's contiguous index, rows padded.
template <Major M, int Rows>
struct SmemTile {
  static constexpr int kLd = M == Major::Red ? kBK + kPad : Rows + kPad;
  static constexpr int kElems = M == Major::Red ? Rows * kLd : kBK * kLd;
  __device__ static int offset(int row, int j) { return M == Major::Red ? row * kLd + j : j * kLd + row; }
};

// One operand in global memory: element (row, j) at p[row·ld + j] (Red) or p[j·ld + row] (Row).
struct Operand {
  const bf16* p;
  int ld;
  int rows;  // rows past this are zero-filled
  bool vec;  // 16-byte copies are exact: aligned, and every valid run of 8 is whole
};

struct Problem {
  Operand a, b;
  int m, n;      // output rows and columns
  int red;       // reduction length
  int chunk;     // reduction elements per chunk
  int chunks;    // ceil(red / chunk)
  float* out_f32;  // exactly one of the two outputs is set
  bf16* out_bf16;
  float* spill;  // chunk-tree levels >= kRegSlots: [level][m][n]
};

// --- global -> shared ---------------------------------------------------------
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

// One stage of one operand: rows [row0, row0 + Rows) × reduction [j0, j0 + kBK),
// of which the first `jvalid` reduction elements belong to the current chunk.
template <Major M, int Rows, int Threads>
__device__ void load_stage(const Operand op, int row0, int j0, int jvalid, bf16* tile) {
  using T = SmemTile<M, Rows>;
  if constexpr (M == Major::Red) {
    constexpr int kRuns = Rows * (kBK / 8);
    for (int v = threadIdx.x; v < kRuns; v += Threads) {
      const int r = v / (kBK / 8), j = (v % (kBK / 8)) * 8, gr = row0 + r;
      const int valid = gr < op.rows ? max(0, min(8, jvalid - j)) : 0;
      const bf16* src = valid > 0 ? op.p + static_cast<size_t>(gr) * op.ld + j0 + j : op.p;
      copy8(tile + T::offset(r, j), src, valid, op.vec);
    }
  } else {
    constexpr int kRuns = kBK * (Rows / 8);
    for (int v = threadIdx.x; v < kRuns; v += Threads) {
      const int j = v / (Rows / 8), r = (v % (Rows / 8)) * 8, gr = row0 + r;
      const int valid = j < jvalid ? max(0, min(8, op.rows - gr)) : 0;
      const bf16* src = valid > 0 ? op.p + static_cast<size_t>(j0 + j) * op.ld + gr : op.p;
      copy8(tile + T::offset(r, j), src, valid, op.vec);
    }
  }
}

// --- the two dot models ----------------------------------------------------------
// Both keep kAcc accumulators per thread; accumulator i is output (row(i), col(i))
// of the CTA tile.

// sm90-tc: mma.sync fragments (PTX ISA, mma.m16n8k16 with .bf16), g = lane / 4,
// t = lane % 4. A 16×16: a0a1 (g, 2t..), a2a3 (g+8, 2t..), a4a5 (g, 2t+8..),
// a6a7 (g+8, 2t+8..); B 16×8: b0b1 (k 2t.., n g), b2b3 (k 2t+8.., n g); C 16×8:
// c0c1 (g, 2t..2t+1), c2c3 (g+8, 2t..2t+1) — the layouts tests/gpu/hw_truth.cu
// proved against the model. Accumulator i = (mt·kNTiles + nt)·4 + e.
template <class Cfg, Major MA, Major MB>
struct TensorCoreDot {
  using TA = SmemTile<MA, Cfg::kBM>;
  using TB = SmemTile<MB, Cfg::kBN>;
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
    for (int k0 = 0; k0 < kBK; k0 += 16) {
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
  using TA = SmemTile<MA, Cfg::kBM>;
  using TB = SmemTile<MB, Cfg::kBN>;
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
    const int end = min(jvalid, kBK);
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

// --- the chunk tree -------------------------------------------------------------
// reduce.h's pairwise_tree over the chunk partials, folded in as each chunk ends:
// node l of the tree over chunks [i·2^l, (i+1)·2^l) is complete when chunk
// (i+1)·2^l − 1 ends, so a binary counter holds at most one pending node per
// level (slot l, set iff bit l of the number of finished chunks is set). Chunk c
// merges with the pending nodes of c's trailing one bits (left operand = the
// earlier node, as v[2i] + v[2i+1]); the last chunk then folds the remaining
// pending nodes from the lowest level up, which is how pairwise_tree moves an odd
// last node up and adds it later. Slots 0..kRegSlots-1 live in registers, deeper
// ones in the global scratch (each thread reads back only what it wrote).
template <class Cfg, class Dot>
struct ChunkTree {
  static constexpr int kSlots = Cfg::kRegSlots;
  float slot[kSlots > 0 ? kSlots : 1][Cfg::kAcc];
  float* spill;  // [level - kSlots][m][n]
  int m, n, chunks, row0, col0;

  __device__ ChunkTree(const Problem& p, int r0, int c0)
      : spill(p.spill), m(p.m), n(p.n), chunks(p.chunks), row0(r0), col0(c0) {}

  __device__ float* spilled(const Dot& d, int level, int i) const {
    const int r = row0 + d.row(i), c = col0 + d.col(i);
    if (r >= m || c >= n) return nullptr;
    return spill + (static_cast<size_t>(level - kSlots) * m + r) * n + c;
  }
  __device__ void merge_spilled(Dot& d, int level) const {
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i)
      if (const float* s = spilled(d, level, i)) d.acc[i] = add_rn(*s, d.acc[i]);
  }
  __device__ void merge_slot(Dot& d, int s) const {
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) d.acc[i] = add_rn(slot[s][i], d.acc[i]);
  }

  // Chunk c's partial is in d.acc; true when d.acc now holds the root.
  __device__ bool finish_chunk(Dot& d, int c) {
    int l = 0;  // level of the node d.acc holds
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (l == s && ((c >> s) & 1)) {
        merge_slot(d, s);
        l = s + 1;
      }
    if (l == kSlots)
      for (; (c >> l) & 1; ++l) merge_spilled(d, l);
    if (c == chunks - 1) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s)
        if (s > l && ((c >> s) & 1)) merge_slot(d, s);
      for (int h = max(l + 1, kSlots); (c >> h) != 0; ++h)
        if ((c >> h) & 1) merge_spilled(d, h);
      return true;
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (s == l)
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; ++i) slot[s][i] = d.acc[i];
    if (l >= kSlots)
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i)
        if (float* s = spilled(d, l, i)) *s = d.acc[i];
    return false;
  }
};

// --- the kernel -----------------------------------------------------------------
template <class Cfg, class Dot>
__device__ void store_outputs(const Problem& p, const Dot& d, int row0, int col0) {
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; ++i) {
    const int r = row0 + d.row(i), c = col0 + d.col(i);
    if (r >= p.m || c >= p.n) continue;
    const size_t at = static_cast<size_t>(r) * p.n + c;
    if (p.out_f32) p.out_f32[at] = d.acc[i];
    else p.out_bf16[at] = round_bf16(d.acc[i]);
  }
}

// The CTA's output tile at (row0, col0) of problem p, over the whole reduction.
template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
__device__ void gemm_tile(const Problem& p, const int row0, const int col0) {
  using Dot = DotT<Cfg, MA, MB>;
  using TA = SmemTile<MA, Cfg::kBM>;
  using TB = SmemTile<MB, Cfg::kBN>;
  constexpr int kStageElems = TA::kElems + TB::kElems;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);

  const int stages_per_chunk = (p.chunk + kBK - 1) / kBK;
  const int stages = p.chunks * stages_per_chunk;
  // Reduction elements of stage s that belong to its chunk (<= 0: none).
  auto valid_of = [&](int s) {
    const int c = s / stages_per_chunk;
    return min(p.chunk, p.red - c * p.chunk) - (s % stages_per_chunk) * kBK;
  };
  auto issue = [&](int s) {
    if (s < stages) {
      const int j0 = (s / stages_per_chunk) * p.chunk + (s % stages_per_chunk) * kBK;
      bf16* tile = smem + (s % Cfg::kStages) * kStageElems;
      load_stage<MA, Cfg::kBM, Cfg::kThreads>(p.a, row0, j0, valid_of(s), tile);
      load_stage<MB, Cfg::kBN, Cfg::kThreads>(p.b, col0, j0, valid_of(s), tile + TA::kElems);
    }
    cp_async_commit();  // one group per stage, empty or not, so the wait count is fixed
  };

  Dot dot;
  ChunkTree<Cfg, Dot> tree(p, row0, col0);
  for (int s = 0; s < Cfg::kStages - 1; ++s) issue(s);
  for (int s = 0; s < stages; ++s) {
    cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();  // stage s is visible to all; stage s - 1 is free again
    issue(s + Cfg::kStages - 1);
    const bf16* tile = smem + (s % Cfg::kStages) * kStageElems;
    dot.step(tile, tile + TA::kElems, valid_of(s));
    if (s % stages_per_chunk == stages_per_chunk - 1) {
      if (tree.finish_chunk(dot, s / stages_per_chunk)) store_outputs<Cfg>(p, dot, row0, col0);
      else dot.clear();
    }
  }
}

template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
__global__ void __launch_bounds__(Cfg::kThreads) linear_kernel(const Problem p) {
  gemm_tile<Cfg, DotT, MA, MB>(p, blockIdx.y * Cfg::kBM, blockIdx.x * Cfg::kBN);
}

// One CTA per entry of the tile table: tile (problem, row0, col0) of a grouped launch.
struct GroupTile {
  int problem, row0, col0;
};

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
    sizeof(bf16) * Cfg::kStages * (SmemTile<MA, Cfg::kBM>::kElems + SmemTile<MB, Cfg::kBN>::kElems);

// Above 48 KB a kernel needs the opt-in; the caller holds the result in a static,
// so it is asked once per instantiation.
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
void launch(const Problem& p, cudaStream_t stream) {
  constexpr size_t kSmem = kSmemBytes<Cfg, MA, MB>;
  const auto kernel = linear_kernel<Cfg, DotT, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, kSmem);
  BP_CUDA_CHECK(opt_in);
  const dim3 grid((p.n + Cfg::kBN - 1) / Cfg::kBN, (p.m + Cfg::kBM - 1) / Cfg::kBM);
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  BP_CUDA_CHECK_LAUNCH();
}

template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
void launch_grouped(const Problem* problems, const GroupTile* tiles, size_t count, cudaStream_t stream) {
  constexpr size_t kSmem = kSmemBytes<Cfg, MA, MB>;
  const auto kernel = grouped_kernel<Cfg, DotT, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, kSmem);
  BP_CUDA_CHECK(opt_in);
  kernel<<<static_cast<unsigned>(count), Cfg::kThreads, kSmem, stream>>>(problems, tiles);
  BP_CUDA_CHECK_LAUNCH();
}

// Levels of the chunk tree that hold a pending node at some point: chunk c < chunks − 1
// stores at the level of its trailing one bits.
int tree_levels(int chunks) {
  int levels = 0;
  while ((1 << levels) - 1 <= chunks - 2) ++levels;
  return levels;
}

int multiprocessors() {
  int dev = 0, sms = 0;
  BP_CUDA_CHECK(cudaGetDevice(&dev));
  BP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// Runs the GEMM with the tile that fills the GPU best: decode-sized M gets the
// 16-row tile, a single chunk the 128 × 128 tile if it alone gives a wave, else
// the narrower tiles (which keep three tree levels in registers).
template <template <class, Major, Major> class DotT, Major MA, Major MB>
void run_with_dot(Problem p, cudaStream_t stream) {
  const int sms = multiprocessors();
  auto ctas = [&](auto cfg) {
    using Cfg = decltype(cfg);
    return static_cast<long long>((p.m + Cfg::kBM - 1) / Cfg::kBM) * ((p.n + Cfg::kBN - 1) / Cfg::kBN);
  };
  auto run = [&](auto cfg) {
    using Cfg = decltype(cfg);
    const int spill_levels = std::max(0, tree_levels(p.chunks) - Cfg::kRegSlots);
    void* spill = nullptr;
    if (spill_levels > 0)
      BP_CUDA_CHECK(cudaMallocAsync(&spill, sizeof(float) * spill_levels * static_cast<size_t>(p.m) * p.n, stream));
    p.spill = static_cast<float*>(spill);
    launch<Cfg, DotT, MA, MB>(p, stream);
    if (spill) BP_CUDA_CHECK(cudaFreeAsync(spill, stream));
  };
  if (p.m <= SmallTile::kBM) return run(SmallTile{});
  if (p.chunks == 1 && ctas(WideTile{}) >= sms) return run(WideTile{});
  if (ctas(NarrowTile{}) >= sms) return run(NarrowTile{});
  run(MidTile{});
}

template <Major MA, Major MB>
void run_gemm(DotModel model, const Problem& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  if (p.chunks == 0) {  // an empty reduction: every output is +0 (all-zero bits)
    const size_t bytes = static_cast<size_t>(p.m) * p.n * (p.out_f32 ? sizeof(float) : sizeof(bf16));
    BP_CUDA_CHECK(cudaMemsetAsync(p.out_f32 ? static_cast<void*>(p.out_f32) : static_cast<void*>(p.out_bf16), 0,
                                  bytes, stream));
    return;
  }
  if (model == DotModel::Sm90Tc) run_with_dot<TensorCoreDot, MA, MB>(p, stream);
  else run_with_dot<SimtFmaDot, MA, MB>(p, stream);
}

// Problems of one grouped launch (same chunking, any sizes): one tile config for
// all, the 16-row tile when every problem is decode-sized, else the 64 × 64 tile,
// whose many CTAs fill the GPU over small groups. The chunk-tree levels past the
// registers get one scratch plane set per problem.
template <template <class, Major, Major> class DotT, Major MA, Major MB>
void run_grouped_with_dot(std::vector<Problem> problems, cudaStream_t stream) {
  int max_m = 0;
  for (const Problem& p : problems) max_m = std::max(max_m, p.m);
  auto run = [&](auto cfg) {
    using Cfg = decltype(cfg);
    std::vector<size_t> spill_at(problems.size());
    size_t spill_elems = 0;
    std::vector<GroupTile> tiles;
    for (size_t g = 0; g < problems.size(); ++g) {
      const Problem& p = problems[g];
      spill_at[g] = spill_elems;
      spill_elems += static_cast<size_t>(std::max(0, tree_levels(p.chunks) - Cfg::kRegSlots)) * p.m * p.n;
      for (int r = 0; r < p.m; r += Cfg::kBM)
        for (int c = 0; c < p.n; c += Cfg::kBN) tiles.push_back({static_cast<int>(g), r, c});
    }
    DeviceBuffer<float> spill(spill_elems, stream);
    for (size_t g = 0; g < problems.size(); ++g) problems[g].spill = spill.get() ? spill.get() + spill_at[g] : nullptr;
    const DeviceBuffer<Problem> d_problems(problems, stream);
    const DeviceBuffer<GroupTile> d_tiles(tiles, stream);
    launch_grouped<Cfg, DotT, MA, MB>(d_problems.get(), d_tiles.get(), tiles.size(), stream);
  };
  if (max_m <= SmallTile::kBM) run(SmallTile{});
  else run(MidTile{});
}

template <Major MA, Major MB>
void run_grouped(DotModel model, const std::vector<Problem>& problems, cudaStream_t stream) {
  std::vector<Problem> launched;
  for (const Problem& p : problems) {
    if (p.m == 0 || p.n == 0) continue;
    if (p.chunks == 0) run_gemm<MA, MB>(model, p, stream);  // the +0 fill
    else launched.push_back(p);
  }
  if (launched.empty()) return;
  if (model == DotModel::Sm90Tc) run_grouped_with_dot<TensorCoreDot, MA, MB>(std::move(launched), stream);
  else run_grouped_with_dot<SimtFmaDot, MA, MB>(std::move(launched), stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// An operand whose reduction index is contiguous: 16-byte runs stay inside one
// chunk when rows, chunk starts and chunk lengths are multiples of 8 elements.
Operand red_major(const bf16* p, int ld, int rows, int red, int chunk) {
  return Operand{p, ld, rows, aligned16(p) && ld % 8 == 0 && chunk % 8 == 0 && red % 8 == 0};
}
// An operand whose row index is contiguous: 16-byte runs of rows.
Operand row_major(const bf16* p, int ld, int rows) {
  return Operand{p, ld, rows, aligned16(p) && ld % 8 == 0 && rows % 8 == 0};
}

void check_chunks(int k, int chunks, const char* what) {
  if (chunks < 1 || k % chunks != 0)
    throw std::invalid_argument(std::string("linear: ") + what + " = " + std::to_string(k) +
                                " is not divisible into " + std::to_string(chunks) + " chunks");
}

void check_sizes(int T, int K, int N) {
  if (T < 0 || K < 0 || N < 0)
    throw std::invalid_argument("linear: negative size T=" + std::to_string(T) + " K=" + std::to_string(K) +
                                " N=" + std::to_string(N));
}

// out[t][n] over K (forward): x [T][K] and w [N][K], both reduction-contiguous.
Problem forward_problem(const bf16* x, const bf16* w, float* out_f32, bf16* out_bf16, int T, int K, int N,
                        int k_chunks) {
  check_sizes(T, K, N);
  check_chunks(K, k_chunks, "K");
  const int chunk = K / k_chunks;
  return Problem{red_major(x, K, T, K, chunk), red_major(w, K, N, K, chunk), T, N, K, chunk,
                 K == 0 ? 0 : k_chunks, out_f32, out_bf16, nullptr};
}

void forward(const Knobs& kn, const bf16* x, const bf16* w, float* out_f32, bf16* out_bf16, int T, int K, int N,
             int k_chunks, cudaStream_t stream) {
  run_gemm<Major::Red, Major::Red>(kn.dot, forward_problem(x, w, out_f32, out_bf16, T, K, N, k_chunks), stream);
}

// out[t][k] over N (input gradient): dy [T][N] reduction-contiguous, w [N][K] read
// as w[n][k] with the output index k contiguous.
void dgrad(const Knobs& kn, const bf16* dy, const bf16* w, float* out_f32, bf16* out_bf16, int T, int K, int N,
           int n_chunks, cudaStream_t stream) {
  check_sizes(T, K, N);
  check_chunks(N, n_chunks, "N");
  const int chunk = N / n_chunks;
  const Problem p{red_major(dy, N, T, N, chunk), row_major(w, K, K), T, K, N, chunk,
                  N == 0 ? 0 : n_chunks, out_f32, out_bf16, nullptr};
  run_gemm<Major::Red, Major::Row>(kn.dot, p, stream);
}

}  // namespace

void linear_acc(const Knobs& kn, const bf16* x, const bf16* w, float* acc, int T, int K, int N, int k_chunks,
                cudaStream_t stream) {
  forward(kn, x, w, acc, nullptr, T, K, N, k_chunks, stream);
}

void linear_fwd(const Knobs& kn, const bf16* x, const bf16* w, bf16* y, int T, int K, int N, int k_chunks,
                cudaStream_t stream) {
  forward(kn, x, w, nullptr, y, T, K, N, k_chunks, stream);
}

void linear_fwd_grouped(const Knobs& kn, const LinearGroup* groups, int count, int K, int N, int k_chunks,
                        cudaStream_t stream) {
  std::vector<Problem> problems;
  for (int g = 0; g < count; ++g) {
    const LinearGroup& lg = groups[g];
    if ((lg.acc == nullptr) == (lg.y == nullptr))
      throw std::invalid_argument("linear_fwd_grouped: group " + std::to_string(g) + " needs exactly one of acc, y");
    problems.push_back(forward_problem(lg.x, lg.w, lg.acc, lg.y, lg.T, K, N, k_chunks));
  }
  run_grouped<Major::Red, Major::Red>(kn.dot, problems, stream);
}

void linear_dgrad(const Knobs& kn, const bf16* dy, const bf16* w, bf16* dx, int T, int K, int N, int n_chunks,
                  cudaStream_t stream) {
  dgrad(kn, dy, w, nullptr, dx, T, K, N, n_chunks, stream);
}

void linear_dgrad_acc(const Knobs& kn, const bf16* dy, const bf16* w, float* acc, int T, int K, int N, int n_chunks,
                      cudaStream_t stream) {
  dgrad(kn, dy, w, acc, nullptr, T, K, N, n_chunks, stream);
}

// dw[n][k] over tokens: A(n, t) = dy[t][n] and B(k, t) = x[t][k], both with the
// output index contiguous; chunks of grad_token_chunk tokens, the last shorter.
void linear_wgrad(const Knobs& kn, const bf16* dy, const bf16* x, float* dw, int T, int K, int N,
                  cudaStream_t stream) {
  check_sizes(T, K, N);
  if (kn.grad_token_chunk < 1)
    throw std::invalid_argument("linear_wgrad: grad_token_chunk = " + std::to_string(kn.grad_token_chunk));
  const int chunks = (T + kn.grad_token_chunk - 1) / kn.grad_token_chunk;
  const Problem p{row_major(dy, N, N), row_major(x, K, K), N, K, T, kn.grad_token_chunk, chunks, dw, nullptr,
                  nullptr};
  run_gemm<Major::Row, Major::Row>(kn.dot, p, stream);
}

}  // namespace bp::cuda
