// rope: the inv_freq and cos/sin tables against float64 (measured and bounded),
// the rotation and its transpose against float64 truth on the tables' own bf16
// values (derived bound), in place, position 0, decode == extend, negative
// controls, golden digests, edge inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "reference/common/rng.h"
#include "reference/numerics/math.h"
#include "reference/ops/rope.h"
#include "reference/truth/rope.h"
#include "support/bounds.h"
#include "support/golden.h"

namespace bp {
namespace {

using truth::MatD;
using truth::VecD;

constexpr float kTheta = 1e6f;  // Qwen3 rope_theta
constexpr int kMaxPos = 40960;  // Qwen3 max_position_embeddings

double ulp_of(float x) {  // spacing of fp32 at x
  const float a = std::fabs(x);
  return double(std::nextafter(a, INFINITY)) - double(a);
}

// Tables for (theta, D, max_pos), built once per shape and shared by the tests.
struct Tables {
  int D, max_pos;
  std::vector<float> inv_freq;
  std::vector<bf16> cos, sin;
  ref::RopeTable view() const { return {cos.data(), sin.data(), max_pos, D}; }
};
const Tables& tables(int D) {
  static Tables t128, t64;
  Tables& t = D == 128 ? t128 : t64;
  if (t.cos.empty()) {
    t = Tables{D, kMaxPos, std::vector<float>(D / 2), std::vector<bf16>(size_t(kMaxPos) * D / 2),
               std::vector<bf16>(size_t(kMaxPos) * D / 2)};
    ref::rope_inv_freq(kTheta, D, t.inv_freq.data());
    ref::rope_tables(kTheta, D, kMaxPos, t.cos.data(), t.sin.data());
  }
  return t;
}

class RopeTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
};

// inv_freq = fl(X·Y), X = exp2(−e·k) with e·k exact (D a power of two), so only
// exp2's own error; Y = exp(−fl(e·L̂)), L̂ = log(m) within math::kMaxUlpLog ulps (each
// <= 2^-23 relative) of ln m, m = theta/2^k in [1, 2). Y's argument is off by
// |Δ| <= e·ln(m)·math::kMaxUlpLog·2^-23 + half an ulp of the product, which exp turns
// into the relative error |e^Δ − 1| <= |Δ|·e^|Δ|, plus math::kMaxUlpExp ulps of its own;
// the final product rounds once more.
double inv_freq_rel_bound(int j, int D) {
  int k;
  const double m = 2 * std::frexp(double(kTheta), &k), e = 2.0 * j / D, a = e * std::log(m);
  const double delta = a * math::kMaxUlpLog * 0x1p-23 * (1 + 0x1p-20) + 0.5 * ulp_of(float(a)) * (1 + 0x1p-20);
  const double x_err = math::kMaxUlpExp2 * 0x1p-23,
               y_err = (1 + delta * std::exp(delta)) * (1 + math::kMaxUlpExp * 0x1p-23) - 1;
  return (1 + x_err) * (1 + y_err) * (1 + test::kU32) - 1;
}

// The measurement the SPEC quotes, with derived bounds as assertions:
//  - inv_freq against 1/theta^(2j/D) in float64 (bounded as above; also in ulps);
//  - the angle f32(p)·inv_freq against p/theta^(2j/D) (radians; bounded by
//    p·inv·(inv_freq bound) + half an ulp of the product);
//  - each table entry against cos/sin of its own fp32 angle in float64: one
//    R after math::cos/sin (bf16_output_bound with math::kMaxUlpSinCosRope);
//  - recorded, not asserted: the entries' absolute error against cos/sin of the
//    exact angle, and the count of entries that differ from an HF-style fp32
//    table (powf, cosf/sinf, then R), whose bits are the host libm's, not ours.
// A table entry against cos/sin of its own fp32 angle: math::cos/sin's ulps, then one R.
double entry_ratio_of(bf16 got, double want) {
  return std::fabs(widen(got) - want) /
         test::bf16_output_bound(want, math::kMaxUlpSinCosRope * 0x1p-23 * std::fabs(want));
}

TEST(RopeTables, AgainstFloat64ForTheta1e6UpToPosition40960) {
  for (int D : {128, 64}) {
    const Tables& t = tables(D);
    const VecD inv = truth::rope_inv_freq(kTheta, D);
    // *_ratio: largest |error| / bound (asserted <= 1); the others are measurements.
    double inv_ratio = 0, inv_ulp = 0, angle_ratio = 0, angle_err = 0, entry_ratio = 0, entry_err = 0, hf_angle_err = 0;
    int64_t hf_mismatches = 0;
    for (int j = 0; j < D / 2; ++j) {
      const double err = std::fabs(t.inv_freq[j] - inv(j));
      inv_ratio = std::max(inv_ratio, err / (inv_freq_rel_bound(j, D) * inv(j)));
      inv_ulp = std::max(inv_ulp, err / ulp_of(float(inv(j))));
    }
    for (int p = 0; p < kMaxPos; ++p)
      for (int j = 0; j < D / 2; ++j) {
        const float freq = mul_rn(float(p), t.inv_freq[j]);
        const double exact = p * inv(j), err = std::fabs(double(freq) - exact);
        angle_ratio = std::max(angle_ratio, err / (exact * inv_freq_rel_bound(j, D) + 0.5 * ulp_of(freq)));
        angle_err = std::max(angle_err, err);
        const size_t at = size_t(p) * (D / 2) + j;
        entry_ratio = std::max({entry_ratio, entry_ratio_of(t.cos[at], std::cos(double(freq))),
                                entry_ratio_of(t.sin[at], std::sin(double(freq)))});
        entry_err = std::max(
            {entry_err, std::fabs(widen(t.cos[at]) - std::cos(exact)), std::fabs(widen(t.sin[at]) - std::sin(exact))});
        const float hf_inv = 1.0f / std::pow(kTheta, float(2 * j) / float(D)), hf_freq = float(p) * hf_inv;
        hf_angle_err = std::max(hf_angle_err, std::fabs(double(hf_freq) - exact));
        hf_mismatches += (round_bf16(std::cos(hf_freq)) != t.cos[at]) + (round_bf16(std::sin(hf_freq)) != t.sin[at]);
      }
    EXPECT_LE(inv_ratio, 1.0) << "D " << D;
    EXPECT_LE(angle_ratio, 1.0) << "D " << D;
    EXPECT_LE(entry_ratio, 1.0) << "D " << D;
    const std::string d = "D" + std::to_string(D) + ".";
    RecordProperty(d + "inv_freq_ratio", std::to_string(inv_ratio));
    RecordProperty(d + "inv_freq_max_ulp", std::to_string(inv_ulp));
    RecordProperty(d + "angle_ratio", std::to_string(angle_ratio));
    RecordProperty(d + "angle_max_abs_err_rad", std::to_string(angle_err));
    RecordProperty(d + "entry_ratio", std::to_string(entry_ratio));
    RecordProperty(d + "entry_vs_exact_angle_max_abs_err", std::to_string(entry_err));
    RecordProperty(d + "hf_fp32_angle_max_abs_err_rad", std::to_string(hf_angle_err));
    RecordProperty(d + "entries_differing_from_hf_fp32", std::to_string(hf_mismatches));
  }
}

// cos/sin of each token's position, widened: the truth is evaluated on the
// tables' own bf16 values (the op's inputs), so the bound below is the rotation's.
struct TokenTrig {
  MatD c, s;  // [T][D/2]
};
TokenTrig gather(const Tables& t, const std::vector<int32_t>& pos) {
  TokenTrig g{MatD(pos.size(), t.D / 2), MatD(pos.size(), t.D / 2)};
  for (size_t i = 0; i < pos.size(); ++i)
    for (int j = 0; j < t.D / 2; ++j) {
      g.c(i, j) = widen(t.cos[size_t(pos[i]) * (t.D / 2) + j]);
      g.s(i, j) = widen(t.sin[size_t(pos[i]) * (t.D / 2) + j]);
    }
  return g;
}

std::vector<int32_t> random_positions(int T, uint64_t seed) {
  std::vector<int32_t> p(T);
  for (int i = 0; i < T; ++i) p[i] = int32_t(counter_hash(seed, i) % kMaxPos);
  return p;
}

// Per output: both products are exact in fp32 (8-bit significands), each R
// rounds by u16 relative, the fp32 add/sub of the two rounded products by u, the
// final R by u16: |out − v| <= bf16_output_bound(v, (u16 + u(1 + u16))·(|a| + |b|))
// where v = a ± b is the exact value and a, b the exact products.
// Returns the largest |error| / bound (<= 1 passes).
double worst_ratio(const std::vector<bf16>& out, const std::vector<bf16>& in, const TokenTrig& g, int H, int D,
                   bool transpose) {
  const int T = int(g.c.rows()), half = D / 2;
  const MatD X = truth::widen(in, T, H * D);
  const MatD want = transpose ? truth::rope_bwd(X, g.c, g.s, H, D) : truth::rope_fwd(X, g.c, g.s, H, D);
  const double per_term = test::kU16 + test::kU32 * (1 + test::kU16);
  double worst = 0;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < D; ++j) {
        const int k = h * D + j, partner = j < half ? k + half : k - half;
        const double terms = std::fabs(X(t, k) * g.c(t, j % half)) + std::fabs(X(t, partner) * g.s(t, j % half));
        const double bound = test::bf16_output_bound(want(t, k), per_term * terms);
        worst = std::max(worst, std::fabs(widen(out[size_t(t) * H * D + k]) - want(t, k)) / bound);
      }
  return worst;
}

std::vector<bf16> apply(const Knobs& kn, const Tables& t, const std::vector<int32_t>& pos, const std::vector<bf16>& x,
                        int H, bool transpose) {
  std::vector<bf16> out(x.size());
  (transpose ? ref::rope_bwd : ref::rope_fwd)(kn, t.view(), pos.data(), x.data(), out.data(), int(pos.size()), H);
  return out;
}

// Real head counts: Qwen3-30B-A3B q (32) and k (4), Qwen3-0.6B q (16) and k (8).
TEST_P(RopeTest, ForwardAndBackwardWithinDerivedBound) {
  double worst = 0;
  for (int H : {32, 4, 16, 8})
    for (int D : {128, 64}) {
      const int T = 9;
      const auto pos = random_positions(T, H + D);
      const auto x = random_bf16(size_t(T) * H * D, H * D, 2.0f);
      const TokenTrig g = gather(tables(D), pos);
      worst = std::max({worst, worst_ratio(apply(knobs(), tables(D), pos, x, H, false), x, g, H, D, false),
                        worst_ratio(apply(knobs(), tables(D), pos, x, H, true), x, g, H, D, true)});
    }
  EXPECT_LE(worst, 1.0);
  RecordProperty("max_err_over_bound", std::to_string(worst));
}

// Truth's backward (the transposed rotation) against central differences.
TEST(RopeTruth, BackwardMatchesFiniteDifferences) {
  const int T = 2, H = 2, D = 4;
  const MatD X = MatD::Random(T, H * D), C = MatD::Random(T, H * D), ang = MatD::Random(T, D / 2);
  const MatD c = ang.array().cos(), s = ang.array().sin();
  const MatD grad = truth::rope_bwd(C, c, s, H, D);
  auto loss = [&](const MatD& x) { return (truth::rope_fwd(x, c, s, H, D).array() * C.array()).sum(); };
  const double h = 1e-6;
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < H * D; ++k) {
      MatD p = X, m = X;
      p(t, k) += h;
      m(t, k) -= h;
      EXPECT_NEAR((loss(p) - loss(m)) / (2 * h), grad(t, k), 1e-8);
    }
}

TEST_P(RopeTest, InPlaceEqualsOutOfPlace) {
  const int T = 5, H = 4, D = 128;
  const auto pos = random_positions(T, 1);
  auto x = random_bf16(size_t(T) * H * D, 2, 1.0f);
  for (bool transpose : {false, true}) {
    const auto want = apply(knobs(), tables(D), pos, x, H, transpose);
    std::vector<bf16> y = x;
    (transpose ? ref::rope_bwd : ref::rope_fwd)(knobs(), tables(D).view(), pos.data(), y.data(), y.data(), T, H);
    EXPECT_TRUE(y == want);
  }
}

// A token rotated alone (decode) equals the same token inside a batch of other
// tokens at other positions (extend, mixed batches), bit for bit.
TEST_P(RopeTest, DecodeEqualsExtendAndBatchInvariance) {
  const int H = 32, D = 128;
  const std::vector<int32_t> one_pos = {40000};
  const auto one = random_bf16(size_t(H) * D, 3, 1.0f);
  for (bool transpose : {false, true}) {
    const auto alone = apply(knobs(), tables(D), one_pos, one, H, transpose);
    for (int batch : {2, 3, 17, 64}) {
      auto pos = random_positions(batch, 4 + batch);
      auto x = random_bf16(size_t(batch) * H * D, 5 + batch, 1.0f);
      const int at = batch / 2;
      pos[at] = one_pos[0];
      std::copy(one.begin(), one.end(), x.begin() + size_t(at) * H * D);
      const auto out = apply(knobs(), tables(D), pos, x, H, transpose);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), out.begin() + size_t(at) * H * D)) << "batch " << batch;
    }
  }
}

// Position 0: the tables hold cos = 1 and sin = +0 exactly, and the rotation is
// the identity (a −0 input may come out +0: −0 − (+0·…) ordering of signed zeros).
TEST_P(RopeTest, PositionZeroIsTheIdentity) {
  const int H = 4, D = 128;
  const Tables& t = tables(D);
  for (int j = 0; j < D / 2; ++j) {
    EXPECT_EQ(t.cos[j].bits, 0x3f80);
    EXPECT_EQ(t.sin[j].bits, 0x0000);
  }
  auto x = random_bf16(size_t(H) * D, 6, 1.0f);
  x[1] = bf16{0x8000};
  x[2] = bf16{0x0001};
  for (bool transpose : {false, true}) {
    const auto out = apply(knobs(), t, {0}, x, H, transpose);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(widen(out[i]), widen(x[i])) << i;
    EXPECT_EQ(out[2].bits, 0x0001) << "subnormal kept";
  }
}

TEST_P(RopeTest, PositionOutsideTableThrowsNamingItAndWritesNothing) {
  const int H = 1, D = 64;
  const std::vector<bf16> x(size_t(2) * H * D, round_bf16(1.0f));
  for (int32_t bad : {-1, kMaxPos}) {
    const std::vector<int32_t> pos = {3, bad};
    std::vector<bf16> out(x.size(), bf16{0x1234});
    try {
      ref::rope_fwd(knobs(), tables(D).view(), pos.data(), x.data(), out.data(), 2, H);
      ADD_FAILURE() << "no exception for position " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](bf16 v) { return v.bits == 0x1234; }));
    EXPECT_THROW(ref::rope_bwd(knobs(), tables(D).view(), pos.data(), x.data(), out.data(), 2, H),
                 std::invalid_argument);
  }
}

TEST(RopeTables, RefuseBadThetaOrHeadDim) {
  std::vector<bf16> c(64), s(64);
  for (float theta : {0.0f, -1e6f, 0x1p-130f, INFINITY, NAN})
    EXPECT_THROW(ref::rope_tables(theta, 64, 2, c.data(), s.data()), std::invalid_argument) << theta;
  for (int D : {0, -2, 63}) EXPECT_THROW(ref::rope_tables(kTheta, D, 1, c.data(), s.data()), std::invalid_argument);
}

// Non-finite inputs follow IEEE through the products: at position 0 (sin = +0)
// an Inf in the first half stays Inf and makes its partner Inf·0 = NaN; a NaN
// makes both elements of its pair NaN; other pairs are untouched.
TEST_P(RopeTest, EdgeInputs) {
  const int D = 64;
  std::vector<bf16> x(D, round_bf16(0.5f));
  x[0] = bf16{0x7f80};
  x[1] = bf16{0x7fc1};
  const auto out = apply(knobs(), tables(D), {0}, x, 1, false);
  EXPECT_EQ(out[0].bits, 0x7f80);
  EXPECT_EQ(out[D / 2].bits, kCanonicalNanBf16);
  EXPECT_EQ(out[1].bits, kCanonicalNanBf16);
  EXPECT_EQ(out[D / 2 + 1].bits, kCanonicalNanBf16);
  EXPECT_EQ(out[2].bits, x[2].bits);
}

// Negative control: one rounding instead of three (R(x1·c − x2·s) in fp32, the
// "missing cast" of an fp32 rotary kernel) gives other bits on the same inputs.
TEST_P(RopeTest, NegativeControlSingleRoundingChangesBits) {
  const int T = 16, H = 8, D = 128;
  const auto pos = random_positions(T, 7);
  const auto x = random_bf16(size_t(T) * H * D, 8, 1.0f);
  const auto out = apply(knobs(), tables(D), pos, x, H, false);
  const Tables& t = tables(D);
  int differ = 0;
  for (int i = 0; i < T; ++i)
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < D / 2; ++j) {
        const size_t at = (size_t(i) * H + h) * D + j, tj = size_t(pos[i]) * (D / 2) + j;
        const float fused =
            sub_rn(mul_rn(widen(x[at]), widen(t.cos[tj])), mul_rn(widen(x[at + D / 2]), widen(t.sin[tj])));
        differ += round_bf16(fused) != out[at];
      }
  EXPECT_GT(differ, 0);
}

TEST_P(RopeTest, GoldenDigests) {
  const int T = 5, H = 4, D = 128;
  const std::vector<int32_t> pos = {0, 1, 7, 4095, kMaxPos - 1};
  const auto x = random_bf16(size_t(T) * H * D, 9, 1.0f);
  const std::string c = contract().name;
  test::expect_golden("ops/rope.txt", c + ".inv_freq", test::digest(tables(D).inv_freq));
  test::expect_golden("ops/rope.txt", c + ".cos", test::digest(tables(D).cos));
  test::expect_golden("ops/rope.txt", c + ".sin", test::digest(tables(D).sin));
  test::expect_golden("ops/rope.txt", c + ".fwd", test::digest(apply(knobs(), tables(D), pos, x, H, false)));
  test::expect_golden("ops/rope.txt", c + ".bwd", test::digest(apply(knobs(), tables(D), pos, x, H, true)));
}

INSTANTIATE_TEST_SUITE_P(Contracts, RopeTest, ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1"),
                         [](const auto& info) { return std::string(info.param).substr(5, 6); });

}  // namespace
}  // namespace bp
