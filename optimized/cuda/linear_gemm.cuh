// The GEMM behind every linear op (SPEC.md §5.4): what both engines and the
// dispatcher (linear.cu) share — the problem, the chunk tree and the output stores
// both engines' kernels run, their host helpers, and the engines' entry points.
//
// Every linear op is one GEMM  out[r][c] = chunked dot over j of A(r, j) · B(c, j):
// the reduction (K, N or tokens) is cut into chunks of `chunk` elements (the last
// may be shorter), each chunk's dot starts at +0 and walks the reduction upward,
// and the chunk partials go through reduce.h's pairwise_tree — exactly
// chunked_dot / token_chunked_dot. One CTA owns an output tile for the whole
// reduction (no split across CTAs, no atomics), and the chunk partials fold into
// the tree as they finish (ChunkTree). Three engines run it:
//   - linear_mma.cu: tiles of 32 reduction elements through a cp.async pipeline;
//     sm90-tc on mma.sync.m16n8k16, fma-seq on the SIMT cores;
//   - linear_decode.cu: the sm90-tc forward at decode sizes (M <= 16): the weight
//     from global memory straight into mma.sync fragments, a warp per strip of 8
//     columns and chunk;
//   - linear_wgmma.cu: sm90-tc where TMA can read both operands and M is past
//     decode sizes: the same G steps on wgmma with TMA-fed, swizzled stages of 64
//     reduction elements.
// Each engine keeps its kernel templates to itself and exports the small functions
// at the end of this file, which pick the instantiation from runtime values (the
// dot model, the operand majors); linear.cu chooses the engine.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "optimized/cuda/common.h"
#include "reference/numerics/bf16.h"
#include "reference/numerics/dot.h"
#include "reference/numerics/fp.h"

namespace bp::cuda::gemm {

// Which index of an operand is contiguous in memory: the reduction index (Red:
// x and w in the forward) or the row index (Row: w in dgrad, dy and x in wgrad).
enum class Major { Red, Row };

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

// One CTA per entry of the tile table: tile (problem, row0, col0) of a grouped launch.
struct GroupTile {
  int problem, row0, col0;
};

// M up to this is decode-sized: the decode engine (linear_decode.cu) or the mma
// engine's decode tiles take it, with more weight bytes in flight than the
// warpgroup kernel's 128 rows.
constexpr int kDecodeRows = 16;

// --- storing the outputs --------------------------------------------------------
// Dots whose accumulators i and i + 1 (i even) are adjacent columns of one row
// store them with one access where the row length and the pointer allow.
template <class Dot>
concept PairedColumns = requires { typename Dot::PairedColumns; };

// Outputs v (laid out as the dot's accumulators) of the tile at (row0, col0).
template <class Cfg, class Dot>
__device__ void store_outputs(const Problem& p, const Dot& d, const float (&v)[Cfg::kAcc], int row0, int col0) {
  constexpr int kStep = PairedColumns<Dot> ? 2 : 1;
  const void* out = p.out_f32 ? static_cast<const void*>(p.out_f32) : static_cast<const void*>(p.out_bf16);
  const bool paired = kStep == 2 && p.n % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; i += kStep) {
    const int r = row0 + d.row(i), c = col0 + d.col(i);
    if (r >= p.m || c >= p.n) continue;
    const size_t at = static_cast<size_t>(r) * p.n + c;
    if (paired) {
      if (p.out_f32) *reinterpret_cast<float2*>(p.out_f32 + at) = make_float2(v[i], v[i + 1]);
      else *reinterpret_cast<uint32_t*>(p.out_bf16 + at) = round_bf16(v[i]).bits |
                                                           (static_cast<uint32_t>(round_bf16(v[i + 1]).bits) << 16);
      continue;
    }
#pragma unroll
    for (int e = 0; e < kStep; ++e) {
      if (c + e >= p.n) break;
      if (p.out_f32) p.out_f32[at + e] = v[i + e];
      else p.out_bf16[at + e] = round_bf16(v[i + e]);
    }
  }
}

// --- the chunk tree -------------------------------------------------------------
// reduce.h's pairwise_tree over the chunk partials, folded in as each chunk ends:
// node l of the tree over chunks [i·2^l, (i+1)·2^l) is complete when chunk
// (i+1)·2^l − 1 ends, so a binary counter holds at most one pending node per
// level (set iff bit l of the number of finished chunks is set). Chunk c merges
// with the pending nodes of c's trailing one bits (left operand = the earlier
// node, as v[2i] + v[2i+1]); the last chunk then folds the remaining pending nodes
// from the lowest level up, which is how pairwise_tree moves an odd last node up
// and adds it later.
// The node being built lives in slot 0, which is also level 0's pending slot;
// levels 1 .. kRegSlots − 1 wait in registers, deeper ones in the global scratch
// (each thread reads back only what it wrote, kStep adjacent columns at a time).
// The dot's accumulators are only read: the warpgroup engine's are written by
// nothing but wgmma, so ptxas need not wait for a wgmma in flight to move them. A
// single chunk's root is the accumulators themselves; a tile with kRegSlots == 0
// takes single chunks only (spill_elems refuses more).
template <class Cfg, class Dot>
struct ChunkTree {
  static constexpr int kSlots = Cfg::kRegSlots;
  static constexpr int kAcc = Cfg::kAcc;
  static constexpr int kStep = PairedColumns<Dot> ? 2 : 1;
  float slot[kSlots > 0 ? kSlots : 1][kAcc];
  float* spill;  // [level - kSlots][m][n]
  int m, n, chunks, row0, col0;

  __device__ ChunkTree(const Problem& p, int r0, int c0)
      : spill(p.spill), m(p.m), n(p.n), chunks(p.chunks), row0(r0), col0(c0) {}

  // Outputs i .. i + kStep − 1 of `level` in the scratch; nullptr past the rows or
  // the first column, and `whole` when all kStep columns are inside (n even keeps a
  // pair inside a row and 8-byte aligned: each problem's scratch starts at a
  // multiple of its m·n, and a grouped launch's problems share n).
  __device__ float* spilled(const Dot& d, int level, int i, bool& whole) const {
    const int r = row0 + d.row(i), c = col0 + d.col(i);
    whole = kStep == 2 && n % 2 == 0;
    if (r >= m || c >= n) return nullptr;
    return spill + (static_cast<size_t>(level - kSlots) * m + r) * n + c;
  }
  __device__ void merge_spilled(const Dot& d, int level) {
#pragma unroll
    for (int i = 0; i < kAcc; i += kStep) {
      bool whole;
      const float* s = spilled(d, level, i, whole);
      if (s == nullptr) continue;
      if (whole) {
        const float2 v = *reinterpret_cast<const float2*>(s);
        slot[0][i] = add_rn(v.x, slot[0][i]);
        slot[0][i + 1] = add_rn(v.y, slot[0][i + 1]);
      } else {
#pragma unroll
        for (int e = 0; e < kStep; ++e)
          if (col0 + d.col(i + e) < n) slot[0][i + e] = add_rn(s[e], slot[0][i + e]);
      }
    }
  }
  __device__ void store_spilled(const Dot& d, int level) const {
#pragma unroll
    for (int i = 0; i < kAcc; i += kStep) {
      bool whole;
      float* s = spilled(d, level, i, whole);
      if (s == nullptr) continue;
      if (whole) {
        *reinterpret_cast<float2*>(s) = make_float2(slot[0][i], slot[0][i + 1]);
      } else {
#pragma unroll
        for (int e = 0; e < kStep; ++e)
          if (col0 + d.col(i + e) < n) s[e] = slot[0][i + e];
      }
    }
  }
  // slot 0 = slot s + slot 0 (slot s holds the earlier node), for s >= 1.
  __device__ void merge_slot(int s) {
#pragma unroll
    for (int j = 1; j < kSlots; ++j)
      if (j == s)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) slot[0][i] = add_rn(slot[j][i], slot[0][i]);
  }

  // Chunk c's partial is in d.acc, or +0 for an empty chunk (no wgmma wrote it);
  // true when the root is complete (store_root).
  __device__ bool finish_chunk(const Dot& d, int c, bool empty) {
    if (chunks == 1) return true;
    if constexpr (kSlots > 0) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const float part = empty ? 0.0f : d.acc[i];
        slot[0][i] = (c & 1) ? add_rn(slot[0][i], part) : part;
      }
      int l = c & 1;  // level of the node in slot 0
#pragma unroll
      for (int s = 1; s < kSlots; ++s)
        if (l == s && ((c >> s) & 1)) {
          merge_slot(s);
          l = s + 1;
        }
      if (l == kSlots)
        for (; (c >> l) & 1; ++l) merge_spilled(d, l);
      if (c == chunks - 1) {
#pragma unroll
        for (int s = 1; s < kSlots; ++s)
          if (s > l && ((c >> s) & 1)) merge_slot(s);
        for (int h = max(l + 1, kSlots); (c >> h) != 0; ++h)
          if ((c >> h) & 1) merge_spilled(d, h);
        return true;
      }
#pragma unroll
      for (int s = 1; s < kSlots; ++s)
        if (s == l)
#pragma unroll
          for (int i = 0; i < kAcc; ++i) slot[s][i] = slot[0][i];
      if (l >= kSlots) store_spilled(d, l);
    }
    return false;
  }
  // Stores the root once finish_chunk returned true (each branch names its array:
  // choosing one at run time would put both in local memory).
  __device__ void store_root(const Problem& p, const Dot& d) const {
    if constexpr (kSlots > 0)
      if (chunks > 1) return store_outputs<Cfg>(p, d, slot[0], row0, col0);
    store_outputs<Cfg>(p, d, d.acc, row0, col0);
  }
};

// Reduction elements of stage s (bk elements each, stages_per_chunk per chunk)
// that belong to its chunk; <= 0: none (the last chunk may be shorter).
__device__ inline int stage_valid(const Problem& p, int s, int stages_per_chunk, int bk) {
  return min(p.chunk, p.red - (s / stages_per_chunk) * p.chunk) - (s % stages_per_chunk) * bk;
}

// --- host side ------------------------------------------------------------------
// Above 48 KB a kernel needs the opt-in; the caller holds the result in a static,
// so it is asked once per instantiation.
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

// Levels of the chunk tree that hold a pending node at some point: chunk c < chunks − 1
// stores at the level of its trailing one bits.
inline int tree_levels(int chunks) {
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

inline int multiprocessors() {
  int dev = 0, sms = 0;
  BP_CUDA_CHECK(cudaGetDevice(&dev));
  BP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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

// --- the engines' entry points --------------------------------------------------
// The operand majors of the public functions: (Red, Red) forward, (Red, Row) input
// gradient, (Row, Row) weight gradient. with_majors hands f the pair as types, so
// each engine instantiates its kernels for these three pairs and no other.
template <Major M>
using MajorC = std::integral_constant<Major, M>;

template <class F>
decltype(auto) with_majors(Major a, Major b, F&& f) {
  using Red = MajorC<Major::Red>;
  using Row = MajorC<Major::Row>;
  if (a == Major::Red && b == Major::Red) return f(Red{}, Red{});
  if (a == Major::Red && b == Major::Row) return f(Red{}, Row{});
  if (a == Major::Row && b == Major::Row) return f(Row{}, Row{});
  throw std::logic_error("linear: no GEMM is instantiated for a row-major A with a reduction-major B");
}

// linear_mma.cu: p on the mma.sync tiles (TensorCoreDot) for sm90-tc, else on the
// SIMT cores (SimtFmaDot), with the tile that fills the GPU best. p has m, n and
// chunks > 0.
void run_mma(DotModel model, Major ma, Major mb, const Problem& p, cudaStream_t stream);
// One grouped launch of `problems` (each with m, n and chunks > 0) on those tiles.
void run_mma_grouped(DotModel model, Major ma, Major mb, std::vector<Problem> problems, cudaStream_t stream);

// linear_decode.cu: a decode-sized sm90-tc forward (M <= kDecodeRows, both
// operands reduction-major with 16-byte runs, x fitting shared memory) with the weight
// streamed into the mma fragments; false (nothing launched) where it does not apply.
bool run_decode(Major ma, Major mb, const Problem& p, cudaStream_t stream);

// linear_wgmma.cu: p on the warpgroup kernel where it fits and its tiles give the
// GPU work; false (nothing launched) leaves p to run_mma.
bool run_wgmma(Major ma, Major mb, const Problem& p, cudaStream_t stream);
// Whether the warpgroup kernel takes a grouped launch of `problems`, and that launch.
bool warpgroup_group_fits(const std::vector<Problem>& problems);
void run_wgmma_grouped(Major ma, Major mb, std::vector<Problem> problems, cudaStream_t stream);

}  // namespace bp::cuda::gemm
