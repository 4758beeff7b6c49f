// bfloat16 storage and the two conversions the spec calls R() and f().
#pragma once
#include "fp.h"

namespace bp {

struct bf16 {
  uint16_t bits;
  friend BP_HD constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
  friend BP_HD constexpr bool operator!=(bf16 a, bf16 b) { return a.bits != b.bits; }
};
static_assert(sizeof(bf16) == 2, "bf16 must be two bytes");

constexpr uint16_t kCanonicalNanBf16 = 0x7fc0u;

BP_HD constexpr bf16 bf16_from_bits(uint16_t b) { return bf16{b}; }
BP_HD inline bool is_nan(bf16 x) { return (x.bits & 0x7fffu) > 0x7f80u; }

// f(x): exact widening bf16 -> fp32.
BP_HD inline float widen(bf16 x) { return float_of(static_cast<uint32_t>(x.bits) << 16); }

// R(x): fp32 -> bf16, round to nearest, ties to even; overflow goes to +-Inf,
// subnormals are rounded like any other value (bf16 shares fp32's exponent range).
// Equal to cvt.rn.bf16.f32 and PyTorch's c10 conversion for every non-NaN input;
// every NaN becomes the canonical 0x7FC0.
BP_HD inline bf16 round_bf16(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{kCanonicalNanBf16};
  const uint32_t lsb = (u >> 16) & 1u;
  return bf16{static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16)};
}

// R(f(x)) shorthand for fp32 values that must pass through bf16 storage.
BP_HD inline float through_bf16(float x) { return widen(round_bf16(x)); }

}  // namespace bp
