// The attention forward on the GPU (SPEC.md §5.6; attention_tile.cuh has the tile
// layout, the dot models and the pieces shared with the backward):
//   one CTA per (query tile, kv head): the tile is 64 (query, head) slots of one
//   sequence, query-major (slot u = query u / G, head kvh·G + u % G), so GQA rows
//   share the K/V tiles. KV blocks of 64 keys walk upward; the online-softmax state
//   lives in registers, the split merge in shared memory. Flash-decoding schedule:
//   one CTA per (tile, kv head, split) writes the split's (m, l, acc) and
//   fwd_combine merges splits in order per row.
// Three kernels: attn_fwd_ws_kernel (sm90-tc at head_dim 64 and 128, merged schedule:
// TMA and wgmma in warpgroups, three query tiles a CTA; two at blocks of 128 keys,
// attn_kv_block 128, which only this kernel runs), attn_decode_kernel (sm90-tc
// at head_dim 64 and 128, flash-decoding: 16-slot tiles, four warps sharing each
// block) and attn_fwd_kernel (the rest: mma.sync or the SIMT chain); launch_fwd picks.
#include "optimized/cuda/attention.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "optimized/cuda/attention_tile.cuh"
#include "optimized/cuda/attention_wgmma.cuh"
#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/ptx.cuh"
#include "reference/numerics/dot.h"
#include "reference/numerics/math.h"

namespace bp::cuda {
namespace {

using namespace attn;  // the pieces both passes share (attention_tile.cuh)
using ref::max_num;

// --- forward --------------------------------------------------------------------

struct FwdArgs {
  const AttnSeq* seqs;
  Heads h;
  int split_blocks;
  const bf16 *q, *k, *v;
  bf16* o;
  float *m, *l;
  const Task* tasks;  // merged schedule: a CTA's tile
  // Flash-decoding: the split plan (split_task), the splits' partials.
  const SplitTile* split_tiles;
  int n_split_tiles;
  float* part_acc;  // [T·Hq][max_splits][D]
  float* part_ml;   // [T·Hq][max_splits][2]: m, l
  int max_splits;
};

// maximumNumber as an integer max: a float's key (a NaN the least, so ignored) and
// the float of the largest key (the key map is its own inverse).
__device__ inline int32_t max_key(float x) { return is_nan(x) ? INT32_MIN : total_order_key(x); }
__device__ inline float of_max_key(int32_t key) {
  return float_of(static_cast<uint32_t>(total_order_key(float_of(static_cast<uint32_t>(key)))));
}

// Levels of a tree that halves 2·n values to one (n a power of two).
__host__ __device__ constexpr int halving_levels(int n) { return n <= 1 ? 1 : 1 + halving_levels(n / 2); }

// The block maximum of the thread's rows by maximumNumber (reference step 1, over
// the state values s, −Inf in absent slots), seeded with −Inf. maximumNumber is
// associative and commutative, so any tree gives the reference's sequential bits.
// The fast tree is fmax_nan's (one FMNMX a node): exact wherever no input is NaN and
// the maximum is not a zero (the sign of zero of FMNMX is not specified). A warp any
// of whose rows has a NaN or a ±0 maximum redoes it on the total-order keys (a NaN
// gets the least key, so it is ignored; the key map is its own inverse).
// Returns whether the block is tame: for every row of the warp no state value is NaN
// and |maximum| < 2^30 (softmax_block's exponents are then ≤ 128 and not NaN).
template <int NT>
__device__ bool block_max(float (&bmax)[2], const float (&s)[NT][4]) {
  constexpr int kLevels = halving_levels(NT);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float t[2 * NT];
#pragma unroll
    for (int j = 0; j < 2 * NT; ++j) t[j] = s[j / 2][2 * i + j % 2];
#pragma unroll
    for (int level = 0; level < kLevels; ++level)  // widths NT, …, 1: constant trip counts keep t in registers
#pragma unroll
      for (int j = 0; j < NT; ++j)
        if (j < (NT >> level)) t[j] = fmax_nan(t[j], t[j + (NT >> level)]);
    float r = fmax_nan(t[0], __shfl_xor_sync(kFull, t[0], 1));
    bmax[i] = fmax_nan(r, __shfl_xor_sync(kFull, r, 2));
  }
  const bool tame = fabsf(bmax[0]) < 0x1p30f && fabsf(bmax[1]) < 0x1p30f;  // false for NaN
  const bool inexact = bmax[0] == 0.0f || bmax[1] == 0.0f || is_nan(bmax[0]) || is_nan(bmax[1]);
  if (__any_sync(kFull, inexact)) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int32_t t[2 * NT];
#pragma unroll
      for (int j = 0; j < 2 * NT; ++j) t[j] = max_key(s[j / 2][2 * i + j % 2]);
#pragma unroll
      for (int level = 0; level < kLevels; ++level)
#pragma unroll
        for (int j = 0; j < NT; ++j)
          if (j < (NT >> level)) t[j] = max(t[j], t[j + (NT >> level)]);
      int32_t key = max(t[0], total_order_key(neg_inf()));
      key = max(key, __shfl_xor_sync(kFull, key, 1));
      key = max(key, __shfl_xor_sync(kFull, key, 2));
      bmax[i] = of_max_key(key);
    }
  }
  return __all_sync(kFull, tame);
}

// Levels 1-3 of the pairwise tree over one row's 8 columns of an n8 tile: the
// thread's pair (2t, 2t + 1), then the quad's t ^ 1 and t ^ 2 (addition is
// commutative, so both lanes of a pair hold the same sum).
__device__ inline float n8_tile_sum(float x0, float x1) {
  const float u = add_rn(x0, x1);
  const float v = add_rn(u, __shfl_xor_sync(kFull, u, 1));
  return add_rn(v, __shfl_xor_sync(kFull, v, 2));
}

// pairwise_tree over the 8·NT slots of each of the thread's two rows, both sums in
// every lane of the quad: level 1 pairs a lane's two columns of an n8 tile, levels
// 2-3 the quad's lanes t ^ 1 and t ^ 2, the levels above the NT n8 tiles. The quad
// shares the adds instead of each lane doing all of them: at level 2 lane t keeps
// row t & 1 and hands the other row to its partner, at level 3 it keeps the half
// of the tiles (t >> 1) of that row, adds their levels up to one sum and meets the
// other half's at the top level across t ^ 2; a last shuffle brings the other
// row's sum. Addition is commutative, so which lane adds a pair does not change the
// bits. The selects cost what the halved shuffles and adds save at levels 2-3; the
// levels above are the gain (ncu, 64 slots: 25 instructions fewer a warp-block than
// n8_tile_sum on every tile).
template <int NT>
__device__ void block_row_sums(const float (&p)[NT][4], const Lane& ln, float (&u)[2]) {
  constexpr int kHalf = NT / 2;
  const bool odd = ln.t & 1, upper = ln.t & 2;
  float w[NT];  // level 2 of row t & 1, tile by tile
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float r0 = add_rn(p[nt][0], p[nt][1]), r1 = add_rn(p[nt][2], p[nt][3]);
    const float keep = odd ? r1 : r0, send = odd ? r0 : r1;
    w[nt] = add_rn(keep, __shfl_xor_sync(kFull, send, 1));
  }
  float x[kHalf];  // level 3: tile kHalf·upper + k
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    const float keep = upper ? w[kHalf + k] : w[k], send = upper ? w[k] : w[kHalf + k];
    x[k] = add_rn(keep, __shfl_xor_sync(kFull, send, 2));
  }
#pragma unroll
  for (int level = 1; level < halving_levels(kHalf); ++level)  // the levels above, neighbours paired
#pragma unroll
    for (int k = 0; k < kHalf / 2; ++k)
      if (k < (kHalf >> level)) x[k] = add_rn(x[2 * k], x[2 * k + 1]);
  const float half = x[0];
  const float mine = add_rn(half, __shfl_xor_sync(kFull, half, 2));
  const float other = __shfl_xor_sync(kFull, mine, 1);
  u[0] = odd ? other : mine;
  u[1] = odd ? mine : other;
}

// Reference steps 2-3 on the thread's rows, given the block maximum bmax: the new
// running maximum, its scaled form, and α = exp(scaled old − scaled new). exp(+0) = 1
// is α of a row that does not see the block (for exp2_poly too).
template <bool kBase2>
__device__ void new_maximum(const ref::SoftmaxRule<kBase2>& rule, const float (&m)[2], const float (&bmax)[2],
                            const BlockRows& br, float (&m_new)[2], float (&mc_new)[2], float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    m_new[i] = max_num(m[i], bmax[i]);
    mc_new[i] = rule.scaled_max(m_new[i]);
    alpha[i] = br.act[i] ? rule.factor_exponent(rule.scaled_max(m[i]), mc_new[i]) : 0.0f;
  }
  softmax_exp_in_place<kBase2, 2>(alpha);
}

// The online-softmax step of one block on the thread's two rows (reference
// softmax_block, steps 1-4 and 6, under the contract's SoftmaxRule): s holds the raw
// dots and becomes P (+0 in absent slots); returns α per row (1 for rows that do
// not see the block). kMasked = false: every row that sees the block sees all its
// keys (no absent slots), so no slot is masked; rows that do not see it (br.act
// false: an invalid slot) keep their state, whatever their P.
template <bool kMasked, bool kBase2, int NT>
__device__ void softmax_block(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&alpha)[2], const BlockRows& br,
                              const ref::SoftmaxRule<kBase2>& rule, const Lane& ln) {
  // Every slot takes its state value (v1 scaled, v2 raw); an absent slot becomes
  // −Inf, which maximumNumber ignores and which the select below keeps out of P.
  bool visible[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      visible[nt][e] = !kMasked || ln.col(nt, e % 2) < br.vis[e / 2];
      const float x = rule.state_value(s[nt][e]);
      s[nt][e] = visible[nt][e] ? x : neg_inf();
    }
  float bmax[2], m_new[2], mc_new[2];
  const bool tame = block_max(bmax, s);
  new_maximum(rule, m, bmax, br, m_new, mc_new, alpha);
  // exp(−Inf) = +0 is P of an absent slot (for exp2_poly too).
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& p = s[nt][2 * i + e];
        p = visible[nt][2 * i + e] ? rule.weight_exponent(p, mc_new[i]) : neg_inf();
      }
  // On a tame block (block_max) every visible value z is finite or −Inf and at most
  // the row's m_new ≥ bmax, so the exponent fma(z, c, −RN(m_new·c)) is at most
  // bmax·c − RN(bmax·c), half an ulp of a number below 2^31 (c < 1.45): ≤ 128, and
  // never NaN (m_new is finite or +Inf); an absent slot's is −Inf. There
  // exp2_poly_core equals exp2_poly (math.h) without its clamp and NaN select, and
  // exp2_poly_core_floor equals it with one instruction fewer: 4 a score fewer.
  if (kBase2 && tame) {
#pragma unroll
    for (int j = 0; j < 4 * NT; ++j) (&s[0][0])[j] = exp2_poly_core_floor((&s[0][0])[j]);
  } else {
    softmax_exp_in_place<kBase2, 4 * NT>(&s[0][0]);
  }
  float u[2];
  block_row_sums(s, ln, u);
#pragma unroll
  for (int i = 0; i < 2; ++i)
    if (br.act[i]) {
      l[i] = fma_rn(alpha[i], l[i], u[i]);
      m[i] = m_new[i];
    }
}

// Reference step 5's acc × α for the rows that see the block. Skipped where every
// α of the warp is 1 (the maximum did not change): x × 1 = x for every x but a NaN,
// and acc's NaNs are already canonical (wgmma's, the SIMT chain's and FMUL's are
// all 0x7FFFFFFF), so the bits are the same.
template <int NT>
__device__ void rescale(float (&acc)[NT][4], const float (&alpha)[2], const BlockRows& br) {
  if (!__any_sync(kFull, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (br.act[e / 2]) acc[nt][e] = mul_rn(acc[nt][e], alpha[e / 2]);
}

// Split merge (reference merge_split) of one row's (m, l) into (M, L); each O_d then
// becomes merged(f, O_d, acc_d).
struct MergeFactors {
  float a, b;
};
// The factors of merging a split whose maximum is m into a state whose maximum is
// M; m_new = max_num(M, m).
template <bool kBase2>
__device__ MergeFactors merge_factors(const ref::SoftmaxRule<kBase2>& rule, float M, float m, float m_new) {
  const float mc_new = rule.scaled_max(m_new);
  float x[2] = {rule.factor_exponent(rule.scaled_max(M), mc_new), rule.factor_exponent(rule.scaled_max(m), mc_new)};
  softmax_exp_in_place<kBase2, 2>(x);
  return {x[0], x[1]};
}
template <bool kBase2>
__device__ MergeFactors merge_split(const ref::SoftmaxRule<kBase2>& rule, float& M, float& L, float m, float l) {
  const float m_new = max_num(M, m);
  const MergeFactors f = merge_factors(rule, M, m, m_new);
  L = fma_rn(f.a, L, mul_rn(f.b, l));
  M = m_new;
  return f;
}
__device__ inline float merged(MergeFactors f, float O, float acc) { return fma_rn(f.a, O, mul_rn(f.b, acc)); }

// A split's state before its first block: m = −Inf, l = +0 (start_split_ml), acc = +0.
__device__ inline void start_split_ml(float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    m[i] = neg_inf();
    l[i] = 0.0f;
  }
}
template <int NT>
__device__ void start_split(float (&m)[2], float (&l)[2], float (&acc)[NT][4]) {
  start_split_ml(m, l);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
}

// The end of a split whose first key is split_key for the thread's rows (those
// that reach it): the first split becomes the merged state (M, L, O) as it is,
// a later one merges in (reference merge_split). O is o_at(nt, e), wherever the
// kernel keeps it.
template <bool kBase2, int NT, class OAt>
__device__ void close_split(const ref::SoftmaxRule<kBase2>& rule, int split_key, const int (&pos)[2], float (&M)[2],
                            float (&L)[2], const float (&m)[2], const float (&l)[2], const float (&acc)[NT][4],
                            OAt&& o_at) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pos[i] < split_key) continue;  // the row ended before this split
    if (split_key == 0) {
      M[i] = m[i];
      L[i] = l[i];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) o_at(nt, 2 * i + e) = acc[nt][2 * i + e];
    } else {
      const MergeFactors f = merge_split(rule, M[i], L[i], m[i], l[i]);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) o_at(nt, 2 * i + e) = merged(f, o_at(nt, 2 * i + e), acc[nt][2 * i + e]);
    }
  }
}

// Row i's part of a split's partial (flash-decoding): acc's columns col0 + ln.col(nt, ·)
// and, where `with_ml`, the row's (m, l).
template <int D, int NT>
__device__ void store_split_partial(const FwdArgs& a, size_t row, int split, int col0, int i, const Lane& ln,
                                    const float (&acc)[NT][4], float m, float l, bool with_ml) {
  const size_t at = row * a.max_splits + split;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    *reinterpret_cast<float2*>(a.part_acc + at * D + col0 + ln.col(nt, 0)) =
        make_float2(acc[nt][2 * i], acc[nt][2 * i + 1]);
  if (with_ml) *reinterpret_cast<float2*>(a.part_ml + at * 2) = make_float2(m, l);
}

// The thread's rows that reach first_key: o = R(O ÷ L), m and l (merged schedule),
// or the split's (acc, m, l) partial (flash-decoding).
template <bool kSplitCtas, int D, class OAt>
__device__ void write_rows(const FwdArgs& a, const SlotTile& tile, const Task& task, const Lane& ln,
                           const int (&pos)[2], int first_key, const float (&m)[2], const float (&l)[2],
                           const float (&acc)[D / 8][4], const float (&M)[2], const float (&L)[2], OAt&& o_at) {
  constexpr int NT = D / 8;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pos[i] < first_key) continue;  // invalid row, or (decode schedule) a row this split does not reach
    const size_t row = tile.row_index(ln.row(i));
    if constexpr (kSplitCtas) {
      store_split_partial<D>(a, row, task.split, 0, i, ln, acc, m[i], l[i], ln.t == 0);
    } else {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<uint32_t*>(a.o + row * D + ln.col(nt, 0)) =
            round_bf16x2(div_rn(o_at(nt, 2 * i), L[i]), div_rn(o_at(nt, 2 * i + 1), L[i]));
      if (ln.t == 0) {
        a.m[row] = M[i];
        a.l[row] = L[i];
      }
    }
  }
}

template <class Model, int D, bool kSplitCtas, bool kBase2>
__global__ void __launch_bounds__(kThreads) attn_fwd_kernel(const FwdArgs a) {
  const auto rule = a.h.rule<kBase2>();
  constexpr int LD = kLd<D>, NT = D / 8;
  extern __shared__ uint4 smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + kTile * LD;
  bf16* sV = sK + kTile * LD;
  bf16* sP = sV + kTile * LD;                                // R(P) rows for the SIMT contraction
  float* sO = reinterpret_cast<float*>(sP + kTile * kPLd);  // merged O, thread-private (merged schedule)

  const Task task = kSplitCtas ? split_task(a.split_tiles, a.n_split_tiles, cta_task(a.h)) : a.tasks[cta_task(a.h)];
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
  auto reset_split = [&] { start_split(m, l, acc); };
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
      softmax_block<true>(p, m, l, alpha, br, rule, ln);
      rescale(acc, alpha, br);
    }
    cp_async_wait<1>();  // V(b)
    __syncthreads();
    // Keys past the first row's position are absent for some row of the tile.
    framed_block_product<Model, D>(acc, p, sP, sV, lo_pos + 1 - kb, hi_pos + 1 - kb, br, ln);
    __syncthreads();  // every warp is done with sV
    if (b < end) load_kv(sV, a.v, b + 1);
    if (!kSplitCtas && (b == end || (b + 1) % a.split_blocks == 0)) {
      close_split(rule, (b / a.split_blocks) * a.split_blocks * kTile, pos, M, L, m, l, acc, o_at);
      reset_split();
    }
  }
  write_rows<kSplitCtas, D>(a, tile, task, ln, pos, first * kTile, m, l, acc, M, L, o_at);
}

// --- flash-decoding on four warps (sm90-tc, head_dim 64 and 128) ------------------
// A decode tile holds G slots a query (8 for Qwen3), so attn_fwd_kernel's split CTA
// has one live warp of four and the other three wait at its barriers (v1's longer
// exp made that warp the bound; v2 was already at the DRAM rate both kernels reach:
// bench/DECISIONS.md, attention: four live warps). Here a CTA of
// four warps takes a tile of 16 slots and shares each block among them: warp w
// computes the scores of keys 16w … 16w + 15 and P·V for head columns
// [w·D/4, (w + 1)·D/4); the block maximum and the top two levels of the sum tree
// cross the warps in shared memory. The blocks stream through a ring of
// kDecodeStages cp.async stages, kDecodeStages − 1 of them in flight. Every score,
// maximum, exponential, tree level and k16 group is the one attn_fwd_kernel
// computes, so the bits are the same.
constexpr int kDecodeSlots = 16, kDecodeStages = 3;

template <int D>
struct DecodeSmem {
  bf16 q[kDecodeSlots * kLd<D>];
  bf16 kv[kDecodeStages][2][kTile * kLd<D>];  // K and V of one block a stage
  bf16 p[kDecodeSlots * kPLd];                // R(P) of the block, all 64 keys
  int32_t max_key[4][kDecodeSlots];           // each warp's block maximum (total_order_key)
  float sum[4][kDecodeSlots];                 // each warp's level-4 sums (its two n8 tiles)
};

// Whether a split-CTA launch runs attn_decode_kernel (16-slot tiles) rather than
// attn_fwd_kernel (64-slot tiles).
constexpr bool on_decode_warps(DotModel model, int D) { return model == DotModel::Sm90Tc && D >= 64; }

template <int D, bool kBase2>
__global__ void __launch_bounds__(kThreads) attn_decode_kernel(const FwdArgs a) {
  using Model = Sm90Tc;
  const auto rule = a.h.rule<kBase2>();
  constexpr int LD = kLd<D>, NT = D / 32, kCols = D / 4;  // the warp's n8 tiles and columns of P·V
  extern __shared__ uint4 smem[];
  auto& sm = *reinterpret_cast<DecodeSmem<D>*>(smem);
  const int warp = threadIdx.x / 32;
  const Lane ln(threadIdx.x % 32);  // every warp holds the tile's 16 rows: row(i) = g + 8i

  // The kv heads of a task are neighbouring CTAs (query_grid): together they read
  // whole key rows (Hkv · D contiguous bf16) at about the same time.
  const Task task = split_task(a.split_tiles, a.n_split_tiles, cta_task(a.h));
  const AttnSeq seq = a.seqs[task.seq];
  const SlotTile tile{seq, a.h.G, a.h.Hq, cta_kv_head(a.h), task.slot0,
                      min(seq.q_len * a.h.G, task.slot0 + kDecodeSlots)};  // the tile ends after 16 slots
  const int lo_pos = tile.min_pos(), hi_pos = tile.max_pos();
  int pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) pos[i] = tile.valid(ln.row(i)) ? tile.pos(ln.row(i)) : -1;
  const int first = task.split * a.split_blocks, end = min(hi_pos / kTile, first + a.split_blocks - 1);

  load_tile<D, kDecodeSlots>(sm.q, [&](int r) { return tile.valid(r) ? a.q + tile.row_index(r) * D : nullptr; });
  auto stage = [&](int b) -> bf16(&)[2][kTile * LD] { return sm.kv[(b - first) % kDecodeStages]; };
  auto load_block = [&](int b) {  // one commit group a block, empty past the split
    if (b <= end) {
      load_key_block<D>(stage(b)[0], a.k, tile, a.h.Hkv, b, hi_pos);
      load_key_block<D>(stage(b)[1], a.v, tile, a.h.Hkv, b, hi_pos);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kDecodeStages - 1; ++s) load_block(first + s);  // Q joins the first group

  uint32_t qf[D / 16][4];  // Q's A fragments, the same for every block
  float m[2], l[2], acc[NT][4];
  start_split(m, l, acc);
  for (int b = first; b <= end; ++b) {
    cp_async_wait<kDecodeStages - 2>();  // block b (and Q)
    __syncthreads();                     // and every warp is done with block b − 1's stage
    load_block(b + kDecodeStages - 1);
    if (b == first) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], sm.q + (ln.lane % 16) * LD + (ln.lane / 16) * 8 + kk * 16);
    }
    const bf16* sK = stage(b)[0];
    const bf16* sV = stage(b)[1];
    const int kb = b * kTile, key0 = 16 * warp;
    const BlockRows br(pos, kb);

    // The scores of the warp's 16 keys: n8 tiles 2·warp and 2·warp + 1 of tile_dots.
    float s[2][4] = {};
    const bf16* b_row = sK + (key0 + (ln.lane / 16) * 8 + ln.lane % 8) * LD + ((ln.lane / 8) % 2) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t k_frag[4];
      ldmatrix_x4(k_frag, b_row + kk * 16);
      mma_m16n8k16(s[0], qf[kk], k_frag[0], k_frag[1]);
      mma_m16n8k16(s[1], qf[kk], k_frag[2], k_frag[3]);
    }

    // softmax_block's steps, the maximum and the sum crossing the warps.
    bool visible[2][4];
    int32_t key[2] = {total_order_key(neg_inf()), total_order_key(neg_inf())};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        visible[nt][e] = key0 + ln.col(nt, e % 2) < br.vis[e / 2];
        const float x = visible[nt][e] ? rule.state_value(s[nt][e]) : neg_inf();
        s[nt][e] = x;
        key[e / 2] = max(key[e / 2], max_key(x));
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      key[i] = max(key[i], __shfl_xor_sync(kFull, key[i], 1));
      key[i] = max(key[i], __shfl_xor_sync(kFull, key[i], 2));
      if (ln.t == 0) sm.max_key[warp][ln.row(i)] = key[i];
    }
    __syncthreads();
    float bmax[2], m_new[2], mc_new[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = ln.row(i);
      bmax[i] = of_max_key(max(max(sm.max_key[0][r], sm.max_key[1][r]), max(sm.max_key[2][r], sm.max_key[3][r])));
    }
    new_maximum(rule, m, bmax, br, m_new, mc_new, alpha);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = visible[nt][e] ? rule.weight_exponent(s[nt][e], mc_new[e / 2]) : neg_inf();
    softmax_exp_in_place<kBase2, 8>(&s[0][0]);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float u[2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        u[nt] = n8_tile_sum(s[nt][2 * i], s[nt][2 * i + 1]);
        *reinterpret_cast<uint32_t*>(sm.p + ln.row(i) * kPLd + key0 + ln.col(nt, 0)) =
            round_bf16x2(s[nt][2 * i], s[nt][2 * i + 1]);
      }
      if (ln.t == 0) sm.sum[warp][ln.row(i)] = add_rn(u[0], u[1]);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = ln.row(i);
      const float sum = add_rn(add_rn(sm.sum[0][r], sm.sum[1][r]), add_rn(sm.sum[2][r], sm.sum[3][r]));
      if (br.act[i]) {
        l[i] = fma_rn(alpha[i], l[i], sum);
        m[i] = m_new[i];
      }
    }
    rescale(acc, alpha, br);

    // acc += R(P) · V over the warp's columns (framed_block_product's two paths).
    const int v_first = max(lo_pos + 1 - kb, 0), v_last = min(hi_pos + 1 - kb, kTile);
    const bool slow = v_first < v_last && any_nonfinite<D>(sV, v_first, v_last);
    if (!slow) {
      uint32_t p_frag[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) ldmatrix_x4(p_frag[kk], sm.p + (ln.lane % 16) * kPLd + (ln.lane / 16) * 8 + kk * 16);
      mma_tile(acc, p_frag, sV + warp * kCols, LD, ln);
    } else {
      chain_tile<Model, true>(acc, sm.p, sV + warp * kCols, LD, {0, 0}, br.vis, br.act, ln);
    }
  }

  // The split's partial for the warp's columns.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pos[i] < first * kTile) continue;  // an invalid row, or one this split does not reach
    store_split_partial<D>(a, tile.row_index(ln.row(i)), task.split, warp * kCols, i, ln, acc, m[i], l[i],
                           warp == 0 && ln.t == 0);
  }
}

// --- the forward on wgmma (sm90-tc, head_dim 64 or 128, merged schedule) --------
// attention_wgmma.cuh's CTA with three consumers and the per-row steps of
// attn_fwd_kernel: a consumer's products are S = Q·Kᵀ and acc += R(P)·V. The
// softmax is issue-bound (exp2_poly's Horner chain and the trees), so the CTA
// hides a consumer's waits behind the other consumers' softmax (twelve consumer
// warps a SM) rather than behind a second score array of its own: block b − 1's
// P·V product runs on while block b's scores are issued. Each consumer keeps its
// merged split state O in shared memory; R(P) rows for the SIMT chain are
// gathered from the fragments (gather_fragment_rows), so the three fit in 227 KB.
//
// Blocks of 128 keys (attn_kv_block 128): a block's 64 scores a thread beside acc's
// 64 and the previous block's R(P) do not fit 160 registers, so two consumers of
// 240 registers take the CTA, as in FlashAttention-3.
template <int D, int KB = kTile>
struct WsForward : WsTile<D, KB == kTile ? 3 : 2, KB> {
  using Tile = WsTile<D, KB == kTile ? 3 : 2, KB>;
  static constexpr size_t kOBytes = sizeof(float) * kTile * D;
  // Per consumer: Q; O.
  static constexpr int kConsumerTiles = 1;
  static constexpr size_t kConsumerExtra = kOBytes;
  static constexpr size_t kSmemBytes = Tile::smem_bytes(kConsumerTiles, kConsumerExtra);
  static_assert(kSmemBytes <= 227 * 1024, "a CTA's shared memory on sm_90");
  // 65536 registers a SM, and the warpgroups share what the launch gave the CTA
  // (setmaxnreg moves registers within it): 512 × 128 = 128 × 32 + 384 × 160, or
  // 384 × 168 = 128 × 24 + 256 × 240.
  static constexpr int kProducerRegs = Tile::kConsumers == 3 ? 32 : 24;
  static constexpr int kConsumerRegs = Tile::kConsumers == 3 ? 160 : 240;
};

template <int D, bool kBase2, int KB>
__global__ void __launch_bounds__(WsForward<D, KB>::kThreads, 1) attn_fwd_ws_kernel(
    const FwdArgs a, const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
  using W = WsForward<D, KB>;
  constexpr int NT = D / 8, kScoreTiles = KB / 8;
  extern __shared__ uint8_t smem_raw[];
  const WsCta<D, W::kConsumers, KB> cta(smem_raw, W::kConsumerTiles, W::kConsumerExtra);
  const typename W::Barriers bar(cta.barriers);
  uint64_t *full_k = bar.full_a, *full_v = bar.full_b, *empty_k = bar.empty_a, *empty_v = bar.empty_b;

  const WsQueryTask qt(a.seqs, a.tasks, a.h, W::kSlots, KB);
  const Task& task = qt.task;
  const AttnSeq& seq = qt.seq;
  const int kvh = qt.kvh, n_slots = qt.n_slots, cta_hi_pos = qt.hi_pos, last_block = qt.last_block;
  cta.init();
  if (run_producer<W::kProducerRegs, W::kConsumerRegs>([&] {
        produce_blocks<D, BlockOperand::kValues>(&k_map, &v_map, cta, kvh, seq.kv_begin, last_block, cta_hi_pos);
      }))
    return;

  const int consumer = static_cast<int>(sm90::warp_uniform(threadIdx.x / 128)) - 1;
  const int barrier = 1 + consumer, thread = threadIdx.x % 128;
  const auto rule = a.h.rule<kBase2>();
  uint8_t* sQ = cta.tiles + consumer * W::kTileBytes;
  float* sO = reinterpret_cast<float*>(cta.extra + consumer * W::kConsumerExtra);
  const SlotTile tile{seq, a.h.G, a.h.Hq, kvh, task.slot0 + consumer * kTile, n_slots};
  const Lane ln(thread);
  const bool has_rows = tile.valid(0);
  const int lo_pos = tile.min_pos(), end = has_rows ? tile.max_pos() / KB : -1;
  int pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) pos[i] = tile.valid(ln.row(i)) ? tile.pos(ln.row(i)) : -1;

  load_swizzled_tile<D>(sQ, thread, [&](int r) { return tile.valid(r) ? a.q + tile.row_index(r) * D : nullptr; });
  cp_async_commit();
  cp_async_wait<0>();
  sm90::fence_proxy_async();  // Q, before wgmma reads it
  sm90::warpgroup_sync(barrier);

  float m[2], l[2], M[2] = {0.0f, 0.0f}, L[2] = {0.0f, 0.0f};
  float acc[NT][4];
  start_split(m, l, acc);
  auto o_at = [&](int nt, int e) -> float& { return sO[(nt * 4 + e) * 128 + thread]; };
  auto parity = [](int b) { return static_cast<uint32_t>((b / W::kStages) & 1); };
  const uint32_t q_addr = sm90::shared_addr(sQ);
  auto stage_addr = [&](const uint8_t* stage) { return sm90::warp_uniform(sm90::shared_addr(stage)); };

  // Two consumers take turns at the tensor cores (ConsumerTurns, FlashAttention-3's
  // ping-pong): block b's P·V and block b + 1's scores are one turn, so one
  // consumer's products run while the other's softmax does. Turns: block 0's
  // scores, then one a block.
  constexpr bool kTurns = W::kConsumers == 2;
  const ConsumerTurns turns(consumer, kTurns ? last_block + 2 : 0);
  float s[kScoreTiles][4];  // block b's scores
  int split_first = 0;  // the first block of the split that block b lies in (no division a block)
  // Block b's end once its P·V product is done: its stage of values goes back, and its
  // split closes where the split or this warpgroup's rows end there.
  auto finish_block = [&](int b) {
    warp_arrive(&empty_v[b % W::kStages], ln);
    const bool split_ends = b + 1 - split_first == a.split_blocks;
    if (b <= end && (b == end || split_ends)) {
      close_split(rule, split_first * KB, pos, M, L, m, l, acc, o_at);
      start_split_ml(m, l);
    }
    if (split_ends) split_first = b + 1;
  };
  // Block b's scores are issued and used within block b's step, so ptxas keeps them
  // in the wgmma's registers (carried across blocks, they were copied out: 32 moves
  // a block). What stays in flight across blocks is block b − 1's P·V product; the
  // wait after block b's scores takes both.
#pragma unroll 1
  for (int b = 0; b <= last_block; ++b) {
    const int st = b % W::kStages, kb = b * KB;
    const uint8_t* v = cta.b_stage(b);
    // Unconditional (attention_wgmma.cuh): past this warpgroup's blocks the scores are
    // never used.
    sm90::mbarrier_wait(&full_k[st], parity(b));
    if (kTurns && b == 0) turns.wait();
    issue_scores<D, KB>(reinterpret_cast<float(&)[KB / 2]>(s), q_addr, stage_addr(cta.a_stage(b)));
    if (kTurns) turns.pass(false);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(reinterpret_cast<float(&)[D / 2]>(acc));
    sm90::fence_accumulators(reinterpret_cast<float(&)[KB / 2]>(s));
    warp_arrive(&empty_k[st], ln);
    if (b > 0) finish_block(b - 1);
    const BlockRows br(pos, kb, KB);
    const bool mine = b <= end;
    // A split's first block starts acc from +0 in its product (scale-d = 0), instead of
    // acc being zeroed at the split's end: zeroed under that condition, acc made
    // ptxas move half of it out and back around it on every block (32 IMAD.MOV each way).
    const bool fresh = b == split_first;
    // Keys past the first row's position are absent for some row of the tile.
    const int lo = lo_pos + 1 - kb;
    float alpha[2];
    if (mine) {
      // Every warp runs the softmax (the products are the warpgroup's): a row that
      // does not see the block gets P = +0 and α = 1.
      if (lo < KB) softmax_block<true>(s, m, l, alpha, br, rule, ln);
      else softmax_block<false>(s, m, l, alpha, br, rule, ln);
    }
    uint32_t p[KB / 16][4];
    a_fragments(p, s);
    if (mine && !fresh) rescale(acc, alpha, br);
    sm90::mbarrier_wait(&full_v[st], parity(b));
    const bool slow = mine && lo < KB && any_nonfinite_rows<D, KB>(v, lo, cta_hi_pos + 1 - kb, barrier, thread);
    // The SIMT chain's operands, taken before the product: R(P)'s rows (p's
    // registers are reused) and acc as the block starts (+0 for a split's first).
    uint32_t slow_rows[2][KB / 2];
    float slow_acc[D / 2];
    if (slow) {
      gather_fragment_rows<KB>(slow_rows, p, ln);
      acc_to_memory(slow_acc, acc, fresh);
    }
    // Unconditional, on whatever p holds: past this warpgroup's blocks acc is no longer
    // read, and a slow block's product is replaced by the chain's. (A select of +0
    // operands for those blocks cost 20 instructions a block on the fast path.)
    if (kTurns) turns.wait();
    issue_block_product<D, KB>(reinterpret_cast<float(&)[D / 2]>(acc), p, stage_addr(v), fresh);
    if (kTurns && b == last_block) turns.pass(true);
    if (slow) {
      sm90::wgmma_wait<0>();
      sm90::fence_accumulators(reinterpret_cast<float(&)[D / 2]>(acc));
      chain_swizzled_rows<D, KB>(slow_acc, reinterpret_cast<const bf16*>(slow_rows[0]), KB, v, {0, 0}, br.vis,
                                 br.act, ln);
      acc_from_memory(acc, slow_acc);
    }
  }
  sm90::wgmma_wait<0>();
  sm90::fence_accumulators(reinterpret_cast<float(&)[D / 2]>(acc));
  finish_block(last_block);
  write_rows<false, D>(a, tile, task, ln, pos, 0, m, l, acc, M, L, o_at);
}

// Flash-decoding combine: row (t, h) merges its splits in increasing order (the
// first is the merged state as it is), then o = R(O ÷ L). One block a row, one
// thread per d. merge_split's chain comes apart: the running maximum M_s is one
// max_num a split (thread 0); each split's factors need only M_{s−1}, M_s and m_s,
// and b_s·l_s only those, so the threads form them side by side; what stays a chain
// is L_s = fma(a_s, L_{s−1}, b_s·l_s), one fma a split (thread 0). Then each thread
// folds its O_d through the factors, its first kCombineAhead loads issued before all that.
constexpr int kCombineAhead = 16;
constexpr size_t combine_smem(int max_splits) { return (sizeof(MergeFactors) + 3 * sizeof(float)) * max_splits; }

template <bool kBase2>
__global__ void fwd_combine_kernel(const int* __restrict__ token_pos, Heads h, int D, int split_blocks, int max_splits,
                                   const float* __restrict__ part_acc, const float* __restrict__ part_ml, bf16* o,
                                   float* m, float* l) {
  extern __shared__ MergeFactors factors[];  // [max_splits]: entry s merges split s; entry 0 holds the final (M, L)
  float* split_m = reinterpret_cast<float*>(factors + max_splits);  // m_s
  float* running_m = split_m + max_splits;                          // M_s
  float* split_l = running_m + max_splits;                          // l_s, then b_s·l_s
  const auto rule = h.rule<kBase2>();
  const int p = token_pos[blockIdx.x];
  if (p < 0) return;  // a token of no sequence
  const size_t row = static_cast<size_t>(blockIdx.x) * h.Hq + blockIdx.y, base = row * max_splits;
  const int d = threadIdx.x, splits = p / kTile / split_blocks + 1;
  float ahead[kCombineAhead];
#pragma unroll
  for (int s = 0; s < kCombineAhead; ++s) ahead[s] = s < splits ? part_acc[(base + s) * D + d] : 0.0f;
  for (int s = d; s < splits; s += blockDim.x) {
    split_m[s] = part_ml[2 * (base + s)];
    split_l[s] = part_ml[2 * (base + s) + 1];
  }
  __syncthreads();
  if (d == 0) {
    float M = split_m[0];
    for (int s = 0; s < splits; ++s) running_m[s] = M = max_num(M, split_m[s]);
  }
  __syncthreads();
  for (int s = 1 + d; s < splits; s += blockDim.x) {  // split 0 is the state as it is
    factors[s] = merge_factors(rule, running_m[s - 1], split_m[s], running_m[s]);
    split_l[s] = mul_rn(factors[s].b, split_l[s]);
  }
  __syncthreads();
  if (d == 0) {
    float L = split_l[0];
    for (int s = 1; s < splits; ++s) L = fma_rn(factors[s].a, L, split_l[s]);
    factors[0] = {running_m[splits - 1], L};
    m[row] = running_m[splits - 1];
    l[row] = L;
  }
  __syncthreads();
  float O = ahead[0];
#pragma unroll
  for (int s = 1; s < kCombineAhead; ++s)
    if (s < splits) O = merged(factors[s], O, ahead[s]);
#pragma unroll 8  // the loads of 8 splits ahead of their merges
  for (int s = kCombineAhead; s < splits; ++s) O = merged(factors[s], O, part_acc[(base + s) * D + d]);
  o[row * D + d] = round_bf16(div_rn(O, factors[0].b));
}

// --- host side --------------------------------------------------------------------

template <int D>
constexpr size_t fwd_smem(bool split_ctas) {
  return sizeof(bf16) * (3 * kTile * kLd<D> + kTile * kPLd) + (split_ctas ? 0 : sizeof(float) * D * kTile);
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

// The forward kernel of the shape: on warpgroups for sm90-tc at head_dim 64 and 128
// in the merged schedule, else on mma.sync (head_dim 32 and the decode splits) or
// SIMT (fma-seq). Flash-decoding tiles are mostly empty slots (a decode step fills
// G of them), which the warpgroup's 64-row products cannot skip.
constexpr bool on_warpgroups(DotModel model, int D, bool split_ctas) {
  return model == DotModel::Sm90Tc && D >= 64 && !split_ctas;
}
constexpr int task_slots(DotModel model, int D, bool split_ctas, int kv_block) {
  if (on_warpgroups(model, D, split_ctas))
    return kv_block == kTile ? WsForward<128>::kSlots : WsForward<128, 128>::kSlots;
  return split_ctas && on_decode_warps(model, D) ? kDecodeSlots : kTile;
}

template <bool kSplitCtas>
void launch_fwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, dim3 grid, cudaStream_t stream,
                const FwdArgs& args) {
  with_shape(kn, dims.D, [&](auto model, auto d, auto base2) {
    constexpr int D = decltype(d)::value;
    constexpr bool kBase2 = decltype(base2)::value;
    if constexpr (on_warpgroups(decltype(model)::kModel, D, kSplitCtas)) {
      const KvMaps maps = kv_tensor_maps(seqs, n_seqs, dims, args.k, args.v, kn.attn_kv_block);
      auto run = [&](auto kv_block) {
        constexpr int KB = decltype(kv_block)::value;
        const auto kernel = attn_fwd_ws_kernel<D, kBase2, KB>;
        constexpr size_t smem = WsForward<D, KB>::kSmemBytes;
        BP_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        kernel<<<grid, WsForward<D, KB>::kThreads, smem, stream>>>(args, maps.k, maps.v);
        BP_CUDA_CHECK_LAUNCH();
      };
      if constexpr (kBase2) {  // check_args: blocks of 128 under the v2 softmax only
        if (kn.attn_kv_block == 128) return run(std::integral_constant<int, 128>{});
      }
      run(std::integral_constant<int, kTile>{});
    } else if constexpr (kSplitCtas && on_decode_warps(decltype(model)::kModel, D)) {
      launch(attn_decode_kernel<D, kBase2>, grid, sizeof(DecodeSmem<D>), stream, args);
    } else {
      launch(attn_fwd_kernel<decltype(model), D, kSplitCtas, kBase2>, grid, fwd_smem<D>(kSplitCtas), stream, args);
    }
  });
}

// Appends n records made of ints to a table of them; returns where they start.
template <class T>
size_t append_words(std::vector<int32_t>& table, const T* records, size_t n) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) % sizeof(int32_t) == 0 && alignof(T) == alignof(int32_t),
                "a record of ints");
  const size_t at = table.size();
  const auto* words = reinterpret_cast<const int32_t*>(records);
  table.insert(table.end(), words, words + n * sizeof(T) / sizeof(int32_t));
  return at;
}

// The merged schedule: one CTA per query tile (and kv head) runs all its splits.
// The sequences and the tiles go up in one upload (each pageable upload adds host
// time to the call before its kernel).
void fwd_merged(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, FwdArgs args, cudaStream_t stream) {
  const std::vector<Task> tasks =
      plan_tiles(seqs, n_seqs, dims.Hq / dims.Hkv, task_slots(kn.dot, dims.D, false, kn.attn_kv_block));
  if (tasks.empty()) return;
  std::vector<int32_t> table;
  const size_t seqs_at = append_words(table, seqs, n_seqs), tasks_at = append_words(table, tasks.data(), tasks.size());
  const DeviceBuffer<int32_t> d_table(table, stream);
  args.seqs = reinterpret_cast<const AttnSeq*>(d_table.get() + seqs_at);
  args.tasks = reinterpret_cast<const Task*>(d_table.get() + tasks_at);
  launch_fwd<false>(kn, dims, seqs, n_seqs, query_grid(tasks.size(), dims.Hkv), stream, args);
}

// Flash-decoding: one CTA per (split, tile, kv head) writes the split's partial and
// fwd_combine merges each row's splits. The sequences, the split plan and each
// token's position (the combine's) go up in one upload: with a task table, most of
// a decode call's host time before its first kernel was the plan's per-split
// records (bench/DECISIONS.md, attention: four live warps and the plan on the device).
void fwd_split_ctas(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, FwdArgs args,
                    cudaStream_t stream) {
  const SplitPlan plan =
      plan_split_tiles(seqs, n_seqs, dims.Hq / dims.Hkv, args.split_blocks, task_slots(kn.dot, dims.D, true, kTile));
  if (plan.n_tasks == 0) return;
  int T = 0, max_pos = 0;
  for (int s = 0; s < n_seqs; ++s)
    if (seqs[s].q_len > 0) {
      T = std::max(T, seqs[s].q_begin + seqs[s].q_len);
      max_pos = std::max(max_pos, seqs[s].past_len + seqs[s].q_len - 1);
    }
  std::vector<int> token_pos(T, -1);
  for (int s = 0; s < n_seqs; ++s)
    for (int i = 0; i < seqs[s].q_len; ++i) token_pos[seqs[s].q_begin + i] = seqs[s].past_len + i;
  std::vector<int32_t> table;
  const size_t seqs_at = append_words(table, seqs, n_seqs);
  const size_t tiles_at = append_words(table, plan.tiles.data(), plan.tiles.size());
  const size_t pos_at = append_words(table, token_pos.data(), token_pos.size());
  const DeviceBuffer<int32_t> d_table(table, stream);
  args.seqs = reinterpret_cast<const AttnSeq*>(d_table.get() + seqs_at);
  args.split_tiles = reinterpret_cast<const SplitTile*>(d_table.get() + tiles_at);
  args.n_split_tiles = static_cast<int>(plan.tiles.size());
  args.max_splits = max_pos / kTile / args.split_blocks + 1;
  const size_t slots = static_cast<size_t>(T) * dims.Hq * args.max_splits;  // rows × splits
  DeviceBuffer<float> partials(slots * (dims.D + 2), stream);
  args.part_acc = partials.get();
  args.part_ml = partials.get() + slots * dims.D;
  launch_fwd<true>(kn, dims, seqs, n_seqs, query_grid(plan.n_tasks, dims.Hkv), stream, args);
  const auto combine = kn.softmax_exp == SoftmaxExp::kExp2Poly ? fwd_combine_kernel<true> : fwd_combine_kernel<false>;
  const size_t smem = combine_smem(args.max_splits);
  if (smem > 48 * 1024)  // contexts past 1.2 M keys at splits of 512
    BP_CUDA_CHECK(cudaFuncSetAttribute(combine, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  combine<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(dims.Hq)), dims.D, smem, stream>>>(
      d_table.get() + pos_at, args.h, dims.D, args.split_blocks, args.max_splits, args.part_acc, args.part_ml, args.o,
      args.m, args.l);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_fwd_scheduled(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q,
                             const bf16* k, const bf16* v, bf16* o, float* m, float* l, FwdSchedule schedule,
                             cudaStream_t stream) {
  // Blocks of 128 keys run on the warpgroup forward alone, which the automatic
  // schedule then keeps (check_args refuses them anywhere else). The arguments are
  // checked before anything is derived from them.
  const bool wide_blocks = kn.attn_kv_block == 128 && on_warpgroups(kn.dot, dims.D, false) &&
                           schedule != FwdSchedule::kSplitCtas;
  check_args(kn, dims, seqs, n_seqs, wide_blocks);
  check_aligned({q, k, v, o});
  const int split_blocks = kn.attn_kv_split / kn.attn_kv_block;
  const bool split_ctas =
      schedule == FwdSchedule::kSplitCtas ||
      (schedule == FwdSchedule::kAuto && !wide_blocks && prefer_split_ctas(seqs, n_seqs, dims, split_blocks));
  FwdArgs args{};
  args.h = heads(dims);
  args.split_blocks = split_blocks;
  args.q = q, args.k = k, args.v = v, args.o = o, args.m = m, args.l = l;
  if (split_ctas) fwd_split_ctas(kn, dims, seqs, n_seqs, args, stream);
  else fwd_merged(kn, dims, seqs, n_seqs, args, stream);
}

void attention_fwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, bf16* o, float* m, float* l, cudaStream_t stream) {
  attention_fwd_scheduled(kn, dims, seqs, n_seqs, q, k, v, o, m, l, FwdSchedule::kAuto, stream);
}

}  // namespace bp::cuda
