// The two dot-product models of the contracts (SPEC.md §2.3). A model turns
// c + sum_k f(a_k)·f(b_k) into fp32 bits; chain() walks K upward, never splitting it.
#pragma once
#include <cstddef>

#include "bf16.h"

namespace bp {

enum class DotModel : int { FmaSeq = 0, Sm90Tc = 1 };

namespace detail {

BP_HD inline int msb_index(uint64_t x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return 63 - __clzll(static_cast<long long>(x));
#else
  return 63 - __builtin_clzll(x);
#endif
}

// (-1)^neg · mag · 2^e converted to fp32 rounding toward zero: fp32 subnormals
// are kept, overflow gives ±Inf, and a result that truncates to zero is +0 whatever
// its sign (the tensor core's conversion, measured on an H100: SPEC.md §2.3.3).
BP_HD inline float rz_to_f32(bool neg, uint64_t mag, int e) {
  const uint32_t sign = neg ? 0x80000000u : 0u;
  if (mag == 0) return 0.0f;
  const int p = msb_index(mag);
  const int ue = p + e;  // value in [2^ue, 2^(ue+1))
  if (ue > 127) return float_of(sign | 0x7f800000u);
  if (ue >= -126) {
    const int sh = p - 23;
    const uint64_t m = sh >= 0 ? (mag >> sh) : (mag << -sh);
    return float_of(sign | (static_cast<uint32_t>(ue + 127) << 23) | (static_cast<uint32_t>(m) & 0x7fffffu));
  }
  const int sh = e + 149;  // quantum of fp32 subnormals is 2^-149
  const uint64_t m = sh >= 0 ? (mag << sh) : (-sh >= 64 ? 0 : (mag >> -sh));
  return m == 0 ? 0.0f : float_of(sign | static_cast<uint32_t>(m));
}

// Significand as an integer and unbiased exponent of the leading position, for a
// finite non-zero bf16 (8-bit significand 1.7) or fp32 (24-bit significand 1.23).
// Subnormals keep exponent -126 with a zero leading bit: they are not renormalised.
BP_HD inline void split_bf16(uint16_t b, uint32_t& sig, int& exp) {
  const uint32_t ef = (b >> 7) & 0xffu;
  sig = (b & 0x7fu) | (ef ? 0x80u : 0u);
  exp = ef ? static_cast<int>(ef) - 127 : -126;
}
BP_HD inline void split_f32(uint32_t u, uint32_t& sig, int& exp) {
  const uint32_t ef = (u >> 23) & 0xffu;
  sig = (u & 0x7fffffu) | (ef ? 0x800000u : 0u);
  exp = ef ? static_cast<int>(ef) - 127 : -126;
}

BP_HD inline uint64_t shift_trunc(uint64_t m, int s) {  // m · 2^s, truncated
  if (s >= 0) return m << s;
  return -s >= 64 ? 0 : (m >> -s);
}

}  // namespace detail

// fma-seq: acc = fmaf(f(a_k), f(b_k), acc) for k = 0..K-1. Portable to any IEEE
// machine with a correctly rounded fma.
struct FmaSeq {
  static constexpr DotModel kModel = DotModel::FmaSeq;
  BP_HD static float chain(float c, const bf16* a, ptrdiff_t sa, const bf16* b, ptrdiff_t sb, int k) {
    for (int i = 0; i < k; ++i) c = fma_rn(widen(a[i * sa]), widen(b[i * sb]), c);
    return c;
  }
};

// sm90-tc: the Hopper bf16 tensor-core model (Khattak & Mikaitis; MMA-Sim), one
// m16n8k16 / wgmma k16 step per group of 16 products, groups chained in increasing k.
struct Sm90Tc {
  static constexpr DotModel kModel = DotModel::Sm90Tc;
  static constexpr int kGroup = 16;
  static constexpr int kFracBits = 25;  // alignment width below 2^E
  // E never goes below the exponent of the smallest bf16 subnormal: terms are
  // never kept below 2^(-133-25) (measured on an H100, SPEC.md §2.3.3).
  static constexpr int kMinAlignExponent = -133;
  // The NaN the tensor cores produce (any NaN operand, Inf·0, Inf − Inf).
  static constexpr uint32_t kNanBits = 0x7fffffffu;

  // d = c + sum_{i<n} f(a_i)·f(b_i) for n <= 16, as one instruction computes it.
  BP_HD static float group(float c, const bf16* a, ptrdiff_t sa, const bf16* b, ptrdiff_t sb, int n) {
    // Non-finite operands: IEEE semantics of the exact sum (SPEC.md §2.3.3).
    bool nan = is_nan(c), pos_inf = false, neg_inf = false;
    const uint32_t cu = bits_of(c);
    if (is_inf(c)) (cu >> 31 ? neg_inf : pos_inf) = true;
    for (int i = 0; i < n; ++i) {
      const uint16_t x = a[i * sa].bits, y = b[i * sb].bits;
      const bool xinf = (x & 0x7fffu) == 0x7f80u, yinf = (y & 0x7fffu) == 0x7f80u;
      const bool xzero = (x & 0x7fffu) == 0, yzero = (y & 0x7fffu) == 0;
      if (is_nan(bf16{x}) || is_nan(bf16{y}) || (xinf && yzero) || (yinf && xzero)) nan = true;
      else if (xinf || yinf) (((x ^ y) >> 15) ? neg_inf : pos_inf) = true;
    }
    if (nan || (pos_inf && neg_inf)) return float_of(kNanBits);
    if (pos_inf || neg_inf) return float_of(neg_inf ? 0xff800000u : 0x7f800000u);

    // Terms: exact unnormalised products (significand in [1,4) at exponent ea+eb)
    // and c; zeros take no part. E = largest term exponent.
    uint32_t psig[kGroup];
    int pexp[kGroup];
    bool pneg[kGroup];
    int count = 0;
    int E = -100000;
    for (int i = 0; i < n; ++i) {
      const uint16_t x = a[i * sa].bits, y = b[i * sb].bits;
      if ((x & 0x7fffu) == 0 || (y & 0x7fffu) == 0) continue;
      uint32_t sx, sy;
      int ex, ey;
      detail::split_bf16(x, sx, ex);
      detail::split_bf16(y, sy, ey);
      psig[count] = sx * sy;  // < 2^16, value psig · 2^(ex+ey-14)
      pexp[count] = ex + ey;
      pneg[count] = ((x ^ y) >> 15) != 0;
      if (pexp[count] > E) E = pexp[count];
      ++count;
    }
    const bool has_c = (cu & 0x7fffffffu) != 0;
    uint32_t csig = 0;
    int cexp = 0;
    if (has_c) {
      detail::split_f32(cu, csig, cexp);  // value csig · 2^(cexp-23)
      if (cexp > E) E = cexp;
    }
    if (count == 0 && !has_c) return 0.0f;
    if (E < kMinAlignExponent) E = kMinAlignExponent;

    // Align every term to 25 fraction bits below 2^E, truncating its magnitude,
    // and add the integers exactly: |sum| < 17 · 2^27.
    int64_t sum = 0;
    for (int i = 0; i < count; ++i) {
      const int64_t t = static_cast<int64_t>(detail::shift_trunc(psig[i], pexp[i] - E + kFracBits - 14));
      sum += pneg[i] ? -t : t;
    }
    if (has_c) {
      const int64_t t = static_cast<int64_t>(detail::shift_trunc(csig, cexp - E + kFracBits - 23));
      sum += (cu >> 31) ? -t : t;
    }
    if (sum == 0) return 0.0f;
    const bool neg = sum < 0;
    return detail::rz_to_f32(neg, static_cast<uint64_t>(neg ? -sum : sum), E - kFracBits);
  }

  // Groups of 16 chained over K in increasing order; a short last group is the
  // same as zero padding, since zero products take no part.
  BP_HD static float chain(float c, const bf16* a, ptrdiff_t sa, const bf16* b, ptrdiff_t sb, int k) {
    for (int g = 0; g < k; g += kGroup) {
      const int n = k - g < kGroup ? k - g : kGroup;
      c = group(c, a + g * sa, sa, b + g * sb, sb, n);
    }
    return c;
  }
};

// Calls f(FmaSeq{}) or f(Sm90Tc{}): the model is chosen once per op, not per element.
template <class F>
decltype(auto) with_dot_model(DotModel m, F&& f) {
  if (m == DotModel::Sm90Tc) return f(Sm90Tc{});
  return f(FmaSeq{});
}

}  // namespace bp
