// The warpgroup pieces of attention (sm90-tc, head_dim 64 and 128), shared by the
// forward (attention_fwd.cu) and the dq and dk/dv passes (attention_bwd.cu). FlashAttention-3's
// CTA: a producer warpgroup whose first warp copies each block's keys and values
// (64 keys; 128 in the forward under attn_kv_block 128) by TMA into a ring of stages,
// and consumer warpgroups (two; three in the forward at blocks of 64), each with its
// own 64-slot query tile of the same sequence and kv head, sharing the blocks. Both products of a block are wgmma: scores Q·Kᵀ from shared
// memory (D/16 k16 groups from +0) and acc += R(T)·B with R(T) from registers (the
// score layout is wgmma's A fragment) and B (V in the forward, K in dq) read
// N-major, 4 groups from the block's first slot. Operands sit in 128-byte-swizzled boxes of 64 rows × 64 bf16.
//
// What the tensor core needs beyond the mma.sync kernels (attention_tile.cuh):
//   - absent slots: 0·Inf is NaN on the tensor core, while the reference skips the
//     slot. The producer zeroes the B rows of the CTA's last block past every row's
//     position; a consumer whose absent slots meet an Inf or NaN B row runs the SIMT
//     chain for that block (chain_swizzled_rows).
//   - ptxas serialises every wgmma of a kernel when one is branched around (C7514),
//     so both issues are unconditional: a block that is not the warpgroup's issues
//     its product on whatever its registers hold where acc is no longer read (the
//     forward), or R(T) = +0 against 1024 zero bytes, which leaves acc as it is
//     (dq, dk/dv: acc is read after such blocks).
#pragma once
#include <cuda.h>

#include <algorithm>
#include <cstdint>

#include "optimized/cuda/attention_tile.cuh"
#include "optimized/cuda/tma.h"
#include "optimized/cuda/wgmma.cuh"

namespace bp::cuda::attn {

// A tile of `Rows` rows × D bf16 in 128-byte-swizzled boxes of Rows rows × 64 bf16
// (the query-side tiles: 64 rows; a key or value block: attn_kv_block rows).
template <int D, int Rows = kTile>
struct SwizzledTile {
  static constexpr int kBoxes = D / 64;
  static constexpr uint32_t kBoxBytes = Rows * 64 * sizeof(bf16);
  static constexpr uint32_t kBytes = kBoxes * kBoxBytes;
  static constexpr int kRowChunks = 8 * kBoxes;  // 16-byte chunks of a tile row
  // Byte offset of the c-th stored 16-byte chunk of row r (whichever columns the
  // swizzle put there): for work on whole rows.
  __device__ static uint32_t chunk(int r, int c) { return (c / 8) * kBoxBytes + r * 128 + (c % 8) * 16; }
  // Byte offset of (row r, column d): box d / 64, 128 bytes a row, the 16-byte chunk
  // index XOR row % 8.
  __device__ static uint32_t offset(int r, int d) {
    return (d / 64) * kBoxBytes + r * 128 + ((((d % 64) / 8) ^ (r % 8)) * 16) + (d % 8) * 2;
  }
  // K-major operand (the query side as A, K or V as B of the scores): k16 group kk
  // is 32 bytes along a row of box kk / 4; 8-row swizzle groups 1024 bytes apart.
  // Descriptors are built once per tile and moved to each group (descriptor_plus).
  __device__ static uint64_t k_major(uint32_t tile) { return sm90::swizzled_descriptor(tile, 16, 1024); }
  __device__ static uint64_t k_major(uint64_t tile_desc, int kk) {
    return sm90::descriptor_plus(tile_desc, (kk / 4) * kBoxBytes + (kk % 4) * 32);
  }
  // The tile as the N-major B of R(T)·B: group kk is rows 16kk.., 128 bytes a row;
  // the next 64 columns of D are the next box.
  __device__ static uint64_t n_major(uint32_t tile) { return sm90::swizzled_descriptor(tile, kBoxBytes, 1024); }
  __device__ static uint64_t n_major(uint64_t tile_desc, int kk) {
    return sm90::descriptor_plus(tile_desc, kk * 16 * 128);
  }
};

// The CTA's layout: consumers of 64-slot query tiles; the ring's stages hold one
// tile a side: a key and a value block of KvBlock rows (forward, dq) or a query-side
// tile (dk/dv, KvBlock 64). Its static functions are the 64-row tile's.
template <int D, int Consumers = 2, int KvBlock = kTile>
struct WsTile : SwizzledTile<D, kTile> {
  using Slots = SwizzledTile<D, kTile>;
  using Block = SwizzledTile<D, KvBlock>;
  static constexpr int kConsumers = Consumers, kStages = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kSlots = kConsumers * kTile;  // query slots a task
  static constexpr uint32_t kTileBytes = Slots::kBytes;  // one query-side tile
  static constexpr uint32_t kStageBytes = Block::kBytes;  // one side of a ring stage
  static constexpr size_t kPBytes = sizeof(bf16) * kTile * kPLd;  // R(T) rows for the SIMT chain
  static constexpr size_t kZeroBytes = 1024;
  static constexpr size_t kBarriers = 4 * kStages + 1;

  // Shared memory of a CTA whose consumers each hold `tiles` swizzled tiles and
  // `extra` further bytes (R(T) rows included), and `shared` bytes for all: the
  // consumers' tiles, the two rings, the zeros, the consumers' extra bytes, the
  // shared bytes, the barriers, slack to align to 1024 bytes (the swizzle is a
  // function of the address bits).
  static constexpr size_t smem_bytes(int tiles, size_t extra, size_t shared = 0) {
    return kConsumers * (tiles * size_t{kTileBytes} + extra) + 2 * kStages * size_t{kStageBytes} + kZeroBytes +
           shared + 8 * kBarriers + 1024;
  }

  // The ring's barriers: per stage, full (the copy landed) and empty (every consumer
  // warp is done with it) for each of its two tiles (a: the keys or the queries, b:
  // the values or the output gradients); `landed`: a stage the producer clears rows
  // of before the consumers see it.
  struct Barriers {
    uint64_t *full_a, *full_b, *empty_a, *empty_b, *landed;
    __device__ explicit Barriers(uint64_t* b)
        : full_a(b), full_b(b + kStages), empty_a(b + 2 * kStages), empty_b(b + 3 * kStages), landed(b + 4 * kStages) {}
  };
};

// Where a CTA's shared memory goes (WsTile::smem_bytes' order). The ring streams two
// tiles a stage: a block's keys (a) and values (b) in the forward and dq, a slot
// tile's queries (a) and output gradients (b) in dk/dv.
template <int D, int Consumers = 2, int KvBlock = kTile>
struct WsCta {
  using W = WsTile<D, Consumers, KvBlock>;
  uint8_t *tiles, *ring_a, *ring_b, *zeros, *extra, *shared;
  uint64_t* barriers;
  __device__ WsCta(uint8_t* smem_raw, int tiles_each, size_t extra_each, size_t shared_bytes = 0) {
    tiles = smem_raw + (1024 - sm90::shared_addr(smem_raw) % 1024) % 1024;
    ring_a = tiles + W::kConsumers * tiles_each * W::kTileBytes;
    ring_b = ring_a + W::kStages * W::kStageBytes;
    zeros = ring_b + W::kStages * W::kStageBytes;
    extra = zeros + W::kZeroBytes;
    shared = extra + W::kConsumers * extra_each;
    barriers = reinterpret_cast<uint64_t*>(shared + shared_bytes);
  }
  // Zeroes the zero bytes and sets up the ring's barriers: a full one completes on
  // `full_arrivals` arrivals (and its copies' bytes), an empty one on
  // `empty_arrivals` (by default one a consumer warp). Every thread calls it.
  __device__ void init(uint32_t full_arrivals = 1, uint32_t empty_arrivals = 4 * W::kConsumers) const {
    for (int c = threadIdx.x; c < W::kZeroBytes / 16; c += W::kThreads)
      reinterpret_cast<uint4*>(zeros)[c] = make_uint4(0, 0, 0, 0);
    sm90::fence_proxy_async();  // the zeros, before wgmma reads them
    if (threadIdx.x == 0) {
      const typename W::Barriers bar(barriers);
      for (int st = 0; st < W::kStages; ++st) {
        sm90::mbarrier_init(&bar.full_a[st], full_arrivals);
        sm90::mbarrier_init(&bar.full_b[st], full_arrivals);
        sm90::mbarrier_init(&bar.empty_a[st], empty_arrivals);
        sm90::mbarrier_init(&bar.empty_b[st], empty_arrivals);
      }
      sm90::mbarrier_init(bar.landed, 1);
      sm90::mbarrier_init_fence();
    }
    __syncthreads();
  }
  __device__ uint8_t* a_stage(int i) const { return ring_a + (i % W::kStages) * W::kStageBytes; }
  __device__ uint8_t* b_stage(int i) const { return ring_b + (i % W::kStages) * W::kStageBytes; }
};

// A consumer warp's arrival on a ring barrier, once all its lanes are done with the
// stage (barriers that count warps).
__device__ inline void warp_arrive(uint64_t* bar, const Lane& ln) {
  __syncwarp();
  if (ln.lane == 0) sm90::mbarrier_arrive(bar);
}

// Turn-taking between the two consumers (FlashAttention-3's scheduler barriers):
// each issues its score products only on its turn and hands the turn over right
// after, so one consumer's exponentials run while the other's products hold the
// tensor cores, instead of both asking for them at once. Named barriers 3 and 4 (1
// and 2 are the consumers' own). Both consumers must take the same number of turns.
struct ConsumerTurns {
  static constexpr int kFirstBarrier = 3;
  int consumer;
  // Consumer 0 takes the first of `turns` turns.
  __device__ ConsumerTurns(int c, int turns) : consumer(c) {
    if (consumer == 1 && turns > 0) sm90::two_warpgroups_arrive(kFirstBarrier);
  }
  __device__ void wait() const { sm90::two_warpgroups_sync(kFirstBarrier + consumer); }
  // After the last turn consumer 1 hands over nothing: every arrival meets a wait.
  __device__ void pass(bool last) const {
    if (consumer == 0 || !last) sm90::two_warpgroups_arrive(kFirstBarrier + 1 - consumer);
  }
};

// Rows [0, 64) of a swizzled tile from global memory (16-byte cp.async by the
// warpgroup's 128 threads), or +0 where src(r) is null. Uncommitted.
template <int D, class Src>
__device__ void load_swizzled_tile(uint8_t* tile, int thread, Src src) {
  for (int c = thread; c < kTile * D / 8; c += 128) {
    const int r = c / (D / 8), d = (c % (D / 8)) * 8;
    uint8_t* dst = tile + WsTile<D>::offset(r, d);
    const bf16* row = src(r);
    if (row) cp_async16(dst, row + d);
    else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// Issues s = A·Bᵀ over D (Q·Kᵀ, dO·Vᵀ) for a 64-row tile A and a block B of KB rows,
// the dot model's chain from +0 (scale-d = 0 on the first group), as one commit group.
template <int D, int KB = kTile>
__device__ void issue_scores(float (&s)[KB / 2], uint32_t a, uint32_t b) {
  static_assert(KB == 64 || KB == 128, "a block is one wgmma's N");
  using A = SwizzledTile<D>;
  using B = SwizzledTile<D, KB>;
  sm90::fence_accumulators(s);
  sm90::wgmma_fence();
  const uint64_t a0 = A::k_major(a), b0 = B::k_major(b);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    if constexpr (KB == 128) sm90::wgmma_m64n128k16<0, 0>(s, A::k_major(a0, kk), B::k_major(b0, kk), kk > 0);
    else sm90::wgmma_m64n64k16<0, 0>(s, A::k_major(a0, kk), B::k_major(b0, kk), kk > 0);
  }
  sm90::wgmma_commit();
}

// Issues acc += A·B over the block's KB slots as one commit group: A's bf16
// fragments (KB / 16 k16 groups, a_fragments' layout) and B's group descriptors given,
// groups of 16 in increasing order. Where from_zero, the chain starts from +0
// instead of acc (scale-d = 0 on the first group, as issue_scores').
// Unconditional (C7514, above). A's registers and the descriptors are chosen before
// the fence: selected between the wgmmas, ptxas serialised every wgmma of the kernel
// (C7520, behind a warpgroup.arrive it put on a divergent path); cmake/nvcc_guard
// fails such a build.
template <int D, int KB = kTile>
__device__ void issue_fragment_product(float (&acc)[D / 2], const uint32_t (&a)[KB / 16][4],
                                       const uint64_t (&desc)[KB / 16], bool from_zero) {
  sm90::fence_accumulators(acc);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk) {
    const int scale_d = kk > 0 || !from_zero;
    if constexpr (D == 128) sm90::wgmma_m64n128k16_rs<1>(acc, a[kk], desc[kk], scale_d);
    else sm90::wgmma_m64n64k16_rs<1>(acc, a[kk], desc[kk], scale_d);
  }
  sm90::wgmma_commit();
}

// acc += R(t)·B with B at `b` (a stage of the ring, KB rows), A the fragments of R(t).
template <int D, int KB = kTile>
__device__ void issue_block_product(float (&acc)[D / 2], const uint32_t (&frag)[KB / 16][4], uint32_t b,
                                    bool from_zero) {
  using B = SwizzledTile<D, KB>;
  uint64_t desc[KB / 16];
  const uint64_t b0 = B::n_major(b);
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk) desc[kk] = B::n_major(b0, kk);
  issue_fragment_product<D, KB>(acc, frag, desc, from_zero);
}

// The same, or, where zero_block, A = +0 against the CTA's zero bytes (descriptor
// strides 0: every core matrix reads them), which leaves acc as it is: 20 selects a
// block on the fast path, for kernels that read acc after a block they may not
// multiply (the SIMT chain redoes it).
template <int D>
__device__ void issue_block_product_or_zero(float (&acc)[D / 2], const uint32_t (&frag)[4][4], uint32_t b,
                                            uint32_t zeros, bool zero_block) {
  using W = WsTile<D>;
  uint32_t a[4][4];
  uint64_t desc[4];
  const uint64_t b0 = W::n_major(b), zero_desc = sm90::swizzled_descriptor(zeros, 0, 0);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = zero_block ? 0u : frag[kk][r];
    desc[kk] = zero_block ? zero_desc : W::n_major(b0, kk);
  }
  issue_fragment_product<D>(acc, a, desc, false);
}

// Whether a row in [lo, hi) of a swizzled tile of Rows rows is Inf or NaN: then the
// block takes the SIMT chain. Every thread of the warpgroup calls it.
template <int D, int Rows = kTile>
__device__ bool any_nonfinite_rows(const uint8_t* tile, int lo, int hi, int barrier, int thread) {
  using W = SwizzledTile<D, Rows>;
  bool found = false;
  lo = max(lo, 0);
  hi = min(hi, Rows);
  for (int c = thread; c < (hi - lo) * W::kRowChunks; c += 128) {
    const uint4 w = *reinterpret_cast<const uint4*>(tile + W::chunk(lo + c / W::kRowChunks, c % W::kRowChunks));
    for (uint32_t x : {w.x, w.y, w.z, w.w}) found |= nonfinite_bf16_pair(x);
  }
  return sm90::warpgroup_any(found, barrier);
}

// The SIMT chains of a block (framed_block_product's slow path) with the thread's
// rows of R(t) at t_rows and t_rows + t_stride, B a swizzled tile, on acc
// ([D / 8][4], the accumulators' layout) in local memory: row i of the thread runs
// slots [lo_i, hi_i) where live_i, each column's slots gathered into plain order,
// then framed_chain over the KB-slot frame (the reference's block, or one 64-slot
// piece of a dk/dv chunk, whose sm90-tc groups align to it). Out of line and called
// once, on acc in local memory: one call site in each warpgroup kernel instead of
// one per accumulator (64), and no accumulator register live across a call.
template <int D, int KB = kTile>
__device__ __noinline__ void chain_swizzled_in_memory(float* acc, const bf16* t_rows, int t_stride, const uint8_t* b,
                                                      int lo0, int hi0, int lo1, int hi1, int live_rows, Lane ln) {
  for (int i = 0; i < 2; ++i) {
    if (!(live_rows >> i & 1)) continue;
    const int lo = i == 0 ? lo0 : lo1, hi = i == 0 ? hi0 : hi1;
    const bf16* t_row = t_rows + i * t_stride;
    for (int nt = 0; nt < D / 8; ++nt)
      for (int e = 0; e < 2; ++e) {
        bf16 column[KB];
        const int d = ln.col(nt, e);
        for (int j = lo; j < hi; ++j) column[j] = *reinterpret_cast<const bf16*>(b + SwizzledTile<D, KB>::offset(j, d));
        float& c = acc[nt * 4 + 2 * i + e];
        c = framed_chain<Sm90Tc>(c, t_row + lo, 1, column + lo, 1, lo, hi, KB);
      }
  }
}

// acc to and from chain_swizzled_in_memory's copy (+0 where from_zero).
template <int NT>
__device__ void acc_to_memory(float* in_memory, const float (&acc)[NT][4], bool from_zero = false) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) in_memory[nt * 4 + e] = from_zero ? 0.0f : acc[nt][e];
}
template <int NT>
__device__ void acc_from_memory(float (&acc)[NT][4], const float* in_memory) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = in_memory[nt * 4 + e];
}

// The same with row i's slots [lo_i, hi_i) where live_i.
template <int D, int KB = kTile>
__device__ void chain_swizzled_rows(float* acc_in_memory, const bf16* t_rows, int t_stride, const uint8_t* b,
                                    const int (&lo)[2], const int (&hi)[2], const bool (&live)[2], const Lane& ln) {
  chain_swizzled_in_memory<D, KB>(acc_in_memory, t_rows, t_stride, b, lo[0], hi[0], lo[1], hi[1],
                              int{live[0]} | int{live[1]} << 1, ln);
}

// The same on acc in registers, passed through local memory (the slow path only).
template <int D>
__device__ void chain_swizzled_rows(float (&acc)[D / 8][4], const bf16* t_rows, int t_stride, const uint8_t* b,
                                    const int (&lo)[2], const int (&hi)[2], const bool (&live)[2], const Lane& ln) {
  float in_memory[D / 8 * 4];
  acc_to_memory(in_memory, acc);
  chain_swizzled_rows<D>(in_memory, t_rows, t_stride, b, lo, hi, live, ln);
  acc_from_memory(acc, in_memory);
}

// The same with the rows of R(t) in st ([row][kPLd], store_fragments' layout).
template <int D>
__device__ void chain_swizzled_rows(float (&acc)[D / 8][4], const bf16* st, const uint8_t* b, const int (&lo)[2],
                                    const int (&hi)[2], const bool (&live)[2], const Lane& ln) {
  chain_swizzled_rows<D>(acc, st + ln.row(0) * kPLd, (ln.row(1) - ln.row(0)) * kPLd, b, lo, hi, live, ln);
}

// The thread's two rows of R(t) from the warp's A fragments (KB slots), for
// chain_swizzled_rows without shared memory: slot 8·nt + 2·t + e of a row is lane
// t's pair nt in the quad. Every lane of the warp calls it.
template <int KB>
__device__ void gather_fragment_rows(uint32_t (&rows)[2][KB / 2], const uint32_t (&frag)[KB / 16][4], const Lane& ln) {
#pragma unroll
  for (int nt = 0; nt < KB / 8; ++nt)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int t = 0; t < 4; ++t)
        rows[i][4 * nt + t] = __shfl_sync(kFull, frag[nt / 2][nt % 2 * 2 + i], (ln.lane & ~3) | t);
}

// Which operand of a block the second product reads (and the producer therefore
// clears past the last position): V in the forward, K in dq.
enum class BlockOperand { kKeys, kValues };

// The producer: block b's keys and values into stage b % kStages once every
// consumer has released it. The CTA's last block may reach past the last key any
// of its rows sees (another sequence's rows, or none): those rows of the `Cleared`
// operand become +0 before the consumers see the block, as absent slots must be
// for the tensor core.
template <int D, BlockOperand Cleared, int Consumers, int KvBlock>
__device__ void produce_blocks(const CUtensorMap* k_map, const CUtensorMap* v_map,
                               const WsCta<D, Consumers, KvBlock>& cta, int kvh, int kv_begin, int last_block,
                               int hi_pos) {
  using W = WsTile<D, Consumers, KvBlock>;
  using B = typename W::Block;
  const typename W::Barriers bar(cta.barriers);
  const int lane = threadIdx.x % 32;
  constexpr bool kClearKeys = Cleared == BlockOperand::kKeys;
  for (int b = 0; b <= last_block; ++b) {
    const int st = b % W::kStages, use = b / W::kStages, row = kv_begin + b * KvBlock;
    uint8_t *k = cta.a_stage(b), *v = cta.b_stage(b);
    const int past = hi_pos + 1 - b * KvBlock;  // rows from here on are past every row's position
    const bool clear = past < KvBlock;           // only the last block, once: `landed` completes one phase
    if (lane == 0) {
      if (use > 0) sm90::mbarrier_wait(&bar.empty_a[st], (use - 1) & 1);
      uint64_t* k_bar = clear && kClearKeys ? bar.landed : &bar.full_a[st];
      sm90::mbarrier_arrive_expect_tx(k_bar, B::kBytes);
      for (int x = 0; x < B::kBoxes; ++x) sm90::tma_load_3d(k + x * B::kBoxBytes, k_map, k_bar, 64 * x, kvh, row);
      if (use > 0) sm90::mbarrier_wait(&bar.empty_b[st], (use - 1) & 1);
      uint64_t* v_bar = clear && !kClearKeys ? bar.landed : &bar.full_b[st];
      sm90::mbarrier_arrive_expect_tx(v_bar, B::kBytes);
      for (int x = 0; x < B::kBoxes; ++x) sm90::tma_load_3d(v + x * B::kBoxBytes, v_map, v_bar, 64 * x, kvh, row);
    }
    if (clear) {
      uint8_t* t = kClearKeys ? k : v;
      sm90::mbarrier_wait(bar.landed, 0);
      for (int c = lane; c < (KvBlock - past) * B::kRowChunks; c += 32)
        *reinterpret_cast<uint4*>(t + B::chunk(past + c / B::kRowChunks, c % B::kRowChunks)) = make_uint4(0, 0, 0, 0);
      sm90::fence_proxy_async();  // the zeros, before wgmma reads them
      __syncwarp();
      if (lane == 0) sm90::mbarrier_arrive(kClearKeys ? &bar.full_a[st] : &bar.full_b[st]);
    }
  }
}

// A query-side CTA's work (forward, dq): its task's slots of one sequence at its kv
// head (query_grid), the last position any of its rows sees, and that position's
// block of kv_block keys.
struct WsQueryTask {
  Task task;
  AttnSeq seq;
  int kvh, n_slots, hi_pos, last_block;
  __device__ WsQueryTask(const AttnSeq* seqs, const Task* tasks, const Heads& h, int slots, int kv_block = kTile)
      : task(tasks[cta_task(h)]), seq(seqs[task.seq]), kvh(cta_kv_head(h)), n_slots(seq.q_len * h.G) {
    hi_pos = seq.past_len + (min(task.slot0 + slots, n_slots) - 1) / h.G;
    last_block = hi_pos / kv_block;
  }
};

// Splits the registers between the warpgroups and runs the producer's part: true
// for the producer warpgroup's threads (its first warp copies; the caller returns),
// false for the consumers', which then hold kConsumerRegs each.
template <int kProducerRegs, int kConsumerRegs, class Produce>
__device__ bool run_producer(Produce&& produce) {
  if (threadIdx.x >= 128) {
    sm90::claim_registers<kConsumerRegs>();
    return false;
  }
  sm90::release_registers<kProducerRegs>();
  if (threadIdx.x < 32) produce();
  return true;
}

// The keys' and values' tensor maps: [rows][Hkv][D], rows up to the last any
// sequence reads (a box past them arrives as zeros), one head's kv_block rows × 64
// columns a box.
struct KvMaps {
  CUtensorMap k, v;
};
inline KvMaps kv_tensor_maps(const AttnSeq* seqs, int n_seqs, AttnDims dims, const bf16* k, const bf16* v,
                             int kv_block = kTile) {
  uint64_t rows = 1;
  for (int s = 0; s < n_seqs; ++s)
    if (seqs[s].q_len > 0)
      rows = std::max<uint64_t>(rows, uint64_t(seqs[s].kv_begin) + seqs[s].past_len + seqs[s].q_len);
  const uint64_t Hkv = static_cast<uint64_t>(dims.Hkv), D = static_cast<uint64_t>(dims.D);
  const uint64_t shape[3] = {D, Hkv, rows}, strides[2] = {D, Hkv * D};
  const uint32_t box[3] = {64, 1, static_cast<uint32_t>(kv_block)};
  return {bf16_tensor_map_3d(k, shape, strides, box), bf16_tensor_map_3d(v, shape, strides, box)};
}

}  // namespace bp::cuda::attn
