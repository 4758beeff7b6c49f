// attention on the GPU (SPEC.md §5.6), bit-identical to reference/ops/attention.cpp:
// the device pieces both passes use (the thread's place in a tile, tile loads, the
// dot and contraction steps, the query tiles) and the host side they share (argument
// checks, the query-tile plan, launches). The passes: attention_fwd.cu (the
// forward, merged or flash-decoding) and attention_bwd.cu (dq, the dk/dv chunk
// partials and their combine).
//
// Every kernel works on 64 × 64 tiles held by 4 warps of 16 rows (the warpgroup
// forward: a consumer warpgroup's wgmma accumulators, the same layout), each thread
// owning the mma.sync accumulator elements (rows g, g + 8 of its warp; columns
// 8·nt + 2t, 8·nt + 2t + 1), g = lane / 4, t = lane % 4. The per-row scalar steps
// (scale, maximumNumber, exp, the pairwise tree, fma merges, roundings) are the
// reference's own BP_HD functions in the reference's order; only the dots run
// differently, and those are the dot model by construction:
//   - sm90-tc: one mma.sync.m16n8k16 per group of 16 in increasing order from the
//     tile's first slot (tools/hw_truth/hw_truth.cu proves mma == Sm90Tc::group);
//     absent slots are +0 operands, i.e. products that take no part;
//   - fma-seq: SIMT, the reference's FmaSeq::chain / framed_chain on shared memory.
// A tensor-core contraction whose absent slots meet a non-finite operand (0·Inf is
// NaN on the tensor core, while the reference skips the slot) takes the SIMT path
// with Sm90Tc::group for that tile: the "slow path" of SPEC.md §5.6.
//
// No kernel uses atomics: every output is written by exactly one thread.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "optimized/cuda/attention.h"
#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/ptx.cuh"
#include "reference/numerics/dot.h"
#include "reference/numerics/math.h"

namespace bp::cuda::attn {

using ref::framed_chain;

constexpr int kTile = 64;      // query slots per CTA, keys per KV tile (= attn_kv_block), slots per kv-grad tile
constexpr int kThreads = 128;  // 4 warps × 16 rows
constexpr int kPLd = kTile + 8;  // shared-memory row of R(P) / R(dS), padded
constexpr unsigned kFull = 0xffffffffu;

// bf16 per shared-memory row of a [64][D] tile: 16-byte rows, ldmatrix rows on distinct banks.
template <int D>
constexpr int kLd = D + 8;

__device__ inline float neg_inf() { return float_of(0xff800000u); }

__device__ inline uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// --- the thread's place in the tile ----------------------------------------------
struct Lane {
  int warp, lane, g, t;
  __device__ Lane() : Lane(threadIdx.x) {}
  // `thread` counts from the first thread of the tile's warps (a warpgroup's 128).
  __device__ explicit Lane(int thread) : warp(thread / 32), lane(thread % 32), g(lane / 4), t(lane % 4) {}
  __device__ int row(int i) const { return 16 * warp + g + 8 * i; }      // i = 0, 1
  __device__ int col(int nt, int e) const { return 8 * nt + 2 * t + e; }  // e = 0, 1
};
// Accumulator element [nt][2i + e] is (row(i), col(nt, e)) of its 16 × 8·NT slice.

// Rows [0, Rows) of a tile from global memory (16-byte cp.async), or +0 where src(r) is null.
template <int D, int Rows = kTile, class Src>
__device__ void load_tile(bf16* tile, Src src) {
  constexpr int kChunks = D / 8;
  for (int v = threadIdx.x; v < Rows * kChunks; v += kThreads) {
    const int r = v / kChunks, c = (v % kChunks) * 8;
    const bf16* row = src(r);
    bf16* dst = tile + r * kLd<D> + c;
    if (row) cp_async16(dst, row + c);
    else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// The same for evenly spaced rows (keys, values): row r < n_rows at row0 + r·stride,
// +0 from n_rows on. Each thread keeps one 16-byte column and steps down the rows.
template <int D>
__device__ void load_rows(bf16* tile, const bf16* row0, size_t stride, int n_rows) {
  constexpr int kChunks = D / 8, kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0, "a thread's column is fixed");
  const int c = (threadIdx.x % kChunks) * 8;
#pragma unroll
  for (int r = threadIdx.x / kChunks; r < kTile; r += kRowStep) {
    bf16* dst = tile + r * kLd<D> + c;
    if (r < n_rows) cp_async16_stream(dst, row0 + r * stride + c);
    else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// Whether either bf16 of a packed pair is Inf or NaN (exponent all ones).
__device__ inline bool nonfinite_bf16_pair(uint32_t w) {
  return (w & 0x7f80u) == 0x7f80u || (w & 0x7f800000u) == 0x7f800000u;
}

// Whether any bf16 of tile rows [r0, r1) is Inf or NaN, over the whole CTA (every
// thread must call; the rows must be complete in shared memory).
template <int D>
__device__ bool any_nonfinite(const bf16* tile, int r0, int r1) {
  bool found = false;
  r0 = max(r0, 0);
  r1 = min(r1, kTile);
  for (int v = r0 * (D / 2) + threadIdx.x; v < r1 * (D / 2); v += kThreads) {
    const uint32_t w = ld32(tile + (v / (D / 2)) * kLd<D> + (v % (D / 2)) * 2);
    found |= nonfinite_bf16_pair(w);
  }
  return __syncthreads_or(found) != 0;
}

// The SIMT dot steps, out of line: each is a loop over up to 128 elements, called
// from unrolled loops over a thread's 32 or 64 accumulators, which would otherwise
// multiply the code (and the compile time) by that count.
template <class Model>
__device__ __noinline__ float chain_dot(float c, const bf16* a, const bf16* b, int ld_b, int n) {
  return Model::chain(c, a, 1, b, ld_b, n);
}
template <class Model>
__device__ __noinline__ float framed_dot(float c, const bf16* a, const bf16* b, int ld_b, int lo, int hi) {
  return framed_chain<Model>(c, a, 1, b, ld_b, lo, hi, kTile);
}

// s[nt][2i+e] = Model::chain(+0, a row(i), b row col(nt, e)) over D: the warp's 16
// rows of `sa` against the 64 rows of `sb` (both [row][d] in shared memory).
template <class Model, int D>
__device__ void tile_dots(float (&s)[8][4], const bf16* sa, const bf16* sb, const Lane& ln) {
  constexpr int LD = kLd<D>;
  if constexpr (Model::kModel == DotModel::Sm90Tc) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    // ldmatrix addresses: A rows 16·warp + lane % 16, columns + 8 for lanes ≥ 16;
    // B (the keys, [n][k] = the mma's col layout) matrix lane / 8 is n8 tile
    // 2·np + lane / 16 at k half (lane / 8) % 2.
    const bf16* a_row = sa + (16 * ln.warp + ln.lane % 16) * LD + (ln.lane / 16) * 8;
    const bf16* b_row = sb + ((ln.lane / 16) * 8 + ln.lane % 8) * LD + ((ln.lane / 8) % 2) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, a_row + kk * 16);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, b_row + np * 16 * LD + kk * 16);
        mma_m16n8k16(s[2 * np], a, b[0], b[1]);
        mma_m16n8k16(s[2 * np + 1], a, b[2], b[3]);
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s[nt][2 * i + e] = chain_dot<Model>(0.0f, sa + ln.row(i) * LD, sb + ln.col(nt, e) * LD, 1, D);
  }
}

// The pair (x0, x1) of n8 tile nt, row i of the thread, as its A-fragment word: the
// score layout is the A layout of the next mma (4 k16 groups of 16 columns). One cvt
// per pair: cvt.rn gives R's bits for every non-NaN value, and a NaN operand's
// payload cannot reach a product (SPEC §2.3.3), so the fragments are R(x).
template <int KGroups>
__device__ void put_fragment(uint32_t (&a)[KGroups][4], int nt, int i, float x0, float x1) {
  a[nt / 2][nt % 2 * 2 + i] = cvt_bf16x2_rn(x0, x1);
}

// The A fragments of the bf16 rounding of a 16 × 8·NT accumulator slice.
template <int NT>
__device__ void a_fragments(uint32_t (&a)[NT / 2][4], const float (&p)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    put_fragment(a, nt, 0, p[nt][0], p[nt][1]);
    put_fragment(a, nt, 1, p[nt][2], p[nt][3]);
  }
}

// The rows of A fragments into st ([row][kPLd], store_rounded's layout).
__device__ inline void store_fragments(bf16* st, const uint32_t (&a)[4][4], const Lane& ln) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      *reinterpret_cast<uint32_t*>(st + ln.row(i) * kPLd + ln.col(nt, 0)) = a[nt / 2][nt % 2 * 2 + i];
}

// acc (16 rows × 8·NT columns) += A · B over the tile's 64 k slots, groups
// of 16 in increasing order; B is [k][n] in shared memory (row stride ld).
template <int NT>
__device__ void mma_tile(float (&acc)[NT][4], const uint32_t (&a)[4][4], const bf16* sb, int ld, const Lane& ln) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sb + (kk * 16 + (ln.lane & 15)) * ld + np * 16 + (ln.lane >> 4) * 8);
      mma_m16n8k16(acc[2 * np], a[kk], b[0], b[1]);
      mma_m16n8k16(acc[2 * np + 1], a[kk], b[2], b[3]);
    }
}

// Stores R(x) of the thread's elements as rows of sp ([row][kPLd]).
__device__ inline void store_rounded(bf16* sp, const float (&x)[8][4], const Lane& ln) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      *reinterpret_cast<uint32_t*>(sp + ln.row(i) * kPLd + ln.col(nt, 0)) = round_bf16x2(x[nt][2 * i], x[nt][2 * i + 1]);
}

// The SIMT contraction: for each live row i, acc continues over the slots [lo_i, hi_i)
// of the tile with operands sa[row][slot] and sb[slot][col]. kFramed: the tile
// is the reference's whole frame (framed_chain, forward and dq blocks); otherwise
// one piece of a longer chunk frame (sm90-tc groups align to the tile; fma-seq is a
// plain chain and the frame's end is handled by the caller).
template <class Model, bool kFramed, int NT>
__device__ void chain_tile(float (&acc)[NT][4], const bf16* sa, const bf16* sb, int ld, const int (&lo)[2],
                           const int (&hi)[2], const bool (&live)[2], const Lane& ln) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!live[i]) continue;
    const bf16* a = sa + ln.row(i) * kPLd + lo[i];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& c = acc[nt][2 * i + e];
        const bf16* b = sb + lo[i] * ld + ln.col(nt, e);
        if constexpr (kFramed || Model::kModel == DotModel::Sm90Tc) c = framed_dot<Model>(c, a, b, ld, lo[i], hi[i]);
        else c = chain_dot<Model>(c, a, b, ld, hi[i] - lo[i]);
      }
  }
}

// --- query tiles ------------------------------------------------------------------

// One CTA's work: a tile of 64 slots of one sequence; `split` is the key split it
// runs in the flash-decoding schedule (-1: all of them).
struct Task {
  int seq, slot0, split;
};

// The (query, head) slots of one tile at kv head kvh.
struct SlotTile {
  AttnSeq s;
  int G, Hq, kvh, slot0, n_slots;
  __device__ bool valid(int r) const { return slot0 + r < n_slots; }
  __device__ int pos(int r) const { return s.past_len + (slot0 + r) / G; }
  __device__ size_t row_index(int r) const {  // t · Hq + h
    const int u = slot0 + r;
    return static_cast<size_t>(s.q_begin + u / G) * Hq + kvh * G + u % G;
  }
  __device__ int min_pos() const { return pos(0); }
  __device__ int max_pos() const { return s.past_len + (min(slot0 + kTile, n_slots) - 1) / G; }
};

struct Heads {
  int Hq, Hkv, G;
  float scale;  // attn_scale(D)
  float c;      // attn_exp2_scale(D): contract v2's base-2 factor
  // The softmax rule of the contract generation (reference/ops/attention.h).
  template <bool kBase2>
  __device__ ref::SoftmaxRule<kBase2> rule() const {
    return {scale, c};
  }
};


// A query-side grid: one CTA a (task, kv head), a task's kv heads side by side, so
// the tasks' longest-first order (tiles_longest_first) holds across the heads. With
// the heads as the grid's y, every head's longest tasks started only after the
// previous head's shortest, and the last head's made the tail.
inline dim3 query_grid(size_t n_tasks, int Hkv) { return dim3(static_cast<unsigned>(n_tasks * Hkv)); }
__device__ inline int cta_task(const Heads& h) { return static_cast<int>(blockIdx.x) / h.Hkv; }
__device__ inline int cta_kv_head(const Heads& h) { return static_cast<int>(blockIdx.x) % h.Hkv; }

__device__ inline SlotTile slot_tile(const AttnSeq* seqs, const Task& task, const Heads& h) {
  const AttnSeq s = seqs[task.seq];
  return {s, h.G, h.Hq, cta_kv_head(h), task.slot0, s.q_len * h.G};
}

// Block b of the sequence's keys (or values) at kv head kvh; keys past `last` are
// zero-filled (never read).
template <int D>
__device__ void load_key_block(bf16* dst, const bf16* base, const SlotTile& tile, int Hkv, int b, int last) {
  const int j0 = b * kTile;
  load_rows<D>(dst, base + (static_cast<size_t>(tile.s.kv_begin + j0) * Hkv + tile.kvh) * D,
               static_cast<size_t>(Hkv) * D, last + 1 - j0);
}

// Which of the thread's rows see the block of kv_block keys from kb and how many of
// its keys (SPEC.md §5.6: keys past p are absent slots).
struct BlockRows {
  bool act[2];
  int vis[2];
  bool warp_live;
  __device__ BlockRows(const int (&pos)[2], int kb, int kv_block = kTile) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      act[i] = pos[i] >= kb;
      vis[i] = act[i] ? min(kv_block, pos[i] + 1 - kb) : 0;
    }
    warp_live = __any_sync(kFull, act[0] || act[1]) != 0;
  }
};

// acc += R(t) · sb over key block kb's keys [first, last] (block-relative) for the
// rows BlockRows br says see it, one framed product per row (the forward's P·V and
// dq's dS·K): by mma on the fragments of R(t) unless sm90-tc meets a non-finite key
// row, else by the SIMT chain through R(t) stored in st. Same bits either way.
template <class Model, int D, int NT>
__device__ void framed_block_product(float (&acc)[NT][4], const float (&t)[8][4], bf16* st, const bf16* sb,
                                     int first, int last, const BlockRows& br, const Lane& ln) {
  constexpr bool kTc = Model::kModel == DotModel::Sm90Tc;
  bool slow = false;
  if constexpr (kTc) slow = any_nonfinite<D>(sb, first, last);
  if (!br.warp_live) return;
  if (kTc && !slow) {
    uint32_t frag[4][4];
    a_fragments(frag, t);
    mma_tile(acc, frag, sb, kLd<D>, ln);
  } else {
    store_rounded(st, t, ln);
    __syncwarp();
    chain_tile<Model, true>(acc, st, sb, kLd<D>, {0, 0}, br.vis, br.act, ln);
  }
}

// --- host side --------------------------------------------------------------------

// `wide_blocks`: the call takes the warpgroup forward, which also runs blocks of
// 128 keys (under the v2 softmax; the other kernels run blocks of 64).
inline void check_args(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, bool wide_blocks = false) {
  ref::attention_check_args(kn, dims, seqs, n_seqs);  // the reference's checks and messages
  const bool wide_ok = wide_blocks && kn.attn_kv_block == 128 && kn.softmax_exp == SoftmaxExp::kExp2Poly;
  if (kn.attn_kv_block != kTile && !wide_ok)
    throw std::invalid_argument(
        "attention (CUDA): attn_kv_block must be 64, or 128 for the sm90-tc forward at head_dim 64 or 128 under "
        "softmax_exp exp2_poly in the merged schedule; got " +
        std::to_string(kn.attn_kv_block));
  if (!attention_takes_head_dim(dims.D))
    throw std::invalid_argument("attention (CUDA): head_dim must be " + attention_head_dims_text() + ", got " +
                                std::to_string(dims.D));
}

inline void check_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw std::invalid_argument("attention (CUDA): tensors must be 16-byte aligned");
}

inline Heads heads(AttnDims d) { return {d.Hq, d.Hkv, d.Hq / d.Hkv, ref::attn_scale(d.D), ref::attn_exp2_scale(d.D)}; }

// Calls f(model, integral_constant<int, D>, bool_constant<base 2 softmax, contract v2>).
template <class F>
void with_shape(const Knobs& kn, int D, F&& f) {
  with_dot_model(kn.dot, [&](auto model) {
    auto with_base2 = [&](auto d) {
      if (kn.softmax_exp == SoftmaxExp::kExp2Poly) f(model, d, std::true_type{});
      else f(model, d, std::false_type{});
    };
    if (D == 32) with_base2(std::integral_constant<int, 32>{});
    else if (D == 64) with_base2(std::integral_constant<int, 64>{});
    else with_base2(std::integral_constant<int, 128>{});
  });
}

template <class Kernel, class Args>
void launch(Kernel kernel, dim3 grid, size_t smem, cudaStream_t stream, const Args& args) {
  BP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kThreads, smem, stream>>>(args);
  BP_CUDA_CHECK_LAUNCH();
}

inline int sequence_tiles(const AttnSeq& s, int G, int slots = kTile) { return (s.q_len * G + slots - 1) / slots; }
inline int tile_max_pos(const AttnSeq& s, int G, int slot0, int slots = kTile) {
  return s.past_len + (std::min(slot0 + slots, s.q_len * G) - 1) / G;
}

// The query tiles of every sequence, `slots` slots each, with their key blocks, the
// longest first so that the causal tail does not idle the GPU.
struct QueryTile {
  int blocks, seq, slot0;
};
inline std::vector<QueryTile> tiles_longest_first(const AttnSeq* seqs, int n_seqs, int G, int slots) {
  std::vector<QueryTile> tiles;
  for (int s = 0; s < n_seqs; ++s)
    for (int tile = 0; tile < sequence_tiles(seqs[s], G, slots); ++tile) {
      const int slot0 = tile * slots;
      tiles.push_back({tile_max_pos(seqs[s], G, slot0, slots) / kTile + 1, s, slot0});
    }
  std::stable_sort(tiles.begin(), tiles.end(), [](const auto& x, const auto& y) { return x.blocks > y.blocks; });
  return tiles;
}

// One task a query tile (the merged schedule and the backward).
inline std::vector<Task> plan_tiles(const AttnSeq* seqs, int n_seqs, int G, int slots = kTile) {
  std::vector<Task> tasks;
  for (const QueryTile& t : tiles_longest_first(seqs, n_seqs, G, slots)) tasks.push_back({t.seq, t.slot0, -1});
  return tasks;
}

// The flash-decoding schedule's tiles: tile i runs tasks task0 … task0 + splits − 1,
// one a split. The CTAs find their task in this list (split_task), so a call plans
// and uploads one record a tile instead of one a split (a decode step: one a
// sequence instead of 64 at 32k keys).
struct SplitTile {
  int seq, slot0, task0;
};
struct SplitPlan {
  std::vector<SplitTile> tiles;
  int n_tasks = 0;
};
inline SplitPlan plan_split_tiles(const AttnSeq* seqs, int n_seqs, int G, int split_blocks, int slots) {
  SplitPlan plan;
  for (const QueryTile& t : tiles_longest_first(seqs, n_seqs, G, slots)) {
    plan.tiles.push_back({t.seq, t.slot0, plan.n_tasks});
    plan.n_tasks += (t.blocks + split_blocks - 1) / split_blocks;
  }
  return plan;
}

// Task `index` of a split plan: the last tile whose first task is at most index.
__device__ inline Task split_task(const SplitTile* tiles, int n_tiles, int index) {
  int lo = 0, hi = n_tiles - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tiles[mid].task0 <= index) lo = mid;
    else hi = mid - 1;
  }
  return {tiles[lo].seq, tiles[lo].slot0, index - tiles[lo].task0};
}

}  // namespace bp::cuda::attn
