// The unit in the last place that float64 truths are measured in (truth::ulp_error,
// nearest_bf16, the harness's errors against the truth).
#pragma once
#include <algorithm>
#include <cmath>

namespace bp::truth {

// The ulp at t of a binary float with `mantissa_bits` stored fraction bits (fp32 23,
// bf16 7) and fp32's exponent range: 2^(floor(log2|t|) − mantissa_bits), the
// subnormals' spacing 2^(−126 − mantissa_bits) below 2^-126.
inline double ulp_of(double t, int mantissa_bits) {
  return std::ldexp(1.0, std::max(std::ilogb(t == 0 ? 0x1p-126 : t), -126) - mantissa_bits);
}

}  // namespace bp::truth
