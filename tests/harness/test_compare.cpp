// Per-tensor comparison metrics (harness/compare/compare.h) on hand-made tensors: +-0,
// NaN payloads, infinities, subnormals, ULP distances and histogram bins, and a negative
// control (a single flipped bit is found, where it is).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "harness/compare/compare.h"

namespace bp::harness {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
float f(uint32_t u) { return float_of(u); }
uint64_t hist_total(const TensorMetrics& m) {
  return std::accumulate(m.ulp_histogram.begin(), m.ulp_histogram.end(), uint64_t{0});
}

TEST(Compare, IdenticalSpecialValuesAreBitIdentical) {
  const std::vector<float> a = {0.0f, -0.0f, 1.0f, f(0x00000001), f(0x807fffff), f(0x7f800000), f(0xff800000),
                                f(0x7fc00000), f(0x7f800001), -3.5f};
  // NaNs with other payloads and sign on B: equal under the NaN policy.
  std::vector<float> b = a;
  b[7] = f(0xffc00123);
  b[8] = f(0x7fffffff);
  const TensorMetrics m = compare(a, b);
  EXPECT_TRUE(m.bit_identical);
  EXPECT_EQ(m.elements, 10u);
  EXPECT_EQ(m.mismatches, 0u);
  EXPECT_EQ(m.first_mismatch, -1);
  EXPECT_EQ(m.max_abs_diff, 0.0);
  EXPECT_EQ(m.max_ulp_diff, 0.0);
  EXPECT_EQ(m.mean_abs_diff, 0.0);
  EXPECT_EQ(m.nan_a, 2u);
  EXPECT_EQ(m.nan_b, 2u);
  EXPECT_EQ(m.inf_a, 2u);
  EXPECT_EQ(m.inf_b, 2u);
  EXPECT_TRUE(m.ulp_histogram.empty());
  EXPECT_EQ(m.nan_policy, "nan_equal");
  EXPECT_EQ(m.dtype, "F32");
  EXPECT_EQ(m.shape, (std::vector<uint64_t>{10}));
}

TEST(Compare, SignedZerosDiffer) {
  const TensorMetrics m = compare(std::vector<float>{0.0f}, std::vector<float>{-0.0f});
  EXPECT_FALSE(m.bit_identical);
  EXPECT_EQ(m.mismatches, 1u);
  EXPECT_EQ(m.max_abs_diff, 0.0);
  EXPECT_EQ(m.max_ulp_diff, 1.0);  // -0 and +0 are adjacent in the ordered mapping
  EXPECT_EQ(m.first_mismatch, 0);
  ASSERT_EQ(m.ulp_histogram.size(), kUlpBins);
  EXPECT_EQ(m.ulp_histogram[0], 1u);
}

TEST(Compare, NanAgainstNumberIsInfinite) {
  const std::vector<float> a = {1.0f, f(0x7fc00000), 2.0f};
  const std::vector<float> b = {1.0f, 5.0f, f(0xff800001)};
  const TensorMetrics m = compare(a, b);
  EXPECT_EQ(m.mismatches, 2u);
  EXPECT_EQ(m.first_mismatch, 1);
  EXPECT_EQ(m.max_abs_diff, kInf);
  EXPECT_EQ(m.max_ulp_diff, kInf);
  EXPECT_EQ(m.mean_abs_diff, kInf);
  EXPECT_EQ(m.nan_a, 1u);
  EXPECT_EQ(m.nan_b, 1u);
  EXPECT_EQ(m.ulp_histogram[kUlpBinNan], 2u);
  EXPECT_EQ(hist_total(m), 2u);  // mismatches only
}

TEST(Compare, InfinitiesAndExtremes) {
  const float max = std::numeric_limits<float>::max();
  const TensorMetrics m1 = compare(std::vector<float>{f(0x7f800000)}, std::vector<float>{max});
  EXPECT_EQ(m1.max_ulp_diff, 1.0);
  EXPECT_EQ(m1.max_abs_diff, kInf);
  EXPECT_EQ(m1.inf_a, 1u);
  EXPECT_EQ(m1.inf_b, 0u);
  const TensorMetrics m2 = compare(std::vector<float>{-INFINITY}, std::vector<float>{INFINITY});
  EXPECT_EQ(m2.max_ulp_diff, static_cast<double>(0xff000001u));
  EXPECT_EQ(m2.max_abs_diff, kInf);
  EXPECT_EQ(m2.ulp_histogram[31], 1u);  // >= 2^31
  // Finite extremes: the abs diff is finite in double.
  const TensorMetrics m3 = compare(std::vector<float>{-max}, std::vector<float>{max});
  EXPECT_EQ(m3.max_abs_diff, 2.0 * static_cast<double>(max));
}

TEST(Compare, Subnormals) {
  const float tiny = f(0x00000001), ntiny = f(0x80000001);
  EXPECT_EQ(ulp_distance_f32(tiny, 0.0f), 1.0);
  EXPECT_EQ(ulp_distance_f32(ntiny, -0.0f), 1.0);
  EXPECT_EQ(ulp_distance_f32(ntiny, tiny), 3.0);  // -tiny, -0, +0, +tiny
  EXPECT_EQ(ulp_distance_f32(f(0x007fffff), f(0x00800000)), 1.0);  // largest subnormal to smallest normal
  const TensorMetrics m = compare(std::vector<float>{tiny, f(0x007fffff)}, std::vector<float>{0.0f, f(0x00800000)});
  EXPECT_EQ(m.mismatches, 2u);
  EXPECT_EQ(m.max_abs_diff, static_cast<double>(tiny));
  EXPECT_EQ(m.mean_abs_diff, static_cast<double>(tiny));
}

TEST(Compare, UlpBinsAreLog2) {
  EXPECT_EQ(ulp_bin(1), 0u);
  EXPECT_EQ(ulp_bin(2), 1u);
  EXPECT_EQ(ulp_bin(3), 1u);
  EXPECT_EQ(ulp_bin(4), 2u);
  EXPECT_EQ(ulp_bin(7), 2u);
  EXPECT_EQ(ulp_bin(8), 3u);
  EXPECT_EQ(ulp_bin(2147483647.0), 30u);
  EXPECT_EQ(ulp_bin(2147483648.0), 31u);
  EXPECT_EQ(ulp_bin(4294967295.0), 31u);
  EXPECT_EQ(ulp_bin(kInf), 32u);
  EXPECT_EQ(ulp_bin_label(0), "1");
  EXPECT_EQ(ulp_bin_label(1), "[2,3]");
  EXPECT_EQ(ulp_bin_label(2), "[4,7]");
  EXPECT_EQ(ulp_bin_label(31), ">=2147483648");
  EXPECT_EQ(ulp_bin_label(32), "NaN");
  const TensorMetrics m = compare(std::vector<float>{1.0f, 1.0f, 2.0f}, std::vector<float>{f(0x3f800004), f(0x3f800007), 2.0f});
  EXPECT_EQ(m.max_ulp_diff, 7.0);
  ASSERT_EQ(m.ulp_histogram.size(), kUlpBins);
  EXPECT_EQ(m.ulp_histogram[2], 2u);
  EXPECT_EQ(hist_total(m), 2u);
}

TEST(Compare, Bf16) {
  const std::vector<bf16> a = {bf16{0x3f80}, bf16{0x0000}, bf16{0x7fc0}, bf16{0x0001}, bf16{0x7f80}};
  const std::vector<bf16> b = {bf16{0x3f81}, bf16{0x8000}, bf16{0xffc1}, bf16{0x8001}, bf16{0x7f7f}};
  const TensorMetrics m = compare(a, b, {5});
  EXPECT_EQ(m.dtype, "BF16");
  EXPECT_EQ(m.mismatches, 4u);  // the NaNs are equal
  EXPECT_EQ(m.first_mismatch, 0);
  EXPECT_EQ(ulp_distance_bf16(a[0], b[0]), 1.0);
  EXPECT_EQ(ulp_distance_bf16(a[1], b[1]), 1.0);
  EXPECT_EQ(ulp_distance_bf16(a[3], b[3]), 3.0);
  EXPECT_EQ(ulp_distance_bf16(a[4], b[4]), 1.0);
  EXPECT_EQ(ulp_distance_bf16(bf16{0xff80}, bf16{0x7f80}), static_cast<double>(0xff01));
  EXPECT_EQ(m.max_abs_diff, kInf);  // Inf vs max finite
  EXPECT_EQ(m.nan_a, 1u);
  EXPECT_EQ(m.inf_a, 1u);
  EXPECT_EQ(m.max_ulp_diff, 3.0);
  EXPECT_EQ(m.ulp_histogram[0], 3u);  // distance 1
  EXPECT_EQ(m.ulp_histogram[1], 1u);  // distance 3
}

TEST(Compare, NegativeControlOneFlippedBitIsFoundWhereItIs) {
  std::vector<float> a(1000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.37f - 100.0f;
  std::vector<float> b = a;
  EXPECT_TRUE(compare(a, b).bit_identical);
  b[617] = f(bits_of(b[617]) ^ 1u);  // one bit, one element
  const TensorMetrics m = compare(a, b);
  EXPECT_FALSE(m.bit_identical);
  EXPECT_EQ(m.mismatches, 1u);
  EXPECT_EQ(m.first_mismatch, 617);
  EXPECT_EQ(m.max_ulp_diff, 1.0);
  EXPECT_GT(m.max_abs_diff, 0.0);
  EXPECT_EQ(m.mean_abs_diff, m.max_abs_diff / 1000.0);
  EXPECT_EQ(hist_total(m), 1u);
  EXPECT_EQ(m.ulp_histogram[0], 1u);
}

// Tensors of 2^20 elements or more are first checked for equal bits in parallel
// blocks: equal ones get the element loop's metrics (NaN and Inf counts included);
// a difference in the last block, a NaN against a number, or a −0 against +0 goes to
// the element loop, which finds it where it is.
TEST(Compare, LargeTensorsTakeTheParallelPassWithTheSameMetrics) {
  const size_t n = (size_t{1} << 20) + 5;
  std::vector<float> a(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i % 1000) - 500.0f;
  a[3] = f(0x7fc00000);
  a[n - 2] = f(0xff800000);
  std::vector<float> b = a;
  b[3] = f(0xffc00123);  // another NaN
  const TensorMetrics same = compare(a, b);
  EXPECT_TRUE(same.bit_identical);
  EXPECT_EQ(same.elements, n);
  EXPECT_EQ(same.mismatches, 0u);
  EXPECT_EQ(same.first_mismatch, -1);
  EXPECT_EQ(same.mean_abs_diff, 0.0);
  EXPECT_TRUE(same.ulp_histogram.empty());
  EXPECT_EQ(same.nan_a, 1u);
  EXPECT_EQ(same.nan_b, 1u);
  EXPECT_EQ(same.inf_a, 1u);
  EXPECT_EQ(same.inf_b, 1u);
  for (const auto& [at, value] : {std::pair<size_t, float>{n - 1, std::nextafter(a[n - 1], 1e9f)},
                                  {size_t{5}, f(0x7fc00000)}, {size_t{500}, -0.0f}}) {
    std::vector<float> c = a;
    c[at] = value;
    const TensorMetrics m = compare(a, c);
    EXPECT_FALSE(m.bit_identical) << at;
    EXPECT_EQ(m.mismatches, 1u) << at;
    EXPECT_EQ(m.first_mismatch, static_cast<int64_t>(at));
    EXPECT_EQ(m.nan_b, at == 5 ? 2u : 1u) << at;
  }
}

TEST(Compare, LogprobAliasAndUnalignedBytes) {
  EXPECT_TRUE(looks_like_logprob("rollout.LogProbs"));
  EXPECT_FALSE(looks_like_logprob("model.embed_tokens.weight"));
  // Unaligned storage: the bytes start one past an aligned address.
  std::vector<uint8_t> a(1 + 8), b(1 + 8);
  const float va[2] = {-1.5f, -2.0f}, vb[2] = {-1.5f, -2.5f};
  std::memcpy(a.data() + 1, va, 8);
  std::memcpy(b.data() + 1, vb, 8);
  TensorMetrics m = compare_bytes(CmpType::F32, a.data() + 1, b.data() + 1, 2, {1, 2});
  m.is_logprob = true;
  EXPECT_EQ(m.mean_abs_diff, 0.25);
  EXPECT_EQ(m.train_rollout_logprob_abs_diff(), 0.25);
  EXPECT_EQ(m.shape, (std::vector<uint64_t>{1, 2}));
  EXPECT_THROW(compare(std::vector<float>{1.0f}, std::vector<float>{}), std::invalid_argument);
  EXPECT_TRUE(compare(std::vector<float>{}, std::vector<float>{}).bit_identical);
}

// The unit of the distance from the float64 truth: 2^(floor(log2 |t|) - p) of the
// tensor's dtype (p = 7 for BF16, 23 for F32), its exponent held at the normal range's
// least (-126) so that it does not vanish at or near 0.
TEST(TruthError, UlpAtTheTruth) {
  EXPECT_EQ(ulp_at(CmpType::BF16, 1.0), 0x1p-7);
  EXPECT_EQ(ulp_at(CmpType::F32, 1.0), 0x1p-23);
  EXPECT_EQ(ulp_at(CmpType::BF16, 1.999), 0x1p-7);  // the binade of the truth, not of its rounding
  EXPECT_EQ(ulp_at(CmpType::BF16, -3.0), 0x1p-6);   // the magnitude's
  EXPECT_EQ(ulp_at(CmpType::F32, 0x1p100), 0x1p77);
  EXPECT_EQ(ulp_at(CmpType::BF16, 0.0), 0x1p-133);
  EXPECT_EQ(ulp_at(CmpType::BF16, -0.0), 0x1p-133);
  EXPECT_EQ(ulp_at(CmpType::F32, 0.0), 0x1p-149);
  EXPECT_EQ(ulp_at(CmpType::F32, 0x1p-140), 0x1p-149);  // a subnormal truth: the smallest normal's unit
  EXPECT_EQ(ulp_at(CmpType::F32, 0x1p-126), 0x1p-149);
}

TEST(TruthError, DistancesInUlpsOfTheTruth) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Exact values: 0 apart. Empty: 0.
  EXPECT_EQ(truth_error(std::vector<float>{1.0f, -2.0f, 0.0f}, std::vector<double>{1.0, -2.0, 0.0}), (TruthError{0, 0}));
  EXPECT_EQ(truth_error(std::vector<float>{}, std::vector<double>{}), (TruthError{0, 0}));
  // A value 3 ulps off (F32 at 1: 3 * 2^-23), one half an ulp off (a correct rounding of 1 + 2^-24).
  EXPECT_EQ(truth_error(std::vector<float>{f(0x3f800003)}, std::vector<double>{1.0}), (TruthError{3, 3}));
  EXPECT_EQ(truth_error(std::vector<float>{1.0f}, std::vector<double>{1.0 + 0x1p-24}), (TruthError{0.5, 0.5}));
  // BF16: 1 + 2^-7 against 1 is one ulp; 0 against 2^-137 a sixteenth (of the unit 2^-133 near 0).
  EXPECT_EQ(truth_error(std::vector<bf16>{bf16{0x3f81}}, std::vector<double>{1.0}), (TruthError{1, 1}));
  EXPECT_EQ(truth_error(std::vector<bf16>{bf16{0x0000}}, std::vector<double>{0x1p-137}), (TruthError{0x1p-4, 0x1p-4}));
  // The mean over the elements, the max the largest: 0, 3 and 1 ulp.
  EXPECT_EQ(truth_error(std::vector<float>{1.0f, f(0x3f800003), f(0x40000001)}, std::vector<double>{1.0, 1.0, 2.0}),
            (TruthError{3, 4.0 / 3}));
  // NaN against a finite truth: inf (max and mean); NaN against a NaN truth and an
  // infinity against itself: 0; an infinity against a finite truth: inf.
  EXPECT_EQ(truth_error(std::vector<float>{NAN, 1.0f}, std::vector<double>{1.0, 1.0}), (TruthError{kInf, kInf}));
  EXPECT_EQ(truth_error(std::vector<float>{NAN, f(0x3f800001)}, std::vector<double>{nan, 1.0}), (TruthError{1, 0.5}));
  EXPECT_EQ(truth_error(std::vector<bf16>{bf16{0x7fc0}}, std::vector<double>{nan}), (TruthError{0, 0}));
  EXPECT_EQ(truth_error(std::vector<float>{INFINITY, -INFINITY}, std::vector<double>{kInf, -kInf}), (TruthError{0, 0}));
  EXPECT_EQ(truth_error(std::vector<bf16>{bf16{0x7f80}}, std::vector<double>{1.0}), (TruthError{kInf, kInf}));
  EXPECT_EQ(truth_error(std::vector<float>{1.0f}, std::vector<double>{nan}), (TruthError{kInf, kInf}));
  EXPECT_THROW(truth_error(std::vector<float>{1.0f}, std::vector<double>{}), std::invalid_argument);
}

}  // namespace
}  // namespace bp::harness
