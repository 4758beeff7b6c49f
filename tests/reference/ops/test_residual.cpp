// residual: R(f(h) + f(o)) is the correctly rounded bf16 sum (checked against an
// independent rounding of the exact sum, exhaustively in the slow twin), in place,
// batch invariance, a negative control, golden digests, edge inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "reference/common/rng.h"
#include "reference/ops/residual.h"
#include "reference/truth/residual.h"
#include "support/golden.h"

namespace bp {
namespace {

using truth::MatD;

class ResidualTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
};

bool finite(uint16_t b) { return (b & 0x7f80u) != 0x7f80u; }

// Independent nearest-even rounding of a finite double to bf16, as a double:
// scale to an integer significand of 8 bits (quantum 2^-133 for subnormals), round
// with nearbyint (ties to even), scale back; 2^128 and beyond is Inf.
double nearest_bf16(double x) {
  if (x == 0) return x;
  int e;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int quantum = std::max(e - 1, -126) - 7;
  const double v = std::ldexp(std::nearbyint(std::ldexp(x, -quantum)), quantum);
  return std::fabs(v) >= 0x1p128 ? std::copysign(INFINITY, v) : v;
}

// Why one rounding: with |h| >= |o| and exponents e_h >= e_o, the fp32 sum is exact
// when e_h − e_o <= 16 (the exact sum is a multiple of 2^(e_o−7) below 2^(e_h+2),
// and a carry needs e_h − e_o <= 7), so R rounds the exact sum once. Otherwise
// |o| < 2^(e_h−16), both the exact sum and its fp32 rounding lie within 2^(e_h−16)
// of h, while the nearest bf16 midpoint is at least 2^(e_h−9) away: both round to h.
// The double sum below is exact for exponent gaps up to 45; beyond, it is h or
// a neighbour one double ulp away, equally far from any midpoint, so the reference
// is right for every finite pair.
// Pairs (h, o) are taken by index: exhaustively (h, o) = (i >> 16, i & 0xffff), or
// sampled from the counter hash; pairs with a non-finite member are skipped (see
// EdgeInputs). `truncate` swaps in a kernel that truncates the fp32 sum instead of
// rounding it (the negative control). Blocks of 2^22 pairs bound the memory.
int64_t count_not_correctly_rounded(const Knobs& kn, int64_t count, bool sampled, bool truncate) {
  const int64_t block = int64_t(1) << 22;
  std::vector<bf16> h(block), o(block), got(block);
  int64_t bad = 0;
  for (int64_t first = 0; first < count; first += block) {
    const int64_t n = std::min(block, count - first);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t pair = sampled ? uint32_t(counter_hash(1, first + i)) : uint32_t(first + i);
      h[i] = bf16{uint16_t(pair >> 16)};
      o[i] = bf16{uint16_t(pair)};
    }
    ref::residual_fwd(kn, h.data(), o.data(), got.data(), n);
    std::atomic<int64_t> block_bad{0};
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      if (!finite(h[i].bits) || !finite(o[i].bits)) continue;
      const float sum = add_rn(widen(h[i]), widen(o[i]));
      const double g = truncate ? double(float_of(bits_of(sum) & 0xffff0000u)) : double(widen(got[i]));
      // The double sum has the IEEE sign of an exact zero (x + (-x) = +0, -0 + -0 = -0).
      const double want = nearest_bf16(double(widen(h[i])) + double(widen(o[i])));
      if (g != want || std::signbit(g) != std::signbit(want)) ++block_bad;
    }
    bad += block_bad;
  }
  return bad;
}

TEST_P(ResidualTest, CorrectlyRoundedSum) {
  EXPECT_EQ(count_not_correctly_rounded(knobs(), int64_t(1) << 22, true, false), 0);
}

TEST(ResidualSlow, SlowCorrectlyRoundedSumAllPairs) {
  EXPECT_EQ(count_not_correctly_rounded(find_contract("bf16-sm90tc-v1")->knobs, int64_t(1) << 32, false, false), 0);
}

// Negative control: the same check catches a kernel that truncates instead.
TEST_P(ResidualTest, NegativeControlTruncationIsCaught) {
  EXPECT_GT(count_not_correctly_rounded(knobs(), int64_t(1) << 20, true, true), 0);
}

TEST_P(ResidualTest, InPlaceAndBatchInvariant) {
  const int H = 2048;
  const auto h = random_bf16(H, 1, 4.0f), o = random_bf16(H, 2, 0.5f);
  std::vector<bf16> alone(H);
  ref::residual_fwd(knobs(), h.data(), o.data(), alone.data(), H);
  for (int batch : {2, 5, 64}) {
    auto hb = random_bf16(size_t(batch) * H, 10 + batch, 4.0f), ob = random_bf16(size_t(batch) * H, 20 + batch, 0.5f);
    const int at = batch - 1;
    std::copy(h.begin(), h.end(), hb.begin() + size_t(at) * H);
    std::copy(o.begin(), o.end(), ob.begin() + size_t(at) * H);
    ref::residual_fwd(knobs(), hb.data(), ob.data(), hb.data(), hb.size());  // in place into h
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), hb.begin() + size_t(at) * H)) << "batch " << batch;
  }
}

TEST_P(ResidualTest, EdgeInputs) {
  auto add = [&](bf16 a, bf16 b) {
    bf16 r;
    ref::residual_fwd(knobs(), &a, &b, &r, 1);
    return r.bits;
  };
  const bf16 pz{0x0000}, nz{0x8000}, inf{0x7f80}, ninf{0xff80}, nan{0xffc1}, max{0x7f7f}, one = round_bf16(1.0f);
  EXPECT_EQ(add(nz, nz), 0x8000);
  EXPECT_EQ(add(nz, pz), 0x0000);
  EXPECT_EQ(add(one, round_bf16(-1.0f)), 0x0000) << "exact cancellation is +0";
  EXPECT_EQ(add(inf, one), 0x7f80);
  EXPECT_EQ(add(inf, ninf), kCanonicalNanBf16);
  EXPECT_EQ(add(nan, one), kCanonicalNanBf16);
  EXPECT_EQ(add(max, max), 0x7f80) << "overflow to Inf";
  EXPECT_EQ(add(bf16{0x0001}, bf16{0x0001}), 0x0002) << "subnormals add exactly, no flush";
}

TEST_P(ResidualTest, GoldenDigests) {
  const size_t n = 4096;
  const auto h = random_bf16(n, 3, 8.0f), o = random_bf16(n, 4, 0.25f);
  std::vector<bf16> out(n);
  ref::residual_fwd(knobs(), h.data(), o.data(), out.data(), n);
  test::expect_golden("ops/residual.txt", contract().name + ".fwd", test::digest(out));
}

// Truth's backward (the identity to both inputs) against central differences.
TEST(ResidualTruth, BackwardMatchesFiniteDifferences) {
  const MatD H = MatD::Random(2, 3), O = MatD::Random(2, 3), C = MatD::Random(2, 3);
  const truth::ResidualGrads g = truth::residual_bwd(C);
  auto loss = [&](const MatD& h, const MatD& o) { return (truth::residual_fwd(h, o).array() * C.array()).sum(); };
  const double step = 1e-6;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      MatD p = H, m = H;
      p(i, j) += step;
      m(i, j) -= step;
      EXPECT_NEAR((loss(p, O) - loss(m, O)) / (2 * step), g.dh(i, j), 1e-8);
      p = O, m = O;
      p(i, j) += step;
      m(i, j) -= step;
      EXPECT_NEAR((loss(H, p) - loss(H, m)) / (2 * step), g.d_o(i, j), 1e-8);
    }
}

INSTANTIATE_TEST_SUITE_P(Contracts, ResidualTest, ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1"),
                         [](const auto& info) { return std::string(info.param).substr(5, 6); });

// sum_round: the parts in the given order from +0, one rounding; another order
// gives other bits on values spanning more than 24 bits (negative control).
TEST(SumRound, OrderFromZeroThenOneRounding) {
  const std::vector<float> a = {1.0f, -0.0f}, b = {0x1p-24f, -0.0f}, c = {0x1p-24f, -0.0f};
  const float* in_order[3] = {a.data(), b.data(), c.data()};
  const float* reversed[3] = {c.data(), b.data(), a.data()};
  std::vector<bf16> x(2), y(2);
  ref::sum_round(in_order, 3, x.data(), 2);
  ref::sum_round(reversed, 3, y.data(), 2);
  EXPECT_EQ(x[0].bits, round_bf16((0.0f + 1.0f) + 0x1p-24f + 0x1p-24f).bits);
  EXPECT_EQ(x[1].bits, 0x0000) << "sums start at +0, so -0 parts give +0";
  const float* f32_order[3] = {a.data(), b.data(), c.data()};
  float acc_fwd = 0.0f, acc_rev = 0.0f;
  for (const float* p : f32_order) acc_fwd += p[0];
  for (const float* p : reversed) acc_rev += p[0];
  EXPECT_NE(bits_of(acc_fwd), bits_of(acc_rev)) << "the fp32 order matters before the rounding";
}

}  // namespace
}  // namespace bp
