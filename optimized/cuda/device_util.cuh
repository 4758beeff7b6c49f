// Device-side helpers shared by the kernels of optimized/cuda/: launch sizes, a
// grid-stride loop, 16-byte vector access to bf16 and fp32 arrays, and the
// contract's row reduction (SPEC.md §2.4.2), and math::exp over many values.
//
// A row's lane_sum is computed by a team of threads: lane l adds the runs
// r = l, l + L, l + 2L, ... (r·vec .. r·vec + vec) in increasing index from +0,
// then lane_tree combines the L lane values: a warp's xor-shuffle tree (offsets
// 16..1; lane 0 then holds reduce.h's v[0] of the warp, the other lanes hold other
// association orders and are never used) and the same tree over the warp totals.
//
// Three team shapes give these bits:
//  - a block of L threads per row (RowTeam<false>),
//  - a warp per row (RowTeam<true>) when the row has at most 32 runs: lanes 32..L-1
//    then hold +0, every warp total but the first is +0, and x + (+0) = x because
//    no lane value is −0 (each starts at +0, and a rounded sum is −0 only if both
//    operands are), so the tree over the warp totals returns warp 0's total, and
//  - a warp per packed row whose threads each hold several lanes (WarpRow).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "reference/numerics/bf16.h"
#include "reference/numerics/fp.h"
#include "reference/numerics/math.h"
#include "reference/numerics/reduce.h"

namespace bp::cuda {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
// Threads per block of elementwise kernels and of warp-per-row kernels.
constexpr int kBlockThreads = 256;
// Most threads a row team's block may have (check_lane_shape): team kernels are
// declared __launch_bounds__(kMaxTeamThreads) so that any lane shape can launch.
constexpr int kMaxTeamThreads = 1024;

// Blocks for a grid-stride loop over n items: enough to fill the GPU, capped so
// that the grid size always fits.
inline unsigned grid_for(size_t n, int threads = kBlockThreads) {
  const size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<size_t>(blocks, 1, size_t{1} << 20));
}

// f(i) for every i in [0, n), spread over the whole grid.
template <class F>
__device__ void for_each_index(size_t n, F&& f) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) f(i);
}

// x[j] = math::exp(x[j]) for j < N (N ≤ 32; x a register array, indices unrolled).
// The common case (a result ≥ 2^-126) has no branch, so the N evaluations
// interleave; a branch per value (math::exp's subnormal path) would serialise
// them, each a ~40-instruction dependent chain. Subnormal results (x < −87.3)
// are redone by math::exp afterwards: the same bits, a rare slow path.
template <int N>
__device__ inline void exp_in_place(float* x) {
  static_assert(N >= 1 && N <= 32, "one bit per value");
  uint32_t below = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    bool b = false;
    const float y = math::exp_unless_subnormal(x[j], b);
    below |= static_cast<uint32_t>(b) << j;
    x[j] = b ? x[j] : y;
  }
  if (below == 0) return;
#pragma unroll
  for (int j = 0; j < N; ++j)
    if ((below >> j) & 1u) x[j] = math::exp(x[j]);
}

// math::exp2_poly_core with t split by one round-to-integer: j = ⌊t⌋ (FRND.FLOOR),
// f = t − j, r = j + 1.5·2^23, three instructions where the core's split takes four
// FADDs. The two splits differ only at an odd integer t, taken as (t, 0) here and
// (t − 1, 1) there, and p(0) = 1, p(1) = 2 exactly; hw_truth's exp2_poly_floor row
// compares the bits with math::exp2_poly's over all 2^32 inputs. For t ≤ 128, not NaN.
__device__ inline float exp2_poly_core_floor(float t) {
  const float j = floorf(t);
  return math::detail::exp2_poly_of_split(t, add_rn(j, math::detail::kRoundShift), sub_rn(t, j));
}

// The softmax exponential of a contract generation over N values in place: v1's
// exp (exp_in_place, whose bits are math::exp's) or v2's exp2_poly (kBase2:
// branch-free, no slow path).
template <bool kBase2, int N>
__device__ inline void softmax_exp_in_place(float* x) {
  if constexpr (kBase2) {
#pragma unroll
    for (int j = 0; j < N; ++j) x[j] = math::exp2_poly(x[j]);
  } else {
    exp_in_place<N>(x);
  }
}

// ---- 16-byte accesses ---------------------------------------------------------
// The bandwidth-bound kernels move kPack bf16 (16 bytes) per load or store where
// every pointer is 16-byte aligned and the sizes are multiples of kPack, and take
// a scalar path otherwise. Only the access width changes: each element still goes
// through the same arithmetic, in the same order, as in the scalar path.
constexpr int kPack = 8;

__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline bool all_aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (!aligned16(p)) return false;
  return true;
}

// kPack consecutive bf16 in one 16-byte register quad: element j is the low (j even)
// or high (j odd) half of word j / 2, the little-endian memory layout.
struct Bf16x8 {
  uint4 bits;

  __device__ bf16 operator[](int j) const {  // j is a constant after unrolling
    const uint32_t w = j < 2 ? bits.x : j < 4 ? bits.y : j < 6 ? bits.z : bits.w;
    return bf16{static_cast<uint16_t>(j % 2 ? w >> 16 : w & 0xffffu)};
  }
  // The pack of value(0), ..., value(kPack - 1), evaluated in that order.
  template <class F>
  __device__ static Bf16x8 of(F&& value) {
    uint32_t w[kPack / 2];
#pragma unroll
    for (int k = 0; k < kPack / 2; ++k) {
      const uint32_t lo = value(2 * k).bits;
      const uint32_t hi = value(2 * k + 1).bits;
      w[k] = lo | hi << 16;
    }
    return {make_uint4(w[0], w[1], w[2], w[3])};
  }
};

// p must be 16-byte aligned. Plain (coherent) loads: the buffers may alias an output.
__device__ inline Bf16x8 load8(const bf16* p) { return {*reinterpret_cast<const uint4*>(p)}; }
__device__ inline void store8(bf16* p, Bf16x8 v) { *reinterpret_cast<uint4*>(p) = v.bits; }

// kPack consecutive floats as two 16-byte loads; p must be 16-byte aligned.
struct F32x8 {
  float v[kPack];
};
__device__ inline F32x8 load8(const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  return {{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
}

// An elementwise pass over [0, n): pack(i) for i = 0, kPack, 2·kPack, ... while
// i + kPack <= n when `packed`, one(i) for every other index (all of them when not
// packed); the whole grid strides over the packs, then over the rest.
template <class Pack, class One>
__device__ void for_each_packed(size_t n, bool packed, Pack&& pack, One&& one) {
  const size_t packs = packed ? n / kPack : 0, rest = packs * kPack;
  for_each_index(packs, [&](size_t p) { pack(p * kPack); });
  for_each_index(n - rest, [&](size_t k) { one(rest + k); });
}

// Blocks for for_each_packed: one thread per pack (or per element when not packed).
inline unsigned grid_for_packed(size_t n, bool packed) { return grid_for(packed ? (n + kPack - 1) / kPack : n); }

// The lane tree needs one block of `lanes` threads; CUDA blocks hold at most 1024.
inline void check_lane_shape(LaneShape shape, const char* op) {
  if (shape.lanes < kWarp || shape.lanes > kMaxTeamThreads || shape.lanes % kWarp != 0 || shape.vec < 1)
    throw std::invalid_argument(std::string(op) + ": the CUDA backend needs row_reduce lanes a multiple of 32 in " +
                                "[32, 1024] and vec >= 1, got " + std::to_string(shape.lanes) + " x " +
                                std::to_string(shape.vec));
}

// A warp per row when every run of the row has a lane of warp 0.
inline bool warp_per_row(int n, LaneShape shape) { return (n + shape.vec - 1) / shape.vec <= kWarp; }

// Calls f(std::true_type{}) for a warp per row, else f(std::false_type{}), so the
// team kind is a compile-time choice of the kernel.
template <class F>
void with_row_team(int n, LaneShape shape, F&& f) {
  if (warp_per_row(n, shape))
    f(std::true_type{});
  else
    f(std::false_type{});
}

// Calls f(std::bool_constant<flag>{}): a run-time choice made a template argument.
template <class F>
void with_flag(bool flag, F&& f) {
  if (flag)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// Calls f(i) for the indices of `lane` in the order that lane adds them.
template <class F>
__device__ void for_lane_indices(int lane, int n, LaneShape shape, F&& f) {
  const int stride = shape.lanes * shape.vec;
  for (int start = lane * shape.vec; start < n; start += stride) {
    const int end = min(start + shape.vec, n);
    for (int i = start; i < end; ++i) f(i);
  }
}

// A row team lane's elements as 16-byte packs, for rows where row_packed holds:
// pack k (k = 0, 1, ...) starts at element start(k), in the order the lane adds its
// elements (runs r = lane, lane + L, ..., each run vec / kPack packs in index
// order), so a lane that adds the kPack elements of its packs in turn adds exactly
// what for_lane_indices gives it, in the same order.
struct LanePacks {
  int lane, n;
  LaneShape shape;

  __device__ int start(int k) const {
    const int per_run = shape.vec / kPack;
    return (lane + k / per_run * shape.lanes) * shape.vec + k % per_run * kPack;
  }
  // n is a multiple of kPack, so a pack that starts inside the row ends inside it.
  __device__ bool has(int k) const { return start(k) < n; }
  // f(start(k)) for k = 0, 1, ... while the pack is in the row.
  template <class F>
  __device__ void for_each(F&& f) const {
    for (int k = 0; has(k); ++k) f(start(k));
  }
};

// Whether every lane's elements of a row of n are whole 16-byte packs: vec and n
// multiples of kPack (the caller checks the pointers' alignment).
inline bool row_packed(int n, LaneShape shape) { return shape.vec % kPack == 0 && n % kPack == 0; }

// The most packs one lane holds of a packed row of n.
inline int lane_packs_max(int n, LaneShape shape) {
  const int runs = (n + shape.vec - 1) / shape.vec;
  return (runs + shape.lanes - 1) / shape.lanes * (shape.vec / kPack);
}

// f(row[i]) for the indices i of `lane` in the order that lane adds them: by 16-byte
// packs (kPacked: row_packed(n, shape) and `row` 16-byte aligned) or one by one.
template <bool kPacked, class F>
__device__ void for_lane_values(const bf16* row, int lane, int n, LaneShape shape, F&& f) {
  if constexpr (kPacked) {
    LanePacks{lane, n, shape}.for_each([&](int i) {
      const Bf16x8 pack = load8(row + i);
#pragma unroll
      for (int j = 0; j < kPack; ++j) f(pack[j]);
    });
  } else {
    for_lane_indices(lane, n, shape, [&](int i) { f(row[i]); });
  }
}

// The lane's fp32 sum of term(i) over its indices, from +0.
template <class Term>
__device__ float lane_partial(int lane, int n, LaneShape shape, Term&& term) {
  float acc = 0.0f;
  for_lane_indices(lane, n, shape, [&](int i) { acc = add_rn(acc, term(i)); });
  return acc;
}

// The xor-shuffle tree within a warp (offsets 16..1): with op = add_rn, lane 0
// gets lane_tree's v[0] for this group of 32.
template <class Op>
__device__ float warp_tree(float v, Op op) {
  for (int off = kWarp / 2; off >= 1; off /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

struct AddRn {
  __device__ float operator()(float a, float b) const { return add_rn(a, b); }
};

// The threads that reduce one row: a block of L threads or one warp.
template <bool kWarpPerRow>
struct RowTeam {
  int row;   // which row (may be past the last row in a warp-per-row tail block)
  int lane;  // 0 .. size-1
  int size;  // threads in the team

  __device__ static RowTeam here() {
    if constexpr (kWarpPerRow) {
      return {static_cast<int>(blockIdx.x) * (kBlockThreads / kWarp) + static_cast<int>(threadIdx.x) / kWarp,
              static_cast<int>(threadIdx.x) % kWarp, kWarp};
    } else {
      return {static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
    }
  }

  // Launch shape for `rows` rows of this team kind (lanes threads per block row team).
  static dim3 grid(int rows) {
    return dim3(kWarpPerRow ? static_cast<unsigned>((rows + kBlockThreads / kWarp - 1) / (kBlockThreads / kWarp))
                            : static_cast<unsigned>(rows));
  }
  static dim3 block(LaneShape shape) { return dim3(kWarpPerRow ? kBlockThreads : shape.lanes); }

  // lane_tree over the team's lane values; every thread of the team gets the total.
  // `warp_totals` is __shared__ float[32]. Block teams: every thread of the block must call.
  __device__ float tree(float v, float* warp_totals) const { return reduce(v, warp_totals, AddRn{}); }

  // The same tree shape with another operation (the max of logprob, where any shape
  // gives the same bits).
  template <class Op>
  __device__ float reduce(float v, float* warp_totals, Op op) const {
    v = warp_tree(v, op);
    if constexpr (kWarpPerRow) {
      return __shfl_sync(kFullMask, v, 0);
    } else {
      const int warp = lane / kWarp, warps = size / kWarp;
      if (lane % kWarp == 0) warp_totals[warp] = v;
      __syncthreads();
      if (warp == 0) {
        // Lanes >= warps only pad the shuffles: no lane below `warps` reads them.
        float w = warp_totals[lane < warps ? lane : 0];
        for (int off = warps / 2; off >= 1; off /= 2) w = op(w, __shfl_xor_sync(kFullMask, w, off));
        __syncwarp();  // every lane has read its total before lane 0 overwrites slot 0
        if (lane == 0) warp_totals[0] = w;
      }
      __syncthreads();
      const float total = warp_totals[0];
      __syncthreads();  // warp_totals may be reused by the next tree
      return total;
    }
  }
};

// ---- A warp per row ------------------------------------------------------------
// A packed row of vec = kPack (lane shape L × 8) summed by one warp with no block
// barrier: thread t holds the contract's lanes t + 32·g for g < kGroups. In the
// warp's view the runs (one pack each) are t + 32·q, q = 0, 1, ...: run t + 32·q
// is lane (t + 32·q) mod L = t + 32·(q mod kGroups), its sweep q / kGroups, so
// adding pack q into acc[q % kGroups] in increasing q gives every lane its terms in
// index order. kGroups = L/32, or fewer when the row has fewer runs: the groups left
// out hold +0 in every lane, their warp totals are +0, and the tree over the warp
// totals adds them as x + (+0) = x (no lane value is −0), so the tree over the
// first kGroups totals (a power of two) gives the same bits.
template <int kGroups, int kSweeps>
struct WarpRow {
  static constexpr int kPacks = kGroups * kSweeps;  // the most packs a thread holds
  int lane;  // 0 .. 31
  int n;     // a multiple of kPack

  __device__ int start(int q) const { return (lane + kWarp * q) * kPack; }
  __device__ bool has(int q) const { return start(q) < n; }

  // f(q, start(q)) for the thread's packs, in increasing q.
  template <class F>
  __device__ void for_each(F&& f) const {
#pragma unroll
    for (int q = 0; q < kPacks; ++q)
      if (has(q)) f(q, start(q));
  }

  // The thread's packs of `row` (16-byte aligned), all loads issued before any use.
  __device__ void load(const bf16* row, Bf16x8 (&packs)[kPacks]) const {
    for_each([&](int q, int i) { packs[q] = load8(row + i); });
  }

  // The row's lane_sum: pack_terms(q, i, add) calls add(term) for the kPack terms
  // of pack q in index order. Every thread of the warp must call; all get lane 0's
  // total (the other threads' trees run in other association orders).
  template <class PackTerms>
  __device__ float sum(PackTerms&& pack_terms) const {
    float acc[kGroups] = {};
    for_each([&](int q, int i) {
      float& a = acc[q % kGroups];  // q is a constant after unrolling
      pack_terms(q, i, [&](float term) { a = add_rn(a, term); });
    });
#pragma unroll
    for (int g = 0; g < kGroups; ++g) acc[g] = warp_tree(acc[g], AddRn{});
    // Offsets kGroups/2 .. 1 over the group totals (constant trip counts, so that
    // acc stays in registers).
#pragma unroll
    for (int level = 1; level < kGroups; level *= 2)
#pragma unroll
      for (int g = 0; g < kGroups / 2; ++g) {
        const int off = kGroups / (2 * level);
        if (g < off) acc[g] = add_rn(acc[g], acc[g + off]);
      }
    return __shfl_sync(kFullMask, acc[0], 0);
  }
};

// WarpRow's template arguments for a packed row of n (vec = kPack): kGroups the
// lane groups that hold a run (a power of two, at most L/32), kSweeps the runs per
// lane.
struct WarpRowShape {
  int groups, sweeps;
};
inline WarpRowShape warp_row_shape(int n, LaneShape shape) {
  const int runs = (n + kPack - 1) / kPack, per_thread = (runs + kWarp - 1) / kWarp;
  int groups = 1;
  while (groups < per_thread && groups < shape.lanes / kWarp) groups *= 2;
  return {groups, (per_thread + groups - 1) / groups};
}

}  // namespace bp::cuda
