// bp::cuda linear vs the CPU reference, bit for bit, under v1's pair (both dot
// models; v2 changes no linear bits): every
// function on small and odd shapes (aligned and unaligned loads, chunk trees of
// every small width, token chunks spilling past the register levels), edge values
// (NaN, Inf, subnormals, signed zeros), and the Qwen3-0.6B / Qwen3-30B-A3B
// projections at M = 1 .. 4096. Every GPU result is computed twice over two
// different poisons (unwritten or racy elements differ). Large shapes compare
// sampled output rows: each output row depends only on its own inputs, so the
// reference on the sampled rows alone gives exactly those rows' bits.
// Negative control: cuBLAS (bf16 in, fp32 compute) on the forward GEMMs must
// differ from the reference somewhere, or the comparison proves nothing. cuBLAS's
// gradient calls (bench_linear's peers) are held to float64 truth's error bound.
// Exit 125 (CTest: skipped) without a Hopper GPU (gpu_test_main.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "harness/exit_codes.h"
#include "optimized/cuda/common.h"
#include "optimized/cuda/linear.h"
#include "reference/common/rng.h"
#include "reference/numerics/chunked.h"
#include "reference/ops/linear.h"
#include "support/cublas_peer.h"
#include "support/float_gen.h"
#include "support/qwen3_linear_shapes.h"

namespace bp {
namespace {

using cuda::DeviceBuffer;

// --- inputs ---------------------------------------------------------------------
enum class Fill {
  Uniform,  // R(U[-1, 1)): the generator of fixtures and models
  Spread,   // exponents over 2^±24: alignment truncation and chunk order matter
  Edge,     // Spread plus signed zeros, subnormals, and rare Inf and NaN
};

std::vector<bf16> make_input(size_t n, uint64_t seed, Fill fill) {
  if (fill == Fill::Uniform) return random_bf16(n, seed, 1.0f);
  test::FloatGen g(seed);
  std::vector<bf16> v(n);
  for (bf16& x : v) {
    uint16_t b = g.bf(g.range(-24, 24));
    if (fill == Fill::Edge) {
      if (g.chance(8)) b = g.bf_signed_zero();
      else if (g.chance(16)) b = g.bf_subnormal();
      else if (g.chance(400)) b = static_cast<uint16_t>(g.pick<uint16_t>({0x7f80, 0xff80, 0x7fc0, 0xffc1}));
      else if (g.chance(32)) b = g.bf(g.range(-133, 100));
    }
    x = bf16{b};
  }
  return v;
}

// Rows 0, the last, and evenly spaced ones between: at most `max` of [0, n).
std::vector<int> sample_rows(int n, int max) {
  std::vector<int> rows;
  if (n <= max) {
    for (int i = 0; i < n; ++i) rows.push_back(i);
    return rows;
  }
  for (int i = 0; i < max; ++i) rows.push_back(static_cast<int>(static_cast<long long>(i) * (n - 1) / (max - 1)));
  return rows;
}

// rows × width block of a row-major [*][width] matrix.
template <class T>
std::vector<T> gather_rows(const std::vector<T>& m, int width, const std::vector<int>& rows) {
  std::vector<T> out;
  out.reserve(rows.size() * static_cast<size_t>(width));
  for (int r : rows) out.insert(out.end(), m.begin() + static_cast<size_t>(r) * width, m.begin() + static_cast<size_t>(r + 1) * width);
  return out;
}

// Columns `cols` of a row-major [height][width] matrix, as [height][cols.size()].
std::vector<bf16> gather_cols(const std::vector<bf16>& m, int height, int width, const std::vector<int>& cols) {
  std::vector<bf16> out;
  out.reserve(static_cast<size_t>(height) * cols.size());
  for (int r = 0; r < height; ++r)
    for (int c : cols) out.push_back(m[static_cast<size_t>(r) * width + c]);
  return out;
}

// --- comparison -----------------------------------------------------------------
uint32_t canonical(float x) { return canonical_bits(x); }
uint32_t canonical(bf16 x) { return is_nan(x) ? kCanonicalNanBf16 : x.bits; }

template <class T>
size_t count_mismatches(const std::vector<T>& want, const std::vector<T>& got, const std::string& what,
                        bool report = true) {
  EXPECT_EQ(want.size(), got.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (canonical(want[i]) != canonical(got[i]) && ++bad <= 3 && report)
      ADD_FAILURE() << what << ": element " << i << " want 0x" << std::hex << canonical(want[i]) << " got 0x"
                    << canonical(got[i]) << std::dec;
  return bad;
}

template <class T>
void expect_identical(const std::vector<T>& want, const std::vector<T>& got, const std::string& what) {
  EXPECT_EQ(count_mismatches(want, got, what), 0u) << what;
}

// Runs `launch(out)` twice, over poisons 0xff.. (NaN) and 0x7f.. (finite), and
// checks that both runs wrote the same bits everywhere; returns them.
template <class T>
std::vector<T> run_twice(size_t n, const std::function<void(T*)>& launch, const std::string& what) {
  DeviceBuffer<T> out(n);
  std::vector<T> runs[2];
  const int poison[2] = {0xff, 0x7f};
  for (int rep = 0; rep < 2; ++rep) {
    if (n > 0) BP_CUDA_CHECK(cudaMemset(out.get(), poison[rep], n * sizeof(T)));
    launch(out.get());
    BP_CUDA_CHECK(cudaDeviceSynchronize());
    runs[rep] = out.download();
  }
  expect_identical(runs[0], runs[1], what + " (repeat over another poison)");
  return runs[0];
}

std::string label(const Contract& c, const char* fn, int T, int K, int N, int chunks) {
  return c.name + " " + fn + " T=" + std::to_string(T) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
         " chunks=" + std::to_string(chunks);
}

// --- one problem, every function ---------------------------------------------------
struct Problem {
  int T, K, N;
  int chunks;         // k_chunks of the forward and n_chunks of dgrad
  int chunk_len = 0;  // of linear_acc and linear_dgrad_acc; 0: the whole reduction's, fixed_chunk_len
};

struct Which {
  bool acc = true, fwd = true, dgrad = true, dgrad_acc = true, wgrad = true;
};

// cuBLAS against the reference acc on the forward's sampled rows: mismatching elements.
struct CublasControl {
  test::CublasPeer peer;
  size_t compared = 0, mismatches = 0;
};

void check_problem(const Contract& contract, const Knobs& kn, const Problem& pb, Fill fill, uint64_t seed, int max_rows,
                   const Which& which, CublasControl* control = nullptr) {
  const int T = pb.T, K = pb.K, N = pb.N;
  const bool backward = which.dgrad || which.dgrad_acc || which.wgrad;
  const auto x = make_input(size_t(T) * K, seed, fill), w = make_input(size_t(N) * K, seed + 1, fill),
             dy = backward ? make_input(size_t(T) * N, seed + 2, fill) : std::vector<bf16>{};
  const DeviceBuffer<bf16> dx_in(x), dw_in(w), ddy(dy);
  const std::vector<int> rows = sample_rows(T, max_rows);
  const int R = static_cast<int>(rows.size());
  // Forward over the sampled token rows.
  const bool cublas = control && pb.chunks == 1;
  if (which.acc || which.fwd || cublas) {
    const auto xs = gather_rows(x, K, rows);
    if (which.acc || cublas) {
      std::vector<float> want(size_t(R) * N);
      const int chunk = pb.chunk_len ? pb.chunk_len : fixed_chunk_len(K, pb.chunks);
      ref::linear_acc(kn, xs.data(), w.data(), want.data(), R, K, N, pb.chunks, chunk);
      if (which.acc) {
        const auto got = run_twice<float>(
            size_t(T) * N,
            [&](float* out) { cuda::linear_acc(kn, dx_in.get(), dw_in.get(), out, T, K, N, pb.chunks, chunk); },
            label(contract, "linear_acc", T, K, N, pb.chunks));
        expect_identical(want, gather_rows(got, N, rows), label(contract, "linear_acc", T, K, N, pb.chunks));
      }
      if (cublas) {
        DeviceBuffer<float> y(size_t(T) * N);
        control->peer.forward(dx_in.get(), dw_in.get(), y.get(), CUDA_R_32F, T, K, N);
        BP_CUDA_CHECK(cudaDeviceSynchronize());
        control->mismatches += count_mismatches(want, gather_rows(y.download(), N, rows), "cublas", false);
        control->compared += want.size();
      }
    }
    if (which.fwd) {
      std::vector<bf16> want(size_t(R) * N);
      ref::linear_fwd(kn, xs.data(), w.data(), want.data(), R, K, N, pb.chunks);
      const auto got = run_twice<bf16>(size_t(T) * N, [&](bf16* out) {
        cuda::linear_fwd(kn, dx_in.get(), dw_in.get(), out, T, K, N, pb.chunks);
      }, label(contract, "linear_fwd", T, K, N, pb.chunks));
      expect_identical(want, gather_rows(got, N, rows), label(contract, "linear_fwd", T, K, N, pb.chunks));
    }
  }
  // Input gradient over the sampled token rows.
  if (which.dgrad || which.dgrad_acc) {
    const auto dys = gather_rows(dy, N, rows);
    if (which.dgrad) {
      std::vector<bf16> want(size_t(R) * K);
      ref::linear_dgrad(kn, dys.data(), w.data(), want.data(), R, K, N, pb.chunks);
      const auto got = run_twice<bf16>(size_t(T) * K, [&](bf16* out) {
        cuda::linear_dgrad(kn, ddy.get(), dw_in.get(), out, T, K, N, pb.chunks);
      }, label(contract, "linear_dgrad", T, K, N, pb.chunks));
      expect_identical(want, gather_rows(got, K, rows), label(contract, "linear_dgrad", T, K, N, pb.chunks));
    }
    if (which.dgrad_acc) {
      std::vector<float> want(size_t(R) * K);
      const int chunk = pb.chunk_len ? pb.chunk_len : fixed_chunk_len(N, pb.chunks);
      ref::linear_dgrad_acc(kn, dys.data(), w.data(), want.data(), R, K, N, pb.chunks, chunk);
      const auto got = run_twice<float>(
          size_t(T) * K,
          [&](float* out) { cuda::linear_dgrad_acc(kn, ddy.get(), dw_in.get(), out, T, K, N, pb.chunks, chunk); },
          label(contract, "linear_dgrad_acc", T, K, N, pb.chunks));
      expect_identical(want, gather_rows(got, K, rows), label(contract, "linear_dgrad_acc", T, K, N, pb.chunks));
    }
  }
  // Weight gradient over sampled output features n: dw[n][:] needs dy[:, n] only.
  if (which.wgrad) {
    const std::vector<int> feats = sample_rows(N, max_rows);
    const int F = static_cast<int>(feats.size());
    const auto dys = gather_cols(dy, T, N, feats);
    std::vector<float> want(size_t(F) * K);
    ref::linear_wgrad(kn, dys.data(), x.data(), want.data(), T, K, F);
    const auto got = run_twice<float>(size_t(N) * K, [&](float* out) {
      cuda::linear_wgrad(kn, ddy.get(), dx_in.get(), out, T, K, N);
    }, label(contract, "linear_wgrad", T, K, N, 0));
    expect_identical(want, gather_rows(got, K, feats), label(contract, "linear_wgrad", T, K, N, 0));
  }
}

class LinearGpu : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
};

// Odd and aligned shapes, every function, all rows: unaligned loads (K, N not
// multiples of 8), edge tiles, M across the tile choices, chunk counts 1..12
// (non-powers of two exercise the tree's odd nodes), short last token chunks.
TEST_P(LinearGpu, SmallShapesEveryFunction) {
  // chunks divides both K (forward) and N (dgrad).
  const Problem problems[] = {
      {1, 16, 8, 1},      {5, 100, 35, 5},   {17, 48, 39, 3},  {33, 136, 72, 8},   {64, 96, 60, 12},
      {130, 256, 200, 4}, {200, 120, 96, 6}, {3, 1000, 24, 8}, {257, 64, 300, 2}, {0, 32, 16, 1},
      {7, 0, 16, 1},      {12, 24, 0, 1},
  };
  uint64_t seed = 100;
  for (const Problem& pb : problems)
    for (Fill fill : {Fill::Uniform, Fill::Spread}) check_problem(contract(), contract().knobs, pb, fill, seed += 7, 1 << 30, {});
}

// Sizes that are not multiples of the chunk count (SPEC.md §2.4.1: chunks of
// ⌈K/C⌉, the last short or empty): K = 300 and N = 36 in 8 chunks (38 and 5 long,
// the last 34 and 1), K = N = 9 (chunk 4 one element, 5-7 empty), K = 3 (chunks
// 3-7 empty), a resized vocabulary's dgrad (N = 1001) and M past the small tiles.
TEST_P(LinearGpu, OddSizesFixedChunks) {
  const Problem problems[] = {
      {5, 300, 36, 8}, {3, 9, 9, 8}, {7, 3, 3, 8}, {40, 100, 1001, 8}, {300, 1021, 260, 8}, {17, 50, 70, 4},
  };
  uint64_t seed = 700;
  for (const Problem& pb : problems)
    for (Fill fill : {Fill::Uniform, Fill::Spread, Fill::Edge})
      check_problem(contract(), contract().knobs, pb, fill, seed += 7, 1 << 30, {});
}

// A TP rank's slice of an odd reduction (SPEC.md §2.4.1 "A rank's chunks"): its
// C/tp chunks at the whole's length, the tail's short or empty — 148 of vocab 300
// in 4 chunks of 38 (the last 34), 21 of I = 49 in 4 of 7 (the last empty), 1792
// in 4 of 512 (the last 256), decode rows, and on the warpgroup chunk tile (48
// tiles) an empty last chunk after a whole stage (1536 in 4 of 512) and after one
// that ends inside a stage (1504: the empty chunk's piece starts at group 2).
TEST_P(LinearGpu, RankSlicesTakeTheWholeChunkLength) {
  const Which partial_sums{true, false, false, true, false};
  const Problem problems[] = {
      {5, 148, 148, 4, 38},  {9, 21, 21, 4, 7},         {200, 1792, 256, 4, 512},  {1, 1792, 2048, 4, 512},
      {33, 148, 40, 2, 76},  {260, 1536, 2048, 4, 512}, {260, 1504, 2048, 4, 512},
  };
  uint64_t seed = 900;
  for (const Problem& pb : problems)
    for (Fill fill : {Fill::Uniform, Fill::Edge})
      check_problem(contract(), contract().knobs, pb, fill, seed += 7, 64, partial_sums);
}

// Decode sizes on the decode engine (linear_decode.cu: M <= 16, K and the chunks
// multiples of 8): more chunks than a CTA has warps and an empty last one (K = 88
// in 12 chunks of 8, every group half inside its chunk, M > 8), columns past the
// last whole strip (N = 44; and N = 1001 with K = 1032, a single chunk ending in
// the middle of a k16 group after three batches of weight loads),
// several strips per CTA with their chunk partials side by side (N = 2200 in 4
// chunks), and more units of strips than CTAs, so a CTA's units alternate between
// its two partial buffers (N = 20000 in 8 chunks). Past 16 rows, where the
// warpgroup kernel declines (chunks of 264, not whole k16 groups), the 16-row
// blocks: 100 rows (the last block of 4) in 2 chunks, and 128 in 4 (a chunk
// shorter than a weight batch, 256 elements, goes to mma.sync instead).
TEST_P(LinearGpu, DecodeShapes) {
  const Problem problems[] = {{11, 88, 44, 12}, {13, 1032, 1001, 1}, {5, 256, 2200, 4},
                              {3, 128, 20000, 8}, {100, 528, 200, 2},  {128, 1056, 1001, 4}};
  uint64_t seed = 800;
  for (const Problem& pb : problems)
    for (Fill fill : {Fill::Uniform, Fill::Spread, Fill::Edge})
      check_problem(contract(), contract().knobs, pb, fill, seed += 7, 1 << 30, {});
}

// Small token chunks: many chunk partials, so the tree spills past the levels
// kept in registers (and the last chunk is short).
TEST_P(LinearGpu, WgradManyTokenChunks) {
  Which only_wgrad{false, false, false, false, true};
  for (const int chunk : {1, 3, 16, 128}) {
    Knobs kn = contract().knobs;
    kn.grad_token_chunk = chunk;
    for (const Problem& pb : {Problem{37, 48, 40, 1}, Problem{300, 64, 72, 1}, Problem{1100, 40, 24, 1}})
      check_problem(contract(), kn, pb, Fill::Spread, 500 + chunk, 1 << 30, only_wgrad);
    // 20 tiles of 512 x 640: the warpgroup kernel where the chunks are whole k16
    // groups (16: four chunks in one 64-token stage; 128 and its 44-token tail).
    check_problem(contract(), kn, Problem{300, 640, 512, 1}, Fill::Spread, 600 + chunk, 24, only_wgrad);
  }
  // The warpgroup chunk tile's tree deep into its global scratch: 32 chunks of 16
  // tokens (levels 1 to 4 there, lm_head's shape of tree), 69 (six levels and an
  // odd last chunk) and 2 (one level, no scratch).
  for (const auto& [tokens, chunk] : {std::pair{512, 16}, std::pair{1100, 16}, std::pair{256, 128}}) {
    Knobs kn = contract().knobs;
    kn.grad_token_chunk = chunk;
    check_problem(contract(), kn, Problem{tokens, 640, 512, 1}, Fill::Spread, 700 + tokens, 24, only_wgrad);
  }
}

TEST_P(LinearGpu, EdgeValues) {
  uint64_t seed = 900;
  for (const Problem& pb : {Problem{16, 64, 32, 1}, Problem{40, 128, 48, 8}, Problem{9, 40, 20, 5}})
    check_problem(contract(), contract().knobs, pb, Fill::Edge, seed += 5, 1 << 30, {});
}

// Shapes large enough for the warpgroup (wgmma + TMA) kernel by linear_wgmma.cu's rule
// (M > 16, at least 17 tiles of 128 x 128; the first forward has 153 tiles of
// 128 x 256), every function, Spread and Edge values: reduction tails that end
// inside a k16 group (K = 1032, N = 1000, 300 tokens = two token chunks of 128 and
// one of 44), chunks that are not whole 64-element stages, so a stage holds the
// end of one chunk and the start of the next (K = 768 in 8 chunks of 96, K = 384
// in chunks of 48, dgrad's N = 1152 in chunks of 144 of the row-major weight) or
// four whole chunks (K = 128 in chunks of 16), edge tiles in both output
// dimensions. Sampled rows (the reference is slow).
TEST_P(LinearGpu, WarpgroupShapes) {
  uint64_t seed = 3000;
  for (const Problem& pb : {Problem{300, 1032, 1000, 1}, Problem{260, 768, 2048, 8}, Problem{1100, 200, 4100, 1},
                            Problem{260, 384, 2048, 8}, Problem{260, 768, 1152, 8}, Problem{260, 128, 2048, 8}})
    for (Fill fill : {Fill::Spread, Fill::Edge}) check_problem(contract(), contract().knobs, pb, fill, seed += 11, 24, {});
}

// Long chunks on the wide warpgroup tile (128 × 256, its chunk tree wholly in the
// scratch, built in memory), on CTA pairs (18 row tiles): 144 tiles, chunks of 4096
// over K = 12400, four (the last 112) and five (the last empty: level 2's pending
// node merges into the root), the forward's and the input gradient's majors; and
// with bf16 outputs, whose root leaves by TMA (store_by_tma): four chunks of 4096,
// and three of 4112 (the last 4110, ending inside a k16 group).
TEST_P(LinearGpu, WideTileLongChunks) {
  const Which acc_only{true, false, false, false, false}, dgrad_acc_only{false, false, false, true, false};
  const Which fwd_only{false, true, false, false, false}, dgrad_only{false, false, true, false, false};
  uint64_t seed = 3100;
  for (int chunks : {4, 5})
    for (Fill fill : {Fill::Spread, Fill::Edge}) {
      check_problem(contract(), contract().knobs, Problem{2200, 12400, 2000, chunks, 4096}, fill, seed += 11, 8,
                    acc_only);
      check_problem(contract(), contract().knobs, Problem{2200, 2000, 12400, chunks, 4096}, fill, seed += 11, 8,
                    dgrad_acc_only);
    }
  for (Fill fill : {Fill::Spread, Fill::Edge}) {
    check_problem(contract(), contract().knobs, Problem{2200, 16384, 2000, 4}, fill, seed += 11, 8, fwd_only);
    check_problem(contract(), contract().knobs, Problem{2200, 2000, 12334, 3}, fill, seed += 11, 8, dgrad_only);
  }
}

int multiprocessor_count() {
  int sms = 0;
  BP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return sms;
}

// Chunked reductions with at most half a wave of 128 × 128 tiles run as the chunk
// tree's two subtrees on two CTAs a tile (launch_subtrees): the largest power-of-
// two prefix of the chunks and the rest, their roots added after. Eight row tiles
// (the last 104 rows) by eight column tiles; five chunks (a prefix of four and one
// chunk), six (four and two) and eight; bf16 and fp32 outputs, the forward's, the
// input gradient's and the weight gradient's majors (seven token chunks of 128,
// the last 104 tokens).
TEST_P(LinearGpu, SubtreesOnFewTiles) {
  const Which fwd_acc{true, true, false, false, false}, dgrad_both{false, false, true, true, false};
  const Which wgrad_only{false, false, false, false, true};
  const int T = multiprocessor_count() / 16 * 128 - 24;
  uint64_t seed = 3700;
  for (const int chunks : {5, 6, 8})
    for (Fill fill : {Fill::Spread, Fill::Edge}) {
      check_problem(contract(), contract().knobs, Problem{T, chunks * 96, 1000, chunks}, fill, seed += 11, 8, fwd_acc);
      check_problem(contract(), contract().knobs, Problem{T, 1000, chunks * 64, chunks}, fill, seed += 11, 8,
                    dgrad_both);
    }
  Knobs kn = contract().knobs;
  kn.grad_token_chunk = 128;
  check_problem(contract(), kn, Problem{6 * 128 + 104, T, 1000, 1}, Fill::Spread, seed += 11, 8, wgrad_only);
}

// A forward captured into a CUDA graph on a stream of its own replays the bits of the
// call made outside one, over two poisons: the subtrees on few tiles, the tree tile
// and a single chunk (every launch takes its tables by value and its temporaries
// from the stream's pool). A grouped launch copies its tile table from host memory,
// which a graph would re-read after its release: it refuses the capture instead.
TEST_P(LinearGpu, CapturedInAGraph) {
  const Knobs& kn = contract().knobs;
  cudaStream_t s = nullptr;
  BP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int T = multiprocessor_count() / 16 * 128 - 24;
  uint64_t seed = 3800;
  for (const Problem& pb : {Problem{T, 768, 1000, 8}, Problem{2200, 1024, 2048, 8}, Problem{T, 1000, 1000, 1}}) {
    const DeviceBuffer<bf16> x(make_input(size_t(pb.T) * pb.K, seed += 11, Fill::Spread)),
        w(make_input(size_t(pb.N) * pb.K, seed += 11, Fill::Spread));
    DeviceBuffer<bf16> y(size_t(pb.T) * pb.N);
    const auto forward = [&] { cuda::linear_fwd(kn, x.get(), w.get(), y.get(), pb.T, pb.K, pb.N, pb.chunks, s); };
    forward();
    BP_CUDA_CHECK(cudaStreamSynchronize(s));
    const std::vector<bf16> want = y.download();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    BP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    forward();
    BP_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    BP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (const int poison : {0xff, 0x7f}) {
      BP_CUDA_CHECK(cudaMemsetAsync(y.get(), poison, y.size() * sizeof(bf16), s));
      BP_CUDA_CHECK(cudaGraphLaunch(exec, s));
      BP_CUDA_CHECK(cudaStreamSynchronize(s));
      expect_identical(want, y.download(), label(contract(), "linear_fwd from a graph", pb.T, pb.K, pb.N, pb.chunks));
    }
    BP_CUDA_CHECK(cudaGraphExecDestroy(exec));
    BP_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  const DeviceBuffer<bf16> x(make_input(size_t(256) * 512, seed += 11, Fill::Spread)),
      w(make_input(size_t(512) * 512, seed += 11, Fill::Spread));
  DeviceBuffer<bf16> y(size_t(256) * 512);
  const cuda::LinearGroup groups[2] = {{x.get(), w.get(), 128, nullptr, y.get()},
                                       {x.get() + 128 * 512, w.get(), 128, nullptr, y.get() + 128 * 512}};
  cudaGraph_t graph = nullptr;
  BP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  EXPECT_THROW(cuda::linear_fwd_grouped(kn, groups, 2, 512, 512, 1, s), std::logic_error);
  BP_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  if (graph) BP_CUDA_CHECK(cudaGraphDestroy(graph));
  BP_CUDA_CHECK(cudaStreamDestroy(s));
}

// The tree tiles (eight chunks: level 1 in shared memory) with more tiles than SMs,
// so each persistent CTA takes several one after another: a warp's output boxes lie
// in its share of the shared level, written at one tile's end and then, at the next
// tile's second chunk, by the tree (after the stores' reads). Chunks of 192 (the
// tree tile) and 96 (the deep one), bf16 outputs by TMA and fp32 ones, the
// forward's and the input gradient's majors; rows past two tiles per SM, the last
// row tile 104 rows.
TEST_P(LinearGpu, TreeTilesManyTilesPerCta) {
  const Which fwd_acc{true, true, false, false, false}, dgrad_only{false, false, true, false, false};
  const int T = (2 * multiprocessor_count() / 16 + 1) * 128 - 24;  // 2048 columns: 16 column tiles
  uint64_t seed = 3600;
  for (const int chunk : {192, 96})
    for (Fill fill : {Fill::Spread, Fill::Edge}) {
      check_problem(contract(), contract().knobs, Problem{T, 8 * chunk, 2048, 8}, fill, seed += 11, 8, fwd_acc);
      check_problem(contract(), contract().knobs, Problem{T, 2048, 8 * chunk, 8}, fill, seed += 11, 8, dgrad_only);
    }
}

// A single-chunk tile's case: T rows, the forward of K = 200 into `cols` columns
// (bf16 outputs by TMA and fp32 ones) and the input gradient into `cols` columns
// from 200 (the other majors), on spread and edge values. 200 ends inside a k16
// group.
void check_tile_case(const Contract& c, int T, int cols, uint64_t seed) {
  const Which fwd_acc{true, true, false, false, false}, dgrad_only{false, false, true, false, false};
  for (Fill fill : {Fill::Spread, Fill::Edge}) {
    check_problem(c, c.knobs, Problem{T, 200, cols, 1}, fill, seed += 11, 8, fwd_acc);
    check_problem(c, c.knobs, Problem{T, cols, 200, 1}, fill, seed += 11, 8, dgrad_only);
  }
}

// The 128 × 192 tile (mid_tiles_win: a single chunk whose 128 × 192 tiles make one
// wave where the 128 × 128 ones make two and the 128 × 256 ones leave SMs idle):
// a quarter of the SMs' count of row tiles (the last one 104 rows) and 760 columns
// (four column tiles, the last 184 wide).
TEST_P(LinearGpu, MidTile) { check_tile_case(contract(), multiprocessor_count() / 4 * 128 - 24, 760, 3300); }

// The 128 × 64 tile (launch_few_tiles): an eighth of the SMs' count of row tiles (the
// last one 104 rows) and 200 columns, which the 128 × 128 tile makes two column
// tiles of and this one four (the last 8 wide).
TEST_P(LinearGpu, SlimTile) { check_tile_case(contract(), (multiprocessor_count() + 7) / 8 * 128 - 24, 200, 3400); }

// The 64 × 64 tile (launch_few_tiles): a sixteenth of the SMs' count of 128-row tiles
// (1000 rows on 132 SMs: sixteen 64-row tiles, the last 40 rows) and 456 columns,
// eight 64-column tiles (the last 8 wide): one wave where the 128 × 64 tile makes half
// as many tiles.
TEST_P(LinearGpu, SmallTile) { check_tile_case(contract(), multiprocessor_count() / 16 * 128 - 24, 456, 3500); }

// Reductions whose 128 × 128 tiles are under an eighth of a wave, on the 64 × 64
// tiles: decode batches past 16 rows (17, 100: two row tiles, the last 36 rows; 128)
// over 200 columns (the last tile 8 wide), a single chunk on the plain tile
// (launch_few_tiles) and chunked ones on the chunk tile (on_chunked_tile) as the
// root's two subtrees (2 chunks; 3: a right subtree of one; 8: levels 1 and 2 in
// the scratch), and launched whole where the right subtree would be empty (3
// chunks of 96 over 192: the last chunk empty). The forward's and the input
// gradient's majors, and a weight gradient of 104 × 64 in three token chunks.
TEST_P(LinearGpu, FewTiles) {
  const Which fwd_acc{true, true, false, false, false}, dgrad_both{false, false, true, true, false};
  const Which wgrad_only{false, false, false, false, true};
  uint64_t seed = 3900;
  for (const int T : {17, 100, 128})
    for (const int chunks : {1, 2, 3, 8})
      for (Fill fill : {Fill::Spread, Fill::Edge}) {
        check_problem(contract(), contract().knobs, Problem{T, chunks * 96, 200, chunks}, fill, seed += 11, 8,
                      fwd_acc);
        check_problem(contract(), contract().knobs, Problem{T, 200, chunks * 64, chunks}, fill, seed += 11, 8,
                      dgrad_both);
      }
  const Which acc_only{true, false, false, false, false}, dgrad_acc_only{false, false, false, true, false};
  check_problem(contract(), contract().knobs, Problem{100, 192, 200, 3, 96}, Fill::Edge, seed += 11, 8, acc_only);
  check_problem(contract(), contract().knobs, Problem{100, 200, 192, 3, 96}, Fill::Edge, seed += 11, 8,
                dgrad_acc_only);
  Knobs kn = contract().knobs;
  kn.grad_token_chunk = 128;
  check_problem(contract(), kn, Problem{300, 64, 104, 1}, Fill::Spread, seed += 11, 8, wgrad_only);
}

// The wide tile on CTA pairs sharing B (two row tiles, three waves of tiles: the
// pairs' rule), each CTA copying half of B's boxes into both; and unpaired where
// the row tiles are odd (three of them, the same tile count). Reductions that end
// inside a k16 group (200), the forward's (B reduction-major) and the input
// gradient's (B row-major) majors.
TEST_P(LinearGpu, WideTilePairs) {
  const Which acc_only{true, false, false, false, false}, dgrad_acc_only{false, false, false, true, false};
  const int sms = multiprocessor_count();
  uint64_t seed = 3200;
  for (const int T : {256, 384})
    for (Fill fill : {Fill::Spread, Fill::Edge}) {
      const int cols = 3 * sms / ((T + 127) / 128) * 256;
      check_problem(contract(), contract().knobs, Problem{T, 200, cols, 1}, fill, seed += 11, 8, acc_only);
      check_problem(contract(), contract().knobs, Problem{T, cols, 200, 1}, fill, seed += 11, 8, dgrad_acc_only);
    }
}

// --- grouped launches ----------------------------------------------------------------
// One group's device inputs and outputs: x [T][K] (dy [T][N] of dgrad's shape), the
// weight [N][K], and wgrad's dy [T][N].
struct GroupData {
  int T;
  DeviceBuffer<bf16> x, w, dy;
  GroupData(int t, int K, int N, uint64_t seed)
      : T(t),
        x(make_input(size_t(t) * K, seed, Fill::Spread)),
        w(make_input(size_t(N) * K, seed + 1, Fill::Spread)),
        dy(make_input(size_t(t) * N, seed + 2, Fill::Spread)) {}
};

// The groups' outputs, `width` per row, concatenated: launch(out, at) writes group
// g's at out + at[g] (run_twice: over two poisons, the same bits).
template <class T, class Launch>
std::vector<T> group_outputs(const std::vector<GroupData>& groups, size_t width, Launch launch,
                             const std::string& what) {
  std::vector<size_t> at;
  size_t n = 0;
  for (const GroupData& g : groups) at.push_back(std::exchange(n, n + size_t(g.T) * width));
  return run_twice<T>(n, [&](T* out) { launch(out, at); }, what);
}

// A grouped forward, input gradient and weight gradient give every group the bits
// it gets alone (itself checked against the reference above): on the grouped
// warpgroup tiles under sm90-tc (single-chunk, and the chunk tree at 8 chunks and
// for wgrad's token chunks), on the SIMT tiles under fma-seq; groups of 0, 64 and
// up to 300 rows (partial row tiles), both wide and narrow outputs. Negative
// control: the grouped forward in 8 chunks differs from the groups' forward in one.
TEST_P(LinearGpu, GroupedEqualsEachGroupAlone) {
  const Knobs& kn = contract().knobs;
  const std::vector<int> rows = {300, 130, 0, 257, 64, 200, 300, 290};
  uint64_t seed = 4000;
  for (const auto& [K, N] : {std::pair{512, 2048}, std::pair{2048, 512}}) {
    std::vector<GroupData> groups;
    groups.reserve(rows.size());
    for (int T : rows) groups.emplace_back(T, K, N, seed += 5);
    const std::string shape = " K=" + std::to_string(K) + " N=" + std::to_string(N);
    // Every group's forward ([T][N]) or input gradient ([T][K]), grouped or alone.
    const auto linear_outputs = [&](bool dgrad, int chunks, bool grouped) {
      const size_t width = dgrad ? K : N;
      const auto alone_fn = dgrad ? cuda::linear_dgrad : cuda::linear_fwd;
      const auto grouped_fn = dgrad ? cuda::linear_dgrad_grouped : cuda::linear_fwd_grouped;
      const std::string what = std::string(dgrad ? "linear_dgrad" : "linear_fwd") + (grouped ? "_grouped" : " alone") +
                               " chunks=" + std::to_string(chunks) + shape;
      return group_outputs<bf16>(groups, width, [&](bf16* out, const std::vector<size_t>& at) {
        std::vector<cuda::LinearGroup> lg;
        for (size_t g = 0; g < groups.size(); ++g) {
          const bf16* in = dgrad ? groups[g].dy.get() : groups[g].x.get();
          if (grouped) lg.push_back({in, groups[g].w.get(), groups[g].T, nullptr, out + at[g]});
          else alone_fn(kn, in, groups[g].w.get(), out + at[g], groups[g].T, K, N, chunks, nullptr);
        }
        if (grouped) grouped_fn(kn, lg.data(), static_cast<int>(lg.size()), K, N, chunks, nullptr);
      }, what);
    };
    std::vector<bf16> fwd_one_chunk;
    for (int chunks : {1, 8})
      for (bool dgrad : {false, true}) {
        const auto grouped = linear_outputs(dgrad, chunks, true);
        expect_identical(linear_outputs(dgrad, chunks, false), grouped,
                         std::string(dgrad ? "linear_dgrad" : "linear_fwd") + " grouped vs alone" + shape);
        if (dgrad) continue;
        if (chunks == 1) fwd_one_chunk = grouped;
        else EXPECT_GT(count_mismatches(fwd_one_chunk, grouped, "control", false), 0u)
                 << "negative control: 8 chunks gave the bits of 1" << shape;
      }
    // Weight gradients: a [N][K] block per group.
    const size_t dw_elems = size_t(N) * K;
    const auto wgrad = [&](bool grouped) {
      return run_twice<float>(dw_elems * groups.size(), [&](float* out) {
        std::vector<cuda::WgradGroup> wg;
        for (size_t g = 0; g < groups.size(); ++g)
          wg.push_back({groups[g].dy.get(), groups[g].x.get(), groups[g].T, out + g * dw_elems});
        if (grouped) return cuda::linear_wgrad_grouped(kn, wg.data(), static_cast<int>(wg.size()), K, N);
        for (const cuda::WgradGroup& w : wg) cuda::linear_wgrad(kn, w.dy, w.x, w.dw, w.T, K, N);
      }, std::string(grouped ? "linear_wgrad_grouped" : "linear_wgrad alone") + shape);
    };
    expect_identical(wgrad(false), wgrad(true), "linear_wgrad_grouped vs alone" + shape);
  }
}

// A pair's input gradient (the MLP's gate and up) is its two trees added by one
// fp32 addition (SPEC.md §5.7 step 3), where the warpgroup kernel reduces it as one
// GEMM over the concatenation (chunk counts a power of two ending at N: 768 in 8
// chunks of 96, a rank's 384 in 4 of 96, 1024 in 8 of 128) and where the pair runs
// apart (the seam off a stage boundary: 8 chunks of 25 or 125, one of 96; 3 chunks;
// 8 chunks of 97 past N = 770; apart, one addition per run of adjacent outputs).
// Groups of 300, 130, 0, 257 and 64 rows, sampled.
// Negative control: the concatenation in half as many chunks (a leaf's chain
// running across two) differs.
TEST_P(LinearGpu, PairedInputGradientIsBothTreesAdded) {
  const Knobs& kn = contract().knobs;
  const int K = 512;
  const std::vector<int> rows = {300, 130, 0, 257, 64};
  struct Case {
    int N, chunks, chunk;
  };
  uint64_t seed = 5000;
  const Case cases[] = {{768, 8, 96},    {384, 4, 96}, {1024, 8, 128}, {200, 8, 25},
                        {1000, 8, 125}, {96, 1, 96},  {768, 3, 256},  {770, 8, 97}};
  for (const Case& c : cases) {
    // Every other case lists the pairs backwards, so their outputs do not follow each other.
    const bool backwards = (&c - cases) % 2 == 1;
    const std::string what = label(contract(), "linear_dgrad_pair_grouped", 0, K, c.N, c.chunks) +
                             (backwards ? " backwards" : "");
    std::vector<GroupData> gate, up;
    gate.reserve(rows.size());
    up.reserve(rows.size());
    for (int T : rows) {
      gate.emplace_back(T, K, c.N, seed += 5);
      up.emplace_back(T, K, c.N, seed += 5);
    }
    std::vector<size_t> at;
    const auto got = group_outputs<float>(gate, K, [&](float* out, const std::vector<size_t>& offsets) {
      at = offsets;
      std::vector<cuda::DgradPair> pairs;
      for (size_t g = 0; g < gate.size(); ++g)
        pairs.push_back({gate[g].dy.get(), gate[g].w.get(), up[g].dy.get(), up[g].w.get(), gate[g].T, out + at[g]});
      if (backwards) std::reverse(pairs.begin(), pairs.end());
      cuda::linear_dgrad_pair_grouped(kn, pairs.data(), static_cast<int>(pairs.size()), K, c.N, c.chunks, c.chunk,
                                      nullptr);
    }, what);
    const bool control = c.N == 768 && c.chunks == 8;
    size_t control_mismatches = 0;
    for (size_t g = 0; g < gate.size(); ++g) {
      const std::vector<int> sampled = sample_rows(gate[g].T, 12);
      const int R = static_cast<int>(sampled.size());
      const auto dy1 = gather_rows(gate[g].dy.download(), c.N, sampled);
      const auto dy2 = gather_rows(up[g].dy.download(), c.N, sampled);
      const auto w1 = gate[g].w.download(), w2 = up[g].w.download();
      std::vector<float> want(size_t(R) * K), second(size_t(R) * K);
      ref::linear_dgrad_acc(kn, dy1.data(), w1.data(), want.data(), R, K, c.N, c.chunks, c.chunk);
      ref::linear_dgrad_acc(kn, dy2.data(), w2.data(), second.data(), R, K, c.N, c.chunks, c.chunk);
      for (size_t i = 0; i < want.size(); ++i) want[i] += second[i];
      const std::vector<float> got_g(got.begin() + at[g], got.begin() + at[g] + size_t(gate[g].T) * K);
      expect_identical(want, gather_rows(got_g, K, sampled), what + " group " + std::to_string(g));
      if (control) {
        std::vector<bf16> dy_cat, w_cat(w1);
        for (int r = 0; r < R; ++r) {
          dy_cat.insert(dy_cat.end(), dy1.begin() + size_t(r) * c.N, dy1.begin() + size_t(r + 1) * c.N);
          dy_cat.insert(dy_cat.end(), dy2.begin() + size_t(r) * c.N, dy2.begin() + size_t(r + 1) * c.N);
        }
        w_cat.insert(w_cat.end(), w2.begin(), w2.end());
        std::vector<float> halved(size_t(R) * K);
        ref::linear_dgrad_acc(kn, dy_cat.data(), w_cat.data(), halved.data(), R, K, 2 * c.N, c.chunks, 2 * c.chunk);
        control_mismatches += count_mismatches(halved, gather_rows(got_g, K, sampled), "control", false);
      }
    }
    if (control) {
      EXPECT_GT(control_mismatches, 0u) << "negative control: 8 chunks of 192 over [dy1 | dy2] gave the pair's bits";
    }
  }
}

// The real projections at M = 1, 16, 128, 1024 (and 4096 for two), k_chunks 1 and
// tp_tree_width, sampled rows; the lm_heads forward only. cuBLAS must differ
// from the reference somewhere in this sweep.
TEST_P(LinearGpu, Qwen3Projections) {
  const Knobs& kn = contract().knobs;
  CublasControl control;
  uint64_t seed = 2000;
  for (const test::LinearShape& s : test::qwen3_linear_shapes()) {
    std::vector<int> ms = {1, 16, 128, 1024};
    if (std::strcmp(s.proj, "o_proj") == 0 || std::strcmp(s.proj, "expert_gate_up") == 0) ms.push_back(4096);
    for (int M : ms)
      for (int chunks : {1, kn.tp_tree_width}) {
        Which which;
        which.wgrad = chunks == 1;  // wgrad has no chunk knob: once per shape and M
        check_problem(contract(), kn, Problem{M, s.K, s.N, chunks}, Fill::Uniform, seed += 3, 8, which, &control);
      }
  }
  for (const test::LinearShape& s : test::qwen3_lm_heads())
    for (int M : {1, 16, 128, 1024}) {
      Which fwd_only{false, true, false, false, false};
      check_problem(contract(), kn, Problem{M, s.K, s.N, 1}, Fill::Uniform, seed += 3, 4, fwd_only);
    }
  std::printf("%s: cuBLAS differs from the reference in %zu of %zu sampled forward outputs\n",
              contract().name.c_str(), control.mismatches, control.compared);
  EXPECT_GT(control.mismatches, 0u) << "negative control: cuBLAS matched the reference everywhere";
}

// bench_linear's peers of the gradients compute the GEMMs linear_dgrad and
// linear_wgrad compute (or their ratios compare unlike work): each cuBLAS output
// lies within the float64 truth's error bound of an fp32-accumulated dot,
// |s − S| ≤ γ_n·Σ|a_j·b_j| with γ_n = n·u/(1 − n·u), n the reduction length and
// u = 2^-23 (the products of bf16 are exact in fp32; u covers an adder that
// truncates), plus the bf16 output's rounding to nearest, half an ulp: 2^-8·|s| ≤
// 2^-8·|R(s)| / (1 − 2^-8) (8 significant bits). Control: the same outputs
// against the truth of other inputs break the bound.
struct GemmTruth {
  std::vector<double> value, magnitude;  // S and Σ|a_j·b_j| per output
};
// out[r][c] = Σ_j a(r, j)·b(c, j) in float64.
template <class A, class B>
GemmTruth gemm_truth(int rows, int cols, int n, A&& a, B&& b) {
  GemmTruth t{std::vector<double>(size_t(rows) * cols), std::vector<double>(size_t(rows) * cols)};
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      for (int j = 0; j < n; ++j) {
        const double p = double(a(r, j)) * double(b(c, j));
        t.value[size_t(r) * cols + c] += p;
        t.magnitude[size_t(r) * cols + c] += std::fabs(p);
      }
  return t;
}
size_t outside_bound(const std::vector<float>& got, const GemmTruth& t, int n, bool bf16_out) {
  const double u = std::ldexp(1.0, -23), gamma = n * u / (1 - n * u);
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - t.value[i]);
    if (!(err <= gamma * t.magnitude[i] + (bf16_out ? std::ldexp(std::fabs(double(got[i])), -8) / (1 - std::ldexp(1.0, -8)) : 0.0))) ++bad;
  }
  return bad;
}
std::vector<float> widened(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = widen(v[i]);
  return f;
}

TEST(CublasPeer, ComputesTheGradients) {
  const int T = 192, K = 160, N = 224;
  const auto x = make_input(size_t(T) * K, 71, Fill::Uniform), w = make_input(size_t(N) * K, 72, Fill::Uniform),
             dy = make_input(size_t(T) * N, 73, Fill::Uniform), other = make_input(size_t(T) * N, 74, Fill::Uniform);
  const DeviceBuffer<bf16> d_x(x), d_w(w), d_dy(dy);
  DeviceBuffer<bf16> dx(size_t(T) * K);
  DeviceBuffer<float> dw(size_t(N) * K);
  test::CublasPeer peer;
  peer.dgrad(d_dy.get(), d_w.get(), dx.get(), T, K, N);
  peer.wgrad(d_dy.get(), d_x.get(), dw.get(), T, K, N);
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  const auto at = [](const std::vector<bf16>& v, int ld) { return [&v, ld](int r, int c) { return widen(v[size_t(r) * ld + c]); }; };
  // dx[t][k] = Σ_n dy[t][n]·w[n][k]; dw[n][k] = Σ_t dy[t][n]·x[t][k].
  const auto dgrad_truth = [&](const std::vector<bf16>& d) {
    return gemm_truth(T, K, N, at(d, N), [&](int k, int n) { return widen(w[size_t(n) * K + k]); });
  };
  const auto wgrad_truth = [&](const std::vector<bf16>& d) {
    return gemm_truth(N, K, T, [&](int n, int t) { return widen(d[size_t(t) * N + n]); },
                      [&](int k, int t) { return widen(x[size_t(t) * K + k]); });
  };
  const auto got_dx = widened(dx.download()), got_dw = dw.download();
  EXPECT_EQ(outside_bound(got_dx, dgrad_truth(dy), N, true), 0u) << "cuBLAS dgrad";
  EXPECT_EQ(outside_bound(got_dw, wgrad_truth(dy), T, false), 0u) << "cuBLAS wgrad";
  EXPECT_GT(outside_bound(got_dx, dgrad_truth(other), N, true), got_dx.size() / 2) << "control: dgrad, other inputs";
  EXPECT_GT(outside_bound(got_dw, wgrad_truth(other), T, false), got_dw.size() / 2) << "control: wgrad, other inputs";
}

INSTANTIATE_TEST_SUITE_P(Contracts, LinearGpu, ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace bp
