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
// the tree as they finish (ChunkTree). Two engines run it:
//   - linear_mma.cu: tiles of 32 reduction elements through a cp.async pipeline;
//     sm90-tc on mma.sync.m16n8k16, fma-seq on the SIMT cores;
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

// M up to this is decode-sized: the mma engine's decode tile (DecodeTile) takes it,
// with more weight bytes in flight than the warpgroup kernel's 128 rows.
constexpr int kDecodeRows = 16;

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

// --- storing the outputs --------------------------------------------------------
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

// linear_wgmma.cu: p on the warpgroup kernel where it fits and its tiles give the
// GPU work; false (nothing launched) leaves p to run_mma.
bool run_wgmma(Major ma, Major mb, const Problem& p, cudaStream_t stream);
// Whether the warpgroup kernel takes a grouped launch of `problems`, and that launch.
bool warpgroup_group_fits(const std::vector<Problem>& problems);
void run_wgmma_grouped(Major ma, Major mb, std::vector<Problem> problems, cudaStream_t stream);

}  // namespace bp::cuda::gemm
