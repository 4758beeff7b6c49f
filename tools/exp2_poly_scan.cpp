// exp2_poly_scan: the polynomial of an exp2_poly form over every fp32 f of its split's
// interval (SPEC.md §2.2, bench/DECISIONS.md "exp2 without the −½ FADD").
//
//   exp2_poly_scan [--centered] C1 C2 ... Cn
//
// p(f) = 1 + C1·f + … + Cn·f^n by fp32 Horner in fma (the polynomial of
// math::detail::exp2_poly_of_split), on f ∈ [0, 1] (v2's split, j = ⌊t⌋) or, with
// --centered, f ∈ [−½, ½] (j = t rounded to nearest). It prints the largest error in
// ulps of 2^f, the count of adjacent f whose p are out of order, and the segment
// boundary p(hi) ≤ 2·p(lo) (the result at t = j + hi against t = (j + 1) + lo). The
// scaling by 2^j is exact, so these are exp2's own over [−125, 128]. Inputs with
// |f| < 2^-30 are left out once p is 1 at their ends (±2^-30 and 0: Horner leaves 1).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "reference/numerics/bf16.h"
#include "reference/numerics/math.h"

namespace {

using bp::bits_of;
using bp::float_of;

float horner(const std::vector<float>& c, float f) {
  float p = c.back();
  for (size_t k = c.size() - 1; k-- > 1;) p = bp::fma_rn(p, f, c[k]);
  return bp::fma_rn(p, f, 1.0f);
}

double ulp_of(double t) {
  int e;
  std::frexp(t, &e);
  return std::ldexp(1.0, e - 24);
}

}  // namespace

int main(int argc, char** argv) {
  bool centered = false;
  std::vector<float> c = {1.0f};  // c[0], unused: the constant term is 1
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--centered") {
      centered = true;
      continue;
    }
    char* end = nullptr;
    c.push_back(std::strtof(argv[i], &end));
    if (*end != '\0') {
      std::fprintf(stderr, "exp2_poly_scan: %s is not a coefficient\n", argv[i]);
      return 2;
    }
  }
  if (c.size() < 2) {
    std::fprintf(stderr, "usage: exp2_poly_scan [--centered] C1 C2 ... Cn\n");
    return 2;
  }
  const float lo = centered ? -0.5f : 0.0f, hi = centered ? 0.5f : 1.0f, tiny = 0x1p-30f;
  double worst = 0;
  float worst_at = 0, prev = -1, first_bad = 0;
  uint64_t evaluated = 0, out_of_order = 0;
  auto visit = [&](float f) {
    const float p = horner(c, f);
    const double t = std::exp2(static_cast<double>(f));
    const double e = std::fabs(p - t) / ulp_of(t);
    if (e > worst) worst = e, worst_at = f;
    if (p < prev && out_of_order++ == 0) first_bad = f;
    prev = p;
    ++evaluated;
  };
  // Increasing f: the negative floats from lo up to −2^-30 (bit patterns down), then
  // +2^-30 up to hi.
  if (centered)
    for (uint32_t b = bits_of(lo); b >= bits_of(-tiny); --b) visit(float_of(b));
  const bool ones = horner(c, tiny) == 1.0f && horner(c, centered ? -tiny : 0.0f) == 1.0f;
  for (uint32_t b = bits_of(tiny); b <= bits_of(hi); ++b) visit(float_of(b));
  const float p_lo = horner(c, lo), p_hi = horner(c, hi);
  char first[64] = "";
  if (out_of_order) std::snprintf(first, sizeof first, " (the first at f = %a)", first_bad);
  std::printf("f in [%g, %g]: %llu evaluated; max %.4f ulp at %a; %llu adjacent pairs out of order%s\n", lo, hi,
              static_cast<unsigned long long>(evaluated), worst, worst_at,
              static_cast<unsigned long long>(out_of_order), first);
  std::printf("p(%g) = %a, p(%g) = %a: boundary p(hi) <= 2 p(lo) %s; p = 1 at +-2^-30: %s\n", lo, p_lo, hi, p_hi,
              p_hi <= 2 * p_lo ? "holds" : "BROKEN", ones ? "yes" : "NO");
  return 0;
}
