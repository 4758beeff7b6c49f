// The GEMM behind every linear op (SPEC.md §5.4): what both engines and the
// dispatcher (linear.cu) share — the problem, the chunk tree and the output stores
// both engines' kernels run, their host helpers, and the engines' entry points.
//
// Every linear op is one GEMM  out[r][c] = chunked dot over j of A(r, j) · B(c, j):
// the reduction (K, N or tokens) is cut into chunks of `chunk` elements (the last
// may be shorter), each chunk's dot starts at +0 and walks the reduction upward,
// and the chunk partials go through reduce.h's pairwise_tree — exactly
// chunked_dot / token_chunked_dot. One CTA owns an output tile for the whole
// reduction (no atomics), and the chunk partials fold into the tree as they finish
// (ChunkTree); where the tiles are too few, the warpgroup engine runs the root's
// two subtrees on two CTAs and adds their roots after (launch_subtrees). Three
// engines run it:
//   - linear_mma.cu: tiles of 32 reduction elements through a cp.async pipeline;
//     sm90-tc on mma.sync.m16n8k16, fma-seq on the SIMT cores;
//   - linear_decode.cu: the sm90-tc forward at decode sizes (M <= 16, and up to
//     128 in 16-row blocks): the weight streamed into mma.sync fragments, a warp
//     per strip of 8 columns and chunk;
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
#include "optimized/cuda/ptx.cuh"
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
  float* spill;  // chunk-tree levels >= kRegSlots (ChunkTree's layout)
  // > 0: the reduction goes on from here in a second operand pair, [A | A2]·[B ; B2]
  // (ProblemPair; only grouped warpgroup launches set it).
  int second_from = 0;
};

// A problem whose reduction continues into a second one's (same m, n and output):
// first's chunks, then second's, counted on across the seam.
struct ProblemPair {
  Problem first, second;
};

// One CTA per entry of the tile table: tile (problem, row0, col0) of a grouped launch.
struct GroupTile {
  int problem, row0, col0;
};

// M up to this is decode-sized: the decode engine (linear_decode.cu) or the mma
// engine's decode tiles take it, with more weight bytes in flight than the
// warpgroup kernel's 128 rows.
constexpr int kDecodeRows = 16;
// Past that, up to this many rows, the decode engine runs 16-row blocks where the
// warpgroup kernel's tiles would not fill the GPU and the mma.sync tiles would each
// walk the whole K chain (bench/DECISIONS.md, linear: row blocks for 16 < M ≤ 128).
constexpr int kDecodeBlockedRows = 128;

// --- storing the outputs --------------------------------------------------------
// Dots whose accumulators i and i + 1 (i even) are adjacent columns of one row
// store them with one access where the row length and the pointer allow.
template <class Dot>
concept PairedColumns = requires { typename Dot::PairedColumns; };

// Element i of outputs laid out as the dot's accumulators: an array, or a function
// that computes it.
template <class V>
__device__ float output_at(const V& v, int i) {
  if constexpr (std::is_invocable_v<const V&, int>) return v(i);
  else return v[i];
}

// Outputs v (output_at) of the tile at (row0, col0).
template <class Cfg, class Dot, class V>
__device__ void store_outputs(const Problem& p, const Dot& d, const V& v, int row0, int col0) {
  constexpr int kStep = PairedColumns<Dot> ? 2 : 1;
  const void* out = p.out_f32 ? static_cast<const void*>(p.out_f32) : static_cast<const void*>(p.out_bf16);
  const bool paired = kStep == 2 && p.n % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; i += kStep) {
    const int r = row0 + d.row(i), c = col0 + d.col(i);
    if (r >= p.m || c >= p.n) continue;
    const size_t at = static_cast<size_t>(r) * p.n + c;
    if (paired) {
      const float v0 = output_at(v, i), v1 = output_at(v, i + 1);
      if (p.out_f32) *reinterpret_cast<float2*>(p.out_f32 + at) = make_float2(v0, v1);
      else *reinterpret_cast<uint32_t*>(p.out_bf16 + at) = round_bf16x2(v0, v1);
      continue;
    }
#pragma unroll
    for (int e = 0; e < kStep; ++e) {
      if (c + e >= p.n) break;
      if (p.out_f32) p.out_f32[at + e] = output_at(v, i + e);
      else p.out_bf16[at + e] = round_bf16(output_at(v, i + e));
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
// levels 1 .. kRegSlots − 1 wait in registers, the next kSmemLevels (a Cfg may
// have them: smem_tree_levels) in the CTA's shared memory, deeper ones in the
// global scratch. In both memories each thread keeps its whole share of the tile,
// past the problem's edge too (it reads back only what it wrote):
// [level][home][warp][i / kStep][lane][kStep] (spill_elems says whose homes; shared
// memory is one home), so a warp's accesses are consecutive, a thread's addresses
// are one pointer plus constants (the output-shaped layout this replaced needed an
// address and a bounds test per pair, which the compiler hoisted out of the chunk
// loop into registers), and a warp's elements of a level lie together (the
// warpgroup tree tiles put a warp's output boxes in its share of a shared level:
// WarpgroupTile::kOutInLevels).
// The dot's accumulators are only read: the warpgroup engine's are written by
// nothing but wgmma, so ptxas need not wait for a wgmma in flight to move them. A
// single chunk's root is the accumulators themselves. A tile with kRegSlots == 0
// (the warpgroup engine's wide tile, given long chunks only) keeps no copy of the
// tile: every pending node, level 0 included, is in memory, where a chunk's node is
// built element by element (build_in_memory), which the tree's independence of
// elements allows.
template <class Cfg>
constexpr int smem_tree_levels() {
  if constexpr (requires { Cfg::kSmemLevels; }) return Cfg::kSmemLevels;
  else return 0;
}

template <class Cfg, class Dot>
struct ChunkTree {
  static constexpr int kSlots = Cfg::kRegSlots;
  static constexpr int kSmemLevels = smem_tree_levels<Cfg>();
  static constexpr int kAcc = Cfg::kAcc;
  static constexpr int kStep = PairedColumns<Dot> ? 2 : 1;
  static constexpr int kTileThreads = Cfg::kBM * Cfg::kBN / kAcc;  // the threads holding a tile's accumulators
  static_assert(kTileThreads * kAcc == Cfg::kBM * Cfg::kBN, "the threads' accumulators cover the tile");
  static_assert(kTileThreads % 32 == 0, "whole warps hold the tile");
  static_assert(kSmemLevels == 0 || (kSlots > 0 && kStep == 2), "shared levels hold paired columns after a slot");
  // Where a thread's elements start in a level, and element i from there.
  __device__ static constexpr int thread_offset(int thread) {
    return thread / 32 * 32 * kAcc + thread % 32 * kStep;
  }
  __device__ static constexpr int element_offset(int i) { return (i - i % kStep) * 32 + i % kStep; }
  float slot[kSlots > 0 ? kSlots : 1][kAcc];
  float* spill;        // this thread's element 0 of level kSlots + kSmemLevels in the scratch
  uint32_t shared_at;  // ... and of level kSlots in shared memory (kSmemLevels > 0)
  size_t level_stride;  // elements from one level to the next in the scratch
  int chunks, row0, col0;

  // `thread`: this thread's index among the tile's kTileThreads; the tile's pending
  // nodes wait in home `home` of the `homes` of every scratch level (spill_elems),
  // and from level kSlots on in `smem_levels` (kSmemLevels tiles) first.
  __device__ ChunkTree(const Problem& p, int r0, int c0, int thread, size_t home, size_t homes,
                       float* smem_levels = nullptr)
      : chunks(p.chunks), row0(r0), col0(c0) {
    level_stride = homes * Cfg::kBM * Cfg::kBN;
    spill = p.spill + home * Cfg::kBM * Cfg::kBN + thread_offset(thread);
    shared_at = smem_levels ? smem_addr(smem_levels + thread_offset(thread)) : 0;
  }

  // Element i of slot 0.
  __device__ float& node(int i) { return slot[0][i]; }

  // The levels from kSlots on: the first kSmemLevels in shared memory, the rest in
  // the scratch. Each memory has its own path: one pointer for both made every
  // store a generic one (ST.E), which waited behind the global queue (lg_throttle;
  // bench/DECISIONS.md, linear: the fold's stores and selects).
  __device__ static constexpr bool in_shared(int level) { return level < kSlots + kSmemLevels; }
  // Element i of a shared `level` at element_offset(i) floats from here ...
  __device__ uint32_t shared_level(int level) const {
    return shared_at + (level - kSlots) * Cfg::kBM * Cfg::kBN * sizeof(float);
  }
  // ... and of a scratch one at [element_offset(i)].
  __device__ float* spilled(int level) const { return spill + (level - kSlots - kSmemLevels) * level_stride; }
  // Paired columns (kStep == 2): node += the pending node whose element pairs
  // load(element_offset(i)) reads (the earlier node on the left), or
  // store(element_offset(i), pair) writes the node.
  template <class Load>
  __device__ void merge_pairs(const Load& load) {
#pragma unroll
    for (int i = 0; i < kAcc; i += 2) {
      const float2 v = load(element_offset(i));
      node(i) = add_rn(v.x, node(i));
      node(i + 1) = add_rn(v.y, node(i + 1));
    }
  }
  template <class Store>
  __device__ void store_pairs(const Store& store) {
#pragma unroll
    for (int i = 0; i < kAcc; i += 2) store(element_offset(i), node(i), node(i + 1));
  }
  __device__ void merge_spilled(int level) {
    if constexpr (kSmemLevels > 0)
      if (in_shared(level)) {
        const uint32_t at = shared_level(level);
        return merge_pairs([at](int e) { return ld_shared_f32x2(at + e * sizeof(float)); });
      }
    const float* s = spilled(level);
    if constexpr (kStep == 2) {
      merge_pairs([s](int e) { return *reinterpret_cast<const float2*>(s + e); });
    } else {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) node(i) = add_rn(s[element_offset(i)], node(i));
    }
  }
  __device__ void store_spilled(int level) {
    if constexpr (kSmemLevels > 0)
      if (in_shared(level)) {
        const uint32_t at = shared_level(level);
        return store_pairs([at](int e, float x, float y) { st_shared_f32x2(at + e * sizeof(float), x, y); });
      }
    float* s = spilled(level);
    if constexpr (kStep == 2) {
      store_pairs([s](int e, float x, float y) { *reinterpret_cast<float2*>(s + e) = make_float2(x, y); });
    } else {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) s[element_offset(i)] = node(i);
    }
  }
  // slot 0 = slot s + slot 0 (slot s holds the earlier node), for s >= 1.
  __device__ void merge_slot(int s) {
#pragma unroll
    for (int j = 1; j < kSlots; ++j)
      if (j == s)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) node(i) = add_rn(slot[j][i], node(i));
  }

  // Element i of the pending node at `level` (>= kSlots; kSlots == 0 has no shared levels).
  __device__ float& pending(int level, int i) const {
    return spilled(level)[element_offset(i)];
  }
  // kSlots == 0: node(level) = pending(from) + node(level), element by element in
  // memory (no registers held across: the accumulators hold them all).
  __device__ void merge_in_memory(int from, int level) const {
#pragma unroll 4
    for (int i = 0; i < kAcc; ++i) pending(level, i) = add_rn(pending(from, i), pending(level, i));
  }
  // kSlots == 0: chunk c's node, built in level 0's place (free for an even c; an odd
  // c merges level 0's pending node first, element by element in place): then the
  // pending nodes of c's other trailing one bits and, for the last chunk, every other
  // pending node from the lowest level up, as the registers' path merges them (the
  // last chunk's root stays in level 0's place).
  __device__ void build_in_memory(const Dot& d, int c, bool empty) const {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const float part = empty ? 0.0f : d.acc[i];
      pending(0, i) = (c & 1) ? add_rn(pending(0, i), part) : part;
    }
    int l = c & 1;
    for (; (c >> l) & 1; ++l) merge_in_memory(l, 0);
    if (c == chunks - 1) {
      for (int h = l + 1; (c >> h) != 0; ++h)
        if ((c >> h) & 1) merge_in_memory(h, 0);
      return;
    }
    if (l > 0)
#pragma unroll 4
      for (int i = 0; i < kAcc; ++i) pending(l, i) = pending(0, i);
  }

  // Slot 0 = chunk c's partial (even c) or slot 0 + the partial (odd c), under
  // uniform branches: one instruction an element where selects over both ways took
  // an FSEL and a predicated FADD (ncu; ptxas still copies slot 0 back to its loop
  // registers once a chunk either way).
  template <class Part>
  __device__ void fold_partial(int c, const Part& part) {
    if (c & 1) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) node(i) = add_rn(node(i), part(i));
    } else {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) node(i) = part(i);
    }
  }
  // Chunk c's partial is in d.acc, or +0 for an empty chunk (no wgmma wrote it);
  // true when the root is complete (store_root).
  __device__ bool finish_chunk(const Dot& d, int c, bool empty) {
    if (chunks == 1) return true;
    if constexpr (kSlots == 0) {
      build_in_memory(d, c, empty);
      return c == chunks - 1;
    } else {
      if (empty) fold_partial(c, [](int) { return 0.0f; });
      else fold_partial(c, [&](int i) { return d.acc[i]; });
      int l = c & 1;  // level of the node in slot 0
#pragma unroll
      for (int s = 1; s < kSlots; ++s)
        if (l == s && ((c >> s) & 1)) {
          merge_slot(s);
          l = s + 1;
        }
      if (l == kSlots)
        for (; (c >> l) & 1; ++l) merge_spilled(l);
      if (c == chunks - 1) {
#pragma unroll
        for (int s = 1; s < kSlots; ++s)
          if (s > l && ((c >> s) & 1)) merge_slot(s);
        for (int h = max(l + 1, kSlots); (c >> h) != 0; ++h)
          if ((c >> h) & 1) merge_spilled(h);
        return true;
      }
#pragma unroll
      for (int s = 1; s < kSlots; ++s)
        if (s == l)
#pragma unroll
          for (int i = 0; i < kAcc; ++i) slot[s][i] = node(i);
      if (l >= kSlots) store_spilled(l);
    }
    return false;
  }
  // Stores the root once finish_chunk returned true, by store(values) (output_at
  // reads them; each branch names its array: choosing one at run time would put
  // both in local memory).
  template <class Store>
  __device__ void store_root(const Dot& d, const Store& store) {
    if constexpr (kSlots == 0)
      if (chunks > 1) return store([&](int i) { return pending(0, i); });
    if constexpr (kSlots > 0)
      if (chunks > 1) {
        float root[kAcc];  // slot 0 itself where it is in registers
#pragma unroll
        for (int i = 0; i < kAcc; ++i) root[i] = node(i);
        return store(root);
      }
    store(d.acc);
  }
  __device__ void store_root(const Problem& p, const Dot& d) {
    store_root(d, [&](const auto& v) { store_outputs<Cfg>(p, d, v, row0, col0); });
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

template <class Cfg>
__host__ __device__ long long tile_count(const Problem& p) {
  return static_cast<long long>((p.m + Cfg::kBM - 1) / Cfg::kBM) * ((p.n + Cfg::kBN - 1) / Cfg::kBN);
}
// The tile at (row0, col0) in p's row-major order of tiles.
template <class Cfg>
__device__ long long tile_index(const Problem& p, int row0, int col0) {
  return static_cast<long long>(row0 / Cfg::kBM) * ((p.n + Cfg::kBN - 1) / Cfg::kBN) + col0 / Cfg::kBN;
}

// Scratch elements for the tree levels Cfg keeps out of registers: `homes` whole
// tiles per level. The mma.sync engine gives each tile its own home (tile_index);
// the persistent warpgroup engine one per CTA, reused by the CTA's tiles one after
// another, so the scratch stays in L2 (132 CTAs × 64 KB a level) instead of
// streaming each tile's nodes out to device memory and back.
template <class Cfg>
size_t spill_elems(const Problem& p, long long homes) {
  return static_cast<size_t>(std::max(0, tree_levels(p.chunks) - Cfg::kRegSlots - smem_tree_levels<Cfg>())) * homes *
         Cfg::kBM * Cfg::kBN;
}

inline int multiprocessors() {
  int dev = 0, sms = 0;
  BP_CUDA_CHECK(cudaGetDevice(&dev));
  BP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// A launch of `grid` CTAs of `threads` threads and `smem` bytes of shared memory, in
// clusters of `cluster` CTAs along x; `attr` holds the cluster attribute the
// config points to. No attribute for clusters of one: a launch with one costs more,
// even of one CTA (bench/DECISIONS.md, linear: where pairs pay).
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, int threads, size_t smem, cudaStream_t stream,
                                                int cluster, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = cluster > 1 ? 1 : 0;
  return config;
}

// A persistent CTA per SM (one fits: the stages fill its shared memory), or per
// tile where there are fewer.
inline unsigned persistent_ctas(long long tiles) {
  return static_cast<unsigned>(std::min<long long>(tiles, multiprocessors()));
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A grouped launch: the tiles of every problem (problem-major) and the chunk-tree
// scratch past the registers Cfg keeps, in one buffer: a home per tile of each
// problem (the mma.sync engine: one CTA per tile), or, where `persistent`, a home
// per CTA of the persistent engine (`ctas` of them), shared by all problems.
template <class Cfg>
struct GroupPlan {
  std::vector<Problem> problems;
  std::vector<GroupTile> tiles;
  DeviceBuffer<float> spill;
  unsigned ctas = 0;

  GroupPlan(std::vector<Problem> ps, cudaStream_t stream, bool persistent = false) : problems(std::move(ps)) {
    for (size_t g = 0; g < problems.size(); ++g)
      for (int r = 0; r < problems[g].m; r += Cfg::kBM)
        for (int c = 0; c < problems[g].n; c += Cfg::kBN) tiles.push_back({static_cast<int>(g), r, c});
    ctas = persistent ? persistent_ctas(static_cast<long long>(tiles.size())) : static_cast<unsigned>(tiles.size());
    std::vector<size_t> spill_at;
    size_t elems = 0;
    for (const Problem& p : problems) {
      const size_t need = spill_elems<Cfg>(p, persistent ? ctas : tile_count<Cfg>(p));
      spill_at.push_back(persistent ? 0 : elems);
      elems = persistent ? std::max(elems, need) : elems + need;
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

// linear_decode.cu: an sm90-tc forward of M <= kDecodeBlockedRows (16-row blocks
// past kDecodeRows; both operands reduction-major with 16-byte runs, 16 rows of x
// fitting shared memory) with the weight streamed into the mma fragments; false
// (nothing launched) where it does not apply.
bool run_decode(Major ma, Major mb, const Problem& p, cudaStream_t stream);

// linear_wgmma.cu: p on the warpgroup kernel where it fits and its tiles give the
// GPU work; false (nothing launched) leaves p to run_mma.
bool run_wgmma(Major ma, Major mb, const Problem& p, cudaStream_t stream);
// Whether the warpgroup kernel takes a grouped launch of `problems`, and that launch.
bool warpgroup_group_fits(const std::vector<Problem>& problems);
void run_wgmma_grouped(Major ma, Major mb, std::vector<Problem> problems, cudaStream_t stream);
// Each pair as one problem over both reductions in one grouped launch, where the
// kernel takes them all (the seam on a stage boundary); false: nothing launched.
bool run_wgmma_pairs(Major ma, Major mb, const std::vector<ProblemPair>& pairs, cudaStream_t stream);

}  // namespace bp::cuda::gemm
