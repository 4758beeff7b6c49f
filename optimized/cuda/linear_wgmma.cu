// The warpgroup engine of linear (sm90-tc on wgmma, operands by TMA; needs sm_90a;
// linear_gemm.cuh says what every GEMM computes).
//
// The same G steps in the same order as TensorCoreDot (linear_mma.cu) — each wgmma
// k16 is one G step per output, K groups walked upward, one CTA per output tile,
// the chunk tree unchanged — on Hopper's asynchronous path: one producer warpgroup
// (one thread) copies 64-element reduction stages of both operands into 128-byte-
// swizzled shared memory with TMA, and a consumer warpgroup per 64 rows of the
// tile (two; one in the 64 × 64 tile) runs wgmma on them while the next stages
// arrive; bf16 outputs leave through shared memory by TMA stores where the tile has
// room (store_by_tma). The CTAs are persistent (one per SM, walking the tiles), so
// the next tile's stages arrive during the current one's last stages and stores.
// The 128 × 256 tile runs on CTA pairs (2-CTA clusters) where its row tiles pair
// up: the pair takes two row tiles of one column tile, and each CTA copies half of
// B's boxes into both (TMA multicast), so B is read from L2 once for two tiles.
// The stages cut the reduction into consecutive 64-element pieces whatever the
// chunks (a chunk of 96 is 1.5 stages, and no element is copied twice); a consumer
// issues each stage's groups chunk by chunk, so no group straddles two chunks as
// long as chunks are whole groups (chunk % 16 == 0, or a single chunk); the part of
// a stage past the reduction's end arrives as zeros, exactly the padding of
// gemm_tile (linear_mma.cu).
//
// A chunked reduction with too few tiles for the SMs runs as its chunk tree's two
// subtrees on two CTAs a tile, their roots added after (launch_subtrees).
//
// It takes the sm90-tc GEMMs where TMA can read both operands in place, chunks are
// whole k16 groups and M is past decode sizes (run_warpgroup,
// warpgroup_group_fits); linear.cu sends the rest to the decode engine or mma.sync.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/linear_gemm.cuh"
#include "optimized/cuda/tma.h"
#include "optimized/cuda/wgmma.cuh"
#include "reference/numerics/bf16.h"

namespace bp::cuda::gemm {
namespace {

constexpr int kWgBK = 64;                              // one 128-byte swizzle row of bf16
constexpr int kBox = 64;                               // TMA boxes: 64 × 64 bf16
constexpr uint32_t kBoxBytes = kBox * kBox * sizeof(bf16);
constexpr uint32_t kSwizzleGroupBytes = 8 * 128;       // 8 rows of 128 bytes: the SBO of every operand

// Cluster > 1: the CTAs of a cluster take row tiles next to each other of one
// column tile and share B's stages, each copying its part of the boxes into all of
// them (TMA multicast): one L2 read of B feeds Cluster tiles.
// BM = 64 (the 64 × 64 tile): one consumer warpgroup.
template <int BN, int RegSlots, int Stages, int SmemLevels = 0, int Cluster = 1, int BM = 128>
struct WarpgroupTile {
  static constexpr int kBM = BM, kBN = BN, kRegSlots = RegSlots, kStages = Stages, kSmemLevels = SmemLevels;
  static constexpr int kCluster = Cluster;
  static_assert((BN / 64) % Cluster == 0, "B's boxes split evenly over the cluster");
  static constexpr int kConsumers = kBM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kAcc = BN / 2;  // a consumer thread's share of its 64 × BN tile
  static constexpr uint32_t kABytes = kBM * kWgBK * sizeof(bf16), kBBytes = kBN * kWgBK * sizeof(bf16);
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  // The chunk tree's levels kRegSlots .. kRegSlots + kSmemLevels − 1 (ChunkTree).
  static constexpr uint32_t kLevelBytes = kSmemLevels * kBM * kBN * sizeof(float);
  // The zero operand of the groups a step does not take (WarpgroupDot::step): one
  // 128-byte swizzle atom, 1024-byte aligned, which is all that descriptor strides
  // of 0 read. compute-sanitizer takes an operand's read as its whole extent from
  // the start (up to kBN × 16 bf16), so the zeros come first and that extent
  // stays inside the CTA's stages.
  static constexpr uint32_t kZeroBytes = 1024;
  static_assert(kZeroBytes + kStageBytes >= kBN * 16 * sizeof(bf16), "the sanitizer's extent of a zero operand");
  // The tiles with room for them store bf16 outputs through shared memory by TMA
  // (store_by_tma): each consumer warp its 16 rows, kOutCols columns at a time, as
  // 64-column boxes of the output map (128-byte swizzle, 16 rows: 2 KB).
  static constexpr int kOutCols = BN % 128 == 0 ? 128 : BN;
  static constexpr uint32_t kOutBoxBytes = 16 * 64 * sizeof(bf16);
  static constexpr uint32_t kOutWarpBytes = kOutCols / 64 * kOutBoxBytes;
  static constexpr uint32_t kOutBoxesBytes = 4 * kConsumers * kOutWarpBytes;
  // The tree tiles keep a warp's boxes in its share of the first shared level
  // (ChunkTree keeps a warp's elements of a level together): the tree has merged
  // that level when the root is stored, and the CTA's next tile writes it first
  // at the end of chunk 2^kRegSlots − 1, after the stores have read the boxes
  // (consume_chunks). That saves a stage's worth of shared memory.
  static constexpr uint32_t kLevelWarpBytes = kBM * kBN * sizeof(float) / (4 * kConsumers);
  static constexpr bool kOutInLevels = kSmemLevels > 0 && kOutWarpBytes <= kLevelWarpBytes;
  // Zeros, stages, tree levels, the stages' barriers, and slack to align the zeros
  // to 1024 bytes; then the outputs' boxes where they fit.
  static constexpr size_t kBaseBytes =
      size_t{kStages} * kStageBytes + kZeroBytes + kLevelBytes + 2 * kStages * sizeof(uint64_t) + 1024;
  static constexpr uint32_t kOutBytes =
      !kOutInLevels && kBaseBytes + kOutBoxesBytes <= 227 * 1024 ? kOutBoxesBytes : 0;
  static constexpr bool kOutByTma = kOutInLevels || kOutBytes > 0;
  static constexpr uint32_t kOutWarpStride = kOutInLevels ? kLevelWarpBytes : kOutWarpBytes;
  static constexpr size_t kSmemBytes = kBaseBytes + kOutBytes;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0 && kLevelBytes % 1024 == 0,
                "every operand tile and output box stays 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "a CTA's shared memory on sm_90");
};
// A single chunk, or long ones (long_chunks), and enough tiles: 128 × 256 (128
// accumulators per consumer thread, so the chunk tree lives in the scratch).
using WgWideTile = WarpgroupTile<256, 0, 4>;
// The same on CTA pairs sharing B, where the row tiles pair up and make three waves
// or more, or the chunks are long: the 128 × 256 tile reads 85 FLOP per L2 byte,
// nearly all of the L2's throughput at the full tensor rate; the pair reads 128, so
// the pairs halve B's L2 reads. A launch with a cluster attribute costs more (even
// with clusters of one CTA), which fewer tiles do not win back, but a launch of
// milliseconds does (30B lm_head's input gradient, 8 chunks of 18992, fed from an
// L2 near its limit); the 128 × 128 tiles are slower in pairs (bench/DECISIONS.md,
// linear: where pairs pay, long chunks on CTA pairs).
using WgWidePairTile = WarpgroupTile<256, 0, 4, 0, 2>;
// A single chunk and fewer tiles: 128 × 128.
using WgNarrowTile = WarpgroupTile<128, 0, 6>;
// A single chunk whose 128 × 192 tiles make fewer waves of work than the others
// (mid_tiles_win): four stages of 40 KB and the outputs' 48 KB of boxes.
using WgMidTile = WarpgroupTile<192, 0, 4>;
// A single chunk whose 128 × 128 tiles leave most SMs idle (launch_few_tiles: 30B's kv_proj
// at 1024 tokens makes 32 of them): 128 × 64, twice the tiles, eight stages of 24
// KB for the longer walk each makes alone; and 64 × 64, four times the tiles (one
// consumer warpgroup), eight of 16 KB.
using WgSlimTile = WarpgroupTile<64, 0, 8>;
using WgSmallTile = WarpgroupTile<64, 0, 8, 0, 1, 64>;
// Chunked reductions and grouped launches: 128 × 128, the chunk tree's level 0 in
// registers beside the accumulators (consume_chunks; level 1 there too spilled).
// Six stages and the outputs' boxes (store_by_tma) beat seven stages without them
// (bench/DECISIONS.md, linear: what the TMA stores gave).
using WgChunkTile = WarpgroupTile<128, 1, 6>;
// Chunked reductions whose tree reaches level 1 (three chunks or more): level 1 in
// shared memory (64 KB, for two stages), so only levels >= 2 go through the global
// scratch; and, for chunks of at most two stages (the weight gradients' 128 tokens,
// the experts' 96), levels 1 and 2 there with three stages. The scratch's L2
// traffic bound those: lm_head's weight gradient, 32 chunks a tile, was L2-bound.
// The long chunks want the deeper ring, the short ones the deeper tree
// (bench/DECISIONS.md, linear: tree levels in shared memory). Both store bf16
// outputs by TMA through boxes inside their first shared level (kOutInLevels),
// which gave the tree tile a fifth stage and the deep one the TMA stores.
using WgTreeTile = WarpgroupTile<128, 1, 5, 1>;
using WgDeepTreeTile = WarpgroupTile<128, 1, 3, 2>;
// Chunked reductions whose 128 × 128 tiles would leave most SMs idle (decode
// batches past 16 rows: 30B's o_proj at 128 tokens makes 16 of them): 64 × 64,
// four times the tiles (twice where M <= 64), level 0 in registers and the few
// deeper nodes in the scratch, eight stages of 16 KB for the long walk each makes
// alone. The decode engine's 16-row blocks, which ran these before, read the
// weight once per block (bench/DECISIONS.md, linear: the 64 × 64 chunk tile).
using WgSmallChunkTile = WarpgroupTile<64, 1, 8, 0, 1, 64>;

// Where an operand's stage lives in shared memory: Red operands are kRows rows of
// 128 bytes (K-major, the swizzle repeating every 8 rows); Row operands are boxes
// of 64 rows × 64 reduction elements, one 128-byte line per reduction element
// (M/N-major, a box every kBoxBytes). The k16 group kk starts 32 bytes (Red) or 16
// lines (Row) further.
template <Major M>
struct SwizzledOperand {
  static constexpr int kTrans = M == Major::Row ? 1 : 0;
  static constexpr uint32_t kLbo = M == Major::Row ? kBoxBytes : 16;  // K-major swizzled: unused
  __device__ static uint32_t group_offset(int kk) { return M == Major::Red ? 32u * kk : 16u * 128u * kk; }
  __device__ static uint64_t descriptor(uint32_t tile, int kk) {
    return sm90::swizzled_descriptor(tile + group_offset(kk), kLbo, kSwizzleGroupBytes);
  }
  // Copies rows [row0, row0 + rows) × reduction [j0, j0 + kWgBK) as rows / 64 boxes;
  // shared by a cluster of Of CTAs, this one (rank) copies its Of-th of the boxes
  // into all of them.
  template <int Of = 1>
  __device__ static void load(void* tile, const void* map, uint64_t* bar, int row0, int j0, int rows,
                              int rank = 0) {
    const int boxes = rows / kBox / Of;
    for (int b = rank * boxes; b < (rank + 1) * boxes; ++b) {
      void* dst = static_cast<char*>(tile) + b * kBoxBytes;
      const int inner = M == Major::Red ? j0 : row0 + b * kBox, outer = M == Major::Red ? row0 + b * kBox : j0;
      if constexpr (Of == 1) sm90::tma_load_2d(dst, map, bar, inner, outer);
      else sm90::tma_load_2d_multicast(dst, map, bar, inner, outer, (1u << Of) - 1);
    }
  }
};

template <int N, int TransA, int TransB>
__device__ inline void wgmma_k16(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (N == 256) sm90::wgmma_m64n256k16<TransA, TransB>(d, a, b, scale_d);
  else if constexpr (N == 192) sm90::wgmma_m64n192k16<TransA, TransB>(d, a, b, scale_d);
  else if constexpr (N == 128) sm90::wgmma_m64n128k16<TransA, TransB>(d, a, b, scale_d);
  else sm90::wgmma_m64n64k16<TransA, TransB>(d, a, b, scale_d);
}

// A consumer warpgroup's 64 × kBN accumulators: warp w of the group holds rows
// 16w..16w+15 in mma.sync's C layout, n8 block after n8 block (PTX ISA, wgmma
// register fragments).
template <class Cfg, Major MA, Major MB>
struct WarpgroupDot {
  using PairedColumns = void;  // accumulators 2i and 2i + 1 are adjacent columns
  using OpA = SwizzledOperand<MA>;
  using OpB = SwizzledOperand<MB>;
  float acc[Cfg::kAcc];
  int consumer, row_base, lane;

  __device__ explicit WarpgroupDot(int c) : consumer(c) {
    const int t = threadIdx.x % 128;
    row_base = 64 * c + 16 * (t / 32);
    lane = t % 32;
    clear();
  }
  __device__ void clear() {
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.0f;
  }
  __device__ int row(int i) const { return row_base + lane / 4 + 8 * ((i % 4) / 2); }
  __device__ int col(int i) const { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

  // Issues the stage's groups kk0 .. kk1 − 1 in increasing order as one commit
  // group; `fresh` (kk0 is its chunk's first group) starts the accumulators from +0
  // by scale-d = 0 (hw_truth: the bits of a +0 accumulator) instead of a clear.
  // All four wgmmas issue every time, straight-line: the groups outside kk0 .. kk1
  // multiply the CTA's zero bytes (`zeros`, descriptor strides 0), so each adds
  // only zero products, which take no part (SPEC §2.3: acc stays as it is; those
  // before a fresh kk0 are discarded by its scale-d = 0). A wgmma under a branch
  // gets a warpgroup.arrive injected before it (ptxas C7519).
  // The stage's addresses (and `consumer`) are warp_uniform: uniform descriptors.
  __device__ void step(uint32_t tile_a, uint32_t tile_b, uint32_t zeros, int kk0, int kk1, bool fresh) {
    tile_a = sm90::warp_uniform(tile_a);
    tile_b = sm90::warp_uniform(tile_b);
    const uint32_t a = tile_a + consumer * kBoxBytes;  // this group's 64 rows: 64 K-major rows or one box
    const uint64_t zero = sm90::swizzled_descriptor(zeros, 0, 0);
    const uint64_t a0 = OpA::descriptor(a, 0), b0 = OpB::descriptor(tile_b, 0);
    uint64_t desc_a[kWgBK / 16], desc_b[kWgBK / 16];
    int scale_d[kWgBK / 16];
#pragma unroll
    for (int kk = 0; kk < kWgBK / 16; ++kk) {
      const bool in = kk >= kk0 && kk < kk1;
      desc_a[kk] = in ? sm90::descriptor_plus(a0, OpA::group_offset(kk)) : zero;
      desc_b[kk] = in ? sm90::descriptor_plus(b0, OpB::group_offset(kk)) : zero;
      scale_d[kk] = kk == kk0 && fresh ? 0 : 1;
    }
    sm90::fence_accumulators(acc);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWgBK / 16; ++kk)
      wgmma_k16<Cfg::kBN, OpA::kTrans, OpB::kTrans>(acc, desc_a[kk], desc_b[kk], scale_d[kk]);
    sm90::wgmma_commit();
  }
  // After a wgmma wait that completed this dot's groups: the compiler may read acc
  // from here on.
  __device__ void fence() { sm90::fence_accumulators(acc); }
  template <int Pending>
  __device__ void wait() {
    sm90::wgmma_wait<Pending>();
    fence();
  }
};

// Shared-memory plan of one CTA: the zero bytes and the stages (1024-byte
// aligned), the chunk tree's shared levels, the outputs' boxes, then a "full"
// barrier per stage (the producer's copies landed) and an "empty" one (every
// consumer warp is done reading it).
// The consumers' loops take the stages and full barriers by shared-memory address
// (a_at, b_at, full_at), computed from two kept at the start: converting the
// pointers each stage cost a dozen instructions of its ~130 (ncu, 128 × 256 tile).
template <class Cfg>
struct WarpgroupSmem {
  unsigned char* stages;
  unsigned char* zeros;
  float* levels;
  uint64_t* full;
  uint64_t* empty;
  uint32_t stages_at, zeros_at, out_at, full0_at;
  __device__ explicit WarpgroupSmem(unsigned char* raw) {
    zeros = raw + ((1024 - sm90::shared_addr(raw) % 1024) % 1024);
    stages = zeros + Cfg::kZeroBytes;
    levels = reinterpret_cast<float*>(stages + size_t{Cfg::kStages} * Cfg::kStageBytes);
    unsigned char* out = reinterpret_cast<unsigned char*>(levels) + Cfg::kLevelBytes;
    full = reinterpret_cast<uint64_t*>(out + Cfg::kOutBytes);
    empty = full + Cfg::kStages;
    zeros_at = sm90::shared_addr(zeros);
    stages_at = zeros_at + Cfg::kZeroBytes;
    out_at = sm90::shared_addr(Cfg::kOutInLevels ? static_cast<void*>(levels) : out);
    full0_at = sm90::shared_addr(full);
  }
  __device__ unsigned char* a(int slot) const { return stages + static_cast<size_t>(slot) * Cfg::kStageBytes; }
  __device__ unsigned char* b(int slot) const { return a(slot) + Cfg::kABytes; }
  __device__ uint32_t a_at(int slot) const { return stages_at + slot * Cfg::kStageBytes; }
  __device__ uint32_t b_at(int slot) const { return a_at(slot) + Cfg::kABytes; }
  __device__ uint32_t full_at(int slot) const { return full0_at + slot * sizeof(uint64_t); }
};

// A CTA's stages form one ring over all its tiles: its n-th stage (counting from
// its first tile's first) is in slot n % kStages, filled for the (n / kStages)-th
// time, so the producer loads the next tile's stages while the consumers finish
// the current one.
template <class Cfg>
struct StageRing {
  int first;  // the ring index of the tile's stage 0
  __device__ int slot(int s) const { return (first + s) % Cfg::kStages; }
  __device__ uint32_t round(int s) const { return (first + s) / Cfg::kStages; }
};

// A consumer's walk of the ring stage by stage from a tile's stage 0: the slot and
// the parity of its fill, kept by an add and a compare a stage (the divisions of
// StageRing, with the pieces' bounds, were most of the chunk loop's ~100
// instructions a stage: ncu, 30B o_proj at M = 4096).
template <class Cfg>
struct RingCursor {
  uint32_t slot, parity;
  __device__ explicit RingCursor(StageRing<Cfg> ring) : slot(ring.slot(0)), parity(ring.round(0) & 1) {}
  __device__ void next() {
    if (++slot == Cfg::kStages) {
      slot = 0;
      parity ^= 1;
    }
  }
};

// One tile of the GEMM: its problem, the problem's operand maps (the second pair's
// are the first's where it has one pair), the output's map where its bf16 outputs
// go by TMA (null: store_outputs), and its corner.
struct TileJob {
  const Problem* p;
  const void* map_a;
  const void* map_b;
  const void* map_a2;
  const void* map_b2;
  const void* map_out;
  int row0, col0;
};

// Stage s of the tile holds reduction elements [s·kWgBK, (s + 1)·kWgBK), whatever
// the chunks; from the problem's second_from on (a whole stage), of its second pair.
// In a cluster the stage's full barrier expects all of B, this CTA's part and its
// peers'; a slot is refilled once every CTA's consumers released it.
template <class Cfg, Major MA, Major MB>
__device__ void warpgroup_producer(const TileJob& job, const WarpgroupSmem<Cfg>& sm, int stages,
                                   StageRing<Cfg> ring, int rank) {
  const int second = job.p->second_from > 0 ? job.p->second_from / kWgBK : stages;
  for (int s = 0; s < stages; ++s) {
    const int slot = ring.slot(s);
    const uint32_t round = ring.round(s);
    if (round > 0) sm90::mbarrier_wait(&sm.empty[slot], (round - 1) & 1);
    sm90::mbarrier_arrive_expect_tx(&sm.full[slot], Cfg::kStageBytes);
    const bool hi = s >= second;
    const int j0 = (hi ? s - second : s) * kWgBK;
    SwizzledOperand<MA>::load(sm.a(slot), hi ? job.map_a2 : job.map_a, &sm.full[slot], job.row0, j0, Cfg::kBM);
    SwizzledOperand<MB>::template load<Cfg::kCluster>(sm.b(slot), hi ? job.map_b2 : job.map_b, &sm.full[slot],
                                                      job.col0, j0, Cfg::kBN, rank);
  }
}

// A clustered CTA's producer, after its last stage: waits until the last fill of
// every slot was released by the consumers of every CTA, so no peer's arrival can
// reach this CTA's barriers after it exits.
template <class Cfg>
__device__ void wait_ring_released(const WarpgroupSmem<Cfg>& sm, int filled) {
  for (int slot = 0; slot < min(filled, Cfg::kStages); ++slot) {
    const int fills = (filled - slot + Cfg::kStages - 1) / Cfg::kStages;
    sm90::mbarrier_wait(&sm.empty[slot], (fills - 1) & 1);
  }
}

// Consumer loops release a stage once the wgmma reading it is done: one stage's
// wgmma stays in flight while the next is issued.
template <class Cfg>
struct StageRelease {
  const WarpgroupSmem<Cfg>& sm;
  int unreleased = -1;  // the slot whose wgmma may still read it
  // One arrival per consumer warp: its wgmma wait (.sync.aligned) has passed on
  // every lane, and 256 arrivals per stage on one barrier would queue. In a
  // cluster, on the slot's barrier in every CTA (each one's producer copies into it).
  __device__ void release(int slot) const {
    if (threadIdx.x % 32 != 0) return;
    if constexpr (Cfg::kCluster == 1) sm90::mbarrier_arrive(&sm.empty[slot]);
    else
      for (int rank = 0; rank < Cfg::kCluster; ++rank) sm90::mbarrier_arrive_cluster(&sm.empty[slot], rank);
  }
  // After wait<1>: every slot but `slot` (the newest group's) is free. A stage
  // shared by two chunks is issued as two groups: the second keeps it.
  __device__ void keep_only(int slot) {
    if (unreleased == slot) return;
    if (unreleased >= 0) release(unreleased);
    unreleased = slot;
  }
  // After wait<0>: all free.
  __device__ void all() {
    if (unreleased >= 0) release(unreleased);
    unreleased = -1;
  }
};

// A consumer warp's 16 rows of the tile's bf16 outputs v (output_at: the dot's
// accumulators, or the chunk tree's root) through shared memory and
// TMA: kOutCols columns at a time, rounded, put into its kOutWarpBytes with stmatrix
// (8 × 8 blocks of mma's C layout: two n8 blocks of 16 rows an instruction) in the
// 128-byte swizzle of the output map's boxes, then stored by its lane 0; TMA leaves
// out what lies past the output's edge. Stored from registers instead (store_outputs:
// 64 four-byte stores a thread, each over 8 rows), the 128 × 256 tile's consumers
// waited on the store queue (lg_throttle) with the tensor cores idle
// (bench/DECISIONS.md, linear: outputs by TMA).
template <class Cfg, class Dot, class V>
__device__ void store_by_tma(const Dot& d, const V& v, const void* map_out, uint32_t buf, int row0, int col0) {
  constexpr int kBlocks = Cfg::kOutCols / 8;  // n8 blocks at a time
  const int lane = threadIdx.x % 32;
  const int row = lane % 8 + 8 * (lane / 8 % 2);  // of the warp's 16, where this lane's stmatrix rows go
#pragma unroll
  for (int part = 0; part < Cfg::kBN / Cfg::kOutCols; ++part) {
    if (lane == 0) sm90::bulk_wait_read();  // the previous part's boxes have left the buffer
    __syncwarp();
#pragma unroll
    for (int jj = 0; jj < kBlocks; jj += 2) {
      const int i = 4 * (part * kBlocks + jj);  // n8 blocks jj and jj + 1: rows g, g + 8 each
      const int chunk = jj % 8 + lane / 16;     // the 16-byte chunk of the box row
      const auto pair = [&](int k) { return round_bf16x2(output_at(v, i + k), output_at(v, i + k + 1)); };
      sm90::stmatrix_x4(buf + jj / 8 * Cfg::kOutBoxBytes + row * 128 + ((chunk ^ (row % 8)) * 16), pair(0), pair(2),
                        pair(4), pair(6));
    }
    sm90::fence_proxy_async();
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int box = 0; box < Cfg::kOutCols / 64; ++box)
        sm90::tma_store_2d(map_out, buf + box * Cfg::kOutBoxBytes, col0 + part * Cfg::kOutCols + box * 64,
                           row0 + d.row_base);
      sm90::bulk_commit();
    }
  }
}

// This consumer warp's share of the outputs' boxes.
template <class Cfg>
__device__ uint32_t out_buffer(const WarpgroupSmem<Cfg>& sm) {
  return sm.out_at + (threadIdx.x - 128) / 32 * Cfg::kOutWarpStride;
}

// Before this warp writes over its boxes' bytes: the TMA stores of its previous tile
// have read them.
__device__ inline void wait_boxes_read() {
  if (threadIdx.x % 32 == 0) sm90::bulk_wait_read();
  __syncwarp();
}

// One chunk (the tiles without tree slots; run_warpgroup gives them no more): the
// loop only issues and releases, so the accumulators are touched by nothing but
// wgmma until the end (with the tree's merges and clears in the loop, ptxas
// injects a wgmma wait where the loop's paths join: C7517).
template <class Cfg, Major MA, Major MB>
__device__ void consume_one_chunk(const Problem& p, const WarpgroupSmem<Cfg>& sm, int row0, int col0, int stages,
                                  int consumer, StageRing<Cfg> ring, const void* map_out) {
  WarpgroupDot<Cfg, MA, MB> dot(consumer);
  StageRelease<Cfg> stage{sm};
  for (int s = 0; s < stages; ++s) {
    const int slot = ring.slot(s);
    sm90::mbarrier_wait(sm.full_at(slot), ring.round(s) & 1);
    // Every group of every stage: past the reduction's end TMA filled both operands'
    // boxes with zeros, whose products take no part, as the zero bytes' would (no
    // select of the descriptors a stage).
    dot.step(sm.a_at(slot), sm.b_at(slot), sm.zeros_at, 0, kWgBK / 16, false);
    dot.template wait<1>();
    stage.keep_only(slot);
  }
  dot.template wait<0>();
  stage.all();
  if constexpr (Cfg::kOutByTma)
    if (map_out) return store_by_tma<Cfg>(dot, dot.acc, map_out, out_buffer(sm), row0, col0);
  store_outputs<Cfg>(p, dot, dot.acc, row0, col0);
}

// Chunked: one accumulator set, each chunk started by scale-d = 0 on its first
// piece (a stage shared by two chunks is issued as two commit groups). At a
// chunk's end the consumer waits for its groups and folds the partial into the
// tree, whose slot 0 is in registers, before the next chunk's first piece: a fold
// overlapping a wgmma in flight (into a second set) made ptxas serialise every
// wgmma of the kernel (C7514) once the issue was straight-line, and the second
// set had pushed slot 0 out to shared memory. Every chunk issues at least one
// piece: a chunk past the reduction's end (empty) issues zero groups in the last
// stage, which this consumer still holds (a chunk loop that can skip its pieces
// is serialised too).
template <class Cfg, Major MA, Major MB>
__device__ void consume_chunks(const Problem& p, const WarpgroupSmem<Cfg>& sm, int row0, int col0, int consumer,
                               StageRing<Cfg> ring, const void* map_out) {
  using Dot = WarpgroupDot<Cfg, MA, MB>;
  Dot dot(consumer);
  // Thread index after the producer warpgroup; the CTA's own home in the scratch.
  ChunkTree<Cfg, Dot> tree(p, row0, col0, threadIdx.x - 128, blockIdx.x, gridDim.x, sm.levels);
  StageRelease<Cfg> stage{sm};
  RingCursor<Cfg> at(ring);
  const uint32_t red = p.red, chunk = p.chunk;
  uint32_t stage_end = kWgBK;  // of the cursor's stage
  for (int c = 0; c < p.chunks; ++c) {
    const uint32_t begin = min(c * chunk, red), end = min(begin + chunk, red);
    uint32_t j = begin;
    do {
      const uint32_t piece_end = min(end, stage_end), stage_begin = stage_end - kWgBK;
      sm90::mbarrier_wait(sm.full_at(at.slot), at.parity);
      dot.step(sm.a_at(at.slot), sm.b_at(at.slot), sm.zeros_at, (j - stage_begin + 15) / 16,
               (piece_end - stage_begin + 15) / 16, j == begin);
      dot.template wait<1>();
      stage.keep_only(at.slot);
      // The last stage stays the cursor's: an empty chunk past the end issues
      // its zero groups there.
      if (piece_end == stage_end && piece_end < red) {
        at.next();
        stage_end += kWgBK;
      }
      j = piece_end;
    } while (j < end);
    dot.template wait<0>();
    // The first shared level (kRegSlots) is first written by the chunk whose
    // trailing one bits reach it.
    if constexpr (Cfg::kOutInLevels)
      if (c == (1 << Cfg::kRegSlots) - 1) wait_boxes_read();
    tree.finish_chunk(dot, c, begin == end);
  }
  stage.all();
  if constexpr (Cfg::kOutByTma)
    if (map_out)
      return tree.store_root(dot, [&](const auto& v) { store_by_tma<Cfg>(dot, v, map_out, out_buffer(sm), row0, col0); });
  tree.store_root(p, dot);
}

// A persistent CTA: units u = c, c + clusters, ... of its cluster c (a unit is a
// tile, or a cluster's row of Cfg::kCluster tiles; job(u) gives this CTA's tile of
// it), their stages in one ring (StageRing), so a tile's pipeline fill and its
// problem's loads overlap the previous tile's last stages and stores, and the
// barriers are set up once.
template <class Cfg, Major MA, Major MB, class Jobs>
__device__ void warpgroup_tiles(int units, const Jobs& job) {
  extern __shared__ __align__(128) unsigned char wg_smem_raw[];
  const WarpgroupSmem<Cfg> sm(wg_smem_raw);
  for (uint32_t c = threadIdx.x; c < Cfg::kZeroBytes / 16; c += Cfg::kThreads)
    reinterpret_cast<uint4*>(sm.zeros)[c] = make_uint4(0, 0, 0, 0);
  sm90::fence_proxy_async();  // the zeros, before wgmma reads them
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      sm90::mbarrier_init(&sm.full[s], 1);
      sm90::mbarrier_init(&sm.empty[s], 4 * Cfg::kConsumers * Cfg::kCluster);  // a consumer warp each
    }
    sm90::mbarrier_init_fence();
  }
  __syncthreads();  // the zeros
  if constexpr (Cfg::kCluster > 1) sm90::cluster_sync_after_barrier_init();
  const int group = sm90::warp_uniform(static_cast<int>(threadIdx.x) / 128);  // WarpgroupDot::step's descriptors
  const int first_unit = blockIdx.x / Cfg::kCluster, unit_stride = gridDim.x / Cfg::kCluster;
  StageRing<Cfg> ring{0};
  if (group == 0) {
    sm90::release_registers<40>();
    if (threadIdx.x != 0) return;
    const int rank = Cfg::kCluster > 1 ? static_cast<int>(sm90::cluster_rank()) : 0;
    for (int u = first_unit; u < units; u += unit_stride) {
      const TileJob j = job(u);
      const int stages = (j.p->red + kWgBK - 1) / kWgBK;
      warpgroup_producer<Cfg, MA, MB>(j, sm, stages, ring, rank);
      ring.first += stages;
    }
    if constexpr (Cfg::kCluster > 1) wait_ring_released(sm, ring.first);
    return;
  }
  sm90::claim_registers<232>();
  for (int u = first_unit; u < units; u += unit_stride) {
    const TileJob j = job(u);
    const Problem p = *j.p;
    const int stages = (p.red + kWgBK - 1) / kWgBK;
    if (Cfg::kRegSlots == 0 && p.chunks == 1)
      consume_one_chunk<Cfg, MA, MB>(p, sm, j.row0, j.col0, stages, group - 1, ring, j.map_out);
    else consume_chunks<Cfg, MA, MB>(p, sm, j.row0, j.col0, group - 1, ring, j.map_out);
    ring.first += stages;
  }
  if (Cfg::kOutByTma && threadIdx.x % 32 == 0) sm90::bulk_wait();  // the buffer stays until the stores are done
}

// One problem, its row tiles in units of Cfg::kCluster (a cluster's CTAs take a
// unit's tiles by rank): unit u at (u % row_units, u / row_units) where
// rows_fastest (rows_first), else (u / col_tiles, u % col_tiles).
template <class Cfg, Major MA, Major MB>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    warpgroup_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_out, const __grid_constant__ Problem p,
                     const bool rows_fastest, const bool out_by_tma) {
  const int row_units = (p.m + Cfg::kBM * Cfg::kCluster - 1) / (Cfg::kBM * Cfg::kCluster);
  const int col_tiles = (p.n + Cfg::kBN - 1) / Cfg::kBN;
  const int rank = Cfg::kCluster > 1 ? static_cast<int>(sm90::cluster_rank()) : 0;
  warpgroup_tiles<Cfg, MA, MB>(row_units * col_tiles, [&](int u) {
    const int row_unit = rows_fastest ? u % row_units : u / col_tiles;
    const int col_tile = rows_fastest ? u / row_units : u % col_tiles;
    const int row_tile = row_unit * Cfg::kCluster + rank;
    return TileJob{&p,        &map_a, &map_b, &map_a, &map_b, out_by_tma ? &map_out : nullptr, row_tile * Cfg::kBM,
                   col_tile * Cfg::kBN};
  });
}

// A group: the tile table's entry t; problem g's maps from maps_per · g on (device
// memory): A, B (and, with two operand pairs, A2, B2), then its output's where
// out_by_tma.
template <class Cfg, Major MA, Major MB>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    warpgroup_grouped_kernel(const Problem* __restrict__ problems, const CUtensorMap* __restrict__ maps,
                             const int maps_per, const bool out_by_tma, const GroupTile* __restrict__ tiles,
                             int n_tiles) {
  const int operands = maps_per - (out_by_tma ? 1 : 0);
  warpgroup_tiles<Cfg, MA, MB>(n_tiles, [&](int t) {
    const GroupTile tile = tiles[t];
    const CUtensorMap* m = &maps[maps_per * tile.problem];
    return TileJob{&problems[tile.problem], &m[0], &m[1], &m[operands - 2], &m[operands - 1],
                   out_by_tma ? &m[operands] : nullptr, tile.row0, tile.col0};
  });
}

// A problem's root as its two subtrees (launch_subtrees): units [0, tiles) are the
// left problem's tiles, the rest the right one's, each on its own operand maps
// (row-major tile order). The outputs are fp32 roots: stored from registers.
template <class Cfg, Major MA, Major MB>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    warpgroup_subtrees_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                              const __grid_constant__ CUtensorMap map_a2, const __grid_constant__ CUtensorMap map_b2,
                              const __grid_constant__ Problem left, const __grid_constant__ Problem right) {
  const int col_tiles = (left.n + Cfg::kBN - 1) / Cfg::kBN;
  const int tiles = (left.m + Cfg::kBM - 1) / Cfg::kBM * col_tiles;
  warpgroup_tiles<Cfg, MA, MB>(2 * tiles, [&](int u) {
    const bool second = u >= tiles;
    const int t = second ? u - tiles : u;
    const void* a = second ? &map_a2 : &map_a;
    const void* b = second ? &map_b2 : &map_b;
    return TileJob{second ? &right : &left, a, b, a, b, nullptr, t / col_tiles * Cfg::kBM, t % col_tiles * Cfg::kBN};
  });
}

// --- host side ------------------------------------------------------------------
// The A and B operands of p as TMA maps with 64 × 64 boxes; the reduction
// extent is p.red, so a stage reaching past it reads zeros.
template <Major M>
CUtensorMap operand_map(const Operand& op, int red) {
  if constexpr (M == Major::Red) return bf16_tensor_map(op.p, red, op.rows, op.ld, kBox, kBox);
  else return bf16_tensor_map(op.p, op.rows, red, op.ld, kBox, kBox);
}

// bf16 outputs that TMA can write in place (base 16-byte aligned, rows whole 16-byte
// units apart, a box's width of columns) go out by TMA, through the output map of
// 64 × 16 boxes (store_by_tma), on the tiles with room for the boxes.
bool stores_by_tma(const Problem& p) { return p.out_bf16 && aligned16(p.out_bf16) && p.n % 8 == 0 && p.n >= 64; }
CUtensorMap output_map(const Problem& p) { return bf16_tensor_map(p.out_bf16, p.n, p.m, p.n, 64, 16); }

// The order of the tiles. The persistent CTAs take them in index order (each
// strides by the CTA count), so the ones in flight share the operand whose tiles
// vary slowest, and that operand is read from device memory about once only if
// the other one (cycled through) stays in L2. Column tiles vary fastest by
// default (each row panel of A is read once, B must stay in L2); where B is too
// large for the L2 and A is not (lm_head: a 622 MB weight against 16 MB of
// activations), row tiles vary fastest instead, so B streams from memory once
// instead of once per row panel.
bool rows_first(const Problem& p) {
  static const size_t budget = [] {
    int dev = 0, l2 = 0;
    BP_CUDA_CHECK(cudaGetDevice(&dev));
    BP_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    return static_cast<size_t>(l2) / 2;
  }();
  const size_t a_bytes = size_t(p.m) * p.red * sizeof(bf16), b_bytes = size_t(p.n) * p.red * sizeof(bf16);
  return b_bytes > budget && a_bytes <= budget;
}

// Persistent CTAs for `units` units of work: one per SM; in clusters, as many
// clusters as fit at once (a cluster's SMs share a GPC, so that can be fewer than
// SMs / kCluster, and a cluster left over would wait for a whole wave).
template <class Cfg, class Kernel>
unsigned persistent_cluster_ctas(Kernel kernel, long long units) {
  if constexpr (Cfg::kCluster == 1) return persistent_ctas(units);
  static const long long fit = [&] {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = cluster_launch_config(dim3(Cfg::kCluster * multiprocessors()), Cfg::kThreads,
                                                            Cfg::kSmemBytes, nullptr, Cfg::kCluster, cluster);
    int clusters = 0;
    BP_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    return static_cast<long long>(clusters);
  }();
  return static_cast<unsigned>(Cfg::kCluster * std::min(units, fit));
}

template <class Cfg, Major MA, Major MB>
void launch_warpgroup(Problem p, cudaStream_t stream) {
  const auto kernel = warpgroup_kernel<Cfg, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, Cfg::kSmemBytes);
  BP_CUDA_CHECK(opt_in);
  const unsigned ctas = persistent_cluster_ctas<Cfg>(kernel, tile_count<Cfg>(p) / Cfg::kCluster);
  DeviceBuffer<float> spill(spill_elems<Cfg>(p, ctas), stream);
  p.spill = spill.get();
  const bool out_by_tma = Cfg::kOutByTma && stores_by_tma(p);
  const CUtensorMap map_out = out_by_tma ? output_map(p) : CUtensorMap{};
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config =
      cluster_launch_config(dim3(ctas), Cfg::kThreads, Cfg::kSmemBytes, stream, Cfg::kCluster, cluster);
  BP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, operand_map<MA>(p.a, p.red), operand_map<MB>(p.b, p.red), map_out,
                                   p, rows_first(p), out_by_tma));
}


// TMA reads an operand in place when its base is 16-byte aligned and its rows
// are whole 16-byte units apart.
bool tma_ready(const Operand& op) { return aligned16(op.p) && op.ld % 8 == 0; }

// The warpgroup kernel computes p when TMA can read both operands and chunks are
// whole k16 groups.
bool warpgroup_can_run(const Problem& p) {
  return tma_ready(p.a) && tma_ready(p.b) && (p.chunks == 1 || p.chunk % 16 == 0);
}

// ... and takes it when M is past decode sizes (the 16-row tile keeps more weight
// bytes in flight there).
bool warpgroup_fits(const Problem& p) { return warpgroup_can_run(p) && p.m > kDecodeRows; }

// Whether p's chunk tree stores a node past level 0 (the tree tiles), and whether
// its chunks are short enough for the deep one.
bool needs_tree_levels(const Problem& p) { return tree_levels(p.chunks) > WgChunkTile::kRegSlots; }
bool short_chunks(const Problem& p) { return p.chunk <= 2 * kWgBK; }
// Whether p's 128 × 128 tiles are under an eighth of a wave.
bool few_tiles(const Problem& p, int sms) { return 8 * tile_count<WgNarrowTile>(p) < sms; }
// launch(std::type_identity<Cfg>{}) on the tile for p's chunks: the 64 × 64 one where
// the 128 × 128 tiles are few, else of the 128 × 128 ones the chunk tile where the
// tree stays in registers, the deep tree tile for short chunks, or the tree tile.
template <class Launch>
void on_chunked_tile(const Problem& p, int sms, const Launch& launch) {
  if (few_tiles(p, sms)) launch(std::type_identity<WgSmallChunkTile>{});
  else if (!needs_tree_levels(p)) launch(std::type_identity<WgChunkTile>{});
  else if (short_chunks(p)) launch(std::type_identity<WgDeepTreeTile>{});
  else launch(std::type_identity<WgTreeTile>{});
}
// Chunks long enough for the wide tile, whose tree has no level in registers: a
// chunk's node (128 KB) goes to the scratch and comes back once, about as many
// bytes as the operands of 170 reduction elements (384 bf16 each), so at 4096 and
// more the scratch adds under 5 % to the L2 traffic, and the wide tile reads a
// quarter fewer operand bytes per product than the 128 × 128 one (lm_head's input
// gradient: 8 chunks of 18992).
bool long_chunks(const Problem& p) { return p.chunks > 1 && p.chunk >= 4096; }

// A tile's work per SM: its waves of tiles times its area. The 128 × 192 tile takes
// a single chunk where that is the least (30B's experts' gate_up at 4096 tokens: 128
// tiles, one wave, where the 128 × 128 tile makes 1.5 and the 128 × 256 leaves a
// quarter of the SMs idle).
template <class Cfg>
long long wave_area(const Problem& p, int sms) {
  return (tile_count<Cfg>(p) + sms - 1) / sms * Cfg::kBM * Cfg::kBN;
}
bool mid_tiles_win(const Problem& p, int sms) {
  return p.chunks == 1 &&
         wave_area<WgMidTile>(p, sms) < std::min(wave_area<WgWideTile>(p, sms), wave_area<WgNarrowTile>(p, sms));
}

// A single chunk that the wide and mid tiles left: of 128 × 128, 128 × 64 and 64 × 64,
// the one whose wave_area is least (the larger on a tie).
template <Major MA, Major MB>
void launch_few_tiles(const Problem& p, int sms, cudaStream_t stream) {
  const long long narrow = wave_area<WgNarrowTile>(p, sms), slim = wave_area<WgSlimTile>(p, sms);
  if (wave_area<WgSmallTile>(p, sms) < std::min(narrow, slim)) launch_warpgroup<WgSmallTile, MA, MB>(p, stream);
  else if (slim < narrow) launch_warpgroup<WgSlimTile, MA, MB>(p, stream);
  else launch_warpgroup<WgNarrowTile, MA, MB>(p, stream);
}

// The largest power of two below `chunks` (>= 2): pairwise_tree's root adds the
// complete tree of that many chunks to the tree of the rest (reduce.h).
int subtree_seam(int chunks) { return static_cast<int>(std::bit_floor(static_cast<unsigned>(chunks - 1))); }

// A chunked reduction whose 128 × 128 tiles are at most half a wave runs as the two
// subtrees of its root on twice the CTAs (launch_subtrees, on on_chunked_tile's
// tile: the 64 × 64 one where they are few), where both subtrees have reduction
// elements (a chunk count past the reduction leaves empty chunks).
bool subtrees_pay(const Problem& p, int sms) {
  return p.chunks > 1 && 2 * tile_count<WgNarrowTile>(p) <= sms &&
         static_cast<long long>(subtree_seam(p.chunks)) * p.chunk < p.red;
}

template <Major MA, Major MB>
void launch_subtrees(const Problem& p, int sms, cudaStream_t stream);

// The warpgroup kernel wherever it fits: 128 × 192 for one chunk where
// mid_tiles_win, 128 × 256 for one chunk (or long ones) and at least a wave of
// tiles, else for one chunk launch_few_tiles' choice, and for several chunks
// on_chunked_tile's. However few its tiles, a single chunk past 16 rows runs
// faster here than on the decode engine's 16-row blocks, which read the weight
// once a block, or on mma.sync, whose tiles each walk the whole K; one size alone
// (30B kv_proj at 17 rows) is a little slower, not worth a rule of its own
// (bench/DECISIONS.md, linear: single chunks with few tiles on the warpgroup kernel).
template <Major MA, Major MB>
bool run_warpgroup(const Problem& p, cudaStream_t stream) {
  if (!warpgroup_fits(p)) return false;
  const int sms = multiprocessors();
  if (mid_tiles_win(p, sms)) {
    launch_warpgroup<WgMidTile, MA, MB>(p, stream);
    return true;
  }
  static_assert(WgNarrowTile::kBM == WgChunkTile::kBM && WgNarrowTile::kBN == WgChunkTile::kBN);
  const bool pairs = (p.m + WgWideTile::kBM - 1) / WgWideTile::kBM % 2 == 0 &&
                     (tile_count<WgWideTile>(p) >= 3 * sms || long_chunks(p));
  if ((p.chunks == 1 || long_chunks(p)) && tile_count<WgWideTile>(p) >= sms) {
    if (pairs) launch_warpgroup<WgWidePairTile, MA, MB>(p, stream);
    else launch_warpgroup<WgWideTile, MA, MB>(p, stream);
  } else if (p.chunks == 1) launch_few_tiles<MA, MB>(p, sms, stream);
  else if (subtrees_pay(p, sms)) launch_subtrees<MA, MB>(p, sms, stream);
  else on_chunked_tile(p, sms, [&]<class Cfg>(std::type_identity<Cfg>) { launch_warpgroup<Cfg, MA, MB>(p, stream); });
  return true;
}

// A grouped launch's operand maps: `per` a problem, in the problems' order.
struct GroupMaps {
  std::vector<CUtensorMap> maps;
  int per;

  // The same with each problem's output map after its operands' (store_by_tma).
  std::vector<CUtensorMap> with_outputs(const std::vector<Problem>& problems) const {
    std::vector<CUtensorMap> all;
    for (size_t g = 0; g < problems.size(); ++g) {
      all.insert(all.end(), maps.begin() + g * per, maps.begin() + (g + 1) * per);
      all.push_back(output_map(problems[g]));
    }
    return all;
  }
};

template <class Cfg, Major MA, Major MB>
void launch_warpgroup_grouped(std::vector<Problem> problems, const GroupMaps& maps, cudaStream_t stream) {
  const auto kernel = warpgroup_grouped_kernel<Cfg, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, Cfg::kSmemBytes);
  BP_CUDA_CHECK(opt_in);
  const bool out_by_tma = Cfg::kOutByTma && std::all_of(problems.begin(), problems.end(), stores_by_tma);
  const DeviceBuffer<CUtensorMap> d_maps(out_by_tma ? maps.with_outputs(problems) : maps.maps, stream);
  GroupPlan<Cfg> plan(std::move(problems), stream, /*persistent=*/true);
  const DeviceBuffer<Problem> d_problems(plan.problems, stream);
  const DeviceBuffer<GroupTile> d_tiles(plan.tiles, stream);
  const int n_tiles = static_cast<int>(plan.tiles.size());
  kernel<<<plan.ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      d_problems.get(), d_maps.get(), maps.per + (out_by_tma ? 1 : 0), out_by_tma, d_tiles.get(), n_tiles);
  BP_CUDA_CHECK_LAUNCH();
}

// On the single-chunk tile where every problem is one chunk (six stages, no tree),
// a tree tile where one stores a node past level 0 (the deep one where every
// problem's chunks are short), as run_warpgroup picks.
template <Major MA, Major MB>
void launch_grouped_on_its_tile(std::vector<Problem> problems, const GroupMaps& maps, cudaStream_t stream) {
  const auto all = [&](auto pred) { return std::all_of(problems.begin(), problems.end(), pred); };
  const bool one_chunk = all([](const Problem& p) { return p.chunks == 1; });
  const bool levels = std::any_of(problems.begin(), problems.end(), needs_tree_levels);
  if (one_chunk) launch_warpgroup_grouped<WgNarrowTile, MA, MB>(std::move(problems), maps, stream);
  else if (!levels) launch_warpgroup_grouped<WgChunkTile, MA, MB>(std::move(problems), maps, stream);
  else if (all(short_chunks)) launch_warpgroup_grouped<WgDeepTreeTile, MA, MB>(std::move(problems), maps, stream);
  else launch_warpgroup_grouped<WgTreeTile, MA, MB>(std::move(problems), maps, stream);
}

// --- a reduction as its root's two subtrees -------------------------------------
// The left subtree's root plus the right one's, as the root adds them, into the
// output (rounded to bf16 where it is bf16), element by element.
__global__ void add_subtree_roots(const float* __restrict__ left, const float* __restrict__ right, size_t n,
                                  float* out_f32, bf16* out_bf16) {
  for_each_index(n, [&](size_t i) {
    const float root = add_rn(left[i], right[i]);
    if (out_f32) out_f32[i] = root;
    else out_bf16[i] = round_bf16(root);
  });
}

// The operand from reduction element `from` on.
template <Major M>
Operand from_element(Operand op, int from) {
  op.p += M == Major::Red ? size_t(from) : size_t(from) * op.ld;
  return op;
}

// Both subtrees' tiles in one launch on the tile p's chunks would take (the left
// subtree's tree is the deeper); a CTA's scratch home serves both.
template <class Cfg, Major MA, Major MB>
void launch_subtree_tiles(Problem left, Problem right, cudaStream_t stream) {
  const auto kernel = warpgroup_subtrees_kernel<Cfg, MA, MB>;
  static const cudaError_t opt_in = allow_smem(kernel, Cfg::kSmemBytes);
  BP_CUDA_CHECK(opt_in);
  const unsigned ctas = persistent_ctas(2 * tile_count<Cfg>(left));
  DeviceBuffer<float> spill(spill_elems<Cfg>(left, ctas), stream);
  left.spill = right.spill = spill.get();
  kernel<<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      operand_map<MA>(left.a, left.red), operand_map<MB>(left.b, left.red), operand_map<MA>(right.a, right.red),
      operand_map<MB>(right.b, right.red), left, right);
  BP_CUDA_CHECK_LAUNCH();
}

// p as its root's subtrees, each a problem of its own whose root goes to fp32
// `roots` (m·n elements apiece): chunks [0, h) and [h, chunks) for h = subtree_seam,
// the second's operands from the seam on. Their tiles run in one launch (by value:
// a CUDA graph can hold it), then add_subtree_roots adds the roots: the bits of p's
// one tree, from twice the CTAs.
template <Major MA, Major MB>
void launch_subtrees(const Problem& p, int sms, cudaStream_t stream) {
  const size_t n = size_t(p.m) * p.n;
  DeviceBuffer<float> roots(2 * n, stream);
  const int h = subtree_seam(p.chunks), seam = h * p.chunk;
  Problem left = p, right = p;
  left.red = seam;
  left.chunks = h;
  right.a = from_element<MA>(p.a, seam);
  right.b = from_element<MB>(p.b, seam);
  right.red = p.red - seam;
  right.chunks = p.chunks - h;
  left.out_bf16 = right.out_bf16 = nullptr;
  left.out_f32 = roots.get();
  right.out_f32 = roots.get() + n;
  on_chunked_tile(left, sms, [&]<class Cfg>(std::type_identity<Cfg>) {
    launch_subtree_tiles<Cfg, MA, MB>(left, right, stream);
  });
  add_subtree_roots<<<grid_for(n), kBlockThreads, 0, stream>>>(roots.get(), roots.get() + n, n, p.out_f32,
                                                               p.out_bf16);
  BP_CUDA_CHECK_LAUNCH();
}

// The pair as one problem: second's chunks after first's, its operands from the
// seam on (where first's chunks end at the seam and both have one chunk length).
Problem joined(Problem first, const Problem& second) {
  first.second_from = first.red;
  first.red += second.red;
  first.chunks += second.chunks;
  return first;
}

}  // namespace

bool run_wgmma(Major ma, Major mb, const Problem& p, cudaStream_t stream) {
  return with_majors(ma, mb, [&](auto a, auto b) {
    return run_warpgroup<decltype(a)::value, decltype(b)::value>(p, stream);
  });
}

// The warpgroup kernel (128 × 128) takes a group when every problem fits it and
// they average half a tile of rows or more.
bool warpgroup_group_fits(const std::vector<Problem>& problems) {
  long long rows = 0;
  for (const Problem& p : problems) {
    if (!warpgroup_can_run(p)) return false;
    rows += p.m;
  }
  return 2 * rows >= static_cast<long long>(problems.size()) * WgNarrowTile::kBM;
}

void run_wgmma_grouped(Major ma, Major mb, std::vector<Problem> problems, cudaStream_t stream) {
  with_majors(ma, mb, [&](auto a, auto b) {
    constexpr Major A = decltype(a)::value, B = decltype(b)::value;
    GroupMaps maps{{}, 2};
    for (const Problem& p : problems)
      maps.maps.insert(maps.maps.end(), {operand_map<A>(p.a, p.red), operand_map<B>(p.b, p.red)});
    launch_grouped_on_its_tile<A, B>(std::move(problems), maps, stream);
  });
}

// Where both halves fit the kernel, first's chunks end at the seam and the seam
// falls on a stage boundary: maps A, B over the first reduction, A2, B2 over the
// second.
bool run_wgmma_pairs(Major ma, Major mb, const std::vector<ProblemPair>& pairs, cudaStream_t stream) {
  std::vector<Problem> problems;
  for (const ProblemPair& q : pairs) {
    const bool seam = int64_t{q.first.chunks} * q.first.chunk == q.first.red && q.second.chunk == q.first.chunk &&
                      q.first.red % kWgBK == 0;
    if (!seam || !warpgroup_can_run(q.second)) return false;
    problems.push_back(joined(q.first, q.second));
  }
  if (!warpgroup_group_fits(problems)) return false;
  with_majors(ma, mb, [&](auto a, auto b) {
    constexpr Major A = decltype(a)::value, B = decltype(b)::value;
    GroupMaps maps{{}, 4};
    for (const ProblemPair& q : pairs)
      maps.maps.insert(maps.maps.end(), {operand_map<A>(q.first.a, q.first.red), operand_map<B>(q.first.b, q.first.red),
                                         operand_map<A>(q.second.a, q.second.red),
                                         operand_map<B>(q.second.b, q.second.red)});
    launch_grouped_on_its_tile<A, B>(std::move(problems), maps, stream);
  });
  return true;
}

}  // namespace bp::cuda::gemm
