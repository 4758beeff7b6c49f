// dot_tiles: the vectorised tiles give the definition's bits (dot_rows_scalar,
// framed_chains_scalar) for every shape, chunking, frame and class of input, at any
// thread count; a deliberately different order of the same products gives other
// bits (negative control).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "reference/common/rng.h"
#include "reference/ops/dot_tiles.h"
#include "support/golden.h"

namespace bp {
namespace {

struct Case {
  int rows_a, rows_b, k, chunk_len;
  int chunks = 0;  // 0: ⌈k/chunk_len⌉ (token chunks); more: fixed chunks, the trailing ones empty
  int count() const { return chunks ? chunks : (k + chunk_len - 1) / chunk_len; }
};

// Tails in every direction: rows not a multiple of the register block (6 or 2) or
// the tile (48), columns not a multiple of the panel (16) or the tile (64), K not a
// multiple of the sm90 group or spanning several K blocks (256), short last chunks,
// and the fixed chunks of sizes that are not multiples of C = 8 (SPEC.md §2.4.1:
// ⌈k/8⌉ long, the last ones short or empty).
const Case kCases[] = {
    {1, 1, 1, 1},      {5, 3, 17, 17},     {7, 19, 40, 16},    {13, 70, 100, 100}, {50, 65, 300, 300},
    {49, 17, 512, 64}, {6, 16, 1024, 128}, {3, 130, 600, 256}, {37, 40, 37, 16},   {2, 9, 33, 5},
    {5, 19, 9, 2, 8},  {7, 70, 300, 38, 8}, {3, 17, 3, 1, 8},  {13, 20, 0, 1, 8},
};

// bf16 bits with a random sign, an exponent field in [lo, hi] and a random
// significand; about one in eight is ±0 (and with lo = 0, subnormals occur).
std::vector<bf16> spread_bf16(size_t n, uint64_t seed, int lo, int hi) {
  std::vector<bf16> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = counter_hash(seed, i);
    const uint32_t sign = (h & 1) << 15, exp = lo + static_cast<int>((h >> 1) % (hi - lo + 1)), sig = (h >> 20) & 0x7f;
    v[i] = ((h >> 40) & 7) == 0 ? bf16{static_cast<uint16_t>(sign)} : bf16{static_cast<uint16_t>(sign | exp << 7 | sig)};
  }
  return v;
}

std::vector<float> run(bool simd, DotModel m, const std::vector<bf16>& a, const std::vector<bf16>& b, const Case& c) {
  std::vector<float> out(static_cast<size_t>(c.rows_a) * c.rows_b);
  (simd ? ref::dot_rows_simd : ref::dot_rows_scalar)(m, a.data(), c.rows_a, b.data(), c.rows_b, c.k, c.chunk_len,
                                                     c.count(), out.data());
  return out;
}

// Input classes, by exponent field: ordinary (both near 1); wide (alignment drops
// whole terms, cancellation); tiny (results in the fp32 subnormal range); huge
// (overflow to ±Inf); subnormal bf16 operands.
struct Inputs {
  const char* what;
  int lo_a, hi_a, lo_b, hi_b;
};
const Inputs kInputs[] = {
    {"ordinary", 120, 130, 115, 128}, {"wide", 90, 160, 90, 160}, {"tiny", 40, 70, 40, 70},
    {"huge", 180, 250, 180, 250},     {"subnormal", 0, 3, 120, 140},
};

class DotTilesTest : public ::testing::TestWithParam<DotModel> {
 protected:
  void SetUp() override {
    if (!ref::dot_rows_simd_available()) GTEST_SKIP() << "no AVX2/FMA on this host: only the scalar path runs";
  }
};

TEST_P(DotTilesTest, SimdEqualsScalarBitForBit) {
  uint64_t seed = 1;
  for (const Inputs& in : kInputs)
    for (const Case& c : kCases) {
      const auto a = spread_bf16(size_t(c.rows_a) * c.k, seed++, in.lo_a, in.hi_a);
      const auto b = spread_bf16(size_t(c.rows_b) * c.k, seed++, in.lo_b, in.hi_b);
      EXPECT_EQ(test::digest(run(true, GetParam(), a, b, c)), test::digest(run(false, GetParam(), a, b, c)))
          << in.what << " " << c.rows_a << "x" << c.rows_b << " k=" << c.k << " chunk=" << c.chunk_len;
    }
}

// Inf and NaN operands (the sm90 lanes hand these to the definition; fma-seq's
// lanes compute them), and a zero K.
TEST_P(DotTilesTest, NonFiniteAndEmpty) {
  const Case c{9, 20, 64, 32};
  auto a = random_bf16(size_t(c.rows_a) * c.k, 3, 1.0f), b = random_bf16(size_t(c.rows_b) * c.k, 4, 1.0f);
  a[5] = round_bf16(INFINITY);
  b[size_t(3) * c.k + 5] = round_bf16(-INFINITY);
  b[size_t(7) * c.k + 9] = bf16{kCanonicalNanBf16};
  a[size_t(2) * c.k + 40] = bf16{0};
  b[size_t(11) * c.k + 40] = round_bf16(INFINITY);
  EXPECT_EQ(test::digest(run(true, GetParam(), a, b, c)), test::digest(run(false, GetParam(), a, b, c)));
  const Case empty{3, 4, 0, 1};
  EXPECT_EQ(test::digest(run(true, GetParam(), a, b, empty)), test::digest(std::vector<float>(12, 0.0f)));
}

// The tiles are split over threads, never a reduction: 1 and 3 threads agree.
TEST_P(DotTilesTest, ThreadCountInvariant) {
  const Case c{100, 150, 520, 130};
  const auto a = spread_bf16(size_t(c.rows_a) * c.k, 11, 110, 140), b = spread_bf16(size_t(c.rows_b) * c.k, 12, 110, 140);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run(true, GetParam(), a, b, c);
  omp_set_num_threads(3);
  const auto three = run(true, GetParam(), a, b, c);
  omp_set_num_threads(before);
  EXPECT_EQ(test::digest(one), test::digest(three));
}

// Negative control: the same products in reversed K order, or in other chunks,
// give other bits, so the equalities above can fail.
TEST_P(DotTilesTest, NegativeControlOtherOrderDiffers) {
  const Case c{8, 32, 512, 512};
  const auto a = random_bf16(size_t(c.rows_a) * c.k, 21, 1.0f), b = random_bf16(size_t(c.rows_b) * c.k, 22, 1.0f);
  auto ar = a, br = b;
  for (int i = 0; i < c.rows_a; ++i) std::reverse(ar.begin() + size_t(i) * c.k, ar.begin() + size_t(i + 1) * c.k);
  for (int j = 0; j < c.rows_b; ++j) std::reverse(br.begin() + size_t(j) * c.k, br.begin() + size_t(j + 1) * c.k);
  const std::string simd = test::digest(run(true, GetParam(), a, b, c));
  EXPECT_NE(simd, test::digest(run(false, GetParam(), ar, br, c)));
  EXPECT_NE(simd, test::digest(run(false, GetParam(), a, b, Case{c.rows_a, c.rows_b, c.k, 128})));
}

// ---- framed_chains: attention's products ----

// A framed product: rows × cols outputs over a frame of k slots, a's and b's slots
// from `first` on; b either row-major by column ([cols][slots]) or by slot.
struct Frame {
  int rows, cols, k, first;
  bool b_by_slot;
  std::vector<int> lo, hi;
  std::vector<bf16> a, b;
  std::vector<float> c;
  ref::FrameOperand fa() const { return {a.data(), k - first, 1}; }
  ref::FrameOperand fb() const {
    return b_by_slot ? ref::FrameOperand{b.data(), 1, cols} : ref::FrameOperand{b.data(), k - first, 1};
  }
};

// An accumulator of one class in five: ±0, fp32 subnormal, ordinary, huge, or
// (rarely) Inf or NaN; each class is an edge of the lanes or of the frame's fix-ups.
float spread_c(uint64_t seed, size_t i) {
  const uint64_t h = counter_hash(seed, i);
  const float u = counter_uniform(seed, i + (1u << 30));
  switch (h % 11) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return u * 0x1p-130f;
    case 3: return u * 0x1p100f;
    case 4: return h % 7 ? u * 4.0f : (h % 2 ? INFINITY : NAN);
    default: return u;
  }
}

// Random ranges (empty ones, ranges touching either end of the frame or neither),
// absent a slots and b slots outside every range set to NaN: never read.
Frame make_frame(uint64_t seed, const Inputs& in) {
  auto pick = [&](int i, int n) { return static_cast<int>(counter_hash(seed, 100 + i) % static_cast<uint64_t>(n)); };
  Frame f{1 + pick(0, 14), 1 + pick(1, 40), 1 + pick(2, 300), 0, pick(3, 2) == 1, {}, {}, {}, {}, {}};
  f.first = pick(4, 3) == 0 ? 0 : pick(5, f.k);
  const int n = f.k - f.first;
  for (int i = 0; i < f.rows; ++i) {
    const int shape = pick(10 + 3 * i, 4);
    int lo = f.first + (shape & 1 ? pick(11 + 3 * i, n + 1) : 0), hi = shape & 2 ? lo + pick(12 + 3 * i, f.k - lo + 1) : f.k;
    f.lo.push_back(lo);
    f.hi.push_back(hi);
  }
  f.a = spread_bf16(size_t(f.rows) * n, seed + 1, in.lo_a, in.hi_a);
  f.b = spread_bf16(size_t(f.cols) * n, seed + 2, in.lo_b, in.hi_b);
  int kmin = f.k, kmax = f.first;
  for (int i = 0; i < f.rows; ++i) {
    for (int s = f.first; s < f.k; ++s)
      if (s < f.lo[i] || s >= f.hi[i]) f.a[size_t(i) * n + s - f.first] = bf16{0x7fc0};
    if (f.lo[i] < f.hi[i]) kmin = std::min(kmin, f.lo[i]), kmax = std::max(kmax, f.hi[i]);
  }
  for (int j = 0; j < f.cols; ++j)
    for (int s = f.first; s < f.k; ++s)
      if (s < kmin || s >= kmax) f.b[f.b_by_slot ? size_t(s - f.first) * f.cols + j : size_t(j) * n + s - f.first] = bf16{0x7fc0};
  for (size_t i = 0; i < size_t(f.rows) * f.cols; ++i) f.c.push_back(spread_c(seed + 3, i));
  return f;
}

std::vector<float> run_frame(bool simd, DotModel m, const Frame& f) {
  std::vector<float> c = f.c;
  (simd ? ref::framed_chains : ref::framed_chains_scalar)(m, f.rows, f.cols, f.k, f.first, f.fa(), f.fb(), f.lo.data(),
                                                          f.hi.data(), c.data(), f.cols);
  return c;
}

TEST_P(DotTilesTest, FramedChainsEqualDefinition) {
  uint64_t seed = 5000;
  for (const Inputs& in : kInputs)
    for (int trial = 0; trial < 40; ++trial, seed += 10) {
      const Frame f = make_frame(seed, in);
      EXPECT_EQ(test::digest(run_frame(true, GetParam(), f)), test::digest(run_frame(false, GetParam(), f)))
          << in.what << " seed " << seed << ": " << f.rows << "x" << f.cols << " k=" << f.k << " first=" << f.first;
    }
}

// Zero accumulators and zero products of either sign over short ranges: where the
// frame's absent slots (+0·+0) decide the sign of a zero result, which the lanes'
// +0·b products do not.
TEST_P(DotTilesTest, FramedChainsSignedZeros) {
  for (uint64_t seed = 9000; seed < 9200; ++seed) {
    Frame f = make_frame(seed, kInputs[0]);
    for (int i = 0; i < f.rows; ++i) {
      f.hi[i] = std::min(f.hi[i], f.lo[i] + 1 + static_cast<int>(counter_hash(seed, i) % 3));
      for (int s = f.lo[i]; s < f.hi[i]; ++s)
        f.a[size_t(i) * (f.k - f.first) + s - f.first] = bf16{static_cast<uint16_t>(counter_hash(seed, 50 + s) & 0x8000)};
    }
    for (size_t i = 0; i < f.c.size(); ++i) f.c[i] = counter_hash(seed, 1000 + i) % 2 ? -0.0f : 0.0f;
    EXPECT_EQ(test::digest(run_frame(true, GetParam(), f)), test::digest(run_frame(false, GetParam(), f)))
        << "seed " << seed;
  }
}

// Inf and NaN in present slots (the lanes hand the product to the definition).
TEST_P(DotTilesTest, FramedChainsNonFinite) {
  Frame f = make_frame(77, kInputs[0]);
  for (int i = 0; i < f.rows; ++i)
    if (f.lo[i] < f.hi[i]) f.a[size_t(i) * (f.k - f.first) + f.lo[i] - f.first] = round_bf16(i % 2 ? INFINITY : -INFINITY);
  EXPECT_EQ(test::digest(run_frame(true, GetParam(), f)), test::digest(run_frame(false, GetParam(), f)));
}

// Negative control: the same present products in reversed slot order give other
// bits; under sm90-tc so does a frame whose groups start elsewhere (first slot 0).
TEST_P(DotTilesTest, NegativeControlFramedOrderDiffers) {
  const int rows = 6, cols = 32, k = 200, first = 8;
  const std::vector<int> lo(rows, 8), hi(rows, 190);
  auto a = random_bf16(size_t(rows) * (k - first), 31, 1.0f), b = random_bf16(size_t(cols) * (k - first), 32, 1.0f);
  auto run = [&](const std::vector<bf16>& x, const std::vector<bf16>& y, int kk, int f0, int shift) {
    std::vector<float> c(size_t(rows) * cols, 0.0f);
    std::vector<int> l = lo, h = hi;
    for (int i = 0; i < rows; ++i) l[i] -= shift, h[i] -= shift;
    ref::framed_chains(GetParam(), rows, cols, kk, f0, {x.data(), k - first, 1}, {y.data(), k - first, 1}, l.data(),
                       h.data(), c.data(), cols);
    return test::digest(c);
  };
  const std::string base = run(a, b, k, first, 0);
  auto ar = a, br = b;  // slots [8, 190) are operands [0, 182)
  for (int i = 0; i < rows; ++i) std::reverse(ar.begin() + size_t(i) * (k - first), ar.begin() + size_t(i) * (k - first) + 182);
  for (int j = 0; j < cols; ++j) std::reverse(br.begin() + size_t(j) * (k - first), br.begin() + size_t(j) * (k - first) + 182);
  EXPECT_NE(base, run(ar, br, k, first, 0));
  if (GetParam() == DotModel::Sm90Tc) {
    EXPECT_NE(base, run(a, b, k - first, 0, first));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DotTilesTest, ::testing::Values(DotModel::FmaSeq, DotModel::Sm90Tc),
                         [](const auto& info) { return info.param == DotModel::FmaSeq ? "fmaseq" : "sm90tc"; });

}  // namespace
}  // namespace bp
