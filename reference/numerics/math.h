// The contract's own elementary functions (SPEC.md §2.2): exp, exp2, log, rsqrt,
// sigmoid, silu, sin, cos.
//
// CUDA's expf/__expf/rsqrtf/sinf are not correctly rounded and their bits are
// undocumented, so bitparity defines these itself. Every function is built only
// from the IEEE primitives of fp.h (add_rn, sub_rn, mul_rn, div_rn, sqrt_rn,
// fma_rn, bits_of/float_of) and integer operations: no libm, no CUDA intrinsics,
// no double arithmetic. Every multiply that feeds an add is written either as an
// explicit fma_rn or as mul_rn followed by add_rn, so g++, clang and nvcc produce
// the same bits. Constants are written as hex floats; the polynomial coefficients
// are weighted minimax fits rounded to fp32 (SPEC.md §2.2 says how).
//
// Every NaN result is the canonical kCanonicalNanF32.
#pragma once
#include <cmath>

#include "fp.h"

namespace bp {
namespace math {

namespace detail {

constexpr uint32_t kInfBits = 0x7f800000u;
constexpr uint32_t kSignBit = 0x80000000u;
constexpr float kRoundShift = 0x1.8p23f;  // x + 1.5·2^23 rounds x to an integer (|x| < 2^22)

BP_HD inline float canonical_nan() { return float_of(kCanonicalNanF32); }

// 2^k as a float, for -126 <= k <= 127 (exact).
BP_HD inline float pow2i(int k) { return float_of(static_cast<uint32_t>(k + 127) << 23); }

// p·2^k in two multiplications: the first is exact (its result stays normal),
// so the result is rounded once, also where it overflows. Valid for
// 2^-40 <= |p| < 2^8 and -160 <= k <= 160; exact whenever p·2^k is representable.
BP_HD inline float scale2(float p, int k) {
  const int k1 = k >> 1;  // floor(k/2): arithmetic shift (defined in C++20)
  const int k2 = k - k1;
  return mul_rn(mul_rn(p, pow2i(k1)), pow2i(k2));
}

// An unevaluated sum hi + lo with |lo| <= ulp(hi)/2.
struct Pair {
  float hi, lo;
};

// (hi + lo)·2^k rounded once. Where the result is normal or overflows this is
// (hi + lo) rounded to fp32 and then scaled (exact unless it overflows). Where it
// falls below 2^-126 the pair is rounded directly at the subnormal grid 2^-149,
// so a subnormal result is not rounded twice: a = |hi|·2^(k+149) and
// b = ±lo·2^(k+149) (exact), ai = a rounded to an integer, g = (a - ai) + b
// rounded to an integer, result = sign(hi)·(ai + g)·2^-149.
// Valid for 2^-40 <= |hi + lo| < 2^8 (or hi = lo = 0) and -160 <= k <= 160,
// and for subnormal hi with k = 0.
//
// finish_normal is the first case alone (no branch), with `below` set where the
// result lies below 2^-126 and finish_subnormal must give it instead.
BP_HD inline float finish_normal(float hi, float lo, int k, bool& below) {
  const float v = add_rn(hi, lo);
  const int ev = static_cast<int>((bits_of(v) >> 23) & 0xffu) - 127;
  below = ev + k < -126;
  return scale2(v, k);
}
BP_HD inline float finish_subnormal(float hi, float lo, int k) {
  const uint32_t sign = bits_of(hi) & kSignBit;
  const float a = scale2(float_of(bits_of(hi) ^ sign), k + 149);  // exact
  const float b = scale2(float_of(bits_of(lo) ^ sign), k + 149);
  const float ai = sub_rn(add_rn(a, 0x1p23f), 0x1p23f);
  const float g = add_rn(sub_rn(a, ai), b);
  const float gi = sub_rn(add_rn(g, kRoundShift), kRoundShift);
  const float n = add_rn(ai, gi);
  return float_of(bits_of(mul_rn(mul_rn(n, 0x1p-75f), 0x1p-74f)) | sign);
}
BP_HD inline float finish(float hi, float lo, int k) {
  bool below = false;
  const float y = finish_normal(hi, lo, k, below);
  return below ? finish_subnormal(hi, lo, k) : y;
}

// exp(rh + rl) for |rh| <= 0.3467 and |rl| <= 2^-20 as a pair hi + lo with
// hi = RN(hi + lo) in [0.70, 1.42]. exp(rh) = 1 + rh + rh^2/2 + rh^3·Q(rh); the
// first three terms are summed exactly (two Fast2Sum steps and the fma-exact
// square), rl enters as rl·exp(rh).
BP_HD inline Pair exp_core(float rh, float rl) {
  constexpr float c0 = 0x1.555554p-3f, c1 = 0x1.5554e4p-5f, c2 = 0x1.1112dep-7f,
                  c3 = 0x1.6d520ep-10f, c4 = 0x1.9e7a5ap-13f;
  const float s = add_rn(1.0f, rh);
  const float e = add_rn(sub_rn(1.0f, s), rh);  // 1 + rh = s + e exactly
  const float z = mul_rn(rh, rh);
  const float zl = fma_rn(rh, rh, -z);  // rh^2 = z + zl exactly
  const float hz = mul_rn(0.5f, z);
  const float s2 = add_rn(s, hz);
  const float e2 = add_rn(sub_rn(s, s2), hz);  // s + hz = s2 + e2 exactly
  float q = fma_rn(c4, rh, c3);
  q = fma_rn(q, rh, c2);
  q = fma_rn(q, rh, c1);
  q = fma_rn(q, rh, c0);
  const float r3 = mul_rn(z, rh);
  float a = add_rn(e, e2);
  a = fma_rn(zl, 0.5f, a);
  const float t0 = fma_rn(r3, q, a);  // exp(rh) ~ s2 + t0
  const float p0 = add_rn(s2, t0);
  const float tail = fma_rn(rl, p0, t0);  // + rl·exp(rh)
  const float hi = add_rn(s2, tail);
  return {hi, add_rn(sub_rn(s2, hi), tail)};  // s2 + tail = hi + lo exactly
}

// exp(x) = (hi + lo)·2^k for finite x in [-110, 100]: k = nearest integer to
// x·log2e (from the exact product inside one fma), x - k·ln2 = rh + rl with rh
// exact (Cody–Waite with the fma), then exp_core.
BP_HD inline Pair exp_parts(float x, int& k) {
  constexpr float kLog2e = 0x1.715476p+0f, kLn2Hi = 0x1.62e430p-1f, kLn2Lo = -0x1.05c610p-29f;
  const float ks = fma_rn(x, kLog2e, kRoundShift);
  k = static_cast<int>(bits_of(ks) - bits_of(kRoundShift));
  const float kf = sub_rn(ks, kRoundShift);
  const float rh = fma_rn(-kf, kLn2Hi, x);  // exact
  const float rl = mul_rn(-kf, kLn2Lo);
  return exp_core(rh, rl);
}

// sigmoid (silu = false) or silu (silu = true) of a finite x with |x| <= 110:
// n/(1 + E) with E = exp(-|x|) = (hi + lo)·2^k and
//   sigmoid: n = 1 (x >= 0), n = (hi + lo) scaled by 2^k (x < 0);
//   silu:    n = x (x >= 0), n = x·(hi + lo) scaled by 2^k (x < 0).
// 1 + E is carried as the pair d + dl, the division is corrected by its exact
// remainder, and the quotient pair is rounded once by finish (also where the
// result is subnormal). Returns the magnitude; the caller applies the sign.
BP_HD inline float logistic(float x, bool silu) {
  const float ax = float_of(bits_of(x) & 0x7fffffffu);
  int k = 0;
  const Pair E = exp_parts(float_of(bits_of(ax) | kSignBit), k);
  const float eh = scale2(E.hi, k), el = scale2(E.lo, k);
  const float d = add_rn(1.0f, eh);
  const float dl = add_rn(add_rn(sub_rn(1.0f, d), eh), el);  // 1 + E ~ d + dl
  const bool neg = x < 0.0f;
  float nh, nl;
  if (!silu) {
    nh = neg ? E.hi : 1.0f;
    nl = neg ? E.lo : 0.0f;
  } else if (neg) {
    nh = mul_rn(ax, E.hi);
    nl = fma_rn(ax, E.lo, fma_rn(ax, E.hi, -nh));  // |x|·(hi + lo) ~ nh + nl
  } else {
    nh = ax;
    nl = 0.0f;
  }
  const float qh = div_rn(nh, d);
  const float rem = fma_rn(-qh, d, nh);  // exact remainder
  const float ql = div_rn(fma_rn(-qh, dl, add_rn(rem, nl)), d);
  return finish(qh, ql, neg ? k : 0);
}

// Bits of 2/pi for the integer (Payne–Hanek) reduction: word i >= 1 holds bits
// 32i-31 .. 32i after the binary point (MSB first); word 0 is zero padding.
BP_HD inline uint32_t two_over_pi_word(int i) {
  switch (i) {
    case 1: return 0xa2f9836eu;
    case 2: return 0x4e441529u;
    case 3: return 0xfc2757d1u;
    case 4: return 0xf534ddc0u;
    case 5: return 0xdb629599u;
    case 6: return 0x3c439041u;
    case 7: return 0xfe5163abu;
    default: return 0u;
  }
}

// Leading zeros of a non-zero 64-bit value (portable, no intrinsics).
BP_HD inline int clz64(uint64_t a) {
  int n = 0;
  if ((a >> 32) == 0) { n += 32; a <<= 32; }
  if ((a >> 48) == 0) { n += 16; a <<= 16; }
  if ((a >> 56) == 0) { n += 8; a <<= 8; }
  if ((a >> 60) == 0) { n += 4; a <<= 4; }
  if ((a >> 62) == 0) { n += 2; a <<= 2; }
  if ((a >> 63) == 0) { n += 1; }
  return n;
}

// |x| = n·pi/2 + r with |r| <= pi/4, for ax = bits of a finite |x| >= 0.5.
// T = x·(2/pi) mod 4 in 2.62 fixed point from a 24x96-bit integer product;
// r is returned as the unevaluated pair rh + rl.
BP_HD inline void reduce_pio2(uint32_t ax, int& n, float& rh, float& rl) {
  constexpr float kPio2Hi = 0x1.921fb6p+0f, kPio2Lo = -0x1.777a5cp-25f;
  const int bexp = static_cast<int>(ax >> 23);
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  // The 96 bits of 2/pi at positions bexp-151 .. bexp-56 (position p is word
  // p/32 + 1, bit p%32 there; negative positions are zero).
  const int q = bexp - 120;  // window start in the padded word stream
  const int i = q >> 5, s = q & 31;
  uint64_t p[3];  // m times each 32-bit word of the window (32x32 -> 64-bit products)
  for (int k = 0; k < 3; ++k) {
    const uint64_t pair = (static_cast<uint64_t>(two_over_pi_word(i + k)) << 32) | two_over_pi_word(i + k + 1);
    p[k] = static_cast<uint64_t>(m) * static_cast<uint32_t>(pair >> (32 - s));
  }
  const uint64_t t = (p[0] << 32) + p[1] + (p[2] >> 32);  // floor(m·window / 2^32) mod 2^64
  const uint64_t nq = (t + (1ull << 61)) >> 62;
  const int64_t f = static_cast<int64_t>(t - (nq << 62));  // in [-2^61, 2^61): units of 2^-62 quadrants
  n = static_cast<int>(nq & 3u);
  const uint32_t sign = f < 0 ? kSignBit : 0u;
  const uint64_t a = f < 0 ? static_cast<uint64_t>(-f) : static_cast<uint64_t>(f);
  if (a == 0) {  // cannot happen for fp32 inputs; defined for completeness
    rh = 0.0f;
    rl = 0.0f;
    return;
  }
  const int lz = clz64(a);
  const uint64_t an = a << lz;
  // fh: the top 24 bits (exact); fl: the next 23 bits (exact); both in quadrants.
  const float fh = float_of(sign | (static_cast<uint32_t>(128 - lz) << 23) | (static_cast<uint32_t>(an >> 40) & 0x7fffffu));
  const float lo_int = sub_rn(float_of(0x4b000000u | (static_cast<uint32_t>(an >> 17) & 0x7fffffu)), 0x1p23f);
  const float fl = float_of(bits_of(mul_rn(lo_int, pow2i(-45 - lz))) | sign);
  // r = (fh + fl)·pi/2 with pi/2 = kPio2Hi + kPio2Lo.
  rh = mul_rn(fh, kPio2Hi);
  const float e = fma_rn(fh, kPio2Hi, -rh);  // exact
  rl = fma_rn(fh, kPio2Lo, fma_rn(fl, kPio2Hi, e));
}

// sin(rh + rl) for |rh| <= pi/4. sin(r) = r + r^3·S(r^2) with S(z) = s0 + z·S1(z):
// rh + rh^3·s0 is formed as an exact pair (rh^3 ~ r3 + r3l, fma-exact product,
// Fast2Sum), so only the small terms r^5·S1, the pair errors and
// rl·cos(rh) ~ rl·(1 - rh^2/2 + rh^4/24) are rounded before the last addition.
BP_HD inline float sin_poly(float rh, float rl) {
  constexpr float s0 = -0x1.555556p-3f, s1 = 0x1.111176p-7f, s2 = -0x1.a05bbcp-13f, s3 = 0x1.7cd93ap-19f;
  const float z = mul_rn(rh, rh);
  const float zl = fma_rn(rh, rh, -z);  // rh^2 = z + zl exactly
  const float r3 = mul_rn(z, rh);
  float r3l = fma_rn(z, rh, -r3);
  r3l = fma_rn(zl, rh, r3l);  // rh^3 ~ r3 + r3l
  float S1 = fma_rn(s3, z, s2);
  S1 = fma_rn(S1, z, s1);
  const float ph = mul_rn(r3, s0);
  const float pl = fma_rn(r3, s0, -ph);  // r3·s0 = ph + pl exactly
  const float h = add_rn(rh, ph);
  const float l = add_rn(sub_rn(rh, h), ph);  // rh + ph = h + l exactly
  float b = mul_rn(rl, fma_rn(fma_rn(z, 0x1.555556p-5f, -0.5f), z, 1.0f));  // rl·cos(rh)
  b = fma_rn(r3l, s0, b);
  b = add_rn(b, pl);
  b = add_rn(b, l);
  const float tail = fma_rn(mul_rn(r3, z), S1, b);
  return add_rn(h, tail);
}

// cos(rh + rl) for |rh| <= pi/4: 1 - rh^2/2 (exact pair) + rh^4·C(rh^2)
// - rl·sin(rh) with sin(rh) ~ rh - rh^3/6 and rh^4 carried as the pair z2 + z2l.
BP_HD inline float cos_poly(float rh, float rl) {
  constexpr float c0 = 0x1.555556p-5f, c1 = -0x1.6c175ep-10f, c2 = 0x1.a071c6p-16f, c3 = -0x1.361c22p-22f;
  const float z = mul_rn(rh, rh);
  const float zl = fma_rn(rh, rh, -z);  // rh^2 = z + zl exactly
  const float hz = mul_rn(0.5f, z);
  const float t = sub_rn(1.0f, hz);
  const float e = sub_rn(sub_rn(1.0f, t), hz);  // 1 - hz = t + e exactly
  float C = fma_rn(c3, z, c2);
  C = fma_rn(C, z, c1);
  C = fma_rn(C, z, c0);
  const float z2 = mul_rn(z, z);
  float z2l = fma_rn(z, z, -z2);
  z2l = fma_rn(add_rn(z, z), zl, z2l);  // rh^4 ~ z2 + z2l
  float a = fma_rn(zl, -0.5f, e);
  a = fma_rn(-rl, fma_rn(mul_rn(z, rh), -0x1.555556p-3f, rh), a);  // -rl·sin(rh)
  a = fma_rn(z2l, C, a);
  const float tail = fma_rn(z2, C, a);
  return add_rn(t, tail);
}

// sin(|x| + q·pi/2) for finite x given by ax = bits of |x|, before the sign of x.
BP_HD inline float sin_shifted(uint32_t ax, int q) {
  int n = 0;
  float rh = float_of(ax), rl = 0.0f;
  if (ax > 0x3f490fdau) reduce_pio2(ax, n, rh, rl);  // |x| >= pi/4 (rounded up)
  n += q;
  const float r = (n & 1) ? cos_poly(rh, rl) : sin_poly(rh, rl);
  return float_of(bits_of(r) ^ (static_cast<uint32_t>(n & 2) << 30));
}

}  // namespace detail

// Largest errors over all 2^32 inputs (tools/ulp_scan against double-precision
// glibc; SPEC.md §2.2), in ulps of the true value, rounded up. The tests and
// `bitparity selfcheck` hold the functions to them.
inline constexpr double kMaxUlpExp = 0.518;      // measured 0.5175 at 0x4047ce1f
inline constexpr double kMaxUlpExp2 = 0.519;     // measured 0.5184 at 0xbeeb0775
inline constexpr double kMaxUlpExp2Poly = 1.232;  // measured 1.2310 at 0xba4de201 (contract v2's exp2_poly)
inline constexpr double kMaxUlpLog = 0.517;      // measured 0.5164 at 0x3fb7941e
inline constexpr double kMaxUlpRsqrt = 0.501;    // measured 0.5000 at 0x00113e07
inline constexpr double kMaxUlpSigmoid = 0.518;  // measured 0.5172 at 0xc2780a16
inline constexpr double kMaxUlpSilu = 0.522;     // measured 0.5213 at 0xc22ffd55
inline constexpr double kMaxUlpSinCos = 0.522;   // measured sin 0.5204 at 0x77a31567, cos 0.5211 at 0x4d30779c
inline constexpr double kMaxUlpSinCosRope = 0.521;  // |x| <= 2^17: sin 0.5203 at 0x43648a2b, cos 0.5204 at 0x469255eb

// exp(x) wherever the result is not below 2^-126, without a branch (selects only),
// so that a kernel can interleave many; `below` is set where it is (x < −87.3),
// and then exp(x) must be called instead. Out-of-range and NaN x are evaluated at
// 0 and their result selected afterwards.
BP_HD inline float exp_unless_subnormal(float x, bool& below) {
  const bool in_range = x >= -110.0f && x <= 100.0f;  // false for NaN
  int k = 0;
  const detail::Pair p = detail::exp_parts(in_range ? x : 0.0f, k);
  const float y = detail::finish_normal(p.hi, p.lo, k, below);
  below = below && in_range;
  // One select each (a nested conditional compiles to a branch).
  const float clamped = x > 0.0f ? float_of(detail::kInfBits) : 0.0f;
  const float finite_or_clamped = in_range ? y : clamped;
  return is_nan(x) ? detail::canonical_nan() : finite_or_clamped;
}

// e^x = (hi + lo)·2^k by exp_parts, rounded once by finish: NaN → NaN, x > 100 →
// +Inf, x < −110 → +0.
BP_HD inline float exp(float x) {
  bool below = false;
  const float y = exp_unless_subnormal(x, below);
  if (!below) return y;
  int k = 0;
  const detail::Pair p = detail::exp_parts(x, k);
  return detail::finish_subnormal(p.hi, p.lo, k);
}

// 2^x. x = k + f (k nearest integer, f exact), 2^f = exp(f·ln2) with f·ln2 as a
// pair, rounded once by finish.
BP_HD inline float exp2(float x) {
  constexpr float kLn2 = 0x1.62e430p-1f, kLn2Lo = -0x1.05c610p-29f;
  if (is_nan(x)) return detail::canonical_nan();
  if (x > 130.0f) return float_of(detail::kInfBits);
  if (x < -160.0f) return 0.0f;
  const float ks = add_rn(x, detail::kRoundShift);
  const int k = static_cast<int>(bits_of(ks) - bits_of(detail::kRoundShift));
  const float f = sub_rn(x, sub_rn(ks, detail::kRoundShift));  // exact, |f| <= 1/2
  const float rh = mul_rn(f, kLn2);
  const float rl = fma_rn(f, kLn2Lo, fma_rn(f, kLn2, -rh));
  const detail::Pair p = detail::exp_core(rh, rl);
  return detail::finish(p.hi, p.lo, k);
}

// 2^x the way fast GPU softmax kernels compute it (contract v2, SPEC.md §2.2): x =
// j + f with j = ⌊x⌋ by one rounding to an integer, 2^f by a degree-6 Horner
// polynomial in fma, j added to the exponent field with one integer add. No branch,
// no division, no pair arithmetic: about a third of exp2's instructions, within
// 1 ulp instead of 0.52. NaN → canonical NaN, x ≥ 128 → +Inf, x < −125 → +0
// (results below 2^-125 are flushed: the integer add makes no subnormals).
// f is reduced to [0, 1], not [−1/2, 1/2], so that every Horner term is ≥ 0 and the
// rounded result cannot decrease as x grows; p(0) = 1 and p(1) = 2 exactly, so it
// cannot decrease where j steps either. The coefficients are tools/fit_exp2_poly.py's:
// a relative-error minimax fit on [0, 1], rounded to fp32 one coefficient at a time
// from c1 up, the higher ones refitted after each.
namespace detail {
// exp2_poly_core after its split of t: 2^f by the polynomial, j (the low bits of
// r = j + 1.5·2^23) into the exponent field, the flush below −125. A kernel may
// split t by other instructions where they give the same j and f (device_util.cuh).
BP_HD inline float exp2_poly_of_split(float t, float r, float f) {
  constexpr float c1 = 0x1.62e42cp-1f, c2 = 0x1.ebfd3ap-3f, c3 = 0x1.c68af6p-5f, c4 = 0x1.3cfd82p-7f,
                  c5 = 0x1.473738p-10f, c6 = 0x1.c44580p-13f;
  float p = fma_rn(c6, f, c5);
  p = fma_rn(p, f, c4);
  p = fma_rn(p, f, c3);
  p = fma_rn(p, f, c2);
  p = fma_rn(p, f, c1);
  p = fma_rn(p, f, 1.0f);  // in [1, 2]
  // bits(r) = 0x4B400000 + j, and 0x4B400000 << 23 vanishes modulo 2^32.
  const float y = float_of(bits_of(p) + (bits_of(r) << 23));
  return t < -125.0f ? 0.0f : y;  // t ≥ −125: j ≥ −125, a normal result (one select: no branch)
}
}  // namespace detail

// exp2_poly_core is exp2_poly without its clamp and NaN select: equal to it for every
// t ≤ 128 that is not NaN (−Inf included: +0), for kernels whose exponents are known
// to lie there (the log-softmax of a chunk with a finite or −Inf maximum).
BP_HD inline float exp2_poly_core(float t) {
  // r = RN(t − 1/2) rounded to an integer (|t| < 2^22): ⌊t⌋, or t itself for an even
  // integer t, which then takes f = 0 instead of f = 1. j sits in the low bits of r.
  const float r = add_rn(sub_rn(t, 0.5f), detail::kRoundShift);
  const float f = sub_rn(t, sub_rn(r, detail::kRoundShift));  // exact; in [0, 1] but for |t| < 2^-25
  return detail::exp2_poly_of_split(t, r, f);
}

BP_HD inline float exp2_poly(float x) {
  // The overflow as a clamp (one min instead of a compare and a select): 128 is an
  // even integer, so t = 128 gives j = 128, f = 0, p = 1 and the exponent insert
  // makes 0x7F800000 = +Inf exactly. fminf takes a NaN x to 128; the NaN select
  // below tests x itself. x != x is the NaN test the hardware does in one compare
  // (no fast-math anywhere, SPEC.md §1).
  const float y = exp2_poly_core(fminf(x, 128.0f));
  return x != x ? detail::canonical_nan() : y;
}

// Natural logarithm. x = 2^E·m with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact),
// log(m) = 2·atanh(u/2) with u = 2f/(2+f) carried as a corrected pair,
// E·ln2 added with ln2 split so that E·kLn2Hi is exact.
BP_HD inline float log(float x) {
  constexpr float kLn2Hi = 0x1.62e4p-1f, kLn2Lo = 0x1.7f7d1cp-20f;
  constexpr float c0 = 0x1.555554p-4f, c1 = 0x1.999c26p-7f, c2 = 0x1.23d3ep-9f, c3 = 0x1.f13b22p-12f;
  uint32_t ux = bits_of(x);
  if (is_nan(x)) return detail::canonical_nan();
  if ((ux & 0x7fffffffu) == 0) return float_of(detail::kInfBits | detail::kSignBit);  // log(±0) = -Inf
  if (ux & detail::kSignBit) return detail::canonical_nan();
  if (ux == detail::kInfBits) return x;
  int E = -127;
  if (ux < 0x00800000u) {  // subnormal: scale into the normal range (exact)
    ux = bits_of(mul_rn(x, 0x1p25f));
    E -= 25;
  }
  const uint32_t mb = ux & 0x7fffffu;
  const uint32_t halve = mb >= 0x3504f4u ? 1u : 0u;  // 1.mb >= sqrt(2): use m/2
  E += static_cast<int>((ux >> 23) + halve);
  const float m = float_of(mb | ((127u - halve) << 23));
  const float f = sub_rn(m, 1.0f);  // exact
  const float dh = add_rn(2.0f, f);
  const float dl = add_rn(sub_rn(2.0f, dh), f);  // 2 + f = dh + dl exactly
  const float f2 = add_rn(f, f);
  const float uh = div_rn(f2, dh);
  const float rem = fma_rn(-uh, dh, f2);  // exact remainder
  const float ul = div_rn(fma_rn(-uh, dl, rem), dh);
  const float w = mul_rn(uh, uh);
  float T = fma_rn(c3, w, c2);
  T = fma_rn(T, w, c1);
  T = fma_rn(T, w, c0);
  const float tail = fma_rn(mul_rn(w, uh), T, fma_rn(mul_rn(ul, 0.25f), w, ul));
  const float ef = sub_rn(float_of(0x4b400000u + static_cast<uint32_t>(E)), detail::kRoundShift);  // E, exact
  const float big = mul_rn(ef, kLn2Hi);  // exact
  const float t = add_rn(big, uh);
  const float et = add_rn(sub_rn(big, t), uh);  // big + uh = t + et exactly
  const float lo = fma_rn(ef, kLn2Lo, add_rn(et, tail));
  return add_rn(t, lo);
}

// 1/sqrt(x). x = m·2^(2k) with m in [1, 4); y0 = 1/sqrt(m) from two IEEE operations,
// then one Newton step on the exact residual 1 - m·y0^2; result y·2^-k (exact).
BP_HD inline float rsqrt(float x) {
  uint32_t ux = bits_of(x);
  if (is_nan(x)) return detail::canonical_nan();
  if ((ux & 0x7fffffffu) == 0) return float_of(detail::kInfBits | ux);  // ±0 -> ±Inf
  if (ux & detail::kSignBit) return detail::canonical_nan();
  if (ux == detail::kInfBits) return 0.0f;
  int e = static_cast<int>(ux >> 23) - 127;
  if (ux < 0x00800000u) {  // subnormal: scale by 2^24 (exact)
    ux = bits_of(mul_rn(x, 0x1p24f));
    e = static_cast<int>(ux >> 23) - 127 - 24;
  }
  const int k = e >> 1;  // floor(e/2)
  const float m = float_of((ux & 0x7fffffu) | (static_cast<uint32_t>(127 + e - 2 * k) << 23));
  const float y0 = div_rn(1.0f, sqrt_rn(m));
  const float zh = mul_rn(y0, y0);
  const float zl = fma_rn(y0, y0, -zh);  // y0^2 = zh + zl exactly
  float eps = fma_rn(-m, zh, 1.0f);
  eps = fma_rn(-m, zl, eps);  // 1 - m·y0^2
  const float y = fma_rn(mul_rn(0.5f, y0), eps, y0);
  return mul_rn(y, detail::pow2i(-k));
}

// sigmoid(x) = 1/(1 + e^-x), computed as 1/(1 + e^-x) for x >= 0 (also -0) and
// as e^x/(1 + e^x) for x < 0 (detail::logistic), so it never overflows and keeps
// the subnormal results of very negative x. |x| > 110: 1 or +0.
BP_HD inline float sigmoid(float x) {
  if (is_nan(x)) return detail::canonical_nan();
  if (x > 110.0f) return 1.0f;
  if (x < -110.0f) return 0.0f;
  return detail::logistic(x, false);
}

// silu(x) = x·sigmoid(x) = x/(1 + e^-x), computed as x/(1 + e^-x) for x >= 0 and
// as (x·e^x)/(1 + e^x) for x < 0 (detail::logistic); the result has the sign of
// x. x > 110: x; x < -110 (also -Inf): -0.
BP_HD inline float silu(float x) {
  if (is_nan(x)) return detail::canonical_nan();
  if (x > 110.0f) return x;
  if (x < -110.0f) return float_of(detail::kSignBit);
  return float_of(bits_of(detail::logistic(x, true)) | (bits_of(x) & detail::kSignBit));
}

// sin(x): |x| < pi/4 directly, else |x| = n·pi/2 + r by the integer reduction
// (reduce_pio2) for every larger finite x; sign of x applied last (sin(-0) = -0).
BP_HD inline float sin(float x) {
  const uint32_t ux = bits_of(x), ax = ux & 0x7fffffffu;
  if (ax >= detail::kInfBits) return detail::canonical_nan();  // NaN, ±Inf
  return float_of(bits_of(detail::sin_shifted(ax, 0)) ^ (ux & detail::kSignBit));
}

// cos(x) = sin(|x| + pi/2), same reduction as sin.
BP_HD inline float cos(float x) {
  const uint32_t ax = bits_of(x) & 0x7fffffffu;
  if (ax >= detail::kInfBits) return detail::canonical_nan();
  return detail::sin_shifted(ax, 1);
}

}  // namespace math
}  // namespace bp
