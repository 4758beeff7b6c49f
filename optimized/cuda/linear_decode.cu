// The decode engine of linear (linear_gemm.cuh says what every GEMM computes):
// sm90-tc forward GEMMs of decode size (M <= 16 rows of x), which stream the weight
// once and are bound by its bytes. A warp per strip of 8 output columns and chunk
// (C times the warps of linear_mma.cu's decode tiles on chunked reductions); the
// weight goes from global memory straight into the mma B fragments in batches of
// kBatch k16 groups, two batches in flight per warp (no shared memory for the
// weight).
//
//   - Work: a task is one strip of 8 output columns (8 weight rows) × one chunk of
//     the reduction; one warp runs one task's chain at a time. A unit is a few
//     consecutive strips with all their chunks (at most kMaxWarps tasks), so the
//     chunk tree runs inside the CTA; a CTA takes unit after unit.
//   - x (<= 16 rows × K) is copied once per CTA into shared memory (cp.async); the
//     warps issue their first weight loads before they wait for it.
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

#include "optimized/cuda/common.h"
#include "optimized/cuda/linear_gemm.cuh"
#include "optimized/cuda/ptx.cuh"
#include "reference/numerics/bf16.h"
#include "reference/numerics/reduce.h"

namespace bp::cuda::gemm {
namespace {

constexpr int kMaxWarps = 8;
// k16 groups per batch of weight loads (two registers each); two batches, 8 KB,
// in flight per warp keep ~2 MB in flight even on 0.6B q_proj's 256 warps.
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

// One warp's chain over one chunk of one strip, its weight loads in batches of
// kBatch groups, two batches in flight: run() waits for batch b (issued a whole
// batch earlier) while batch b + 1 is on its way, then reissues b's registers for
// b + 2. A rolling ring (each group's load refilled kDepth groups ahead) ran at one
// group per memory latency (bench/NOTES.md, session 11): a batch issued back to
// back and waited for at once needs one wait per batch. Every lane issues every
// load of a batch (a dead piece reads its row's first 8 bytes and is zeroed where
// used), so no branch separates the loads.
struct StripChain {
  uint2 batch[2][kBatch];
  const bf16* w_row;  // this lane's weight row
  int k;              // this lane's first element in it: the chunk's start + 4t
  int groups, batches, len, t;

  // Group i's piece of this lane lies inside the chunk (so i < groups).
  __device__ bool live(int i) const { return 16 * i + 4 * t < len; }
  __device__ void issue(int b, uint2 (&dst)[kBatch]) const {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = b * kBatch + j;
      dst[j] = ld_stream8(w_row + (live(i) ? k + 16 * i : 0));
    }
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
    if (batches > 0) issue(0, batch[0]);
    if (batches > 1) issue(1, batch[1]);
  }

  // The groups of batch b from src, in increasing order, into acc.
  __device__ void consume(const Problem& p, int b, const uint2 (&src)[kBatch], const bf16* x_lo, const bf16* x_hi,
                          float (&acc)[4]) const {
    const bool hi_rows = p.m > 8;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = b * kBatch + j;
      if (i >= groups) break;
      const bool in = live(i);
      // {row g: k 2t.., row g+8: k 2t.., row g: k 2t+8.., row g+8: k 2t+8..}; a dead piece reads k 0..3.
      const uint2 lo = *reinterpret_cast<const uint2*>(x_lo + (in ? 16 * i : 0));
      const uint2 hi = hi_rows ? *reinterpret_cast<const uint2*>(x_hi + (in ? 16 * i : 0)) : make_uint2(0, 0);
      const uint32_t a[4] = {in ? lo.x : 0u, in ? hi.x : 0u, in ? lo.y : 0u, in ? hi.y : 0u};
      mma_m16n8k16(acc, a, in ? src[j].x : 0u, in ? src[j].y : 0u);
    }
  }

  // acc = the chunk's dot from +0; xs: x's rows (row stride x_ld) at the chunk's start.
  __device__ void run(const Problem& p, const bf16* xs, int x_ld, float (&acc)[4]) {
    const int g = threadIdx.x % 32 / 4;
    // Rows past M read row M − 1 (their outputs are not stored); with M <= 8 the
    // mma's rows 8..15 are zero and not read at all.
    const bf16* x_lo = xs + min(g, p.m - 1) * x_ld + 4 * t;
    const bf16* x_hi = xs + min(g + 8, p.m - 1) * x_ld + 4 * t;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
    for (int b = 0; b < batches; b += 2) {
      consume(p, b, batch[0], x_lo, x_hi, acc);
      if (b + 2 < batches) issue(b + 2, batch[0]);
      if (b + 1 < batches) {
        consume(p, b + 1, batch[1], x_lo, x_hi, acc);
        if (b + 3 < batches) issue(b + 3, batch[1]);
      }
    }
  }
};

// Units of `unit_strips` consecutive strips (every chunk of each), unit u to CTA
// u mod gridDim.x: a CTA copies x once and its warps stream unit after unit.
// Shared memory: x [m][x_ld] bf16, then (chunks > 1) two buffers of the partials
// [strip][row < m][8 columns][chunk] fp32, units alternating between them, so
// one barrier per unit both completes a unit's partials and frees the buffer
// the next unit writes.
__global__ void __launch_bounds__(kMaxWarps * 32) decode_kernel(const Problem p, const int unit_strips,
                                                                 const int x_ld) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* xs = reinterpret_cast<bf16*>(smem_raw);
  float* part = reinterpret_cast<float*>(smem_raw + (static_cast<size_t>(p.m) * x_ld * sizeof(bf16) + 15) / 16 * 16);
  const int part_elems = unit_strips * p.m * 8 * p.chunks;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int all_strips = (p.n + 7) / 8, units = (all_strips + unit_strips - 1) / unit_strips;
  const auto tasks_of = [&](int unit) { return min(unit_strips, all_strips - unit * unit_strips) * p.chunks; };

  const int runs_per_row = p.red / 8;
  for (int v = threadIdx.x; v < p.m * runs_per_row; v += blockDim.x) {
    const int r = v / runs_per_row, j = (v % runs_per_row) * 8;
    cp_async16(xs + r * x_ld + j, p.a.p + static_cast<size_t>(r) * p.a.ld + j);
  }
  cp_async_commit();

  // The warp's tasks in order: task warp, warp + warps, ... of each of the CTA's
  // units. Each task's weight loads start as the previous task ends (the first
  // while x arrives), before the stores and the barrier between units.
  StripChain chain;
  const auto start = [&](int unit, int task) {
    if (unit < units && task < tasks_of(unit))
      chain.start(p, (unit * unit_strips + task / p.chunks) * 8, task % p.chunks * p.chunk);
  };
  start(blockIdx.x, warp);
  cp_async_wait<0>();
  __syncthreads();

  const StripTile tile{lane};
  int buf = 0;
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x, buf ^= 1) {
    const int tasks = tasks_of(unit), strip0 = unit * unit_strips;
    float* unit_part = part + buf * part_elems;
    for (int task = warp; task < tasks; task += warps) {
      float acc[4];
      chain.run(p, xs + task % p.chunks * p.chunk, x_ld, acc);
      if (task + warps < tasks) start(unit, task + warps);
      else start(unit + gridDim.x, warp);
      const int s = task / p.chunks, c = task % p.chunks;
      if (p.chunks == 1) {
        store_outputs<StripCfg>(p, tile, acc, 0, (strip0 + s) * 8);
        continue;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (tile.row(i) < p.m) unit_part[((s * p.m + tile.row(i)) * 8 + tile.col(i)) * p.chunks + c] = acc[i];
    }
    if (p.chunks == 1) continue;
    __syncthreads();
    for (int s = warp; s < tasks / p.chunks; s += warps) {
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        v[i] = tile.row(i) < p.m
                   ? pairwise_tree(unit_part + ((s * p.m + tile.row(i)) * 8 + tile.col(i)) * p.chunks, p.chunks)
                   : 0.0f;
      store_outputs<StripCfg>(p, tile, v, 0, (strip0 + s) * 8);
    }
  }
}

}  // namespace

bool run_decode(Major ma, Major mb, const Problem& p, cudaStream_t stream) {
  if (ma != Major::Red || mb != Major::Red || p.m > kDecodeRows || !p.a.vec || !p.b.vec) return false;
  const int strips = (p.n + 7) / 8, sms = multiprocessors();
  // A unit is as many strips as the warps hold (every chunk of a strip in one
  // CTA), fewer while the units would not cover every SM.
  int unit_strips = std::max(1, kMaxWarps / p.chunks);
  while (unit_strips > 1 && (strips + unit_strips - 1) / unit_strips < sms) unit_strips /= 2;
  const int units = (strips + unit_strips - 1) / unit_strips;
  const int warps = std::min(kMaxWarps, unit_strips * p.chunks);
  const int x_ld = x_stride_elems(p.red);
  const size_t x_bytes = (static_cast<size_t>(p.m) * x_ld * sizeof(bf16) + 15) / 16 * 16;
  const size_t part_bytes = p.chunks > 1 ? 2 * sizeof(float) * unit_strips * p.m * 8 * p.chunks : 0;
  static const int max_smem = [] {
    int dev = 0, bytes = 0;
    BP_CUDA_CHECK(cudaGetDevice(&dev));
    BP_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return bytes;
  }();
  const size_t smem = x_bytes + part_bytes;
  if (smem > static_cast<size_t>(max_smem)) return false;
  static const cudaError_t opt_in = allow_smem(decode_kernel, max_smem);
  BP_CUDA_CHECK(opt_in);
  // As many CTAs as fit on the GPU at once (each copies x once), at most one per unit.
  int per_sm = 0;
  BP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_kernel, warps * 32, smem));
  const int ctas = std::min(units, std::max(1, per_sm) * sms);
  decode_kernel<<<ctas, warps * 32, smem, stream>>>(p, unit_strips, x_ld);
  BP_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace bp::cuda::gemm
