// The decode engine of linear (linear_gemm.cuh says what every GEMM computes):
// sm90-tc forward GEMMs of decode size (M <= 16 rows of x), which stream the weight
// once and are bound by its bytes; and up to 128 rows where the warpgroup kernel
// declines (chunks that are not whole k16 groups), as a grid row per 16-row block.
// A warp per strip of 8 output columns and chunk (C times the warps of
// linear_mma.cu's decode tiles on chunked reductions); the weight goes from global
// memory by cp.async into a per-lane ring in shared memory (launches of few warps)
// and from there into the mma B fragments, in batches of kBatch k16 groups, up to 8
// batches (32 KB) in flight per warp; launches of many warps load the batches into
// registers, two in flight (RegisterBatches).
//
//   - Work: a task is one strip of 8 output columns (8 weight rows) × one chunk of
//     the reduction; one warp runs one task's chain at a time. A unit is a few
//     consecutive strips with all their chunks (at most kMaxWarps tasks), so the
//     chunk tree runs inside the CTA; a CTA takes unit after unit.
//   - x (<= 16 rows × K) is copied into shared memory once per CTA at M = 1
//     (cp.async) and once per pair of CTAs past it (a 2-CTA cluster, TMA
//     multicast: copy_x_to_pair); the warps issue their first weight loads
//     before they wait for it.
//   - The chain: per chunk, the k16 groups in increasing order, one
//     mma.sync.m16n8k16 each from a +0 accumulator, x as A (16 rows) and the strip
//     as B — the chain linear_mma.cu's TensorCoreDot runs, group for group.
//   - Within a group, lane t (t = lane % 4) loads the 4 contiguous elements
//     4t .. 4t+3 (one 8-byte load of its weight row, one of each x row) and hands
//     them to the mma as its k's 2t, 2t+1, 2t+8, 2t+9. That is one permutation of the
//     group's 16 k's, the same for A and B, so each output's group sees the same 16
//     products, only at other positions. The sm90-tc G step (SPEC.md §2.3.2) is a
//     function of the multiset of its terms: the non-finite rules look at which
//     kinds of product occur, E is their maximum exponent, each term is truncated
//     on its own to the grid 2^(E−25), the truncated terms are added exactly as
//     integers and the sum is converted once. None of it depends on a term's
//     position, so the permutation leaves every group's bits unchanged (the
//     hardware is the model: tools/hw_truth/hw_truth.cu, SPEC.md §2.3.3).
//     The piece of a group past the chunk's end (chunks are multiples of 8
//     elements here, so a piece is wholly in or out) is zero on both operands:
//     zero products take no part, and a zero x keeps an Inf or NaN weight
//     element of the next chunk out of this one.
//   - Chunk partials meet in shared memory; each output's C partials go through
//     reduce.h's pairwise_tree in chunk order, then store_outputs.
// It takes the forward (both operands reduction-major) where both operands allow
// 16-byte copies (rows, chunk starts and lengths multiples of 8 elements) and x
// fits in shared memory; linear_mma.cu runs the rest.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "optimized/cuda/common.h"
#include "optimized/cuda/linear_gemm.cuh"
#include "optimized/cuda/ptx.cuh"
#include "optimized/cuda/wgmma.cuh"
#include "reference/numerics/bf16.h"
#include "reference/numerics/reduce.h"

namespace bp::cuda::gemm {
namespace {

constexpr int kMaxWarps = 8;
// CTAs that share x's copy past M = 1 (copy_x_to_pair): a pair copies x once where
// each CTA copied it, halving x's L2 reads beside the weight's; clusters of four lose
// on the chunked shapes, fewer of them fitting (bench/DECISIONS.md, linear: x shared by
// CTA pairs past M = 1).
constexpr int kXCluster = 2;
// k16 groups per batch of weight loads: 4 KB a warp. Two batches in registers per
// warp keep 0.5 MB in flight on 30B kv_proj's 64 warps at M = 1, where the copy
// bandwidth wants several MB: hence the rings of launches of few warps.
constexpr int kBatch = 16;

// One warp's 16 × 8 mma tile as store_outputs reads it (accumulator i: row
// g + 8·(i / 2), column 2t + i % 2 of the C fragment, PTX ISA mma.m16n8k16).
struct StripCfg {
  static constexpr int kAcc = 4;
};
struct StripTile {
  using PairedColumns = void;
  int lane;
  __device__ int row(int i) const { return lane / 4 + 8 * (i / 2); }
  __device__ int col(int i) const { return 2 * (lane % 4) + i % 2; }
};

// x's rows in shared memory: a row stride of 32 (mod 128) bytes puts the 4 rows a
// half-warp reads (8 bytes per lane, 32 bytes per row) in distinct banks.
inline int x_stride_elems(int red) { return ((2 * red + 95) / 128 * 128 + 32) / 2; }

// Where a chain's weight batches wait between their loads and their mma. Both take
// batch b in slot parity P = b % 2 (a compile-time constant at every call, so the
// registers are never indexed at run time) and a batch's loads end in one commit.
//   - RegisterBatches: two batches in registers, 8 KB a warp; what the many warps
//     of chunked launches want (their chains are a batch or two long).
//   - RingBatches<R>: R batches in the lane's own slots of a ring in shared memory,
//     filled by cp.async (no barrier: a lane reads back only what it copied), so the
//     bytes in flight cost no registers and a launch of few warps (30B kv_proj at
//     M = 1: 64 strips, a warp each) keeps its whole chain's weight on the way.
//     Every step commits one cp.async group (an empty one past the chain's end), so
//     "batch b landed" is always wait_group R − 1.
struct RegisterBatches {
  static constexpr int kDepth = 2, kCommits = 0;
  static constexpr size_t kWarpBytes = 0;
  uint2 batch[2][kBatch];
  __device__ explicit RegisterBatches(uint2*) {}
  template <int P>
  __device__ void load(int, int j, const bf16* src) {
    batch[P][j] = ld_stream8(src);
  }
  __device__ void commit() const {}
  __device__ void wait() const {}
  template <int P>
  __device__ uint2 at(int, int j) const {
    return batch[P][j];
  }
  __device__ void reuse() const {}
};

template <int R>
struct RingBatches {
  static_assert(R % 2 == 0, "a slot's parity is its batch's");
  static constexpr int kDepth = R, kCommits = R;
  static constexpr size_t kWarpBytes = size_t{R} * kBatch * 32 * sizeof(uint2);
  uint2* ring;  // this lane's slot 0: slot (b, j) at [((b mod R)·kBatch + j)·32]
  __device__ explicit RingBatches(uint2* warp_ring) : ring(warp_ring + threadIdx.x % 32) {}
  __device__ uint2* slot(int b, int j) const { return ring + ((b % R) * kBatch + j) * 32; }
  template <int P>
  __device__ void load(int b, int j, const bf16* src) const {
    cp_async8_stream(slot(b, j), src);
  }
  __device__ void commit() const { cp_async_commit(); }
  __device__ void wait() const { cp_async_wait<R - 1>(); }  // the oldest batch: R − 1 commits came after it
  template <int P>
  __device__ uint2 at(int b, int j) const {
    return *slot(b, j);
  }
  __device__ void reuse() const { __syncwarp(); }  // the slots' reads before the copies that refill them
};

// One warp's chain over one chunk of one strip, its weight loads in batches of
// kBatch groups, Store::kDepth batches in flight: step b waits for batch b, runs
// it and reloads its slots with batch b + kDepth. A rolling ring of register loads
// refilled a group at a time ran at one group per memory latency (bench/DECISIONS.md,
// linear: the weight straight into the mma fragments); batches keep one wait per
// batch. Every lane issues every load of a batch (a dead piece reads its row's
// first 8 bytes and is zeroed where used), so no branch separates them.
template <class Store>
struct StripChain {
  Store store;
  const bf16* w_row;  // this lane's weight row
  int k;              // this lane's first element in it: the chunk's start + 4t
  int groups, batches, len, t;

  __device__ explicit StripChain(uint2* warp_ring) : store(warp_ring) {}

  // Group i's piece of this lane lies inside the chunk (so i < groups).
  __device__ bool live(int i) const { return 16 * i + 4 * t < len; }
  // Batch b's loads (none past the last batch), then one commit.
  template <int P>
  __device__ void issue(int b) {
    if (b < batches)
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = b * kBatch + j;
        store.template load<P>(b, j, w_row + (live(i) ? k + 16 * i : 0));
      }
    store.commit();
  }

  __device__ void start(const Problem& p, int col0, int k0) {
    const int lane = threadIdx.x % 32;
    t = lane % 4;
    len = min(p.chunk, p.red - k0);  // <= 0: an empty chunk, whose partial is +0
    groups = len > 0 ? (len + 15) / 16 : 0;
    batches = (groups + kBatch - 1) / kBatch;
    // Columns past N read row N − 1: they reach only outputs that are not stored.
    w_row = p.b.p + static_cast<size_t>(min(col0 + lane / 4, p.n - 1)) * p.b.ld;
    k = k0 + 4 * t;
#pragma unroll 1
    for (int b = 0; b < Store::kDepth; b += 2) {
      issue<0>(b);
      issue<1>(b + 1);
    }
  }

  // Batch b's groups, in increasing order, into acc, then its slots' next batch.
  // A batch wholly inside the chunk takes a body without the per-group checks (a
  // single warp's chain issues every instruction in turn, so the checks' instructions
  // were the chain's time); the last one of a chunk keeps them.
  template <int P>
  __device__ void step(int rows, int b, const bf16* x_lo, const bf16* x_hi, float (&acc)[4]) {
    store.wait();
    const bool whole = 16 * kBatch * (b + 1) <= len;
    if (rows > 8) whole ? batch<P, false, true>(b, x_lo, x_hi, acc) : batch<P, true, true>(b, x_lo, x_hi, acc);
    else whole ? batch<P, false, false>(b, x_lo, x_hi, acc) : batch<P, true, false>(b, x_lo, x_hi, acc);
    store.reuse();
    issue<P>(b + Store::kDepth);
  }

  // A fragments {row g: k 2t.., row g+8: k 2t.., row g: k 2t+8.., row g+8: k 2t+8..};
  // HiRows: M > 8, else the mma's rows 8..15 are zero. Checked: groups may end
  // inside the batch and a lane's piece may lie past the chunk (a dead piece reads
  // k 0..3 and is zero on both operands).
  template <int P, bool Checked, bool HiRows>
  __device__ void batch(int b, const bf16* x_lo, const bf16* x_hi, float (&acc)[4]) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = b * kBatch + j;
      if (Checked && i >= groups) break;
      const bool in = !Checked || live(i);
      const int at = in ? 16 * i : 0;
      const uint2 lo = *reinterpret_cast<const uint2*>(x_lo + at);
      const uint2 hi = HiRows ? *reinterpret_cast<const uint2*>(x_hi + at) : make_uint2(0, 0);
      const uint2 w = store.template at<P>(b, j);
      const uint32_t a[4] = {in ? lo.x : 0u, in ? hi.x : 0u, in ? lo.y : 0u, in ? hi.y : 0u};
      mma_m16n8k16(acc, a, in ? w.x : 0u, in ? w.y : 0u);
    }
  }

  // acc = the chunk's dot from +0; xs: the block's `rows` rows of x (row stride
  // x_ld) at the chunk's start.
  __device__ void run(int rows, const bf16* xs, int x_ld, float (&acc)[4]) {
    const int g = threadIdx.x % 32 / 4;
    // Rows past the block read its last row (their outputs are not stored); with
    // <= 8 rows the mma's rows 8..15 are zero and not read at all.
    const bf16* x_lo = xs + min(g, rows - 1) * x_ld + 4 * t;
    const bf16* x_hi = xs + min(g + 8, rows - 1) * x_ld + 4 * t;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
    for (int b = 0; b < batches; b += 2) {
      step<0>(rows, b, x_lo, x_hi, acc);
      if (b + 1 < batches) step<1>(rows, b + 1, x_lo, x_hi, acc);
    }
  }
};

// Shared memory of a CTA: where CTAs share x, the barrier its copies complete on
// (16 bytes); its row block of x [rows][x_ld] bf16, then (chunks > 1) two buffers
// of the partials [strip][row < rows][8 columns][chunk] fp32, then a ring per warp
// (RingBatches).
struct DecodeSmem {
  size_t bar_bytes, x_bytes, part_bytes;
  __host__ __device__ DecodeSmem(const Problem& p, int rows, int unit_strips, int x_ld, bool shared_x)
      : bar_bytes(shared_x ? 16 : 0),
        x_bytes(bar_bytes + (static_cast<size_t>(rows) * x_ld * sizeof(bf16) + 15) / 16 * 16),
        part_bytes(p.chunks > 1 ? 2 * sizeof(float) * unit_strips * rows * 8 * p.chunks : 0) {}
  template <class Store>
  __host__ __device__ size_t bytes(int warps) const {
    return x_bytes + part_bytes + warps * Store::kWarpBytes;
  }
};

// The block's x rows into xs by cp.async, one commit group. Row by row: a division
// per 16 bytes was most of the M = 16 launches' instructions.
__device__ void copy_x(const Problem& p, int row0, int rows, bf16* xs, int x_ld) {
  for (int r = 0; r < rows; ++r)
    for (int j = 8 * threadIdx.x; j < p.red; j += 8 * blockDim.x)
      cp_async16(xs + r * x_ld + j, p.a.p + static_cast<size_t>(row0 + r) * p.a.ld + j);
  cp_async_commit();
}

// The same for a cluster's CTAs, completing on x_arrived: rank r copies rows r,
// r + n, ... into every CTA of the cluster (a bulk copy a row, TMA multicast), so x
// is read from L2 once a cluster (at M = 16 the 256 CTAs of 30B q_proj each copying
// 64 KB read as many bytes as the 16 MB weight). Every CTA copies its rows, whether
// or not it has a unit: its peers wait for them.
__device__ void copy_x_to_pair(const Problem& p, int row0, int rows, bf16* xs, int x_ld, uint64_t* x_arrived) {
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(x_arrived, 1);
    sm90::mbarrier_init_fence();
  }
  sm90::cluster_sync_after_barrier_init();  // every CTA's barrier is set before a peer's copy lands on it
  if (threadIdx.x != 0) return;
  const uint32_t row_bytes = p.red * sizeof(bf16), ctas = sm90::cluster_size(), rank = sm90::cluster_rank();
  sm90::mbarrier_arrive_expect_tx(x_arrived, rows * row_bytes);
  for (int r = rank; r < rows; r += ctas)
    sm90::bulk_load_multicast(xs + r * x_ld, p.a.p + static_cast<size_t>(row0 + r) * p.a.ld, row_bytes, x_arrived,
                              (1u << ctas) - 1);
}

// Units of `unit_strips` consecutive strips (every chunk of each), unit u to CTA
// u mod gridDim.x: a CTA copies its row block of x once and its warps stream unit
// after unit. The partials' two buffers take units in turn, so one barrier per unit
// both completes a unit's partials and frees the buffer the next unit writes.
// Grid row y takes rows [16y, 16y + 16) of x and the output (past 16 rows, each
// block reads the weight, from L2 after the first); p itself stays the launch's (a
// copy offset to the block slowed M = 1). SharedX: launched in clusters whose CTAs
// share x's copy (copy_x_to_pair); the other instances hold no cluster instruction
// (a kernel holding one runs M = 1 slower even in clusters of one).
template <class Store, bool SharedX>
__global__ void __launch_bounds__(kMaxWarps * 32) decode_kernel(const Problem p, const int unit_strips,
                                                                 const int x_ld) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int row0 = kDecodeRows * blockIdx.y, rows = min(kDecodeRows, p.m - row0);
  const DecodeSmem plan(p, rows, unit_strips, x_ld, SharedX);
  uint64_t* x_arrived = reinterpret_cast<uint64_t*>(smem_raw);
  bf16* xs = reinterpret_cast<bf16*>(smem_raw + plan.bar_bytes);
  float* part = reinterpret_cast<float*>(smem_raw + plan.x_bytes);
  uint2* rings = reinterpret_cast<uint2*>(smem_raw + plan.x_bytes + plan.part_bytes);
  const int part_elems = unit_strips * rows * 8 * p.chunks;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int all_strips = (p.n + 7) / 8, units = (all_strips + unit_strips - 1) / unit_strips;
  const auto tasks_of = [&](int unit) { return min(unit_strips, all_strips - unit * unit_strips) * p.chunks; };

  if constexpr (SharedX) copy_x_to_pair(p, row0, rows, xs, x_ld, x_arrived);
  else copy_x(p, row0, rows, xs, x_ld);

  // The warp's tasks in order: task warp, warp + warps, ... of each of the CTA's
  // units. Each task's weight loads start as the previous task ends (the first
  // while x arrives), before the stores and the barrier between units.
  StripChain<Store> chain(rings + warp * Store::kWarpBytes / sizeof(uint2));
  const auto start = [&](int unit, int task) {
    const bool has_task = unit < units && task < tasks_of(unit);
    if (has_task) chain.start(p, (unit * unit_strips + task / p.chunks) * 8, task % p.chunks * p.chunk);
    return has_task;
  };
  // x: committed before the batches a start commits (or on its barrier).
  const bool has_task = start(blockIdx.x, warp);
  if constexpr (SharedX) {
    sm90::mbarrier_wait(x_arrived, 0);
  } else {
    if (has_task) cp_async_wait<Store::kCommits>();
    else cp_async_wait<0>();
    __syncthreads();
  }

  const StripTile tile{lane};
  int buf = 0;
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x, buf ^= 1) {
    const int tasks = tasks_of(unit), strip0 = unit * unit_strips;
    float* unit_part = part + buf * part_elems;
    for (int task = warp; task < tasks; task += warps) {
      float acc[4];
      chain.run(rows, xs + task % p.chunks * p.chunk, x_ld, acc);
      if (task + warps < tasks) start(unit, task + warps);
      else start(unit + gridDim.x, warp);
      const int s = task / p.chunks, c = task % p.chunks;
      if (p.chunks == 1) {
        store_outputs<StripCfg>(p, tile, acc, row0, (strip0 + s) * 8);
        continue;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (tile.row(i) < rows) unit_part[((s * rows + tile.row(i)) * 8 + tile.col(i)) * p.chunks + c] = acc[i];
    }
    if (p.chunks == 1) continue;
    __syncthreads();
    for (int s = warp; s < tasks / p.chunks; s += warps) {
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        v[i] = tile.row(i) < rows
                   ? pairwise_tree(unit_part + ((s * rows + tile.row(i)) * 8 + tile.col(i)) * p.chunks, p.chunks)
                   : 0.0f;
      store_outputs<StripCfg>(p, tile, v, row0, (strip0 + s) * 8);
    }
  }
}

// A launch of decode_kernel<Store, SharedX>: as many CTAs as fit on the GPU at
// once, at most one per unit, over all row blocks; where SharedX in clusters of
// kXCluster (a cluster's SMs share a GPC, so fewer may fit than the SMs allow).
struct DecodeLaunch {
  const Problem& p;
  int warps, units, row_blocks, unit_strips, x_ld;
  size_t smem;
  template <class Store, bool SharedX>
  void run(int max_smem, cudaStream_t stream) const {
    const auto kernel = decode_kernel<Store, SharedX>;
    static const cudaError_t opt_in = allow_smem(kernel, max_smem);
    BP_CUDA_CHECK(opt_in);
    constexpr int kCluster = SharedX ? kXCluster : 1;
    const int sms = multiprocessors();
    cudaLaunchAttribute cluster;
    cudaLaunchConfig_t config =
        cluster_launch_config(dim3(kCluster * sms, row_blocks), warps * 32, smem, stream, kCluster, cluster);
    int fit = 0;  // clusters, or CTAs
    if constexpr (SharedX) {
      BP_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, kernel, &config));
    } else {
      BP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, warps * 32, smem));
      fit *= sms;
    }
    config.gridDim.x = kCluster * std::min((units + kCluster - 1) / kCluster, std::max(1, fit / row_blocks));
    BP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, unit_strips, x_ld));
  }
};

}  // namespace

bool run_decode(Major ma, Major mb, const Problem& p, cudaStream_t stream) {
  if (ma != Major::Red || mb != Major::Red || p.m > kDecodeBlockedRows || !p.a.vec || !p.b.vec) return false;
  // Row blocks re-read the weight once a block, which pays where a chain is at least
  // a batch long; chunks shorter than that run every batch checked (the experts'
  // chunks of 96 at M = 128 ran slower in blocks than on mma.sync).
  if (p.m > kDecodeRows && std::min(p.chunk, p.red) < kBatch * 16) return false;
  const int strips = (p.n + 7) / 8, sms = multiprocessors();
  const int row_blocks = (p.m + kDecodeRows - 1) / kDecodeRows;
  // A unit is as many strips as the warps hold (every chunk of a strip in one
  // CTA), fewer while the units of all row blocks would not cover every SM.
  int unit_strips = std::max(1, kMaxWarps / p.chunks);
  while (unit_strips > 1 && (strips + unit_strips - 1) / unit_strips * row_blocks < sms) unit_strips /= 2;
  const int units = (strips + unit_strips - 1) / unit_strips;
  const int warps = std::min(kMaxWarps, unit_strips * p.chunks);
  const int x_ld = x_stride_elems(p.red);
  // Past M = 1, CTA pairs share x's copy (4 KB at M = 1 does not win back what a
  // cluster launch costs).
  const bool shared_x = p.m > 1 && units > 1;
  const DecodeSmem plan(p, std::min(p.m, kDecodeRows), unit_strips, x_ld, shared_x);
  static const int max_smem = [] {
    int dev = 0, bytes = 0;
    BP_CUDA_CHECK(cudaGetDevice(&dev));
    BP_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return bytes;
  }();
  const auto launch = [&](auto store) {
    using Store = typename decltype(store)::type;
    const DecodeLaunch on{p, warps, units, row_blocks, unit_strips, x_ld, plan.bytes<Store>(warps)};
    if (shared_x) on.run<Store, true>(max_smem, stream);
    else on.run<Store, false>(max_smem, stream);
    return true;
  };
  // A launch of few warps (a single chunk over few strips: at most two warps a CTA)
  // takes the deepest ring whose CTA stays within a third of an SM's shared memory
  // (two or three CTAs an SM), at least two batches (faster than the registers even
  // so); the many warps of chunked launches and of the lm_heads keep their batches
  // in registers (a ring is slower there: fewer CTAs an SM).
  const size_t third = static_cast<size_t>(max_smem) / 3;
  const auto fits = [&](size_t bytes) { return bytes <= static_cast<size_t>(max_smem); };
  if (p.chunks > 1 || warps > 2 || !fits(plan.bytes<RingBatches<2>>(warps)))
    return fits(plan.bytes<RegisterBatches>(warps)) && launch(std::type_identity<RegisterBatches>{});
  if (plan.bytes<RingBatches<8>>(warps) <= third) return launch(std::type_identity<RingBatches<8>>{});
  if (plan.bytes<RingBatches<4>>(warps) <= third) return launch(std::type_identity<RingBatches<4>>{});
  return launch(std::type_identity<RingBatches<2>>{});
}

}  // namespace bp::cuda::gemm
