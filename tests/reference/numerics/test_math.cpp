// reference/numerics/math.h against double-precision glibc (SPEC.md §2.2):
// special values, the documented ulp bounds on dense samples (every input in a
// few hot windows plus a strided sample of all 2^32) and, in the Slow* tests,
// over all 2^32 inputs; monotonicity of exp, exp2, log, sigmoid and rsqrt; and
// negative controls showing that each check can fail.
//
// Error of y against the true value t (double precision): |y - t| / ulp(t) with
// ulp(t) = 2^(floor(log2|t|) - 23) for |t| >= 2^-126 and 2^-149 below; an
// infinite y where t is finite but rounds to that infinity counts as exact, and
// otherwise as ±2^128.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/numerics/math.h"
#include "reference/truth/math.h"

namespace bp {
namespace {

using Fn = float (*)(float);
using Ref = double (*)(double);


struct MathFn {
  const char* name;
  Fn f;
  Ref ref;
  double bound;            // documented maximum over all 2^32 inputs (ulps)
  int mono;                // +1 non-decreasing, -1 non-increasing where not NaN, 0 none
  std::vector<uint32_t> hot;  // centres of dense windows (bit patterns)
};

const std::vector<MathFn>& functions() {
  static const std::vector<MathFn> fns = {
      {"exp", math::exp, truth::exp, math::kMaxUlpExp, 1,
       {0x3eb17218u, 0xbeb17218u, 0x42b17218u, 0xc2aeac50u, 0xc2cff1b5u, 0x41200000u}},
      {"exp2", math::exp2, truth::exp2, math::kMaxUlpExp2, 1,
       {0x3f000000u, 0xbf000000u, 0x43000000u, 0xc2fc0000u, 0xc3150000u, 0xc3160000u}},
      {"exp2_poly", math::exp2_poly, truth::exp2_flushed, math::kMaxUlpExp2Poly, 1,
       {0x3f000000u, 0xbf000000u, 0x43000000u, 0xc2fa0000u, 0x00000000u, 0xba4de201u}},
      {"log", math::log, truth::log, math::kMaxUlpLog, 1,
       {0x3f3504f3u, 0x3fb504f3u, 0x00800000u, 0x7f7e0000u, 0x402df854u, 0x3e800000u}},
      {"rsqrt", math::rsqrt, truth::rsqrt, math::kMaxUlpRsqrt, -1,
       {0x00800000u, 0x7f7e0000u, 0x40800000u, 0x3f000000u, 0x358637bdu, 0x00400000u}},
      {"sigmoid", math::sigmoid, truth::sigmoid, math::kMaxUlpSigmoid, 1,
       {0xc2aeac50u, 0xc2cff1b5u, 0x41880000u, 0xc1880000u, 0x3eb17218u, 0xbeb17218u}},
      {"silu", math::silu, truth::silu, math::kMaxUlpSilu, 0,
       {0xc2aeac50u, 0xc2cff1b5u, 0xc2d90000u, 0xc0000000u, 0xbeb17218u, 0x3eb17218u}},
      {"sin", math::sin, truth::sin, math::kMaxUlpSinCos, 0,
       {0x3f490fdbu, 0x3fc90fdbu, 0x40490fdbu, 0x47c35000u, 0x46000000u, 0x7f7e0000u}},
      {"cos", math::cos, truth::cos, math::kMaxUlpSinCos, 0,
       {0x3f490fdbu, 0x3fc90fdbu, 0x40490fdbu, 0x47c35000u, 0x46000000u, 0x7f7e0000u}},
  };
  return fns;
}


struct Stats {
  double max_err = 0;
  uint32_t arg = 0;
  uint64_t special = 0, mono_bad = 0, evaluated = 0;
  uint32_t first_special = 0, first_mono = 0;
};

// One chunk: inputs lo, lo + stride, ... < hi. With stride 1 adjacent inputs are
// also checked for order (mono != 0).
Stats scan_chunk(Fn f, Ref ref, int mono, uint64_t lo, uint64_t hi, uint64_t stride) {
  Stats s;
  bool have_prev = false;
  float prev = 0;
  for (uint64_t v = lo; v < hi; v += stride) {
    const uint32_t u = static_cast<uint32_t>(v);
    const float x = float_of(u);
    const float y = f(x);
    const double t = ref(static_cast<double>(x));
    ++s.evaluated;
    if (truth::special_mismatch(y, t) && s.special++ == 0) s.first_special = u;
    if (!std::isnan(y) && !std::isnan(t)) {
      const double e = truth::ulp_error(y, t);
      if (e > s.max_err) {
        s.max_err = e;
        s.arg = u;
      }
    }
    if (mono != 0 && stride == 1) {
      const bool pair = u != 0 && u != 0x80000000u && !std::isnan(x) && !std::isnan(float_of(u - 1));
      if (pair && !have_prev) prev = f(float_of(u - 1));
      if (pair && !std::isnan(prev) && !std::isnan(y)) {
        const bool up = (u & 0x80000000u) == 0;  // x(u) > x(u - 1)
        const float a = up ? prev : y, b = up ? y : prev;
        if ((mono > 0 ? b < a : b > a) && s.mono_bad++ == 0) s.first_mono = u;
      }
      prev = y;
      have_prev = true;
    }
  }
  return s;
}

// [lo, hi) with the given stride, cut into independent chunks run in parallel;
// the per-chunk results are combined afterwards in chunk order.
Stats scan(Fn f, Ref ref, int mono, uint64_t lo, uint64_t hi, uint64_t stride) {
  const uint64_t kChunk = uint64_t{1} << 16;
  const uint64_t span = hi - lo, n = (span + kChunk - 1) / kChunk;
  std::vector<Stats> part(n);
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t c = 0; c < static_cast<int64_t>(n); ++c) {
    const uint64_t clo = lo + static_cast<uint64_t>(c) * kChunk, chi = std::min(hi, clo + kChunk);
    const uint64_t first = clo + (stride - (clo - lo) % stride) % stride;
    part[static_cast<size_t>(c)] = scan_chunk(f, ref, mono, first, chi, stride);
  }
  Stats all;
  for (const Stats& s : part) {
    if (s.max_err > all.max_err) {
      all.max_err = s.max_err;
      all.arg = s.arg;
    }
    if (s.special && !all.special) all.first_special = s.first_special;
    if (s.mono_bad && !all.mono_bad) all.first_mono = s.first_mono;
    all.special += s.special;
    all.mono_bad += s.mono_bad;
    all.evaluated += s.evaluated;
  }
  return all;
}

void merge(Stats& into, const Stats& s) {
  if (s.max_err > into.max_err) {
    into.max_err = s.max_err;
    into.arg = s.arg;
  }
  if (s.special && !into.special) into.first_special = s.first_special;
  if (s.mono_bad && !into.mono_bad) into.first_mono = s.first_mono;
  into.special += s.special;
  into.mono_bad += s.mono_bad;
  into.evaluated += s.evaluated;
}

// The sampled check: every 4099th input of all 2^32, every input in 2^17-wide
// windows around 0, -0, ±1 and the function's hot spots (~2.4M evaluations).
Stats sampled(Fn f, Ref ref, int mono, const std::vector<uint32_t>& hot) {
  Stats all = scan(f, ref, 0, 0, uint64_t{1} << 32, 4099);
  std::vector<uint32_t> centres = {0x00010000u, 0x80010000u, 0x3f800000u, 0xbf800000u};
  centres.insert(centres.end(), hot.begin(), hot.end());
  for (uint32_t c : centres) merge(all, scan(f, ref, mono, uint64_t{c} - 0x10000u, uint64_t{c} + 0x10000u, 1));
  return all;
}

std::string hex(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", u);
  return b;
}

void expect_within_bound(const MathFn& fn, const Stats& s) {
  EXPECT_LE(s.max_err, fn.bound) << fn.name << ": worst input " << hex(s.arg) << " = " << float_of(s.arg);
  EXPECT_EQ(s.special, 0u) << fn.name << ": first special-value mismatch at " << hex(s.first_special);
  EXPECT_EQ(s.mono_bad, 0u) << fn.name << ": first order violation at " << hex(s.first_mono);
  ::testing::Test::RecordProperty(std::string(fn.name) + "_max_ulp", std::to_string(s.max_err));
}

// --- special values --------------------------------------------------------

struct Case {
  Fn f;
  uint32_t in, out;
};

TEST(Math, SpecialValues) {
  constexpr uint32_t kNan = kCanonicalNanF32, kInf = 0x7f800000u, kNegInf = 0xff800000u, kOne = 0x3f800000u;
  const Case cases[] = {
      // exp
      {math::exp, 0x7f800000u, kInf}, {math::exp, 0xff800000u, 0x00000000u}, {math::exp, 0x00000000u, kOne},
      {math::exp, 0x80000000u, kOne}, {math::exp, 0x00000001u, kOne}, {math::exp, 0x80000001u, kOne},
      {math::exp, 0x42b17217u, 0x7f7fff84u},   // largest finite result
      {math::exp, 0x42b17218u, kInf},          // smallest input that overflows
      {math::exp, 0xc2cff1b4u, 0x00000001u},   // smallest subnormal result
      {math::exp, 0xc2cff1b5u, 0x00000000u},   // underflows to +0
      {math::exp, 0x3f800000u, 0x402df854u},   // e
      // exp2
      {math::exp2, 0x7f800000u, kInf}, {math::exp2, 0xff800000u, 0x00000000u}, {math::exp2, 0x80000000u, kOne},
      {math::exp2, 0x43000000u, kInf}, {math::exp2, 0x42fe0000u, 0x7f000000u}, {math::exp2, 0xc2fc0000u, 0x00800000u},
      {math::exp2, 0xc3150000u, 0x00000001u}, {math::exp2, 0xc3160000u, 0x00000000u},  // 2^-149, 2^-150 ties to 0
      {math::exp2, 0xc315ffffu, 0x00000001u}, {math::exp2, 0x3f000000u, 0x3fb504f3u},  // 2^-149.99.., sqrt(2)
      // exp2_poly: integers give exact powers of two (odd ones through p(1) = 2), the
      // flush below -125 and the saturation from 128
      {math::exp2_poly, 0x00000000u, kOne}, {math::exp2_poly, 0x80000000u, kOne},
      {math::exp2_poly, 0x7f800000u, kInf}, {math::exp2_poly, 0xff800000u, 0x00000000u},
      {math::exp2_poly, 0x3f800000u, 0x40000000u}, {math::exp2_poly, 0xbf800000u, 0x3f000000u},  // 2, 1/2
      {math::exp2_poly, 0x42fe0000u, 0x7f000000u}, {math::exp2_poly, 0x42fc0000u, 0x7e800000u},  // 2^127, 2^126
      {math::exp2_poly, 0x43000000u, kInf}, {math::exp2_poly, 0x42ffffffu, 0x7f7fffa7u},       // 128, 128 - ulp
      {math::exp2_poly, 0xc2fa0000u, 0x01000000u}, {math::exp2_poly, 0xc2fa0001u, 0x00000000u},  // -125, below
      {math::exp2_poly, 0xc2f80000u, 0x01800000u}, {math::exp2_poly, 0x7f7fffffu, kInf},
      {math::exp2_poly, 0xff7fffffu, 0x00000000u}, {math::exp2_poly, 0x00000001u, kOne},
      // log
      {math::log, 0x00000000u, kNegInf}, {math::log, 0x80000000u, kNegInf}, {math::log, 0x3f800000u, 0x00000000u},
      {math::log, 0x7f800000u, kInf}, {math::log, 0xff800000u, kNan}, {math::log, 0xbf800000u, kNan},
      {math::log, 0x80000001u, kNan}, {math::log, 0x40000000u, 0x3f317218u}, {math::log, 0x3f000000u, 0xbf317218u},
      {math::log, 0x00000001u, 0xc2ce8ed0u},  // log(2^-149)
      {math::log, 0x7f7fffffu, 0x42b17218u},  // log(FLT_MAX)
      // rsqrt
      {math::rsqrt, 0x00000000u, kInf}, {math::rsqrt, 0x80000000u, kNegInf}, {math::rsqrt, 0x7f800000u, 0x00000000u},
      {math::rsqrt, 0xff800000u, kNan}, {math::rsqrt, 0xbf800000u, kNan}, {math::rsqrt, 0x80000001u, kNan},
      {math::rsqrt, 0x40800000u, 0x3f000000u}, {math::rsqrt, 0x3e800000u, 0x40000000u}, {math::rsqrt, kOne, kOne},
      {math::rsqrt, 0x00000001u, 0x64b504f3u},  // 2^74.5
      {math::rsqrt, 0x7f7fffffu, 0x1f800000u},  // FLT_MAX^-1/2 rounds to 2^-64
      // sigmoid
      {math::sigmoid, 0x00000000u, 0x3f000000u}, {math::sigmoid, 0x80000000u, 0x3f000000u},
      {math::sigmoid, 0x7f800000u, kOne}, {math::sigmoid, 0xff800000u, 0x00000000u},
      {math::sigmoid, 0x42c80000u, kOne}, {math::sigmoid, 0xc2c80000u, 0x0000001bu},  // sigmoid(-100): subnormal
      {math::sigmoid, 0xc2d90000u, 0x00000000u}, {math::sigmoid, 0x7f7fffffu, kOne}, {math::sigmoid, 0xff7fffffu, 0u},
      // silu
      {math::silu, 0x00000000u, 0x00000000u}, {math::silu, 0x80000000u, 0x80000000u},
      {math::silu, 0x7f800000u, kInf}, {math::silu, 0xff800000u, 0x80000000u},
      {math::silu, 0x7f7fffffu, 0x7f7fffffu}, {math::silu, 0xff7fffffu, 0x80000000u},
      {math::silu, 0xc2c80000u, 0x80000a5fu},  // silu(-100): subnormal
      {math::silu, 0x00000003u, 0x00000002u},  // 1.5·2^-149 (1 + tiny) rounds up
      {math::silu, 0xc2da0000u, 0x80000000u},  // -109: below half the smallest subnormal
      // sin, cos
      {math::sin, 0x00000000u, 0x00000000u}, {math::sin, 0x80000000u, 0x80000000u},
      {math::sin, 0x00000001u, 0x00000001u}, {math::sin, 0x80000001u, 0x80000001u},
      {math::sin, 0x7f800000u, kNan}, {math::sin, 0xff800000u, kNan},
      {math::sin, 0x40490fdbu, 0xb3bbbd2eu},  // sin(fp32 pi) = -8.74e-8
      {math::sin, 0x3fc90fdbu, kOne},
      {math::cos, 0x00000000u, kOne}, {math::cos, 0x80000000u, kOne}, {math::cos, 0x00000001u, kOne},
      {math::cos, 0x7f800000u, kNan}, {math::cos, 0xff800000u, kNan},
      {math::cos, 0x3fc90fdbu, 0xb33bbd2eu},  // cos(fp32 pi/2) = -4.37e-8
      {math::cos, 0x40490fdbu, 0xbf800000u},
  };
  for (const Case& c : cases) {
    const float y = c.f(float_of(c.in));
    EXPECT_EQ(bits_of(y), c.out) << "input " << hex(c.in) << " gave " << hex(bits_of(y));
  }
  // Every NaN input gives the canonical NaN, whatever its sign and payload.
  for (const MathFn& fn : functions())
    for (uint32_t nan : {0x7fc00000u, 0x7fc00001u, 0x7f800001u, 0x7fffffffu, 0xffc00000u, 0xffffffffu, 0xff800001u})
      EXPECT_EQ(bits_of(fn.f(float_of(nan))), kCanonicalNanF32) << fn.name << " of " << hex(nan);
}

// Overflow and underflow neighbourhoods: every input in ±2^12 ulps of each
// threshold gives exactly the double result rounded to fp32.
TEST(Math, ThresholdsRoundCorrectly) {
  struct T {
    Fn f;
    Ref ref;
    uint32_t centre;
  } thresholds[] = {{math::exp, truth::exp, 0x42b17218u},      {math::exp, truth::exp, 0xc2aeac50u},
                    {math::exp, truth::exp, 0xc2cff1b5u},      {math::exp2, truth::exp2, 0x43000000u},
                    {math::exp2, truth::exp2, 0xc2fc0000u},    {math::exp2, truth::exp2, 0xc3160000u},
                    {math::log, truth::log, 0x00000001u},      {math::log, truth::log, 0x7f7fefffu},
                    {math::sigmoid, truth::sigmoid, 0xc2cff1b5u}, {math::silu, truth::silu, 0xc2d90000u},
                    {math::rsqrt, truth::rsqrt, 0x00001000u},  {math::rsqrt, truth::rsqrt, 0x7f7fefffu}};
  for (const T& t : thresholds) {
    int bad = 0;
    for (uint32_t u = t.centre - 4096; u != t.centre + 4096; ++u) {
      const float x = float_of(u);
      bad += canonical_bits(t.f(x)) != canonical_bits(static_cast<float>(t.ref(x)));
    }
    EXPECT_EQ(bad, 0) << "around " << hex(t.centre);
  }
}

// --- accuracy --------------------------------------------------------------

TEST(Math, SampledWithinDocumentedBounds) {
  for (const MathFn& fn : functions()) expect_within_bound(fn, sampled(fn.f, fn.ref, fn.mono, fn.hot));
}

// sin and cos over the RoPE range |x| <= 2^17: every 2053rd input.
TEST(Math, RopeRangeWithinBound) {
  for (Fn f : {math::sin, math::cos}) {
    const Ref ref = f == math::sin ? truth::sin : truth::cos;
    Stats all = scan(f, ref, 0, 0, 0x48000001u, 2053);           // +0 .. 2^17
    merge(all, scan(f, ref, 0, 0x80000000u, 0xc8000001u, 2053));  // -0 .. -2^17
    EXPECT_LE(all.max_err, math::kMaxUlpSinCosRope) << hex(all.arg);
    EXPECT_EQ(all.special, 0u) << hex(all.first_special);
  }
}

// --- negative controls: the checks above can fail --------------------------

// exp with its result moved one ulp up: the bound check catches it, and the bits differ.
float exp_one_ulp_up(float x) {
  const float y = math::exp(x);
  return (std::isnan(y) || std::isinf(y) || y == 0.0f) ? y : float_of(bits_of(y) + 1);
}
TEST(Math, NegativeControlOneUlpWorseExpIsCaught) {
  const Stats s = sampled(exp_one_ulp_up, truth::exp, 0, {});
  EXPECT_GT(s.max_err, math::kMaxUlpExp);
  EXPECT_NE(bits_of(exp_one_ulp_up(0.5f)), bits_of(math::exp(0.5f)));
}

// exp through exp2(x·log2e): the rounding of x·log2e costs up to ~|x|·2^-24
// relatively, far outside the bound.
float exp_via_exp2(float x) { return math::exp2(mul_rn(x, 0x1.715476p+0f)); }
TEST(Math, NegativeControlPerturbedReductionIsCaught) {
  EXPECT_GT(sampled(exp_via_exp2, truth::exp, 0, {}).max_err, math::kMaxUlpExp);
}

// The textbook rsqrt 1/sqrt(x) (two roundings) exceeds rsqrt's bound.
float rsqrt_naive(float x) { return div_rn(1.0f, sqrt_rn(x)); }
TEST(Math, NegativeControlNaiveRsqrtIsCaught) {
  const Stats s = sampled(rsqrt_naive, truth::rsqrt, 0, {});
  EXPECT_GT(s.max_err, math::kMaxUlpRsqrt);
}

// The textbook sigmoid 1/(1 + exp(-x)) loses the subnormal results of very
// negative x (exp(-x) overflows): caught by the bound and the special-value check.
float sigmoid_naive(float x) { return div_rn(1.0f, add_rn(1.0f, math::exp(-x))); }
TEST(Math, NegativeControlNaiveSigmoidIsCaught) {
  const Stats s = sampled(sigmoid_naive, truth::sigmoid, 0, {0xc2c80000u});
  EXPECT_GT(s.max_err, math::kMaxUlpSigmoid);
}

// A result that steps down every other input is caught by the order check (on
// inputs near 2^-11, where exp changes by far less than an ulp per input step).
float exp_not_monotonic(float x) {
  const float y = math::exp(x);
  return (bits_of(x) & 1u) && y > 0.0f && !std::isinf(y) ? float_of(bits_of(y) - 1) : y;
}
TEST(Math, NegativeControlOrderCheckCatchesNonMonotonic) {
  EXPECT_GT(scan(exp_not_monotonic, truth::exp, 1, 0x3a000000u, 0x3a010000u, 1).mono_bad, 0u);
  EXPECT_EQ(scan(math::exp, truth::exp, 1, 0x3a000000u, 0x3a010000u, 1).mono_bad, 0u);
}

// --- exhaustive (label slow) ----------------------------------------------

void exhaustive(const char* name) {
  for (const MathFn& fn : functions()) {
    if (std::string(fn.name) != name) continue;
    expect_within_bound(fn, scan(fn.f, fn.ref, fn.mono, 0, uint64_t{1} << 32, 1));
    if (fn.f == math::sin || fn.f == math::cos) {
      Stats rope = scan(fn.f, fn.ref, 0, 0, 0x48000001u, 1);
      merge(rope, scan(fn.f, fn.ref, 0, 0x80000000u, 0xc8000001u, 1));
      EXPECT_LE(rope.max_err, math::kMaxUlpSinCosRope) << hex(rope.arg);
    }
  }
}
TEST(Math, SlowExhaustiveExp) { exhaustive("exp"); }
TEST(Math, SlowExhaustiveExp2) { exhaustive("exp2"); }
TEST(Math, SlowExhaustiveExp2Poly) { exhaustive("exp2_poly"); }
TEST(Math, SlowExhaustiveLog) { exhaustive("log"); }
TEST(Math, SlowExhaustiveRsqrt) { exhaustive("rsqrt"); }
TEST(Math, SlowExhaustiveSigmoid) { exhaustive("sigmoid"); }
TEST(Math, SlowExhaustiveSilu) { exhaustive("silu"); }
TEST(Math, SlowExhaustiveSin) { exhaustive("sin"); }
TEST(Math, SlowExhaustiveCos) { exhaustive("cos"); }

}  // namespace
}  // namespace bp
