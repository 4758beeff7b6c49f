// `bitparity selfcheck` (also bitparity with no subcommand): the numerics core
// checked against what it promises, in seconds, from the installed binary alone.
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "harness/cli/common.h"
#include "harness/exit_codes.h"
#include "reference/contract/contract.h"
#include "reference/numerics/dot.h"
#include "reference/numerics/math.h"
#include "reference/numerics/sm90_vectors.h"
#include "reference/truth/math.h"

namespace bp::harness {

namespace {

struct CheckResult {
  std::string name;
  bool passed;
  std::string detail;  // one line: what was checked and what was found
};

CheckResult check_sm90_vectors() {
  int bad = 0, n = 0;
  std::ostringstream why;
  for (const Sm90Vector& v : sm90_targeted_vectors()) {
    const std::vector<bf16> a = to_bf16_exact(v.a), b = to_bf16_exact(v.b);
    const uint32_t got = bits_of(Sm90Tc::group(v.c, a.data(), 1, b.data(), 1, 16));
    ++n;
    if (got != v.expect) {
      ++bad;
      why << " [" << v.what << ": got 0x" << std::hex << got << std::dec << "]";
    }
  }
  return {"sm90-tc targeted vectors", bad == 0, std::to_string(n - bad) + "/" + std::to_string(n) + " match" + why.str()};
}

CheckResult check_bf16_rounding() {
  // Ties to even, overflow to Inf, subnormals, canonical NaN.
  struct Case { uint32_t in; uint16_t out; } cases[] = {
      {0x3f808000u, 0x3f80}, {0x3f818000u, 0x3f82}, {0x7f7fffffu, 0x7f80},
      {0x00018000u, 0x0002}, {0x7fc12345u, kCanonicalNanBf16}, {0x80000000u, 0x8000}};
  int bad = 0;
  for (const Case& c : cases) bad += round_bf16(float_of(c.in)).bits != c.out;
  return {"bf16 round-to-nearest-even", bad == 0, std::to_string(6 - bad) + "/6 edge cases"};
}

CheckResult check_fma_seq() {
  // fma-seq keeps the product exact before each add: 1 + 2^-24·(1+2^-7)... one rounding per step.
  const std::vector<bf16> a = to_bf16_exact({1.0f, 0x1p-24f, 0x1p-24f}), b = to_bf16_exact({1.0f, 1.0f, 1.0f});
  const float got = FmaSeq::chain(0.0f, a.data(), 1, b.data(), 1, 3);
  const float expect = (1.0f + 0x1p-24f) + 0x1p-24f;  // ties to even at each step: stays 1
  return {"fma-seq chain order", bits_of(got) == bits_of(expect), "sequential rounding at every step"};
}

CheckResult check_contracts() {
  std::ostringstream out;
  bool ok = true;
  for (const Contract& c : contracts()) {
    const std::string err = validate(c.knobs);
    ok = ok && err.empty();
    out << c.name << "=" << c.knob_hash() << (err.empty() ? "" : " (" + err + ")") << " ";
  }
  return {"contracts", ok, out.str()};
}

CheckResult check_math() {
  // SPEC.md §2.2: special values, then every 65521st fp32 input against the float64
  // twins (reference/truth/math.h) within the documented ulp bounds, in truth::ulp_error's
  // measure; NaN must be the canonical NaN exactly where the twin gives NaN.
  struct Fn {
    const char* name;
    float (*f)(float);
    double (*ref)(double);
    double bound;
  };
  const Fn fns[] = {
      {"exp", math::exp, truth::exp, math::kMaxUlpExp},
      {"exp2", math::exp2, truth::exp2, math::kMaxUlpExp2},
      {"exp2_poly", math::exp2_poly, truth::exp2_flushed, math::kMaxUlpExp2Poly},
      {"log", math::log, truth::log, math::kMaxUlpLog},
      {"rsqrt", math::rsqrt, truth::rsqrt, math::kMaxUlpRsqrt},
      {"sigmoid", math::sigmoid, truth::sigmoid, math::kMaxUlpSigmoid},
      {"silu", math::silu, truth::silu, math::kMaxUlpSilu},
      {"sin", math::sin, truth::sin, math::kMaxUlpSinCos},
      {"cos", math::cos, truth::cos, math::kMaxUlpSinCos}};
  struct Case { float (*f)(float); uint32_t in, out; } cases[] = {
      {math::exp, 0xff800000u, 0x00000000u}, {math::exp, 0x42b17218u, 0x7f800000u}, {math::exp, 0xc2cff1b4u, 0x00000001u},
      {math::exp2, 0xc3160000u, 0x00000000u}, {math::log, 0x80000000u, 0xff800000u}, {math::log, 0x3f800000u, 0x00000000u},
      {math::log, 0xbf800000u, kCanonicalNanF32}, {math::rsqrt, 0x80000000u, 0xff800000u}, {math::rsqrt, 0x00000001u, 0x64b504f3u},
      {math::sigmoid, 0xc2c80000u, 0x0000001bu}, {math::silu, 0xff800000u, 0x80000000u}, {math::silu, 0xc2c80000u, 0x80000a5fu},
      {math::sin, 0x80000000u, 0x80000000u}, {math::sin, 0x40490fdbu, 0xb3bbbd2eu}, {math::cos, 0x7f800000u, kCanonicalNanF32},
      {math::cos, 0x3fc90fdbu, 0xb33bbd2eu}, {math::sin, 0xffc01234u, kCanonicalNanF32},
      {math::exp2_poly, 0xbf800000u, 0x3f000000u}, {math::exp2_poly, 0xc2fa0001u, 0x00000000u},
      {math::exp2_poly, 0x43000000u, 0x7f800000u}};
  int bad_special = 0;
  for (const Case& c : cases) bad_special += bits_of(c.f(float_of(c.in))) != c.out;
  std::ostringstream out;
  bool ok = bad_special == 0;
  uint64_t sampled = 0;
  for (const Fn& fn : fns) {
    double worst = 0;
    uint32_t worst_at = 0;
    int bad_nan = 0;
    for (uint64_t v = 0; v < (uint64_t{1} << 32); v += 65521) {
      const float x = float_of(static_cast<uint32_t>(v)), y = fn.f(x);
      const double t = fn.ref(x);
      ++sampled;
      if (std::isnan(t) || std::isnan(y)) {
        bad_nan += !(std::isnan(t) && bits_of(y) == kCanonicalNanF32);
        continue;
      }
      const double e = truth::ulp_error(y, t);
      if (e > worst) {
        worst = e;
        worst_at = static_cast<uint32_t>(v);
      }
    }
    if (worst > fn.bound || bad_nan) {
      ok = false;
      out << fn.name << ": " << worst << " ulp at 0x" << std::hex << worst_at << std::dec << " (bound " << fn.bound
          << "), " << bad_nan << " NaN mismatches; ";
    }
  }
  out << (sizeof cases / sizeof cases[0]) - bad_special << "/" << (sizeof cases / sizeof cases[0])
      << " special values, " << sampled << " sampled inputs within the SPEC §2.2 ulp bounds";
  return {"elementary functions", ok, out.str()};
}

int selfcheck() {
  int failed = 0;
  for (const CheckResult& r :
       {check_bf16_rounding(), check_sm90_vectors(), check_fma_seq(), check_math(), check_contracts()}) {
    std::printf("%-4s %-32s %s\n", r.passed ? "ok" : "FAIL", r.name.c_str(), r.detail.c_str());
    failed += !r.passed;
  }
  std::printf("%s\n", failed ? "selfcheck: FAILED" : "selfcheck: all exact");
  return failed ? kExitMismatch : kExitExact;
}

}  // namespace

Subcommand add_selfcheck_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("selfcheck", "check the numerics core (bf16, dot models, math, contracts)");
  return {sub, selfcheck};
}

}  // namespace bp::harness
