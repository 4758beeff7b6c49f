// attention on the GPU (SPEC.md §5.6), bit-identical to reference/ops/attention.cpp.
//
// Every kernel works on 64 × 64 tiles held by 4 warps of 16 rows, each thread
// owning the mma.sync accumulator elements (rows g, g + 8 of its warp; columns
// 8·nt + 2t, 8·nt + 2t + 1), g = lane / 4, t = lane % 4. The per-row scalar steps
// (scale, maximumNumber, exp, the pairwise tree, fma merges, roundings) are the
// reference's own BP_HD functions in the reference's order; only the dots run
// differently, and those are the dot model by construction:
//   - sm90-tc: one mma.sync.m16n8k16 per group of 16 in increasing order from the
//     tile's first slot (tests/gpu/hw_truth.cu proves mma == Sm90Tc::group);
//     absent slots are +0 operands, i.e. products that take no part;
//   - fma-seq: SIMT, the reference's FmaSeq::chain / framed_chain on shared memory.
// A tensor-core contraction whose absent slots meet a non-finite operand (0·Inf is
// NaN on the tensor core, while the reference skips the slot) takes the SIMT path
// with Sm90Tc::group for that tile: the "slow path" of SPEC.md §5.6.
//
// Kernels (no atomics; every output written by exactly one thread):
//   forward  one CTA per (query tile, kv head): the tile is 64 (query, head) slots of
//            one sequence, query-major (slot u = query u / G, head kvh·G + u % G), so
//            GQA rows share the K/V tiles. KV blocks of 64 keys walk upward; the
//            online-softmax state lives in registers, the split merge in shared memory.
//            Flash-decoding schedule: one CTA per (tile, kv head, split) writes the
//            split's (m, l, acc) and fwd_combine merges splits in order per row.
//   dq       one CTA per (query tile, kv head), key blocks upward, one chain per row.
//   dk, dv   one CTA per (key tile, kv head, query chunk), all D columns: the chunk's
//            slots are the contraction dimension, in 64-slot tiles from the chunk's
//            first slot, with Δ = dot(dout, o) per query row computed once before
//            (slot_delta_kernel); partials go to global memory and kv_combine runs
//            the pairwise tree over chunks (as a binary counter: same bits).
#include "optimized/cuda/attention.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/ptx.cuh"
#include "reference/numerics/dot.h"
#include "reference/numerics/math.h"

namespace bp::cuda {
namespace {

using ref::framed_chain;
using ref::max_num;

constexpr int kTile = 64;      // query slots per CTA, keys per KV tile (= attn_kv_block), slots per kv-grad tile
constexpr int kThreads = 128;  // 4 warps × 16 rows
constexpr int kPLd = kTile + 8;  // shared-memory row of R(P) / R(dS), padded
constexpr unsigned kFull = 0xffffffffu;

// bf16 per shared-memory row of a [64][D] tile: 16-byte rows, ldmatrix rows on distinct banks.
template <int D>
constexpr int kLd = D + 8;

__device__ inline float neg_inf() { return float_of(0xff800000u); }

__device__ inline uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ inline uint32_t pack_bf16(float lo, float hi) {
  return round_bf16(lo).bits | (static_cast<uint32_t>(round_bf16(hi).bits) << 16);
}

// --- the thread's place in the tile ----------------------------------------------
struct Lane {
  int warp, lane, g, t;
  __device__ Lane() : warp(threadIdx.x / 32), lane(threadIdx.x % 32), g(lane / 4), t(lane % 4) {}
  __device__ int row(int i) const { return 16 * warp + g + 8 * i; }      // i = 0, 1
  __device__ int col(int nt, int e) const { return 8 * nt + 2 * t + e; }  // e = 0, 1
};
// Accumulator element [nt][2i + e] is (row(i), col(nt, e)) of its 16 × 8·NT slice.

// Rows [0, 64) of a tile from global memory (16-byte cp.async), or +0 where src(r) is null.
template <int D, class Src>
__device__ void load_tile(bf16* tile, Src src) {
  constexpr int kChunks = D / 8;
  for (int v = threadIdx.x; v < kTile * kChunks; v += kThreads) {
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
    if (r < n_rows) cp_async16(dst, row0 + r * stride + c);
    else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
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
    found |= (w & 0x7f80u) == 0x7f80u || (w & 0x7f800000u) == 0x7f800000u;
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

// A fragments (4 groups of 16 columns) of the bf16 rounding of a 16 × 64 accumulator
// slice: the score layout is the A layout of the next mma. One cvt per pair: the
// fragments only feed the mma, where R and cvt give the same product bits.
__device__ void a_fragments(uint32_t (&a)[4][4], const float (&p)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = cvt_bf16x2_rn(p[2 * kk][0], p[2 * kk][1]);
    a[kk][1] = cvt_bf16x2_rn(p[2 * kk][2], p[2 * kk][3]);
    a[kk][2] = cvt_bf16x2_rn(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[kk][3] = cvt_bf16x2_rn(p[2 * kk + 1][2], p[2 * kk + 1][3]);
  }
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
__device__ void store_rounded(bf16* sp, const float (&x)[8][4], const Lane& ln) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      *reinterpret_cast<uint32_t*>(sp + ln.row(i) * kPLd + ln.col(nt, 0)) = pack_bf16(x[nt][2 * i], x[nt][2 * i + 1]);
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
  float scale;
};

__device__ SlotTile slot_tile(const AttnSeq* seqs, const Task& task, const Heads& h) {
  const AttnSeq s = seqs[task.seq];
  return {s, h.G, h.Hq, static_cast<int>(blockIdx.y), task.slot0, s.q_len * h.G};
}

// Block b of the sequence's keys (or values) at kv head kvh; keys past `last` are
// zero-filled (never read).
template <int D>
__device__ void load_key_block(bf16* dst, const bf16* base, const SlotTile& tile, int Hkv, int b, int last) {
  const int j0 = b * kTile;
  load_rows<D>(dst, base + (static_cast<size_t>(tile.s.kv_begin + j0) * Hkv + tile.kvh) * D,
               static_cast<size_t>(Hkv) * D, last + 1 - j0);
}

// Which of the thread's rows see block kb.. and how many of its keys (SPEC.md §5.6:
// keys past p are absent slots).
struct BlockRows {
  bool act[2];
  int vis[2];
  bool warp_live;
  __device__ BlockRows(const int (&pos)[2], int kb) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      act[i] = pos[i] >= kb;
      vis[i] = act[i] ? min(kTile, pos[i] + 1 - kb) : 0;
    }
    warp_live = __any_sync(kFull, act[0] || act[1]) != 0;
  }
};

// --- forward --------------------------------------------------------------------

struct FwdArgs {
  const AttnSeq* seqs;
  const Task* tasks;
  Heads h;
  int split_blocks;
  const bf16 *q, *k, *v;
  bf16* o;
  float *m, *l;
  float* part_acc;  // flash-decoding: [T·Hq][max_splits][D]
  float* part_ml;   // [T·Hq][max_splits][2]: m, l
  int max_splits;
};

// The online-softmax step of one block on the thread's two rows (reference
// softmax_block, steps 1-4 and 6): s holds the raw dots and becomes P (+0 in absent
// slots); returns α per row (1 for rows that do not see the block).
__device__ void softmax_block(float (&s)[8][4], float (&m)[2], float (&l)[2], float (&alpha)[2], const BlockRows& br,
                              float scale, const Lane& ln) {
  // Every slot is scaled; an absent slot becomes −Inf, which maximumNumber ignores
  // and which the select below keeps out of P.
  bool visible[8][4];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      visible[nt][e] = ln.col(nt, e % 2) < br.vis[e / 2];
      const float x = mul_rn(s[nt][e], scale);
      s[nt][e] = visible[nt][e] ? x : neg_inf();
    }
  // maximumNumber is associative and commutative, so any tree gives the reference's
  // sequential bits. It runs on total_order_key integers (one IMNMX a node, no
  // NaN tests): a NaN score gets the least key, so it is ignored as maximumNumber
  // ignores it, and the −Inf seed (what the reference starts from) keeps a row
  // whose scores are all NaN at −Inf. The key map is its own inverse.
  float bmax[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int32_t t[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float x = s[j / 2][2 * i + j % 2];
      t[j] = is_nan(x) ? INT32_MIN : total_order_key(x);
    }
#pragma unroll
    for (int w = 8; w >= 1; w /= 2)
#pragma unroll
      for (int j = 0; j < w; ++j) t[j] = max(t[j], t[j + w]);
    int32_t key = max(t[0], total_order_key(neg_inf()));
    key = max(key, __shfl_xor_sync(kFull, key, 1));
    key = max(key, __shfl_xor_sync(kFull, key, 2));
    bmax[i] = float_of(static_cast<uint32_t>(total_order_key(float_of(static_cast<uint32_t>(key)))));
  }
  // exp(+0) = 1 is α of a row that does not see the block; exp(−Inf) = +0 is P of
  // an absent slot.
  float m_new[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    m_new[i] = max_num(m[i], bmax[i]);
    alpha[i] = br.act[i] ? sub_rn(m[i], m_new[i]) : 0.0f;
  }
  exp_in_place<2>(alpha);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& p = s[nt][2 * i + e];
        p = visible[nt][2 * i + e] ? sub_rn(p, m_new[i]) : neg_inf();
      }
  exp_in_place<32>(&s[0][0]);
  // pairwise_tree over the 64 slots: level 1 pairs columns (2t, 2t+1) in the thread,
  // levels 2 and 3 pair t ^ 1 and t ^ 2 (addition is commutative), levels 4-6 pair
  // the n8 tiles in the thread.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float u[8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      u[nt] = add_rn(s[nt][2 * i], s[nt][2 * i + 1]);
      u[nt] = add_rn(u[nt], __shfl_xor_sync(kFull, u[nt], 1));
      u[nt] = add_rn(u[nt], __shfl_xor_sync(kFull, u[nt], 2));
    }
#pragma unroll
    for (int w = 4; w >= 1; w /= 2)
#pragma unroll
      for (int j = 0; j < w; ++j) u[j] = add_rn(u[2 * j], u[2 * j + 1]);
    if (br.act[i]) {
      l[i] = fma_rn(alpha[i], l[i], u[0]);
      m[i] = m_new[i];
    }
  }
}

// Split merge (reference merge_split) of one row's (m, l) into (M, L); each O_d then
// becomes merged(f, O_d, acc_d).
struct MergeFactors {
  float a, b;
};
__device__ MergeFactors merge_split(float& M, float& L, float m, float l) {
  const float m_new = max_num(M, m);
  float x[2] = {sub_rn(M, m_new), sub_rn(m, m_new)};
  exp_in_place<2>(x);
  const MergeFactors f{x[0], x[1]};
  L = fma_rn(f.a, L, mul_rn(f.b, l));
  M = m_new;
  return f;
}
__device__ inline float merged(MergeFactors f, float O, float acc) { return fma_rn(f.a, O, mul_rn(f.b, acc)); }

template <class Model, int D, bool kSplitCtas>
__global__ void __launch_bounds__(kThreads) attn_fwd_kernel(const FwdArgs a) {
  constexpr int LD = kLd<D>, NT = D / 8;
  constexpr bool kTc = Model::kModel == DotModel::Sm90Tc;
  extern __shared__ uint4 smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + kTile * LD;
  bf16* sV = sK + kTile * LD;
  bf16* sP = sV + kTile * LD;                                // R(P) rows for the SIMT contraction
  float* sO = reinterpret_cast<float*>(sP + kTile * kPLd);  // merged O, thread-private (merged schedule)

  const Task task = a.tasks[blockIdx.x];
  const SlotTile tile = slot_tile(a.seqs, task, a.h);
  const Lane ln;
  const int lo_pos = tile.min_pos(), hi_pos = tile.max_pos();
  int pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) pos[i] = tile.valid(ln.row(i)) ? tile.pos(ln.row(i)) : -1;

  const int last_block = hi_pos / kTile;
  const int first = kSplitCtas ? task.split * a.split_blocks : 0;
  const int end = kSplitCtas ? min(last_block, first + a.split_blocks - 1) : last_block;
  auto load_kv = [&](bf16* dst, const bf16* src, int b) {
    load_key_block<D>(dst, src, tile, a.h.Hkv, b, hi_pos);
    cp_async_commit();
  };

  // K(b + 1) is copied while block b's softmax and P·V run, V(b + 1) while block
  // b + 1's scores run: one buffer each, two commit groups in flight.
  load_tile<D>(sQ, [&](int r) { return tile.valid(r) ? a.q + tile.row_index(r) * D : nullptr; });
  load_kv(sK, a.k, first);
  load_kv(sV, a.v, first);

  float m[2], l[2], M[2] = {0.0f, 0.0f}, L[2] = {0.0f, 0.0f};
  float acc[NT][4];
  auto reset_split = [&] {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m[i] = neg_inf();
      l[i] = 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  };
  reset_split();
  auto o_at = [&](int nt, int e) -> float& { return sO[(nt * 4 + e) * kThreads + threadIdx.x]; };

  for (int b = first; b <= end; ++b) {
    const int kb = b * kTile;
    cp_async_wait<1>();  // Q and K(b); V(b) may be in flight
    __syncthreads();

    const BlockRows br(pos, kb);
    float p[8][4], alpha[2];
    if (br.warp_live) tile_dots<Model, D>(p, sQ, sK, ln);
    __syncthreads();  // every warp is done with sK
    if (b < end) load_kv(sK, a.k, b + 1);
    else cp_async_commit();  // an empty group keeps the count uniform
    if (br.warp_live) {
      softmax_block(p, m, l, alpha, br, a.h.scale, ln);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (br.act[e / 2]) acc[nt][e] = mul_rn(acc[nt][e], alpha[e / 2]);
    }
    cp_async_wait<1>();  // V(b)
    __syncthreads();
    // Keys past the first row's position are absent for some row of the tile.
    bool slow = false;
    if constexpr (kTc) slow = any_nonfinite<D>(sV, lo_pos + 1 - kb, hi_pos + 1 - kb);
    if (br.warp_live) {
      if (kTc && !slow) {
        uint32_t pa[4][4];
        a_fragments(pa, p);
        mma_tile(acc, pa, sV, LD, ln);
      } else {
        store_rounded(sP, p, ln);
        __syncwarp();
        chain_tile<Model, true>(acc, sP, sV, LD, {0, 0}, br.vis, br.act, ln);
      }
    }
    __syncthreads();  // every warp is done with sV
    if (b < end) load_kv(sV, a.v, b + 1);
    if (!kSplitCtas && (b == end || (b + 1) % a.split_blocks == 0)) {
      const int split_first = (b / a.split_blocks) * a.split_blocks;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (pos[i] < split_first * kTile) continue;  // the row ended before this split
        if (split_first == 0) {  // the first split is the merged state
          M[i] = m[i];
          L[i] = l[i];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) o_at(nt, 2 * i + e) = acc[nt][2 * i + e];
        } else {
          const MergeFactors f = merge_split(M[i], L[i], m[i], l[i]);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) o_at(nt, 2 * i + e) = merged(f, o_at(nt, 2 * i + e), acc[nt][2 * i + e]);
        }
      }
      reset_split();
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pos[i] < first * kTile) continue;  // invalid row, or (decode schedule) a row this split does not reach
    const size_t row = tile.row_index(ln.row(i));
    if constexpr (kSplitCtas) {
      const size_t at = row * a.max_splits + task.split;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<float2*>(a.part_acc + at * D + ln.col(nt, 0)) =
            make_float2(acc[nt][2 * i], acc[nt][2 * i + 1]);
      if (ln.t == 0) *reinterpret_cast<float2*>(a.part_ml + at * 2) = make_float2(m[i], l[i]);
    } else {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<uint32_t*>(a.o + row * D + ln.col(nt, 0)) =
            round_bf16(div_rn(o_at(nt, 2 * i), L[i])).bits |
            (static_cast<uint32_t>(round_bf16(div_rn(o_at(nt, 2 * i + 1), L[i])).bits) << 16);
      if (ln.t == 0) {
        a.m[row] = M[i];
        a.l[row] = L[i];
      }
    }
  }
}

// Flash-decoding combine: row (t, h) merges its splits in increasing order (the
// first is the merged state as it is), then o = R(O ÷ L). One thread per d.
__global__ void fwd_combine_kernel(const int* __restrict__ token_pos, int Hq, int D, int split_blocks, int max_splits,
                                   const float* __restrict__ part_acc, const float* __restrict__ part_ml, bf16* o,
                                   float* m, float* l) {
  const int p = token_pos[blockIdx.x];
  if (p < 0) return;  // a token of no sequence
  const size_t row = static_cast<size_t>(blockIdx.x) * Hq + blockIdx.y, base = row * max_splits;
  const int d = threadIdx.x, splits = p / kTile / split_blocks + 1;
  float M = part_ml[2 * base], L = part_ml[2 * base + 1], O = part_acc[base * D + d];
  for (int s = 1; s < splits; ++s) {
    const size_t at = base + s;
    O = merged(merge_split(M, L, part_ml[2 * at], part_ml[2 * at + 1]), O, part_acc[at * D + d]);
  }
  o[row * D + d] = round_bf16(div_rn(O, L));
  if (d == 0) {
    m[row] = M;
    l[row] = L;
  }
}

// --- backward: dq -----------------------------------------------------------------

struct BwdArgs {
  const AttnSeq* seqs;
  const Task* tasks;
  Heads h;
  const bf16 *q, *k, *v, *o, *dout;
  const float *m, *l;
  bf16* dq;
};

// Δ = dot(dout, o) of query row `at` (row = token·Hq + head; reference recompute_probs).
template <class Model, int D>
__device__ float slot_delta(const bf16* dout, const bf16* o, long long at) {
  return Model::chain(0.0f, dout + at * D, 1, o + at * D, 1, D);
}

// Per-slot statistics of the backward: m, 1 ÷ l and Δ = delta_of(row), for the slot
// rows whose index is not negative.
template <class Index, class DeltaOf>
__device__ void slot_stats(float* sM, float* sInvL, float* sDelta, const float* m, const float* l, Index index,
                           DeltaOf delta_of) {
  if (threadIdx.x >= kTile) return;
  const long long at = index(static_cast<int>(threadIdx.x));
  if (at < 0) return;
  sM[threadIdx.x] = m[at];
  sInvL[threadIdx.x] = div_rn(1.0f, l[at]);
  sDelta[threadIdx.x] = delta_of(at);
}

// Δ of rows [row0, row0 + n), for the dk/dv kernel: a software tensor-core chain of
// D products per row is far dearer than a tile's mma work, and every (key tile,
// column part) CTA would otherwise redo it for every slot.
template <class Model, int D>
__global__ void slot_delta_kernel(const bf16* __restrict__ dout, const bf16* __restrict__ o, size_t row0, size_t n,
                                  float* __restrict__ delta) {
  for_each_index(n, [&](size_t i) { delta[i] = slot_delta<Model, D>(dout, o, static_cast<long long>(row0 + i)); });
}

// P = exp(s·scale − m) · (1 ÷ l) of the thread's elements in place (reference
// recompute_probs; then dS = P · (dp − Δ)), from the raw dots s = q·k; element
// [nt][e] takes its m and 1 ÷ l at sM[at(nt, e)], sInvL[at(nt, e)].
template <class At>
__device__ void probabilities(float (&s)[8][4], float scale, const float* sM, const float* sInvL, At at) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = sub_rn(mul_rn(s[nt][e], scale), sM[at(nt, e)]);
  exp_in_place<32>(&s[0][0]);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = mul_rn(s[nt][e], sInvL[at(nt, e)]);
}

template <class Model, int D>
__global__ void __launch_bounds__(kThreads) attn_dq_kernel(const BwdArgs a) {
  constexpr int LD = kLd<D>, NT = D / 8;
  constexpr bool kTc = Model::kModel == DotModel::Sm90Tc;
  extern __shared__ uint4 smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + kTile * LD;
  bf16* sK = sdO + kTile * LD;
  bf16* sV = sK + kTile * LD;
  bf16* sDS = sV + kTile * LD;
  float* sM = reinterpret_cast<float*>(sDS + kTile * kPLd);
  float* sInvL = sM + kTile;
  float* sDelta = sInvL + kTile;

  const SlotTile tile = slot_tile(a.seqs, a.tasks[blockIdx.x], a.h);
  const Lane ln;
  const int lo_pos = tile.min_pos(), hi_pos = tile.max_pos();
  int pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) pos[i] = tile.valid(ln.row(i)) ? tile.pos(ln.row(i)) : -1;

  load_tile<D>(sQ, [&](int r) { return tile.valid(r) ? a.q + tile.row_index(r) * D : nullptr; });
  load_tile<D>(sdO, [&](int r) { return tile.valid(r) ? a.dout + tile.row_index(r) * D : nullptr; });
  cp_async_commit();
  slot_stats(
      sM, sInvL, sDelta, a.m, a.l,
      [&](int r) { return tile.valid(r) ? static_cast<long long>(tile.row_index(r)) : -1LL; },
      [&](long long at) { return slot_delta<Model, D>(a.dout, a.o, at); });

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;

  // V(b + 1) is copied while block b's scores, probabilities and dq run, K(b + 1)
  // while block b + 1's dP = dO·V^T runs: one buffer each, two cp.async groups.
  const int last_block = hi_pos / kTile;
  load_key_block<D>(sV, a.v, tile, a.h.Hkv, 0, hi_pos);
  cp_async_commit();
  load_key_block<D>(sK, a.k, tile, a.h.Hkv, 0, hi_pos);
  cp_async_commit();
  for (int b = 0; b <= last_block; ++b) {
    const int kb = b * kTile;
    const BlockRows br(pos, kb);
    cp_async_wait<1>();  // V(b); K(b) may still be in flight
    __syncthreads();
    float dp[8][4];
    if (br.warp_live) tile_dots<Model, D>(dp, sdO, sV, ln);
    cp_async_wait<0>();
    __syncthreads();  // K(b) is here and no warp reads V(b) any more
    if (b < last_block) {
      load_key_block<D>(sV, a.v, tile, a.h.Hkv, b + 1, hi_pos);
      cp_async_commit();
    }

    float ds[8][4];
    if (br.warp_live) {
      tile_dots<Model, D>(ds, sQ, sK, ln);
      probabilities(ds, a.h.scale, sM, sInvL, [&](int, int e) { return ln.row(e / 2); });
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = ds[nt][e], delta = sDelta[ln.row(e / 2)];
          ds[nt][e] =
              ln.col(nt, e % 2) < br.vis[e / 2] ? widen(round_bf16(mul_rn(p, sub_rn(dp[nt][e], delta)))) : 0.0f;
        }
    }
    bool slow = false;
    if constexpr (kTc) slow = any_nonfinite<D>(sK, lo_pos + 1 - kb, hi_pos + 1 - kb);
    if (br.warp_live) {
      if (kTc && !slow) {
        uint32_t fa[4][4];
        a_fragments(fa, ds);
        mma_tile(acc, fa, sK, LD, ln);
      } else {
        store_rounded(sDS, ds, ln);
        __syncwarp();
        chain_tile<Model, true>(acc, sDS, sK, LD, {0, 0}, br.vis, br.act, ln);
      }
    }
    __syncthreads();
    if (b < last_block) {
      load_key_block<D>(sK, a.k, tile, a.h.Hkv, b + 1, hi_pos);
      cp_async_commit();
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pos[i] < 0) continue;
    bf16* out = a.dq + tile.row_index(ln.row(i)) * D;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      *reinterpret_cast<uint32_t*>(out + ln.col(nt, 0)) =
          round_bf16(mul_rn(a.h.scale, acc[nt][2 * i])).bits |
          (static_cast<uint32_t>(round_bf16(mul_rn(a.h.scale, acc[nt][2 * i + 1])).bits) << 16);
  }
}

// --- backward: dk, dv chunk partials ----------------------------------------------

struct KvArgs {
  AttnSeq s;
  Heads h;
  int C, c_begin;
  const bf16 *q, *k, *v, *dout;
  const float *m, *l;
  const float* delta;     // Δ of the sequence's query rows, from row delta_row0
  long long delta_row0;
  float *dk_part, *dv_part;
};

template <class Model, int D>
__global__ void __launch_bounds__(kThreads) attn_kv_kernel(const KvArgs a) {
  constexpr int LD = kLd<D>, NT = D / 8;
  constexpr bool kTc = Model::kModel == DotModel::Sm90Tc;
  extern __shared__ uint4 smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + kTile * LD;
  bf16* sQ = sV + kTile * LD;
  bf16* sdO = sQ + kTile * LD;
  bf16* sP = sdO + kTile * LD;  // [key][slot]
  bf16* sDS = sP + kTile * kPLd;
  float* sM = reinterpret_cast<float*>(sDS + kTile * kPLd);
  float* sInvL = sM + kTile;
  float* sDelta = sInvL + kTile;
  int* sPos = reinterpret_cast<int*>(sDelta + kTile);

  const AttnSeq& s = a.s;
  const int S = s.past_len + s.q_len, G = a.h.G, kvh = blockIdx.y;
  const int key0 = blockIdx.x * kTile, key_last = min(key0 + kTile - 1, S - 1);
  const int c = a.c_begin + static_cast<int>(blockIdx.z);
  const int frame = a.C * G, chunk_pos0 = c * a.C, chunk_end = min(S, (c + 1) * a.C);
  // Slots before this position see no key of the tile (or are not queries): zero rows.
  const int first_pos = max(s.past_len, key0);
  const Lane ln;

  const size_t kv_stride = static_cast<size_t>(a.h.Hkv) * D;
  const bf16* kbase = a.k + (static_cast<size_t>(s.kv_begin) * a.h.Hkv + kvh) * D;
  const bf16* vbase = a.v + (static_cast<size_t>(s.kv_begin) * a.h.Hkv + kvh) * D;
  if (chunk_end > first_pos) {  // else no slot of the chunk sees a key of the tile: the partial is +0
    load_rows<D>(sK, kbase + key0 * kv_stride, kv_stride, S - key0);
    load_rows<D>(sV, vbase + key0 * kv_stride, kv_stride, S - key0);
    cp_async_commit();
  }

  int key[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) key[i] = key0 + ln.row(i);
  float dk[NT][4], dv[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nt][e] = dv[nt][e] = 0.0f;

  for (int u0 = 0; u0 < frame; u0 += kTile) {
    const int p_lo = chunk_pos0 + u0 / G, p_hi = chunk_pos0 + (min(u0 + kTile, frame) - 1) / G;
    if (p_hi < first_pos || p_lo >= chunk_end) continue;  // no slot of this tile sees a key of the tile
    auto slot_pos = [&](int r) {
      const int u = u0 + r, p = chunk_pos0 + u / G;
      return u < frame && p >= first_pos && p < chunk_end ? p : -1;
    };
    auto slot_index = [&](int r) -> long long {
      const int p = slot_pos(r);
      if (p < 0) return -1;
      return static_cast<long long>(s.q_begin + p - s.past_len) * a.h.Hq + kvh * G + (u0 + r) % G;
    };
    load_tile<D>(sQ, [&](int r) { const long long at = slot_index(r); return at < 0 ? nullptr : a.q + at * D; });
    load_tile<D>(sdO, [&](int r) { const long long at = slot_index(r); return at < 0 ? nullptr : a.dout + at * D; });
    cp_async_commit();
    slot_stats(sM, sInvL, sDelta, a.m, a.l, slot_index, [&](long long at) { return a.delta[at - a.delta_row0]; });
    if (threadIdx.x < kTile) sPos[threadIdx.x] = slot_pos(threadIdx.x);
    cp_async_wait<0>();
    __syncthreads();

    // Rows are keys, columns slots: S^T = K·Q^T and dP^T = V·dO^T (the dots are
    // symmetric in their operands under both models).
    float pb[8][4], dsb[8][4];
    {
      float dp[8][4];
      tile_dots<Model, D>(pb, sK, sQ, ln);
      tile_dots<Model, D>(dp, sV, sdO, ln);
      probabilities(pb, a.h.scale, sM, sInvL, [&](int nt, int e) { return ln.col(nt, e % 2); });
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = ln.col(nt, e % 2), j = key[e / 2];
          const bool present = j < S && sPos[col] >= j;
          const float p = pb[nt][e];
          dsb[nt][e] = present ? widen(round_bf16(mul_rn(p, sub_rn(dp[nt][e], sDelta[col])))) : 0.0f;
          pb[nt][e] = present ? widen(round_bf16(p)) : 0.0f;
        }
    }
    bool slow = false;
    if constexpr (kTc) {
      // Loaded slots before the tile's last key are absent for some key: rows
      // [first_pos, min(chunk_end, key_last)) in positions.
      const int r0 = (first_pos - chunk_pos0) * G - u0;
      const int r1 = min((min(chunk_end, key_last) - chunk_pos0) * G, frame) - u0;
      slow = any_nonfinite<D>(sQ, r0, r1);
      slow = any_nonfinite<D>(sdO, r0, r1) || slow;
    }
    if (kTc && !slow) {
      uint32_t fa[4][4];
      a_fragments(fa, pb);
      mma_tile(dv, fa, sdO, LD, ln);
      a_fragments(fa, dsb);
      mma_tile(dk, fa, sQ, LD, ln);
    } else {
      store_rounded(sP, pb, ln);
      store_rounded(sDS, dsb, ln);
      __syncwarp();
      // Present slots of key j: the contiguous run of slots with position >= j.
      int lo[2], hi[2];
      bool live[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        lo[i] = kTile;
        hi[i] = 0;
        for (int r = 0; r < kTile; ++r)
          if (sPos[r] >= key[i]) {
            lo[i] = min(lo[i], r);
            hi[i] = r + 1;
          }
        live[i] = key[i] < S && lo[i] < hi[i];
      }
      chain_tile<Model, false>(dv, sP, sdO, LD, lo, hi, live, ln);
      chain_tile<Model, false>(dk, sDS, sQ, LD, lo, hi, live, ln);
    }
    __syncthreads();
  }
  cp_async_wait<0>();  // a CTA whose slot tiles were all skipped still waits for its K, V copies

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (key[i] >= S) continue;
    const size_t at = ((static_cast<size_t>(c - a.c_begin) * S + key[i]) * a.h.Hkv + kvh) * D;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float k_acc = dk[nt][2 * i + e], v_acc = dv[nt][2 * i + e];
        if constexpr (Model::kModel == DotModel::FmaSeq) {
          // framed_chain's absent slots at the frame's end: fma(+0, +0, c) = c + (+0).
          if (chunk_end < (c + 1) * a.C) {
            k_acc = add_rn(k_acc, 0.0f);
            v_acc = add_rn(v_acc, 0.0f);
          }
        }
        a.dk_part[at + ln.col(nt, e)] = k_acc;
        a.dv_part[at + ln.col(nt, e)] = v_acc;
      }
  }
}

// pairwise_tree over n values at p[0], p[stride], ...: as a binary counter (merge
// equal-level neighbours as they arrive, then fold the stack from the top), which
// is the same association for every n.
__device__ float chunk_tree(const float* p, size_t stride, int n) {
  float value[32];
  int level[32], top = 0;
  for (int c = 0; c < n; ++c) {
    value[top] = p[c * stride];
    level[top++] = 0;
    while (top >= 2 && level[top - 1] == level[top - 2]) {
      value[top - 2] = add_rn(value[top - 2], value[top - 1]);
      ++level[top - 2];
      --top;
    }
  }
  if (top == 0) return 0.0f;
  float sum = value[top - 1];
  for (int x = top - 2; x >= 0; --x) sum = add_rn(value[x], sum);
  return sum;
}

__global__ void kv_combine_kernel(size_t n, int n_chunks, float scale, const float* __restrict__ dk_part,
                                  const float* __restrict__ dv_part, bf16* __restrict__ dk, bf16* __restrict__ dv) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dv[i] = round_bf16(chunk_tree(dv_part + i, n, n_chunks));
    dk[i] = round_bf16(mul_rn(scale, chunk_tree(dk_part + i, n, n_chunks)));
  }
}

// --- host side --------------------------------------------------------------------

void check_args(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs) {
  ref::attention_check_args(kn, dims, seqs, n_seqs);  // the reference's checks and messages
  if (kn.attn_kv_block != kTile)
    throw std::invalid_argument("attention (CUDA): attn_kv_block must be 64, got " +
                                std::to_string(kn.attn_kv_block));
  if (dims.D != 32 && dims.D != 64 && dims.D != 128)
    throw std::invalid_argument("attention (CUDA): head_dim must be 32, 64 or 128, got " + std::to_string(dims.D));
}

void check_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw std::invalid_argument("attention (CUDA): tensors must be 16-byte aligned");
}

Heads heads(AttnDims d) { return {d.Hq, d.Hkv, d.Hq / d.Hkv, ref::attn_scale(d.D)}; }

// Calls f(model, integral_constant<int, D>).
template <class F>
void with_shape(const Knobs& kn, int D, F&& f) {
  with_dot_model(kn.dot, [&](auto model) {
    if (D == 32) f(model, std::integral_constant<int, 32>{});
    else if (D == 64) f(model, std::integral_constant<int, 64>{});
    else f(model, std::integral_constant<int, 128>{});
  });
}

template <class Kernel, class Args>
void launch(Kernel kernel, dim3 grid, size_t smem, cudaStream_t stream, const Args& args) {
  BP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kThreads, smem, stream>>>(args);
  BP_CUDA_CHECK_LAUNCH();
}

int sequence_tiles(const AttnSeq& s, int G) { return (s.q_len * G + kTile - 1) / kTile; }
int tile_max_pos(const AttnSeq& s, int G, int slot0) {
  return s.past_len + (std::min(slot0 + kTile, s.q_len * G) - 1) / G;
}

// The query tiles of every sequence (one task per split in the flash-decoding
// schedule), the longest first so that the causal tail does not idle the GPU.
std::vector<Task> plan_tiles(const AttnSeq* seqs, int n_seqs, int G, int split_blocks, bool per_split) {
  std::vector<std::pair<int, Task>> work;
  for (int s = 0; s < n_seqs; ++s)
    for (int tile = 0; tile < sequence_tiles(seqs[s], G); ++tile) {
      const int slot0 = tile * kTile, blocks = tile_max_pos(seqs[s], G, slot0) / kTile + 1;
      if (!per_split) {
        work.push_back({blocks, {s, slot0, -1}});
        continue;
      }
      for (int sp = 0; sp * split_blocks < blocks; ++sp)
        work.push_back({std::min(split_blocks, blocks - sp * split_blocks), {s, slot0, sp}});
    }
  std::stable_sort(work.begin(), work.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<Task> tasks;
  tasks.reserve(work.size());
  for (const auto& w : work) tasks.push_back(w.second);
  return tasks;
}

template <int D>
constexpr size_t fwd_smem(bool split_ctas) {
  return sizeof(bf16) * (3 * kTile * kLd<D> + kTile * kPLd) + (split_ctas ? 0 : sizeof(float) * D * kTile);
}
template <int D>
constexpr size_t dq_smem() {
  return sizeof(bf16) * (4 * kTile * kLd<D> + kTile * kPLd) + sizeof(float) * 3 * kTile;
}
template <int D>
constexpr size_t kv_smem() {
  return sizeof(bf16) * (4 * kTile * kLd<D> + 2 * kTile * kPLd) + sizeof(float) * 4 * kTile;
}

bool prefer_split_ctas(const AttnSeq* seqs, int n_seqs, AttnDims dims, int split_blocks) {
  int device = 0, sms = 0;
  BP_CUDA_CHECK(cudaGetDevice(&device));
  BP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int G = dims.Hq / dims.Hkv;
  size_t ctas = 0;
  bool several_splits = false;
  for (int s = 0; s < n_seqs; ++s) {
    ctas += static_cast<size_t>(sequence_tiles(seqs[s], G)) * dims.Hkv;
    several_splits |= seqs[s].q_len > 0 && (seqs[s].past_len + seqs[s].q_len - 1) / kTile >= split_blocks;
  }
  return several_splits && ctas < 2 * static_cast<size_t>(sms);
}

}  // namespace

void attention_fwd_scheduled(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q,
                             const bf16* k, const bf16* v, bf16* o, float* m, float* l, FwdSchedule schedule,
                             cudaStream_t stream) {
  check_args(kn, dims, seqs, n_seqs);
  check_aligned({q, k, v, o});
  const int split_blocks = kn.attn_kv_split / kn.attn_kv_block, G = dims.Hq / dims.Hkv;
  const bool split_ctas = schedule == FwdSchedule::kSplitCtas ||
                          (schedule == FwdSchedule::kAuto && prefer_split_ctas(seqs, n_seqs, dims, split_blocks));
  const std::vector<Task> tasks = plan_tiles(seqs, n_seqs, G, split_blocks, split_ctas);
  if (tasks.empty()) return;
  const DeviceBuffer<AttnSeq> d_seqs(std::vector<AttnSeq>(seqs, seqs + n_seqs), stream);
  const DeviceBuffer<Task> d_tasks(tasks, stream);
  FwdArgs args{d_seqs.get(), d_tasks.get(), heads(dims), split_blocks, q, k, v, o, m, l, nullptr, nullptr, 0};
  const dim3 grid(static_cast<unsigned>(tasks.size()), static_cast<unsigned>(dims.Hkv));

  if (!split_ctas) {
    with_shape(kn, dims.D, [&](auto model, auto d) {
      constexpr int D = decltype(d)::value;
      launch(attn_fwd_kernel<decltype(model), D, false>, grid, fwd_smem<D>(false), stream, args);
    });
    return;
  }
  // Flash-decoding: per-token positions for the combine, split partials per row.
  int T = 0, max_pos = 0;
  for (int s = 0; s < n_seqs; ++s)
    if (seqs[s].q_len > 0) {
      T = std::max(T, seqs[s].q_begin + seqs[s].q_len);
      max_pos = std::max(max_pos, seqs[s].past_len + seqs[s].q_len - 1);
    }
  std::vector<int> token_pos(T, -1);
  for (int s = 0; s < n_seqs; ++s)
    for (int i = 0; i < seqs[s].q_len; ++i) token_pos[seqs[s].q_begin + i] = seqs[s].past_len + i;
  args.max_splits = max_pos / kTile / split_blocks + 1;
  const size_t rows = static_cast<size_t>(T) * dims.Hq;
  DeviceBuffer<float> part_acc(rows * args.max_splits * dims.D, stream), part_ml(rows * args.max_splits * 2, stream);
  const DeviceBuffer<int> d_token_pos(token_pos, stream);
  args.part_acc = part_acc.get();
  args.part_ml = part_ml.get();
  with_shape(kn, dims.D, [&](auto model, auto d) {
    constexpr int D = decltype(d)::value;
    launch(attn_fwd_kernel<decltype(model), D, true>, grid, fwd_smem<D>(true), stream, args);
  });
  fwd_combine_kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(dims.Hq)), dims.D, 0, stream>>>(
      d_token_pos.get(), dims.Hq, dims.D, split_blocks, args.max_splits, part_acc.get(), part_ml.get(), o, m, l);
  BP_CUDA_CHECK_LAUNCH();
}

void attention_fwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, bf16* o, float* m, float* l, cudaStream_t stream) {
  attention_fwd_scheduled(kn, dims, seqs, n_seqs, q, k, v, o, m, l, FwdSchedule::kAuto, stream);
}

void attention_bwd_dq(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                      const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq,
                      cudaStream_t stream) {
  check_args(kn, dims, seqs, n_seqs);
  check_aligned({q, k, v, o, dout, dq});
  const std::vector<Task> tasks = plan_tiles(seqs, n_seqs, dims.Hq / dims.Hkv, 1, false);
  if (tasks.empty()) return;
  const DeviceBuffer<AttnSeq> d_seqs(std::vector<AttnSeq>(seqs, seqs + n_seqs), stream);
  const DeviceBuffer<Task> d_tasks(tasks, stream);
  const BwdArgs args{d_seqs.get(), d_tasks.get(), heads(dims), q, k, v, o, dout, m, l, dq};
  with_shape(kn, dims.D, [&](auto model, auto d) {
    constexpr int D = decltype(d)::value;
    launch(attn_dq_kernel<decltype(model), D>, dim3(static_cast<unsigned>(tasks.size()), dims.Hkv), dq_smem<D>(),
           stream, args);
  });
}

int attention_bwd_kv_partials(const Knobs& kn, AttnDims dims, const AttnSeq& seq, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout,
                              float* dk_part, float* dv_part, cudaStream_t stream) {
  check_args(kn, dims, &seq, 1);
  check_aligned({q, k, v, o, dout});
  const int C = kn.grad_token_chunk, S = seq.past_len + seq.q_len;
  const int c_begin = seq.past_len / C, c_end = (S + C - 1) / C, n_chunks = c_end - c_begin;
  if (n_chunks <= 0 || S == 0) return std::max(n_chunks, 0);
  const size_t delta_row0 = static_cast<size_t>(seq.q_begin) * dims.Hq, rows = static_cast<size_t>(seq.q_len) * dims.Hq;
  DeviceBuffer<float> delta(rows, stream);
  with_shape(kn, dims.D, [&](auto model, auto d) {
    constexpr int D = decltype(d)::value;
    if (rows > 0) {
      slot_delta_kernel<decltype(model), D>
          <<<grid_for(rows), kBlockThreads, 0, stream>>>(dout, o, delta_row0, rows, delta.get());
      BP_CUDA_CHECK_LAUNCH();
    }
    const KvArgs args{seq, heads(dims), C, c_begin, q, k, v, dout, m, l,
                      delta.get(), static_cast<long long>(delta_row0), dk_part, dv_part};
    const dim3 grid(static_cast<unsigned>((S + kTile - 1) / kTile), static_cast<unsigned>(dims.Hkv),
                    static_cast<unsigned>(n_chunks));
    launch(attn_kv_kernel<decltype(model), D>, grid, kv_smem<D>(), stream, args);
  });
  return n_chunks;
}

// The combine reads no knob: the chunk count and the scale say everything.
void attention_bwd_kv_combine(const Knobs& /*kn*/, AttnDims dims, int S, int n_chunks, const float* dk_part,
                              const float* dv_part, bf16* dk, bf16* dv, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(S) * dims.Hkv * dims.D;
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, size_t{1} << 16));
  kv_combine_kernel<<<blocks, 256, 0, stream>>>(n, n_chunks, ref::attn_scale(dims.D), dk_part, dv_part, dk, dv);
  BP_CUDA_CHECK_LAUNCH();
}

void attention_bwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq, bf16* dk,
                   bf16* dv, cudaStream_t stream) {
  attention_bwd_dq(kn, dims, seqs, n_seqs, q, k, v, o, m, l, dout, dq, stream);
  const int C = kn.grad_token_chunk;
  for (int s = 0; s < n_seqs; ++s) {
    // The sequence's keys see only its queries: chunks before past_len are +0.
    const AttnSeq& seq = seqs[s];
    const int S = seq.past_len + seq.q_len, n_chunks = (S + C - 1) / C, first = seq.past_len / C;
    if (S == 0) continue;
    const size_t chunk_size = static_cast<size_t>(S) * dims.Hkv * dims.D;
    DeviceBuffer<float> dk_part(n_chunks * chunk_size, stream), dv_part(n_chunks * chunk_size, stream);
    if (first > 0) {
      BP_CUDA_CHECK(cudaMemsetAsync(dk_part.get(), 0, first * chunk_size * sizeof(float), stream));
      BP_CUDA_CHECK(cudaMemsetAsync(dv_part.get(), 0, first * chunk_size * sizeof(float), stream));
    }
    attention_bwd_kv_partials(kn, dims, seq, q, k, v, o, m, l, dout, dk_part.get() + first * chunk_size,
                              dv_part.get() + first * chunk_size, stream);
    const size_t rows = static_cast<size_t>(seq.kv_begin) * dims.Hkv * dims.D;
    attention_bwd_kv_combine(kn, dims, S, n_chunks, dk_part.get(), dv_part.get(), dk + rows, dv + rows, stream);
  }
}

}  // namespace bp::cuda
