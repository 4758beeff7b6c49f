// Portable IEEE primitives shared by the host (g++/clang) and device (nvcc) builds.
// Everything bit-defined in bitparity is written in terms of these.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BP_HD __host__ __device__
#define BP_DEVICE_CODE 1
#else
#define BP_HD
#endif

#if defined(__CUDA_ARCH__)
#include <cuda_runtime.h>
#else
#include <cmath>
#endif

namespace bp {

BP_HD inline uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

BP_HD inline float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

BP_HD inline uint64_t bits_of(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

BP_HD inline double double_of(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// Single-rounding fused multiply-add. Host: C99 fmaf (correctly rounded in glibc,
// hardware or software). Device: the explicit _rn intrinsic so no flag can change it.
BP_HD inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Explicit round-to-nearest arithmetic. The builds forbid contraction, but these
// make the intent unmissable where a multiply feeds an add.
BP_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
BP_HD inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
BP_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
BP_HD inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
BP_HD inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

BP_HD inline bool is_nan(float x) { return (bits_of(x) & 0x7fffffffu) > 0x7f800000u; }
BP_HD inline bool is_inf(float x) { return (bits_of(x) & 0x7fffffffu) == 0x7f800000u; }

// A non-NaN float's place in IEEE totalOrder (−0 < +0) as a signed integer, so that
// a max or min is one integer compare and a select: no branch, which lets a kernel
// interleave many of them.
BP_HD inline int32_t total_order_key(float x) {
  const auto b = static_cast<int32_t>(bits_of(x));
  return b ^ ((b >> 31) & 0x7fffffff);
}

// The one NaN bitparity produces and compares: positive quiet NaN, no payload.
constexpr uint32_t kCanonicalNanF32 = 0x7fc00000u;

// NaN payloads differ between libraries and instructions; every bit comparison
// goes through this first (the policy is recorded in reports).
BP_HD inline uint32_t canonical_bits(float x) { return is_nan(x) ? kCanonicalNanF32 : bits_of(x); }

}  // namespace bp
