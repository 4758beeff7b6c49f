// ulp_scan: exhaustive accuracy scan of reference/numerics/math.h over all 2^32
// fp32 inputs against double-precision glibc evaluation (SPEC.md §2.2).
//
//   ulp_scan [--stride N] [function ...]     (default: every function, stride 1)
//
// Per function it prints the maximum error in ulps of the true value (ulp(t) =
// 2^(floor(log2|t|) - 23) for normal t, 2^-149 below), an input attaining it, the
// same over the RoPE range |x| <= 2^17 for sin/cos, the count of results that
// differ from the double result rounded to fp32, special-value mismatches (NaN
// where the reference is not or vice versa, a non-canonical NaN, an exact
// infinity or exact zero of the reference missed, a zero of the wrong sign) and,
// for monotonic functions, the count of adjacent inputs whose results are out
// of order. Work is split into independent chunks (OpenMP); per-chunk results
// are combined afterwards in chunk order.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "reference/numerics/math.h"
#include "reference/truth/math.h"

namespace {

using bp::bits_of;
using bp::float_of;
namespace truth = bp::truth;

struct Fn {
  const char* name;
  float (*f)(float);
  double (*ref)(double);
  int mono;   // +1 non-decreasing, -1 non-increasing (where not NaN), 0 none
  bool rope;  // also report |x| <= 2^17
};


const Fn kFns[] = {
    {"exp", bp::math::exp, truth::exp, 1, false},
    {"exp2", bp::math::exp2, truth::exp2, 1, false},
    {"exp2_poly", bp::math::exp2_poly, truth::exp2_flushed, 1, false},
    {"log", bp::math::log, truth::log, 1, false},
    {"rsqrt", bp::math::rsqrt, truth::rsqrt, -1, false},
    {"sigmoid", bp::math::sigmoid, truth::sigmoid, 1, false},
    {"silu", bp::math::silu, truth::silu, 0, false},
    {"sin", bp::math::sin, truth::sin, 0, true},
    {"cos", bp::math::cos, truth::cos, 0, true},
};


struct Stats {
  double max_err = 0, max_rope = 0;
  uint32_t arg = 0, arg_rope = 0;
  uint64_t special = 0, not_rn = 0, mono_bad = 0, evaluated = 0;
  uint32_t first_special = 0, first_mono = 0;
};

Stats scan_chunk(const Fn& fn, uint64_t lo, uint64_t hi, uint64_t stride) {
  Stats s;
  float prev = 0.0f;
  bool have_prev = false;
  for (uint64_t v = lo; v < hi; v += stride) {
    const uint32_t u = static_cast<uint32_t>(v);
    const float x = float_of(u);
    const float y = fn.f(x);
    const double t = fn.ref(static_cast<double>(x));
    ++s.evaluated;
    if (truth::special_mismatch(y, t)) {
      if (s.special++ == 0) s.first_special = u;
    }
    if (!std::isnan(y) && !std::isnan(t)) {
      const double e = truth::ulp_error(y, t);
      if (e > s.max_err) { s.max_err = e; s.arg = u; }
      if (fn.rope && std::fabs(x) <= 0x1p17f && e > s.max_rope) { s.max_rope = e; s.arg_rope = u; }
      if (y != static_cast<float>(t)) ++s.not_rn;
    }
    if (fn.mono != 0 && stride == 1) {
      // Adjacent inputs u-1, u: ascending values for u <= 0x7f800000, descending
      // for negative bit patterns.
      if (!have_prev && u != 0 && u != 0x80000000u) { prev = fn.f(float_of(u - 1)); have_prev = true; }
      if (have_prev && u != 0 && u != 0x80000000u && !std::isnan(prev) && !std::isnan(y) &&
          !std::isnan(x) && !std::isnan(float_of(u - 1))) {
        const bool up = (u & 0x80000000u) == 0;  // x(u) > x(u-1)
        const float a = up ? prev : y, b = up ? y : prev;  // a: smaller input, b: larger
        const bool bad = fn.mono > 0 ? (b < a) : (b > a);
        if (bad && s.mono_bad++ == 0) s.first_mono = u;
      }
      prev = y;
      have_prev = true;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t stride = 1;
  std::vector<std::string> want;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--stride") && i + 1 < argc) {
      stride = std::strtoull(argv[++i], nullptr, 0);
      if (stride == 0) stride = 1;
    } else {
      want.push_back(argv[i]);
    }
  }
  std::printf("ulp_scan: %s inputs (stride %llu), %d threads; error in ulps of the double-precision value\n",
              stride == 1 ? "all 2^32" : "strided", static_cast<unsigned long long>(stride), omp_get_max_threads());
  std::printf("%-8s %10s %-12s %-16s %10s %-12s %12s %8s %8s %7s\n", "function", "max_ulp", "at_bits", "at_x",
              "rope_max", "rope_at", "not_rn", "special", "mono_bad", "secs");
  int status = 0;
  for (const Fn& fn : kFns) {
    if (!want.empty() && std::find(want.begin(), want.end(), fn.name) == want.end()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t kChunk = 1ull << 20, nchunks = (1ull << 32) / kChunk;
    std::vector<Stats> part(nchunks);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < static_cast<int64_t>(nchunks); ++c) {
      const uint64_t lo = static_cast<uint64_t>(c) * kChunk;
      uint64_t first = lo + (stride - lo % stride) % stride;  // keep the global stride grid
      part[c] = scan_chunk(fn, first, lo + kChunk, stride);
    }
    Stats all;
    for (const Stats& s : part) {  // combined in chunk order: ties go to the lowest bit pattern
      if (s.max_err > all.max_err) { all.max_err = s.max_err; all.arg = s.arg; }
      if (s.max_rope > all.max_rope) { all.max_rope = s.max_rope; all.arg_rope = s.arg_rope; }
      if (s.special && !all.special) all.first_special = s.first_special;
      if (s.mono_bad && !all.mono_bad) all.first_mono = s.first_mono;
      all.special += s.special;
      all.not_rn += s.not_rn;
      all.mono_bad += s.mono_bad;
      all.evaluated += s.evaluated;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char rope[32] = "-", rope_at[32] = "-";
    if (fn.rope) {
      std::snprintf(rope, sizeof rope, "%.4f", all.max_rope);
      std::snprintf(rope_at, sizeof rope_at, "0x%08x", all.arg_rope);
    }
    std::printf("%-8s %10.4f 0x%08x   %-16a %10s %-12s %12llu %8llu %8s %7.1f\n", fn.name, all.max_err, all.arg,
                static_cast<double>(float_of(all.arg)), rope, rope_at, static_cast<unsigned long long>(all.not_rn),
                static_cast<unsigned long long>(all.special),
                fn.mono && stride == 1 ? std::to_string(all.mono_bad).c_str() : "-", secs);
    if (all.special) std::printf("  first special-value mismatch at 0x%08x\n", all.first_special);
    if (all.mono_bad) std::printf("  first monotonicity violation at 0x%08x\n", all.first_mono);
    std::fflush(stdout);
    if (all.special || all.mono_bad) status = 1;
  }
  return status;
}
