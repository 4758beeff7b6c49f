// Float64 twins of the elementary functions (reference/numerics/math.h) and how
// their error is measured (SPEC.md §2.2): shared by tests/reference/numerics/test_math.cpp and
// tools/ulp_scan.cpp so that both measure the same thing.
#pragma once
#include <algorithm>
#include <cmath>

#include "reference/numerics/fp.h"
#include "reference/truth/ulp.h"

namespace bp::truth {

inline double exp(double x) { return std::exp(x); }
inline double exp2(double x) { return std::exp2(x); }
inline double log(double x) { return std::log(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x == -INFINITY ? -0.0 : x / (1.0 + std::exp(-x)); }
inline double sin(double x) { return std::sin(x); }
inline double cos(double x) { return std::cos(x); }
// exp2_poly's true value: 2^x where it does not flush (x ≥ −125) or saturate (x ≥ 128).
inline double exp2_flushed(double x) {
  if (std::isnan(x)) return x;
  if (x >= 128.0) return INFINITY;
  return x < -125.0 ? 0.0 : std::exp2(x);
}

// Error of y against the true value t in ulps of t (ulp_of(t, 23), its exponent at
// most fp32's 127); neither is NaN. An infinite y counts as 2^128 unless t rounds to
// that infinity.
inline double ulp_error(float y, double t) {
  if (std::isinf(t)) return y == static_cast<float>(t) ? 0.0 : INFINITY;
  double ay = y;
  if (std::isinf(y)) {
    if (static_cast<float>(t) == y) return 0.0;
    ay = std::copysign(0x1p128, ay);
  }
  return std::fabs(ay - t) / ulp_of(std::min(std::fabs(t), 0x1p127), 23);
}

// NaN where the reference has none (or the reverse), a non-canonical NaN, an
// exact infinity or zero of the reference missed, a zero of the wrong sign.
inline bool special_mismatch(float y, double t) {
  const bool yn = std::isnan(y), tn = std::isnan(t);
  if (yn != tn) return true;
  if (yn) return bits_of(y) != kCanonicalNanF32;
  if (std::isinf(t) && static_cast<double>(y) != t) return true;
  if (t == 0.0 && !(y == 0.0f && std::signbit(y) == std::signbit(t))) return true;
  if (y == 0.0f && std::signbit(y) != std::signbit(t)) return true;
  return false;
}

}  // namespace bp::truth
