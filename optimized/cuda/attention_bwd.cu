// The attention backward on the GPU (SPEC.md §5.6; attention_tile.cuh has the tile
// layout, the dot models and the pieces shared with the forward, attention_wgmma.cuh
// the warpgroup CTA):
//   Δ        dot(dout, o) per query row, once per backward (slot_delta_mma_kernel
//            under sm90-tc, slot_delta_kernel under fma-seq).
//   dq       one CTA per (query tile, kv head), key blocks upward, one chain per row:
//            attn_dq_ws_kernel (sm90-tc, head_dim 64 and 128: TMA and wgmma, two
//            query tiles a CTA) or attn_dq_kernel (the rest).
//   dk, dv   one CTA per (key tile, kv head, query chunk): the chunk's slots are the
//            contraction dimension, in 64-slot tiles from the chunk's first slot;
//            partials go to global memory and kv_combine runs the pairwise tree over
//            chunks (as a binary counter: same bits). attn_kv_ws_kernel (sm90-tc,
//            head_dim 64 and 128, slot tiles of whole tokens: two 64-key tiles a CTA)
//            or attn_kv_kernel (the rest).
#include "optimized/cuda/attention.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
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

// The same on the tensor cores (sm90-tc): a warp takes 16 rows and forms D = A·B by
// mma.sync over the head's D in k16 groups from +0, A = dout's rows, B[k][n] = o[row
// n][k]; D[m][m] is row m's chain (for_diagonal). Rows past n arrive as zeros.
constexpr int kDeltaWarps = 4;
template <int D>
__global__ void __launch_bounds__(kDeltaWarps* kWarp)
    slot_delta_mma_kernel(const bf16* __restrict__ dout, const bf16* __restrict__ o, size_t row0, size_t n,
                          float* __restrict__ delta) {
  constexpr int LD = kLd<D>;
  __shared__ __align__(16) bf16 tiles[kDeltaWarps][2][16 * LD];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const size_t first = (static_cast<size_t>(blockIdx.x) * kDeltaWarps + warp) * 16;
  if (first >= n) return;  // no block barrier below
  bf16 *sA = tiles[warp][0], *sB = tiles[warp][1];
  for (int p = lane; p < 16 * D / 8; p += kWarp) {
    const int r = p / (D / 8), c = p % (D / 8) * 8;
    const bool in = first + r < n;
    const size_t at = (row0 + first + (in ? r : 0)) * D + c;
    cp_async16(sA + r * LD + c, dout + at, in ? 16 : 0);
    cp_async16(sB + r * LD + c, o + at, in ? 16 : 0);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  // ldmatrix rows of this lane (matrix j = lane / 8, its row lane % 8): A's matrices are
  // (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15); B's, stored
  // [n][k], (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
  const int j = lane / 8, r = lane % 8;
  const int a_at = (r + 8 * (j % 2)) * LD + 8 * (j / 2), b_at = (r + 8 * (j / 2)) * LD + 8 * (j % 2);
  float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < D; k += 16) {
    uint32_t a[4], b[4];
    ldmatrix_x4(a, sA + a_at + k);
    ldmatrix_x4(b, sB + b_at + k);
    mma_m16n8k16(d0, a, b[0], b[1]);
    mma_m16n8k16(d1, a, b[2], b[3]);
  }
  for_diagonal(d0, d1, lane, [&](int g, float lo, float hi) {
    if (first + g < n) delta[first + g] = lo;
    if (first + 8 + g < n) delta[first + 8 + g] = hi;
  });
}

// P = weight(s, m) · (1 ÷ l) of the thread's elements in place (reference
// recompute_probs under the contract's SoftmaxRule; then dS = P · (dp − Δ)), from
// the raw dots s = q·k; element [nt][e] takes its m and 1 ÷ l at sM[at(nt, e)],
// sInvL[at(nt, e)].
template <bool kBase2, class At>
__device__ void probabilities(float (&s)[8][4], const ref::SoftmaxRule<kBase2>& rule, const float* sM,
                              const float* sInvL, At at) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[nt][e] = rule.weight_exponent(rule.state_value(s[nt][e]), rule.scaled_max(sM[at(nt, e)]));
  softmax_exp_in_place<kBase2, 32>(&s[0][0]);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = mul_rn(s[nt][e], sInvL[at(nt, e)]);
}

// dq = R(scale × c) of the thread's valid rows (reference step 3).
template <int D>
__device__ void write_dq_rows(bf16* dq, float scale, const SlotTile& tile, const int (&pos)[2],
                              const float (&acc)[D / 8][4], const Lane& ln) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (pos[i] < 0) continue;
    bf16* out = dq + tile.row_index(ln.row(i)) * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<uint32_t*>(out + ln.col(nt, 0)) =
          round_bf16(mul_rn(scale, acc[nt][2 * i])).bits |
          (static_cast<uint32_t>(round_bf16(mul_rn(scale, acc[nt][2 * i + 1])).bits) << 16);
  }
}

template <class Model, int D, bool kBase2>
__global__ void __launch_bounds__(kThreads) attn_dq_kernel(const BwdArgs a) {
  const auto rule = a.h.rule<kBase2>();
  constexpr int LD = kLd<D>, NT = D / 8;
  extern __shared__ uint4 smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + kTile * LD;
  bf16* sK = sdO + kTile * LD;
  bf16* sV = sK + kTile * LD;
  bf16* sDS = sV + kTile * LD;
  float* sM = reinterpret_cast<float*>(sDS + kTile * kPLd);
  float* sInvL = sM + kTile;
  float* sDelta = sInvL + kTile;

  const SlotTile tile = slot_tile(a.seqs, a.tasks[cta_task(a.h)], a.h);
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
      probabilities(ds, rule, sM, sInvL, [&](int, int e) { return ln.row(e / 2); });
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = ds[nt][e], delta = sDelta[ln.row(e / 2)];
          ds[nt][e] =
              ln.col(nt, e % 2) < br.vis[e / 2] ? widen(round_bf16(mul_rn(p, sub_rn(dp[nt][e], delta)))) : 0.0f;
        }
    }
    framed_block_product<Model, D>(acc, ds, sDS, sK, lo_pos + 1 - kb, hi_pos + 1 - kb, br, ln);
    __syncthreads();
    if (b < last_block) {
      load_key_block<D>(sK, a.k, tile, a.h.Hkv, b + 1, hi_pos);
      cp_async_commit();
    }
  }

  write_dq_rows<D>(a.dq, a.h.scale, tile, pos, acc, ln);
}

// --- backward: dq on wgmma (sm90-tc, head_dim 64 or 128) ---------------------------
// attention_wgmma.cuh's CTA with attn_dq_kernel's per-row steps: a consumer holds Q
// and dO of its 64 slots and runs S = Q·Kᵀ and dP = dO·Vᵀ (wgmma, one commit group
// each), then dS in registers and acc += R(dS)·K with K read N-major. m_c, 1 ÷ l and
// Δ are per row, so they live in the thread's registers (Δ from slot_delta_mma_kernel).
template <int D>
struct WsDq : WsTile<D> {
  // Per consumer: Q and dO; the R(dS) rows.
  static constexpr int kConsumerTiles = 2;
  static constexpr size_t kConsumerExtra = WsTile<D>::kPBytes;
  static constexpr size_t kSmemBytes = WsTile<D>::smem_bytes(kConsumerTiles, kConsumerExtra);
  static_assert(kSmemBytes <= 227 * 1024, "a CTA's shared memory on sm_90");
};

struct DqWsArgs {
  const AttnSeq* seqs;
  const Task* tasks;
  Heads h;
  const bf16 *q, *dout;
  const float *m, *l, *delta;  // delta: Δ of every query row, indexed as m
  bf16* dq;
};

// The fragments of R(dS) of one block from the raw scores s and dP (reference step
// 2 and the dS product; +0 where kMasked and the slot is absent): P = exp(s, m_c) ×
// (1 ÷ l), dS = P × (dP − Δ). Unmasked, every row that sees the block sees all its
// keys and a row that sees none is never written. One n8 tile at a time: the scores
// die as their fragments form. (Waiting for S alone and forming P while dP's product
// runs was slower: the two tiles' registers then live across the exponentials.)
template <bool kMasked, bool kBase2>
__device__ void block_ds(const float (&s)[8][4], const float (&dp)[8][4], const ref::SoftmaxRule<kBase2>& rule,
                         const float (&mc)[2], const float (&inv_l)[2], const float (&delta)[2], const BlockRows& br,
                         const Lane& ln, uint32_t (&fds)[4][4]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    float x[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = rule.weight_exponent(rule.state_value(s[nt][e]), mc[e / 2]);
    softmax_exp_in_place<kBase2, 4>(x);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float ds = mul_rn(mul_rn(x[e], inv_l[e / 2]), sub_rn(dp[nt][e], delta[e / 2]));
      x[e] = !kMasked || ln.col(nt, e % 2) < br.vis[e / 2] ? ds : 0.0f;
    }
    put_fragment(fds, nt, 0, x[0], x[1]);
    put_fragment(fds, nt, 1, x[2], x[3]);
  }
}

template <int D, bool kBase2>
__global__ void __launch_bounds__(WsDq<D>::kThreads, 1) attn_dq_ws_kernel(
    const DqWsArgs a, const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map) {
  using W = WsDq<D>;
  constexpr int NT = D / 8;
  extern __shared__ uint8_t smem_raw[];
  const WsCta<D> cta(smem_raw, W::kConsumerTiles, W::kConsumerExtra);
  const typename W::Barriers bar(cta.barriers);

  const WsQueryTask qt(a.seqs, a.tasks, a.h, W::kSlots);
  const AttnSeq& seq = qt.seq;
  const int kvh = qt.kvh, n_slots = qt.n_slots, cta_hi_pos = qt.hi_pos, last_block = qt.last_block;
  cta.init();
  if (run_producer<40, 232>([&] {
        produce_blocks<D, BlockOperand::kKeys>(&k_map, &v_map, cta, kvh, seq.kv_begin, last_block, cta_hi_pos);
      }))
    return;

  const int consumer = threadIdx.x / 128 - 1, barrier = 1 + consumer, thread = threadIdx.x % 128;
  const auto rule = a.h.rule<kBase2>();
  uint8_t* sQ = cta.tiles + consumer * W::kConsumerTiles * W::kTileBytes;
  uint8_t* sdO = sQ + W::kTileBytes;
  bf16* sDS = reinterpret_cast<bf16*>(cta.extra + consumer * W::kConsumerExtra);
  const SlotTile tile{seq, a.h.G, a.h.Hq, kvh, qt.task.slot0 + consumer * kTile, n_slots};
  const Lane ln(thread);
  const int lo_pos = tile.min_pos(), end = tile.valid(0) ? tile.max_pos() / kTile : -1;
  int pos[2];
  float mc[2], inv_l[2], delta[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool valid = tile.valid(ln.row(i));
    const size_t row = valid ? tile.row_index(ln.row(i)) : 0;
    pos[i] = valid ? tile.pos(ln.row(i)) : -1;
    mc[i] = valid ? rule.scaled_max(a.m[row]) : 0.0f;
    inv_l[i] = valid ? div_rn(1.0f, a.l[row]) : 0.0f;
    delta[i] = valid ? a.delta[row] : 0.0f;
  }
  load_swizzled_tile<D>(sQ, thread, [&](int r) { return tile.valid(r) ? a.q + tile.row_index(r) * D : nullptr; });
  load_swizzled_tile<D>(sdO, thread, [&](int r) { return tile.valid(r) ? a.dout + tile.row_index(r) * D : nullptr; });
  cp_async_commit();
  cp_async_wait<0>();
  sm90::fence_proxy_async();  // Q and dO, before wgmma reads them
  sm90::warpgroup_sync(barrier);

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  const uint32_t q_addr = sm90::shared_addr(sQ), do_addr = sm90::shared_addr(sdO);
  const uint32_t zero_addr = sm90::shared_addr(cta.zeros);
#pragma unroll 1
  for (int b = 0; b <= last_block; ++b) {
    const int st = b % W::kStages, kb = b * kTile;
    const uint32_t parity = (b / W::kStages) & 1;
    const uint8_t* k = cta.a_stage(b);
    float s[8][4], dp[8][4];
    sm90::mbarrier_wait(&bar.full_a[st], parity);
    issue_scores<D>(reinterpret_cast<float(&)[32]>(s), q_addr, sm90::shared_addr(k));
    sm90::mbarrier_wait(&bar.full_b[st], parity);
    issue_scores<D>(reinterpret_cast<float(&)[32]>(dp), do_addr, sm90::shared_addr(cta.b_stage(b)));
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(reinterpret_cast<float(&)[32]>(s));
    sm90::fence_accumulators(reinterpret_cast<float(&)[32]>(dp));
    warp_arrive(&bar.empty_b[st], ln);
    const BlockRows br(pos, kb);
    const bool mine = b <= end;
    // Keys past the first row's position are absent for some row of the tile.
    const int lo = lo_pos + 1 - kb;
    uint32_t fds[4][4];
    if (mine) {
      if (lo < kTile) block_ds<true>(s, dp, rule, mc, inv_l, delta, br, ln, fds);
      else block_ds<false>(s, dp, rule, mc, inv_l, delta, br, ln, fds);
    }
    const bool slow = mine && lo < kTile && any_nonfinite_rows<D>(k, lo, cta_hi_pos + 1 - kb, barrier, thread);
    // Past this warpgroup's blocks acc is no longer read.
    issue_block_product_or_zero<D>(reinterpret_cast<float(&)[D / 2]>(acc), fds, sm90::shared_addr(k), zero_addr,
                                   !mine || slow);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(reinterpret_cast<float(&)[D / 2]>(acc));
    if (slow && br.warp_live) {
      store_fragments(sDS, fds, ln);
      __syncwarp();
      chain_swizzled_rows<D>(acc, sDS, k, {0, 0}, br.vis, br.act, ln);
    }
    warp_arrive(&bar.empty_a[st], ln);
  }
  write_dq_rows<D>(a.dq, a.h.scale, tile, pos, acc, ln);
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
  // Leave the partials of chunks ending at or before the key unwritten: the combine
  // does not read them (attention_bwd). The public kv_partials writes every row.
  bool skip_unseen;
  __device__ bool unseen(int c, int key) const { return skip_unseen && (c + 1) * C <= key; }
};

template <class Model, int D, bool kBase2>
__global__ void __launch_bounds__(kThreads) attn_kv_kernel(const KvArgs a) {
  const auto rule = a.h.rule<kBase2>();
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
  if (a.unseen(c, key0)) return;
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
      probabilities(pb, rule, sM, sInvL, [&](int nt, int e) { return ln.col(nt, e % 2); });
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
    if (key[i] >= S || a.unseen(c, key[i])) continue;
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

// --- backward: dk, dv chunk partials on wgmma (sm90-tc, head_dim 64 or 128) ---------
// A CTA per (128 keys, kv head, query chunk): the producer warp streams the chunk's
// 64-slot tiles of Q (ring a) and dO (ring b) by TMA, each a 3-D box of 64 / G
// tokens × G heads × 64 columns (the frame's query-major slot order), with the
// slots' statistics; each consumer holds its 64 keys' K and V and runs Sᵀ = K·Qᵀ
// and dPᵀ = V·dOᵀ (wgmma), Pᵀ and dSᵀ in registers, then dv += R(Pᵀ)·dO and
// dk += R(dSᵀ)·Q with dO and Q read N-major: the slots are the contraction, 4 k16
// groups a tile from its first slot, as the chunk's sm90-tc chain groups them.
// A slot tile's statistics, staged with its Q and dO: m_c, 1 ÷ l, Δ and the
// position (−1: not a slot of the chunk that sees a key of the CTA).
struct SlotStats {
  float mc[kTile], inv_l[kTile], delta[kTile];
  int pos[kTile];
};

template <int D>
struct WsKv : WsTile<D> {
  static constexpr int kKeys = WsTile<D>::kConsumers * kTile;  // keys a CTA
  // The producer warp writes each stage's statistics (and cleared rows) with plain
  // stores, so every writer arrives on its full barrier after its stores and every
  // consumer thread on its empty one after its reads (a lane's arrival after
  // __syncwarp orders only that lane's own accesses for compute-sanitizer).
  static constexpr uint32_t kFullArrivals = 32;
  static constexpr uint32_t kEmptyArrivals = 128 * WsTile<D>::kConsumers;
  // Per consumer: K and V; the R(Pᵀ) and R(dSᵀ) rows. For all: the stages' statistics.
  static constexpr int kConsumerTiles = 2;
  static constexpr size_t kConsumerExtra = 2 * WsTile<D>::kPBytes;
  static constexpr size_t kSharedBytes = WsTile<D>::kStages * sizeof(SlotStats);
  static constexpr size_t kSmemBytes = WsTile<D>::smem_bytes(kConsumerTiles, kConsumerExtra, kSharedBytes);
  static_assert(kSmemBytes <= 227 * 1024, "a CTA's shared memory on sm_90");
};

// Which slots of a chunk the CTA's keys meet: the frame's 64-slot tiles
// [t_begin, t_end), positions [first_pos, end_pos) (the rest of a tile is cleared).
struct KvChunk {
  int G, chunk_pos0, first_pos, end_pos, t_begin, t_end;
  __device__ KvChunk(const AttnSeq& s, int C, int G_, int c, int key0) : G(G_) {
    const int S = s.past_len + s.q_len;
    chunk_pos0 = c * C;
    first_pos = max(s.past_len, key0);
    end_pos = min(S, (c + 1) * C);
    t_begin = first_pos > chunk_pos0 ? (first_pos - chunk_pos0) * G / kTile : 0;
    t_end = end_pos > first_pos ? ((end_pos - chunk_pos0) * G + kTile - 1) / kTile : t_begin;
  }
  __device__ int pos(int t, int r) const { return chunk_pos0 + (t * kTile + r) / G; }  // slot r of tile t
  __device__ bool valid(int t, int r) const {
    const int p = pos(t, r);
    return p >= first_pos && p < end_pos;
  }
};

// The producer: slot tile t of the chunk (the i-th of the CTA) into stage i % kStages
// with its statistics, once both consumers have released the stage. Rows of slots
// outside [first_pos, end_pos) (before the CTA's first key, past the chunk or the
// sequence: another sequence's rows, or none) become +0 before the consumers see
// the tile, as absent slots must be for the tensor core.
template <int D, bool kBase2>
__device__ void produce_slot_tiles(const CUtensorMap* q_map, const CUtensorMap* do_map, const WsCta<D>& cta,
                                   const KvArgs& a, const KvChunk& ch, int kvh) {
  using W = WsKv<D>;
  const typename W::Barriers bar(cta.barriers);
  const auto rule = a.h.rule<kBase2>();
  const int lane = threadIdx.x % 32;
  int clears = 0;
  for (int t = ch.t_begin; t < ch.t_end; ++t) {
    const int i = t - ch.t_begin, st = i % W::kStages, use = i / W::kStages;
    // Every lane waits: each writes the stage (statistics, cleared rows) after the
    // consumers' reads of its previous tile.
    if (use > 0) sm90::mbarrier_wait(&bar.empty_a[st], (use - 1) & 1);
    SlotStats& stats = reinterpret_cast<SlotStats*>(cta.shared)[st];
    for (int r = lane; r < kTile; r += 32) {
      const bool valid = ch.valid(t, r);
      const size_t row = valid ? static_cast<size_t>(a.s.q_begin + ch.pos(t, r) - a.s.past_len) * a.h.Hq +
                                     kvh * ch.G + r % ch.G
                               : 0;
      stats.mc[r] = valid ? rule.scaled_max(a.m[row]) : 0.0f;
      stats.inv_l[r] = valid ? div_rn(1.0f, a.l[row]) : 0.0f;
      stats.delta[r] = valid ? a.delta[row - a.delta_row0] : 0.0f;
      stats.pos[r] = valid ? ch.pos(t, r) : -1;
    }
    // Every lane arrives on the full barrier after its own writes (kFullArrivals);
    // lane 0's arrival also announces the copies' bytes.
    const bool clear = !ch.valid(t, 0) || !ch.valid(t, kTile - 1);
    uint8_t *q = cta.a_stage(i), *dout = cta.b_stage(i);
    if (lane == 0) {
      uint64_t* full = clear ? bar.landed : &bar.full_a[st];
      const int token0 = a.s.q_begin + ch.pos(t, 0) - a.s.past_len;
      sm90::mbarrier_arrive_expect_tx(full, 2 * W::kTileBytes);
      for (int x = 0; x < W::kBoxes; ++x) {
        sm90::tma_load_3d(q + x * W::kBoxBytes, q_map, full, 64 * x, kvh * ch.G, token0);
        sm90::tma_load_3d(dout + x * W::kBoxBytes, do_map, full, 64 * x, kvh * ch.G, token0);
      }
    } else if (!clear) {
      sm90::mbarrier_arrive(&bar.full_a[st]);
    }
    if (clear) {
      sm90::mbarrier_wait(bar.landed, clears++ & 1);
      for (int c = lane; c < kTile * W::kRowChunks; c += 32) {
        const int r = c / W::kRowChunks;
        if (ch.valid(t, r)) continue;
        *reinterpret_cast<uint4*>(q + W::chunk(r, c % W::kRowChunks)) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(dout + W::chunk(r, c % W::kRowChunks)) = make_uint4(0, 0, 0, 0);
      }
      sm90::fence_proxy_async();  // the zeros, before wgmma reads them
      sm90::mbarrier_arrive(&bar.full_a[st]);
    }
  }
}

// The fragments of R(Pᵀ) and R(dSᵀ) of one slot tile from the raw Sᵀ (s) and dPᵀ
// (dp), +0 where a slot is absent for the row's key (reference step 2 and dS; a key
// past the sequence sees no slot). One n8 tile at a time, as block_ds: the tiles die
// as their fragments form, which keeps dk, dv and both tiles in registers.
template <bool kBase2>
__device__ void tile_p_ds(const float (&s)[8][4], const float (&dp)[8][4], const ref::SoftmaxRule<kBase2>& rule,
                          const SlotStats& stats, const int (&key)[2], const Lane& ln, uint32_t (&fp)[4][4],
                          uint32_t (&fds)[4][4]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int col = ln.col(nt, 0);  // and col + 1
    const float2 mc = *reinterpret_cast<const float2*>(stats.mc + col);
    const float2 inv_l = *reinterpret_cast<const float2*>(stats.inv_l + col);
    const float2 delta = *reinterpret_cast<const float2*>(stats.delta + col);
    const int2 pos = *reinterpret_cast<const int2*>(stats.pos + col);
    float p[4], ds[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = rule.weight_exponent(rule.state_value(s[nt][e]), e % 2 ? mc.y : mc.x);
    softmax_exp_in_place<kBase2, 4>(p);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool present = (e % 2 ? pos.y : pos.x) >= key[e / 2];
      const float pe = mul_rn(p[e], e % 2 ? inv_l.y : inv_l.x);
      ds[e] = present ? mul_rn(pe, sub_rn(dp[nt][e], e % 2 ? delta.y : delta.x)) : 0.0f;
      p[e] = present ? pe : 0.0f;
    }
    put_fragment(fp, nt, 0, p[0], p[1]);
    put_fragment(fp, nt, 1, p[2], p[3]);
    put_fragment(fds, nt, 0, ds[0], ds[1]);
    put_fragment(fds, nt, 1, ds[2], ds[3]);
  }
}

template <int D, bool kBase2>
__global__ void __launch_bounds__(WsKv<D>::kThreads, 1) attn_kv_ws_kernel(
    const KvArgs a, const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap do_map) {
  using W = WsKv<D>;
  constexpr int NT = D / 8;
  extern __shared__ uint8_t smem_raw[];
  const WsCta<D> cta(smem_raw, W::kConsumerTiles, W::kConsumerExtra, W::kSharedBytes);
  const typename W::Barriers bar(cta.barriers);
  const AttnSeq& s = a.s;
  const int S = s.past_len + s.q_len, kvh = static_cast<int>(blockIdx.y);
  const int c = a.c_begin + static_cast<int>(blockIdx.z);
  if (a.unseen(c, static_cast<int>(blockIdx.x) * W::kKeys)) return;  // before any barrier: the whole CTA
  const KvChunk ch(s, a.C, a.h.G, c, static_cast<int>(blockIdx.x) * W::kKeys);
  cta.init(W::kFullArrivals, W::kEmptyArrivals);
  // dk and dv take 128 registers a consumer thread at D = 128: the producer keeps 24.
  if (run_producer<24, 240>([&] { produce_slot_tiles<D, kBase2>(&q_map, &do_map, cta, a, ch, kvh); })) return;

  const int consumer = threadIdx.x / 128 - 1, barrier = 1 + consumer, thread = threadIdx.x % 128;
  const auto rule = a.h.rule<kBase2>();
  const int key0 = static_cast<int>(blockIdx.x) * W::kKeys + consumer * kTile, key_last = min(key0 + kTile, S) - 1;
  uint8_t* sK = cta.tiles + consumer * W::kConsumerTiles * W::kTileBytes;
  uint8_t* sV = sK + W::kTileBytes;
  bf16* sP = reinterpret_cast<bf16*>(cta.extra + consumer * W::kConsumerExtra);
  bf16* sDS = sP + kTile * kPLd;
  const Lane ln(thread);
  auto key_row = [&](const bf16* base, int r) {
    return key0 + r < S ? base + (static_cast<size_t>(s.kv_begin + key0 + r) * a.h.Hkv + kvh) * D : nullptr;
  };
  if (ch.t_begin < ch.t_end) {  // else no slot of the chunk sees a key of the CTA: the partials are +0
    load_swizzled_tile<D>(sK, thread, [&](int r) { return key_row(a.k, r); });
    load_swizzled_tile<D>(sV, thread, [&](int r) { return key_row(a.v, r); });
  }
  cp_async_commit();
  cp_async_wait<0>();
  sm90::fence_proxy_async();  // K and V, before wgmma reads them
  sm90::warpgroup_sync(barrier);

  int key[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) key[i] = key0 + ln.row(i);
  float dk[NT][4], dv[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nt][e] = dv[nt][e] = 0.0f;
  const uint32_t k_addr = sm90::shared_addr(sK), v_addr = sm90::shared_addr(sV);
  const uint32_t zero_addr = sm90::shared_addr(cta.zeros);
  const int own_first_pos = max(ch.first_pos, key0);
  // The score products take turns (ConsumerTurns): one consumer's exponentials run
  // under the other's products; dq's gained nothing from it (bench/DECISIONS.md, attention).
  const ConsumerTurns turns(consumer, ch.t_end - ch.t_begin);
#pragma unroll 1
  for (int t = ch.t_begin; t < ch.t_end; ++t) {
    const int i = t - ch.t_begin, st = i % W::kStages;
    const uint8_t *q = cta.a_stage(i), *dout = cta.b_stage(i);
    const auto& stats = reinterpret_cast<const SlotStats*>(cta.shared)[st];
    sm90::mbarrier_wait(&bar.full_a[st], (i / W::kStages) & 1);
    float sT[8][4], dpT[8][4];
    turns.wait();
    issue_scores<D>(reinterpret_cast<float(&)[32]>(sT), k_addr, sm90::shared_addr(q));
    issue_scores<D>(reinterpret_cast<float(&)[32]>(dpT), v_addr, sm90::shared_addr(dout));
    turns.pass(t + 1 == ch.t_end);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(reinterpret_cast<float(&)[32]>(sT));
    sm90::fence_accumulators(reinterpret_cast<float(&)[32]>(dpT));
    // The tile meets this consumer's keys where a slot's position reaches its first key.
    const bool mine = key0 < S && ch.pos(t, kTile - 1) >= own_first_pos;
    uint32_t fp[4][4], fds[4][4];
    if (mine) tile_p_ds<kBase2>(sT, dpT, rule, stats, key, ln, fp, fds);
    // Loaded slots before the consumer's last key are absent for some key: rows
    // [first_pos, min(end_pos, key_last)) in positions (the CTA's first position:
    // the other consumer's slots are loaded too).
    const int r0 = (ch.first_pos - ch.chunk_pos0) * ch.G - t * kTile;
    const int r1 = (min(ch.end_pos, key_last) - ch.chunk_pos0) * ch.G - t * kTile;
    bool slow = false;
    if (mine && r0 < kTile && r1 > 0) {
      slow = any_nonfinite_rows<D>(q, r0, r1, barrier, thread);
      slow = any_nonfinite_rows<D>(dout, r0, r1, barrier, thread) || slow;
    }
    issue_block_product_or_zero<D>(reinterpret_cast<float(&)[D / 2]>(dv), fp, sm90::shared_addr(dout), zero_addr,
                                   !mine || slow);
    issue_block_product_or_zero<D>(reinterpret_cast<float(&)[D / 2]>(dk), fds, sm90::shared_addr(q), zero_addr,
                                   !mine || slow);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(reinterpret_cast<float(&)[D / 2]>(dv));
    sm90::fence_accumulators(reinterpret_cast<float(&)[D / 2]>(dk));
    if (slow) {
      // Present slots of key j: the contiguous run with position >= j.
      int lo[2], hi[2];
      bool live[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        lo[k] = kTile;
        hi[k] = 0;
        for (int r = 0; r < kTile; ++r)
          if (stats.pos[r] >= key[k]) {
            lo[k] = min(lo[k], r);
            hi[k] = r + 1;
          }
        live[k] = key[k] < S && lo[k] < hi[k];
      }
      if (__any_sync(kFull, live[0] || live[1])) {
        store_fragments(sP, fp, ln);
        store_fragments(sDS, fds, ln);
        __syncwarp();
        chain_swizzled_rows<D>(dv, sP, dout, lo, hi, live, ln);
        chain_swizzled_rows<D>(dk, sDS, q, lo, hi, live, ln);
      }
    }
    sm90::mbarrier_arrive(&bar.empty_a[st]);
  }

#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (key[k] >= S || a.unseen(c, key[k])) continue;
    const size_t at = ((static_cast<size_t>(c - a.c_begin) * S + key[k]) * a.h.Hkv + kvh) * D;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      *reinterpret_cast<float2*>(a.dk_part + at + ln.col(nt, 0)) = make_float2(dk[nt][2 * k], dk[nt][2 * k + 1]);
      *reinterpret_cast<float2*>(a.dv_part + at + ln.col(nt, 0)) = make_float2(dv[nt][2 * k], dv[nt][2 * k + 1]);
    }
  }
}

// pairwise_tree over n < 2^Levels values at p[0], p[stride], ...: as a binary
// counter (merge equal-level neighbours as they arrive, then fold the pending
// subtrees), which is the same association for every n. Leaves before `first` are
// +0 without being read (chunks that end before the key), and those before the
// aligned group of kAhead holding `first` are not pushed either: pushing +0 leaves
// leaves every slot they touch +0, which the slots already are (an unaligned start
// made the loop slower: its unrolled pushes lose the index's low bits). Every push steps through
// all Levels slots (predicated, to keep them in registers): the launch picks the
// fewest levels that hold n (kv_combine), as this bounds the kernel's issue rate.
constexpr int kCombineLevels = 16;
template <int Levels>
__device__ float chunk_tree(const float* p, size_t stride, int n, int first) {
  // Slot `level` holds a pending subtree of 2^level chunks while bit `level` of the
  // count is set; chunk c merges with the slots of c's trailing ones, lowest first
  // (older subtree on the left), and lands in the first clear one. The unrolled
  // levels keep the slots in registers (a stack indexed by its top lives in local memory).
  float slot[Levels] = {};
  auto push = [&](int c, float carry) {
    bool merging = true;
#pragma unroll
    for (int level = 0; level < Levels; ++level)
      if (merging) {
        if ((c >> level) & 1) {
          carry = add_rn(slot[level], carry);
        } else {
          slot[level] = carry;
          merging = false;
        }
      }
  };
  constexpr int kAhead = 8;  // loads in flight a thread
  for (int c0 = first & ~(kAhead - 1); c0 < n; c0 += kAhead) {
    float v[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) v[j] = c0 + j >= first && c0 + j < n ? p[(c0 + j) * stride] : 0.0f;
#pragma unroll
    for (int j = 0; j < kAhead; ++j)
      if (c0 + j < n) push(c0 + j, v[j]);
  }
  // The pending subtrees of n, lowest level on the right.
  float sum = 0.0f;
  bool any = false;
#pragma unroll
  for (int level = 0; level < Levels; ++level)
    if ((n >> level) & 1) {
      sum = any ? add_rn(slot[level], sum) : slot[level];
      any = true;
    }
  return sum;
}

template <int Levels>
__global__ void kv_combine_kernel(size_t n, size_t key_row, int C, int n_chunks, float scale,
                                  const float* __restrict__ dk_part, const float* __restrict__ dv_part,
                                  bf16* __restrict__ dk, bf16* __restrict__ dv) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int seen_from = static_cast<int>(i / key_row) / C;  // chunks before it end at or before the key
    dv[i] = round_bf16(chunk_tree<Levels>(dv_part + i, n, n_chunks, seen_from));
    dk[i] = round_bf16(mul_rn(scale, chunk_tree<Levels>(dk_part + i, n, n_chunks, seen_from)));
  }
}

// --- host side --------------------------------------------------------------------

template <int D>
constexpr size_t dq_smem() {
  return sizeof(bf16) * (4 * kTile * kLd<D> + kTile * kPLd) + sizeof(float) * 3 * kTile;
}
template <int D>
constexpr size_t kv_smem() {
  return sizeof(bf16) * (4 * kTile * kLd<D> + 2 * kTile * kPLd) + sizeof(float) * 4 * kTile;
}

// Δ of rows [row0, row0 + rows) into delta (slot_delta_mma_kernel under sm90-tc).
template <class Model, int D>
void launch_slot_delta(const bf16* dout, const bf16* o, size_t row0, size_t rows, float* delta, cudaStream_t stream) {
  if (rows == 0) return;
  if constexpr (Model::kModel == DotModel::Sm90Tc)
    slot_delta_mma_kernel<D>
        <<<grid_for((rows + 15) / 16, kDeltaWarps), kDeltaWarps * kWarp, 0, stream>>>(dout, o, row0, rows, delta);
  else
    slot_delta_kernel<Model, D><<<grid_for(rows), kBlockThreads, 0, stream>>>(dout, o, row0, rows, delta);
  BP_CUDA_CHECK_LAUNCH();
}

// Δ of every query row of the sequences, rows [0, T·Hq) with T past the last token
// any sequence has: one launch that dq and every sequence's dk/dv partials share.
DeviceBuffer<float> query_deltas(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* dout,
                                 const bf16* o, cudaStream_t stream) {
  size_t rows = 0;
  for (int s = 0; s < n_seqs; ++s)
    if (seqs[s].q_len > 0) rows = std::max(rows, static_cast<size_t>(seqs[s].q_begin + seqs[s].q_len) * dims.Hq);
  DeviceBuffer<float> delta(rows, stream);
  with_shape(kn, dims.D, [&](auto model, auto d, auto) {
    launch_slot_delta<decltype(model), decltype(d)::value>(dout, o, 0, rows, delta.get(), stream);
  });
  return delta;
}

// dq and dk/dv on warpgroups: sm90-tc at head_dim 64 and 128 (as the forward); dk/dv
// also needs a slot tile of whole tokens (G divides 64) and a chunk frame of whole
// tiles (its TMA boxes are 64 / G tokens × G heads).
constexpr bool bwd_on_warpgroups(DotModel model, int D) { return model == DotModel::Sm90Tc && D >= 64; }
bool kv_tiles_whole_tokens(int G, int C) { return kTile % G == 0 && (C * G) % kTile == 0; }

template <int D, bool kBase2>
void launch_dq_ws(AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k, const bf16* v,
                  const float* m, const float* l, const bf16* dout, const float* delta, bf16* dq,
                  cudaStream_t stream) {
  const std::vector<Task> tasks = plan_tiles(seqs, n_seqs, dims.Hq / dims.Hkv, WsDq<D>::kSlots);
  if (tasks.empty()) return;
  const DeviceBuffer<AttnSeq> d_seqs(std::vector<AttnSeq>(seqs, seqs + n_seqs), stream);
  const DeviceBuffer<Task> d_tasks(tasks, stream);
  const DqWsArgs args{d_seqs.get(), d_tasks.get(), heads(dims), q, dout, m, l, delta, dq};
  const KvMaps maps = kv_tensor_maps(seqs, n_seqs, dims, k, v);
  const auto kernel = attn_dq_ws_kernel<D, kBase2>;
  constexpr size_t smem = WsDq<D>::kSmemBytes;
  BP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<query_grid(tasks.size(), dims.Hkv), WsDq<D>::kThreads, smem, stream>>>(args, maps.k, maps.v);
  BP_CUDA_CHECK_LAUNCH();
}

template <int D, bool kBase2>
void launch_kv_ws(AttnDims dims, const KvArgs& args, int n_chunks, cudaStream_t stream) {
  const int G = dims.Hq / dims.Hkv, S = args.s.past_len + args.s.q_len;
  // Q and dO as [tokens][Hq][D] up to the sequence's last (a box past it, or before
  // the first token, arrives as zeros), 64 / G tokens × G heads × 64 columns a box.
  const uint64_t shape[3] = {uint64_t(D), uint64_t(dims.Hq), uint64_t(args.s.q_begin + args.s.q_len)};
  const uint64_t strides[2] = {uint64_t(D), uint64_t(dims.Hq) * D};
  const uint32_t box[3] = {64, static_cast<uint32_t>(G), static_cast<uint32_t>(kTile / G)};
  const CUtensorMap q_map = bf16_tensor_map_3d(args.q, shape, strides, box);
  const CUtensorMap do_map = bf16_tensor_map_3d(args.dout, shape, strides, box);
  const auto kernel = attn_kv_ws_kernel<D, kBase2>;
  constexpr size_t smem = WsKv<D>::kSmemBytes;
  BP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>((S + WsKv<D>::kKeys - 1) / WsKv<D>::kKeys), static_cast<unsigned>(dims.Hkv),
                  static_cast<unsigned>(n_chunks));
  kernel<<<grid, WsKv<D>::kThreads, smem, stream>>>(args, q_map, do_map);
  BP_CUDA_CHECK_LAUNCH();
}

// attention_bwd_dq with Δ of every query row given (query_deltas).
void dq_with_deltas(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                    const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout,
                    const float* delta, bf16* dq, cudaStream_t stream) {
  with_shape(kn, dims.D, [&](auto model, auto d, auto base2) {
    constexpr int D = decltype(d)::value;
    constexpr bool kBase2 = decltype(base2)::value;
    if constexpr (bwd_on_warpgroups(decltype(model)::kModel, D)) {
      launch_dq_ws<D, kBase2>(dims, seqs, n_seqs, q, k, v, m, l, dout, delta, dq, stream);
    } else {  // the mma.sync or SIMT kernel forms Δ itself
      const std::vector<Task> tasks = plan_tiles(seqs, n_seqs, dims.Hq / dims.Hkv);
      if (tasks.empty()) return;
      const DeviceBuffer<AttnSeq> d_seqs(std::vector<AttnSeq>(seqs, seqs + n_seqs), stream);
      const DeviceBuffer<Task> d_tasks(tasks, stream);
      const BwdArgs args{d_seqs.get(), d_tasks.get(), heads(dims), q, k, v, o, dout, m, l, dq};
      launch(attn_dq_kernel<decltype(model), D, kBase2>, query_grid(tasks.size(), dims.Hkv), dq_smem<D>(), stream, args);
    }
  });
}

// attention_bwd_kv_partials with Δ given for the sequence's query rows from row
// delta_row0 on; skip_unseen: see KvArgs.
int kv_partials_with_deltas(const Knobs& kn, AttnDims dims, const AttnSeq& seq, const bf16* q, const bf16* k,
                            const bf16* v, const float* m, const float* l, const bf16* dout, const float* delta,
                            size_t delta_row0, float* dk_part, float* dv_part, bool skip_unseen,
                            cudaStream_t stream) {
  const int C = kn.grad_token_chunk, S = seq.past_len + seq.q_len;
  const int c_begin = seq.past_len / C, c_end = (S + C - 1) / C, n_chunks = c_end - c_begin;
  if (n_chunks <= 0 || S == 0) return std::max(n_chunks, 0);
  with_shape(kn, dims.D, [&](auto model, auto d, auto base2) {
    constexpr int D = decltype(d)::value;
    constexpr bool kBase2 = decltype(base2)::value;
    const KvArgs args{seq, heads(dims), C, c_begin, q, k, v, dout, m, l,
                      delta, static_cast<long long>(delta_row0), dk_part, dv_part, skip_unseen};
    if constexpr (bwd_on_warpgroups(decltype(model)::kModel, D)) {
      if (kv_tiles_whole_tokens(dims.Hq / dims.Hkv, C)) {
        launch_kv_ws<D, kBase2>(dims, args, n_chunks, stream);
        return;
      }
    }
    const dim3 grid(static_cast<unsigned>((S + kTile - 1) / kTile), static_cast<unsigned>(dims.Hkv),
                    static_cast<unsigned>(n_chunks));
    launch(attn_kv_kernel<decltype(model), D, kBase2>, grid, kv_smem<D>(), stream, args);
  });
  return n_chunks;
}

}  // namespace

void attention_bwd_dq(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                      const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq,
                      cudaStream_t stream) {
  check_args(kn, dims, seqs, n_seqs);
  check_aligned({q, k, v, o, dout, dq});
  const bool needs_deltas = bwd_on_warpgroups(kn.dot, dims.D);
  const DeviceBuffer<float> delta =
      needs_deltas ? query_deltas(kn, dims, seqs, n_seqs, dout, o, stream) : DeviceBuffer<float>(0, stream);
  dq_with_deltas(kn, dims, seqs, n_seqs, q, k, v, o, m, l, dout, delta.get(), dq, stream);
}

int attention_bwd_kv_partials(const Knobs& kn, AttnDims dims, const AttnSeq& seq, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout,
                              float* dk_part, float* dv_part, cudaStream_t stream) {
  check_args(kn, dims, &seq, 1);
  check_aligned({q, k, v, o, dout});
  const size_t delta_row0 = static_cast<size_t>(seq.q_begin) * dims.Hq, rows = static_cast<size_t>(seq.q_len) * dims.Hq;
  DeviceBuffer<float> delta(rows, stream);
  with_shape(kn, dims.D, [&](auto model, auto d, auto) {
    launch_slot_delta<decltype(model), decltype(d)::value>(dout, o, delta_row0, rows, delta.get(), stream);
  });
  return kv_partials_with_deltas(kn, dims, seq, q, k, v, m, l, dout, delta.get(), delta_row0, dk_part, dv_part,
                                 false, stream);
}

void attention_bwd_kv_combine(const Knobs& kn, AttnDims dims, int S, int n_chunks, const float* dk_part,
                              const float* dv_part, bf16* dk, bf16* dv, cudaStream_t stream) {
  ref::attention_check_args(kn, dims, nullptr, 0);  // the combine reads grad_token_chunk alone
  const size_t n = static_cast<size_t>(S) * dims.Hkv * dims.D;
  if (n == 0) return;
  if (n_chunks >= (1 << kCombineLevels))
    throw std::invalid_argument("attention_bwd_kv_combine (CUDA): at most " + std::to_string((1 << kCombineLevels) - 1) +
                                " token chunks, got " + std::to_string(n_chunks));
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, size_t{1} << 16));
  const auto launch_levels = [&](auto kernel) {
    kernel<<<blocks, 256, 0, stream>>>(n, static_cast<size_t>(dims.Hkv) * dims.D, kn.grad_token_chunk, n_chunks,
                                       ref::attn_scale(dims.D), dk_part, dv_part, dk, dv);
  };
  if (n_chunks < (1 << 4)) launch_levels(kv_combine_kernel<4>);
  else if (n_chunks < (1 << 6)) launch_levels(kv_combine_kernel<6>);
  else if (n_chunks < (1 << 8)) launch_levels(kv_combine_kernel<8>);
  else launch_levels(kv_combine_kernel<kCombineLevels>);
  BP_CUDA_CHECK_LAUNCH();
}

void attention_bwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq, bf16* dk,
                   bf16* dv, cudaStream_t stream) {
  check_args(kn, dims, seqs, n_seqs);
  check_aligned({q, k, v, o, dout, dq});
  const DeviceBuffer<float> delta = query_deltas(kn, dims, seqs, n_seqs, dout, o, stream);
  dq_with_deltas(kn, dims, seqs, n_seqs, q, k, v, o, m, l, dout, delta.get(), dq, stream);
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
    kv_partials_with_deltas(kn, dims, seq, q, k, v, m, l, dout, delta.get(), 0, dk_part.get() + first * chunk_size,
                            dv_part.get() + first * chunk_size, true, stream);
    const size_t rows = static_cast<size_t>(seq.kv_begin) * dims.Hkv * dims.D;
    attention_bwd_kv_combine(kn, dims, S, n_chunks, dk_part.get(), dv_part.get(), dk + rows, dv + rows, stream);
  }
}

}  // namespace bp::cuda
