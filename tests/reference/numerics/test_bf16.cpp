// fp32 -> bf16 round-to-nearest-even against an independent implementation that
// picks the nearer of the two neighbouring bf16 values by exact comparison.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cmath>

#include "reference/numerics/bf16.h"

namespace bp {
namespace {

// Independent: truncate to get the lower neighbour, step one bf16 ulp for the
// upper one, compare the exact distances in double; ties go to the even one.
uint16_t independent_rne(float x) {
  if (std::isnan(x)) return kCanonicalNanBf16;
  const uint32_t u = bits_of(x);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  if ((u & 0xffffu) == 0) return lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // next magnitude (may reach Inf)
  const double dx = x;
  const double dlo = widen(bf16{lo});
  double dhi;
  if ((hi & 0x7fffu) == 0x7f80u) {
    dhi = std::ldexp(std::copysign(1.0, dx), 128);  // where the next bf16 would be past max
  } else {
    dhi = widen(bf16{hi});
  }
  const double elo = std::fabs(dx - dlo), ehi = std::fabs(dhi - dx);
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo & 1u) ? hi : lo;
}

uint64_t count_mismatches(uint64_t begin, uint64_t end, uint64_t step) {
  std::atomic<uint64_t> bad{0};
#pragma omp parallel for schedule(static)
  for (int64_t i = static_cast<int64_t>(begin); i < static_cast<int64_t>(end); i += static_cast<int64_t>(step)) {
    const float x = float_of(static_cast<uint32_t>(i));
    if (round_bf16(x).bits != independent_rne(x)) bad.fetch_add(1, std::memory_order_relaxed);
  }
  return bad.load();
}

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(round_bf16(0.0f).bits, 0x0000);
  EXPECT_EQ(round_bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(round_bf16(INFINITY).bits, 0x7f80);
  EXPECT_EQ(round_bf16(-INFINITY).bits, 0xff80);
  EXPECT_EQ(round_bf16(float_of(0x7fc00001u)).bits, kCanonicalNanBf16);
  EXPECT_EQ(round_bf16(float_of(0xffffffffu)).bits, kCanonicalNanBf16);
  EXPECT_EQ(round_bf16(float_of(0x7f800001u)).bits, kCanonicalNanBf16);  // signalling NaN
  EXPECT_EQ(round_bf16(float_of(0x7f7fffffu)).bits, 0x7f80);             // FLT_MAX rounds up to Inf
  EXPECT_EQ(round_bf16(float_of(0x7f7f7fffu)).bits, 0x7f7f);             // just below the tie
  EXPECT_EQ(round_bf16(float_of(0x3f808000u)).bits, 0x3f80);             // tie to even (down)
  EXPECT_EQ(round_bf16(float_of(0x3f818000u)).bits, 0x3f82);             // tie to even (up)
  EXPECT_EQ(round_bf16(float_of(0x00008000u)).bits, 0x0000);             // subnormal tie to even
  EXPECT_EQ(round_bf16(float_of(0x00018000u)).bits, 0x0002);
  EXPECT_EQ(round_bf16(float_of(0x007fffffu)).bits, 0x0080);             // largest subnormal -> min normal
}

TEST(Bf16, WidenIsExact) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const bf16 x{static_cast<uint16_t>(b)};
    if (is_nan(x)) continue;
    EXPECT_EQ(round_bf16(widen(x)).bits, b);
    EXPECT_EQ(bits_of(widen(x)), b << 16);
  }
}

TEST(Bf16, SampledAgainstIndependent) {
  // Every 4099th input plus every input around each bf16 boundary of 2^16 windows.
  EXPECT_EQ(count_mismatches(0, 1ull << 32, 4099), 0u);
  for (uint64_t hi : {0x0000ull, 0x3f80ull, 0x7f7full, 0x8000ull, 0xbf80ull, 0xff7full, 0x0080ull})
    EXPECT_EQ(count_mismatches(hi << 16, (hi + 2) << 16, 1), 0u) << "window " << hi;
}

TEST(Bf16, SlowExhaustiveAgainstIndependent) { EXPECT_EQ(count_mismatches(0, 1ull << 32, 1), 0u); }

// Negative control: a round-half-up conversion must be caught by the same check.
TEST(Bf16, NegativeControlHalfUpDiffers) {
  const float tie = float_of(0x3f808000u);
  const uint16_t half_up = static_cast<uint16_t>((bits_of(tie) + 0x8000u) >> 16);
  EXPECT_NE(half_up, independent_rne(tie));
}

}  // namespace
}  // namespace bp
