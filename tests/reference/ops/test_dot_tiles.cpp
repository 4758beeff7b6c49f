// dot_tiles: the vectorised tiles give the definition's bits (dot_rows_scalar) for
// every shape, chunking and class of input, at any thread count; a deliberately
// different order of the same products gives other bits (negative control).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <string>

#include "reference/common/rng.h"
#include "reference/ops/dot_tiles.h"
#include "support/golden.h"

namespace bp {
namespace {

struct Case {
  int rows_a, rows_b, k, chunk_len;
};

// Tails in every direction: rows not a multiple of the register block (6 or 2) or
// the tile (48), columns not a multiple of the panel (16) or the tile (64), K not a
// multiple of the sm90 group or spanning several K blocks (256), short last chunks.
const Case kCases[] = {
    {1, 1, 1, 1},      {5, 3, 17, 17},     {7, 19, 40, 16},    {13, 70, 100, 100}, {50, 65, 300, 300},
    {49, 17, 512, 64}, {6, 16, 1024, 128}, {3, 130, 600, 256}, {37, 40, 37, 16},   {2, 9, 33, 5},
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
                                                     out.data());
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

INSTANTIATE_TEST_SUITE_P(Models, DotTilesTest, ::testing::Values(DotModel::FmaSeq, DotModel::Sm90Tc),
                         [](const auto& info) { return info.param == DotModel::FmaSeq ? "fmaseq" : "sm90tc"; });

}  // namespace
}  // namespace bp
