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
//   - the chunk partials fold into the tree as they finish (ChunkTree);
//   - sm90-tc where TMA can read both operands and M is past decode sizes: the
//     warpgroup kernel, the same G steps on wgmma with TMA-fed, swizzled stages
//     of 64 reduction elements (the section below says how).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/ptx.cuh"
#include "optimized/cuda/tma.h"
#include "optimized/cuda/wgmma.cuh"
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
  using PairedColumns = void;  // accumulators 2i and 2i + 1 are adjacent columns
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
// Dots whose accumulators i and i + 1 (i even) are adjacent columns of one row
// store them with one access where the row length and the pointer allow.
template <class Dot>
concept PairedColumns = requires { typename Dot::PairedColumns; };

template <class Cfg, class Dot>
__device__ void store_outputs(const Problem& p, const Dot& d, int row0, int col0) {
  constexpr int kStep = PairedColumns<Dot> ? 2 : 1;
  const void* out = p.out_f32 ? static_cast<const void*>(p.out_f32) : static_cast<const void*>(p.out_bf16);
  const bool paired = kStep == 2 && p.n % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; i += kStep) {
    const int r = row0 + d.row(i), c = col0 + d.col(i);
    if (r >= p.m || c >= p.n) continue;
    const size_t at = static_cast<size_t>(r) * p.n + c;
    if (paired) {
      if (p.out_f32) *reinterpret_cast<float2*>(p.out_f32 + at) = make_float2(d.acc[i], d.acc[i + 1]);
      else *reinterpret_cast<uint32_t*>(p.out_bf16 + at) = round_bf16(d.acc[i]).bits |
                                                           (static_cast<uint32_t>(round_bf16(d.acc[i + 1]).bits) << 16);
      continue;
    }
#pragma unroll
    for (int e = 0; e < kStep; ++e) {
      if (c + e >= p.n) break;
      if (p.out_f32) p.out_f32[at + e] = d.acc[i + e];
      else p.out_bf16[at + e] = round_bf16(d.acc[i + e]);
    }
  }
}

// Reduction elements of stage s (bk elements each, stages_per_chunk per chunk)
// that belong to its chunk; <= 0: none (the last chunk may be shorter).
__device__ inline int stage_valid(const Problem& p, int s, int stages_per_chunk, int bk) {
  return min(p.chunk, p.red - (s / stages_per_chunk) * p.chunk) - (s % stages_per_chunk) * bk;
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
  auto valid_of = [&](int s) { return stage_valid(p, s, stages_per_chunk, kBK); };
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

// --- the warpgroup kernel (sm90-tc on wgmma, operands by TMA) ------------------
// The same G steps in the same order as TensorCoreDot — each wgmma k16 is one G
// step per output, K groups walked upward, one CTA per output tile, the chunk
// tree unchanged — on Hopper's asynchronous path: one producer warpgroup (one
// thread) copies 64-element reduction stages of both operands into 128-byte-
// swizzled shared memory with TMA, and two consumer warpgroups, 64 rows each,
// run wgmma on them while the next stages arrive. Each chunk's stages start at
// the chunk's first element, and a stage's k16 groups past its chunk's end are
// not issued (whatever the copy brought there), so no group straddles two chunks
// as long as chunks are whole groups (chunk % 16 == 0, or a single chunk); the
// part of a stage past the reduction's end arrives as zeros, exactly the padding
// of gemm_tile.
constexpr int kWgBK = 64;                              // one 128-byte swizzle row of bf16
constexpr int kBox = 64;                               // TMA boxes: 64 × 64 bf16
constexpr uint32_t kBoxBytes = kBox * kBox * sizeof(bf16);
constexpr uint32_t kSwizzleGroupBytes = 8 * 128;       // 8 rows of 128 bytes: the SBO of every operand

template <int BN, int RegSlots, int Stages>
struct WarpgroupTile {
  static constexpr int kBM = 128, kBN = BN, kRegSlots = RegSlots, kStages = Stages;
  static constexpr int kConsumers = kBM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kAcc = BN / 2;  // a consumer thread's share of its 64 × BN tile
  static constexpr uint32_t kABytes = kBM * kWgBK * sizeof(bf16), kBBytes = kBN * kWgBK * sizeof(bf16);
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  // Stages, their barriers, and slack to align the first stage to 1024 bytes.
  static constexpr size_t kSmemBytes = size_t{kStages} * kStageBytes + 2 * kStages * sizeof(uint64_t) + 1024;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "every operand tile stays 1024-byte aligned");
};
// A single chunk and enough tiles: 128 × 256 (128 accumulators per consumer thread).
using WgWideTile = WarpgroupTile<256, 0, 4>;
// Chunked reductions or fewer tiles: 128 × 128, the tree's first level in registers.
using WgNarrowTile = WarpgroupTile<128, 1, 6>;

// Where an operand's stage lives in shared memory: Red operands are kRows rows of
// 128 bytes (K-major, the swizzle repeating every 8 rows); Row operands are boxes
// of 64 rows × 64 reduction elements, one 128-byte line per reduction element
// (M/N-major, a box every kBoxBytes). The k16 group kk starts 32 bytes (Red) or 16
// lines (Row) further.
template <Major M>
struct SwizzledOperand {
  static constexpr int kTrans = M == Major::Row ? 1 : 0;
  static constexpr uint32_t kLbo = M == Major::Row ? kBoxBytes : 16;  // K-major swizzled: unused
  __device__ static uint32_t group_offset(int kk) { return M == Major::Red ? 32u * kk : 16u * 128u * kk; }
  __device__ static uint64_t descriptor(uint32_t tile, int kk) {
    return sm90::swizzled_descriptor(tile + group_offset(kk), kLbo, kSwizzleGroupBytes);
  }
  // Copies rows [row0, row0 + rows) × reduction [j0, j0 + kWgBK) as rows / 64 boxes.
  __device__ static void load(void* tile, const void* map, uint64_t* bar, int row0, int j0, int rows) {
    for (int b = 0; b < rows / kBox; ++b) {
      void* dst = static_cast<char*>(tile) + b * kBoxBytes;
      if constexpr (M == Major::Red) sm90::tma_load_2d(dst, map, bar, j0, row0 + b * kBox);
      else sm90::tma_load_2d(dst, map, bar, row0 + b * kBox, j0);
    }
  }
};

template <int N, int TransA, int TransB>
__device__ inline void wgmma_k16(float (&d)[N / 2], uint64_t a, uint64_t b) {
  if constexpr (N == 256) sm90::wgmma_m64n256k16<TransA, TransB>(d, a, b);
  else sm90::wgmma_m64n128k16<TransA, TransB>(d, a, b);
}

// A consumer warpgroup's 64 × kBN accumulators: warp w of the group holds rows
// 16w..16w+15 in mma.sync's C layout, n8 block after n8 block (PTX ISA, wgmma
// register fragments).
template <class Cfg, Major MA, Major MB>
struct WarpgroupDot {
  using PairedColumns = void;  // accumulators 2i and 2i + 1 are adjacent columns
  using OpA = SwizzledOperand<MA>;
  using OpB = SwizzledOperand<MB>;
  float acc[Cfg::kAcc];
  int consumer, row_base, lane;

  __device__ explicit WarpgroupDot(int c) : consumer(c) {
    const int t = threadIdx.x % 128;
    row_base = 64 * c + 16 * (t / 32);
    lane = t % 32;
    clear();
  }
  __device__ void clear() {
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.0f;
  }
  __device__ int row(int i) const { return row_base + lane / 4 + 8 * ((i % 4) / 2); }
  __device__ int col(int i) const { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

  // Issues the stage's groups that hold reduction elements, in increasing order.
  __device__ void step(uint32_t tile_a, uint32_t tile_b, int jvalid) {
    const uint32_t a = tile_a + consumer * kBoxBytes;  // this group's 64 rows: 64 K-major rows or one box
    sm90::fence_accumulators(acc);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWgBK / 16; ++kk)
      if (kk * 16 < jvalid)
        wgmma_k16<Cfg::kBN, OpA::kTrans, OpB::kTrans>(acc, OpA::descriptor(a, kk), OpB::descriptor(tile_b, kk));
    sm90::wgmma_commit();
  }
  template <int Pending>
  __device__ void wait() {
    sm90::wgmma_wait<Pending>();
    sm90::fence_accumulators(acc);
  }
};

// Shared-memory plan of one CTA: the stages (1024-byte aligned), then a "full"
// barrier per stage (the producer's copies landed) and an "empty" one (every
// consumer thread is done reading it).
template <class Cfg>
struct WarpgroupSmem {
  unsigned char* stages;
  uint64_t* full;
  uint64_t* empty;
  __device__ explicit WarpgroupSmem(unsigned char* raw) {
    stages = raw + ((1024 - sm90::shared_addr(raw) % 1024) % 1024);
    full = reinterpret_cast<uint64_t*>(stages + size_t{Cfg::kStages} * Cfg::kStageBytes);
    empty = full + Cfg::kStages;
  }
  __device__ unsigned char* a(int slot) const { return stages + static_cast<size_t>(slot) * Cfg::kStageBytes; }
  __device__ unsigned char* b(int slot) const { return a(slot) + Cfg::kABytes; }
};

template <class Cfg, Major MA, Major MB>
__device__ void warpgroup_producer(const Problem& p, const void* map_a, const void* map_b, const WarpgroupSmem<Cfg>& sm,
                                   int row0, int col0, int stages_per_chunk, int stages) {
  for (int s = 0; s < stages; ++s) {
    const int slot = s % Cfg::kStages, round = s / Cfg::kStages;
    if (round > 0) sm90::mbarrier_wait(&sm.empty[slot], (round - 1) & 1);
    if (stage_valid(p, s, stages_per_chunk, kWgBK) <= 0) {  // nothing to copy: the consumers issue no group
      sm90::mbarrier_arrive(&sm.full[slot]);
      continue;
    }
    sm90::mbarrier_arrive_expect_tx(&sm.full[slot], Cfg::kStageBytes);
    const int j0 = (s / stages_per_chunk) * p.chunk + (s % stages_per_chunk) * kWgBK;
    SwizzledOperand<MA>::load(sm.a(slot), map_a, &sm.full[slot], row0, j0, Cfg::kBM);
    SwizzledOperand<MB>::load(sm.b(slot), map_b, &sm.full[slot], col0, j0, Cfg::kBN);
  }
}

template <class Cfg, Major MA, Major MB>
__device__ void warpgroup_consumer(const Problem& p, const WarpgroupSmem<Cfg>& sm, int row0, int col0,
                                   int stages_per_chunk, int stages, int consumer) {
  using Dot = WarpgroupDot<Cfg, MA, MB>;
  Dot dot(consumer);
  ChunkTree<Cfg, Dot> tree(p, row0, col0);
  int unreleased = -1;  // the slot whose wgmma may still read it
  auto release = [&](int slot) { sm90::mbarrier_arrive(&sm.empty[slot]); };
  for (int s = 0; s < stages; ++s) {
    const int slot = s % Cfg::kStages;
    sm90::mbarrier_wait(&sm.full[slot], (s / Cfg::kStages) & 1);
    const int c = s / stages_per_chunk;
    dot.step(sm90::shared_addr(sm.a(slot)), sm90::shared_addr(sm.b(slot)), stage_valid(p, s, stages_per_chunk, kWgBK));
    if (s % stages_per_chunk == stages_per_chunk - 1) {  // the chunk's partial is complete
      dot.template wait<0>();
      if (unreleased >= 0) release(unreleased);
      release(slot);
      unreleased = -1;
      if (tree.finish_chunk(dot, c)) store_outputs<Cfg>(p, dot, row0, col0);
      else dot.clear();
    } else {  // keep one stage's wgmma in flight
      dot.template wait<1>();
      if (unreleased >= 0) release(unreleased);
      unreleased = slot;
    }
  }
}

template <class Cfg, Major MA, Major MB>
__device__ void warpgroup_tile(const Problem& p, const void* map_a, const void* map_b, int row0, int col0) {
  extern __shared__ __align__(128) unsigned char wg_smem_raw[];
  const WarpgroupSmem<Cfg> sm(wg_smem_raw);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      sm90::mbarrier_init(&sm.full[s], 1);
      sm90::mbarrier_init(&sm.empty[s], 128 * Cfg::kConsumers);
    }
    sm90::mbarrier_init_fence();
  }
  __syncthreads();
  const int stages_per_chunk = (p.chunk + kWgBK - 1) / kWgBK;
  const int stages = p.chunks * stages_per_chunk;
  const int group = threadIdx.x / 128;
  if (group == 0) {
    sm90::release_registers<40>();
    if (threadIdx.x == 0) warpgroup_producer<Cfg, MA, MB>(p, map_a, map_b, sm, row0, col0, stages_per_chunk, stages);
  } else {
    sm90::claim_registers<232>();
    warpgroup_consumer<Cfg, MA, MB>(p, sm, row0, col0, stages_per_chunk, stages, group - 1);
  }
}

// One CTA per tile: x over column tiles, y over row tiles.
template <class Cfg, Major MA, Major MB>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    warpgroup_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const Problem p) {
  warpgroup_tile<Cfg, MA, MB>(p, &map_a, &map_b, blockIdx.y * Cfg::kBM, blockIdx.x * Cfg::kBN);
}

// maps: problem g's A and B maps at 2g and 2g + 1 (device memory).
template <class Cfg, Major MA, Major MB>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    warpgroup_grouped_kernel(const Problem* __restrict__ problems, const CUtensorMap* __restrict__ maps,
                             const GroupTile* __restrict__ tiles) {
  const GroupTile tile = tiles[blockIdx.x];
  const Problem p = problems[tile.problem];
  warpgroup_tile<Cfg, MA, MB>(p, &maps[2 * tile.problem], &maps[2 * tile.problem + 1], tile.row0, tile.col0);
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

// Levels of the chunk tree that hold a pending node at some point: chunk c < chunks − 1
// stores at the level of its trailing one bits.
int tree_levels(int chunks) {
  int levels = 0;
  while ((1 << levels) - 1 <= chunks - 2) ++levels;
  return levels;
}

// Scratch elements for the tree levels Cfg keeps out of registers.
template <class Cfg>
size_t spill_elems(const Problem& p) {
  return static_cast<size_t>(std::max(0, tree_levels(p.chunks) - Cfg::kRegSlots)) * p.m * p.n;
}

template <class Cfg>
long long tile_count(const Problem& p) {
  return static_cast<long long>((p.m + Cfg::kBM - 1) / Cfg::kBM) * ((p.n + Cfg::kBN - 1) / Cfg::kBN);
}

int multiprocessors() {
  int dev = 0, sms = 0;
  BP_CUDA_CHECK(cudaGetDevice(&dev));
  BP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// One launch over all tiles of p (its tree scratch freed in stream order after it).
template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
void launch(Problem p, cudaStream_t stream) {
  constexpr size_t kSmem = kSmemBytes<Cfg, MA, MB>;
  const auto kernel = linear_kernel<Cfg, DotT, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, kSmem);
  BP_CUDA_CHECK(opt_in);
  DeviceBuffer<float> spill(spill_elems<Cfg>(p), stream);
  p.spill = spill.get();
  const dim3 grid((p.n + Cfg::kBN - 1) / Cfg::kBN, (p.m + Cfg::kBM - 1) / Cfg::kBM);
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  BP_CUDA_CHECK_LAUNCH();
}

// The A and B operands of p as TMA maps with 64 × 64 boxes; the reduction
// extent is p.red, so a stage reaching past it reads zeros.
template <Major M>
CUtensorMap operand_map(const Operand& op, int red) {
  if constexpr (M == Major::Red) return bf16_tensor_map(op.p, red, op.rows, op.ld, kBox, kBox);
  else return bf16_tensor_map(op.p, op.rows, red, op.ld, kBox, kBox);
}

template <class Cfg, Major MA, Major MB>
void launch_warpgroup(Problem p, cudaStream_t stream) {
  const auto kernel = warpgroup_kernel<Cfg, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, Cfg::kSmemBytes);
  BP_CUDA_CHECK(opt_in);
  DeviceBuffer<float> spill(spill_elems<Cfg>(p), stream);
  p.spill = spill.get();
  const dim3 grid((p.n + Cfg::kBN - 1) / Cfg::kBN, (p.m + Cfg::kBM - 1) / Cfg::kBM);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(operand_map<MA>(p.a, p.red), operand_map<MB>(p.b, p.red), p);
  BP_CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// TMA reads an operand in place when its base is 16-byte aligned and its rows
// are whole 16-byte units apart.
bool tma_ready(const Operand& op) { return aligned16(op.p) && op.ld % 8 == 0; }

// The warpgroup kernel computes p when TMA can read both operands and chunks are
// whole k16 groups.
bool warpgroup_can_run(const Problem& p) {
  return tma_ready(p.a) && tma_ready(p.b) && (p.chunks == 1 || p.chunk % 16 == 0);
}

// ... and takes it when M is past decode sizes (the 16-row tile keeps more weight
// bytes in flight there).
bool warpgroup_fits(const Problem& p) { return warpgroup_can_run(p) && p.m > SmallTile::kBM; }

// The warpgroup kernel where it fits and its tiles give the GPU work: 128 × 256
// for one chunk and at least a wave of tiles, else 128 × 128 if that gives an
// eighth of a wave (one SM on wgmma does ~1/30 of the GPU's mma.sync rate
// measured on these shapes, so even a partial wave wins); false leaves p to the
// mma.sync kernels.
template <Major MA, Major MB>
bool run_warpgroup(const Problem& p, cudaStream_t stream) {
  if (!warpgroup_fits(p)) return false;
  const int sms = multiprocessors();
  if (p.chunks == 1 && tile_count<WgWideTile>(p) >= sms) launch_warpgroup<WgWideTile, MA, MB>(p, stream);
  else if (8 * tile_count<WgNarrowTile>(p) >= sms) launch_warpgroup<WgNarrowTile, MA, MB>(p, stream);
  else return false;
  return true;
}

// Runs the GEMM with the mma.sync tile that fills the GPU best: decode-sized M
// gets the 16-row tile, a single chunk the 128 × 128 tile if it alone gives a
// wave, else the narrower tiles (which keep three tree levels in registers).
template <template <class, Major, Major> class DotT, Major MA, Major MB>
void run_with_dot(const Problem& p, cudaStream_t stream) {
  const int sms = multiprocessors();
  if (p.m <= SmallTile::kBM) return launch<SmallTile, DotT, MA, MB>(p, stream);
  if (p.chunks == 1 && tile_count<WideTile>(p) >= sms) return launch<WideTile, DotT, MA, MB>(p, stream);
  if (tile_count<NarrowTile>(p) >= sms) return launch<NarrowTile, DotT, MA, MB>(p, stream);
  launch<MidTile, DotT, MA, MB>(p, stream);
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
  if (model == DotModel::Sm90Tc) {
    if (!run_warpgroup<MA, MB>(p, stream)) run_with_dot<TensorCoreDot, MA, MB>(p, stream);
  } else {
    run_with_dot<SimtFmaDot, MA, MB>(p, stream);
  }
}

// A grouped launch: one CTA per tile of every problem (problem-major), and each
// problem's chunk-tree scratch, past the registers Cfg keeps, in one buffer.
template <class Cfg>
struct GroupPlan {
  std::vector<Problem> problems;
  std::vector<GroupTile> tiles;
  DeviceBuffer<float> spill;

  GroupPlan(std::vector<Problem> ps, cudaStream_t stream) : problems(std::move(ps)) {
    std::vector<size_t> spill_at;
    size_t elems = 0;
    for (size_t g = 0; g < problems.size(); ++g) {
      const Problem& p = problems[g];
      spill_at.push_back(elems);
      elems += spill_elems<Cfg>(p);
      for (int r = 0; r < p.m; r += Cfg::kBM)
        for (int c = 0; c < p.n; c += Cfg::kBN) tiles.push_back({static_cast<int>(g), r, c});
    }
    spill = DeviceBuffer<float>(elems, stream);
    for (size_t g = 0; g < problems.size(); ++g)
      problems[g].spill = spill.get() ? spill.get() + spill_at[g] : nullptr;
  }
};

template <class Cfg, template <class, Major, Major> class DotT, Major MA, Major MB>
void launch_grouped(std::vector<Problem> problems, cudaStream_t stream) {
  constexpr size_t kSmem = kSmemBytes<Cfg, MA, MB>;
  const auto kernel = grouped_kernel<Cfg, DotT, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, kSmem);
  BP_CUDA_CHECK(opt_in);
  GroupPlan<Cfg> plan(std::move(problems), stream);
  const DeviceBuffer<Problem> d_problems(plan.problems, stream);
  const DeviceBuffer<GroupTile> d_tiles(plan.tiles, stream);
  kernel<<<static_cast<unsigned>(plan.tiles.size()), Cfg::kThreads, kSmem, stream>>>(d_problems.get(), d_tiles.get());
  BP_CUDA_CHECK_LAUNCH();
}

template <class Cfg, Major MA, Major MB>
void launch_warpgroup_grouped(std::vector<Problem> problems, cudaStream_t stream) {
  const auto kernel = warpgroup_grouped_kernel<Cfg, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, Cfg::kSmemBytes);
  BP_CUDA_CHECK(opt_in);
  GroupPlan<Cfg> plan(std::move(problems), stream);
  std::vector<CUtensorMap> maps;
  for (const Problem& p : plan.problems) {
    maps.push_back(operand_map<MA>(p.a, p.red));
    maps.push_back(operand_map<MB>(p.b, p.red));
  }
  const DeviceBuffer<Problem> d_problems(plan.problems, stream);
  const DeviceBuffer<CUtensorMap> d_maps(maps, stream);
  const DeviceBuffer<GroupTile> d_tiles(plan.tiles, stream);
  kernel<<<static_cast<unsigned>(plan.tiles.size()), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      d_problems.get(), d_maps.get(), d_tiles.get());
  BP_CUDA_CHECK_LAUNCH();
}

// Problems of one grouped launch on the mma.sync/SIMT tiles: the 16-row tile when
// every problem is decode-sized, else the 64 × 64 tile, whose many CTAs fill the
// GPU over small groups.
template <template <class, Major, Major> class DotT, Major MA, Major MB>
void run_grouped_with_dot(std::vector<Problem> problems, cudaStream_t stream) {
  int max_m = 0;
  for (const Problem& p : problems) max_m = std::max(max_m, p.m);
  if (max_m <= SmallTile::kBM) launch_grouped<SmallTile, DotT, MA, MB>(std::move(problems), stream);
  else launch_grouped<MidTile, DotT, MA, MB>(std::move(problems), stream);
}

// The warpgroup kernel (128 × 128) takes a group when every problem fits it and
// they average half a tile of rows or more.
bool warpgroup_group_fits(const std::vector<Problem>& problems) {
  long long rows = 0;
  for (const Problem& p : problems) {
    if (!warpgroup_can_run(p)) return false;
    rows += p.m;
  }
  return 2 * rows >= static_cast<long long>(problems.size()) * WgNarrowTile::kBM;
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
  if (model == DotModel::FmaSeq) run_grouped_with_dot<SimtFmaDot, MA, MB>(std::move(launched), stream);
  else if (warpgroup_group_fits(launched)) launch_warpgroup_grouped<WgNarrowTile, MA, MB>(std::move(launched), stream);
  else run_grouped_with_dot<TensorCoreDot, MA, MB>(std::move(launched), stream);
}

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

// out[t][k] over N (input gradient): dy [T][N] reduction-contiguous, w [N][K] read
// as w[n][k] with the output index k contiguous.
Problem dgrad_problem(const bf16* dy, const bf16* w, float* out_f32, bf16* out_bf16, int T, int K, int N,
                      int n_chunks) {
  check_sizes(T, K, N);
  check_chunks(N, n_chunks, "N");
  const int chunk = N / n_chunks;
  return Problem{red_major(dy, N, T, N, chunk), row_major(w, K, K), T, K, N, chunk,
                 N == 0 ? 0 : n_chunks, out_f32, out_bf16, nullptr};
}

// dw[n][k] over tokens: A(n, t) = dy[t][n] and B(k, t) = x[t][k], both with the
// output index contiguous; chunks of grad_token_chunk tokens, the last shorter.
Problem wgrad_problem(const Knobs& kn, const bf16* dy, const bf16* x, float* dw, int T, int K, int N) {
  check_sizes(T, K, N);
  if (kn.grad_token_chunk < 1)
    throw std::invalid_argument("linear_wgrad: grad_token_chunk = " + std::to_string(kn.grad_token_chunk));
  const int chunks = (T + kn.grad_token_chunk - 1) / kn.grad_token_chunk;
  return Problem{row_major(dy, N, N), row_major(x, K, K), N, K, T, kn.grad_token_chunk, chunks, dw, nullptr, nullptr};
}

// The problems of a grouped forward or input gradient (make: a LinearGroup's
// problem), each group with exactly one output.
template <class Make>
std::vector<Problem> group_problems(const char* fn, const LinearGroup* groups, int count, Make make) {
  std::vector<Problem> problems;
  for (int g = 0; g < count; ++g) {
    if ((groups[g].acc == nullptr) == (groups[g].y == nullptr))
      throw std::invalid_argument(std::string(fn) + ": group " + std::to_string(g) + " needs exactly one of acc, y");
    problems.push_back(make(groups[g]));
  }
  return problems;
}

}  // namespace

void linear_acc(const Knobs& kn, const bf16* x, const bf16* w, float* acc, int T, int K, int N, int k_chunks,
                cudaStream_t stream) {
  run_gemm<Major::Red, Major::Red>(kn.dot, forward_problem(x, w, acc, nullptr, T, K, N, k_chunks), stream);
}

void linear_fwd(const Knobs& kn, const bf16* x, const bf16* w, bf16* y, int T, int K, int N, int k_chunks,
                cudaStream_t stream) {
  run_gemm<Major::Red, Major::Red>(kn.dot, forward_problem(x, w, nullptr, y, T, K, N, k_chunks), stream);
}

void linear_fwd_grouped(const Knobs& kn, const LinearGroup* groups, int count, int K, int N, int k_chunks,
                        cudaStream_t stream) {
  const auto problem = [&](const LinearGroup& g) { return forward_problem(g.x, g.w, g.acc, g.y, g.T, K, N, k_chunks); };
  run_grouped<Major::Red, Major::Red>(kn.dot, group_problems("linear_fwd_grouped", groups, count, problem), stream);
}

void linear_dgrad(const Knobs& kn, const bf16* dy, const bf16* w, bf16* dx, int T, int K, int N, int n_chunks,
                  cudaStream_t stream) {
  run_gemm<Major::Red, Major::Row>(kn.dot, dgrad_problem(dy, w, nullptr, dx, T, K, N, n_chunks), stream);
}

void linear_dgrad_acc(const Knobs& kn, const bf16* dy, const bf16* w, float* acc, int T, int K, int N, int n_chunks,
                      cudaStream_t stream) {
  run_gemm<Major::Red, Major::Row>(kn.dot, dgrad_problem(dy, w, acc, nullptr, T, K, N, n_chunks), stream);
}

void linear_dgrad_grouped(const Knobs& kn, const LinearGroup* groups, int count, int K, int N, int n_chunks,
                          cudaStream_t stream) {
  const auto problem = [&](const LinearGroup& g) { return dgrad_problem(g.x, g.w, g.acc, g.y, g.T, K, N, n_chunks); };
  run_grouped<Major::Red, Major::Row>(kn.dot, group_problems("linear_dgrad_grouped", groups, count, problem), stream);
}

void linear_wgrad(const Knobs& kn, const bf16* dy, const bf16* x, float* dw, int T, int K, int N,
                  cudaStream_t stream) {
  run_gemm<Major::Row, Major::Row>(kn.dot, wgrad_problem(kn, dy, x, dw, T, K, N), stream);
}

void linear_wgrad_grouped(const Knobs& kn, const WgradGroup* groups, int count, int K, int N, cudaStream_t stream) {
  std::vector<Problem> problems;
  for (int g = 0; g < count; ++g)
    problems.push_back(wgrad_problem(kn, groups[g].dy, groups[g].x, groups[g].dw, groups[g].T, K, N));
  run_grouped<Major::Row, Major::Row>(kn.dot, problems, stream);
}

}  // namespace bp::cuda
