// Random fp32 / bf16 bit patterns for dot-product cases, from std::mt19937_64's raw
// output (defined by the standard, unlike the std:: distributions), so a seed names
// the same cases on every compiler. Shared by test_dot and the GPU hw_truth program.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <random>

namespace bp::test {

class FloatGen {
 public:
  explicit FloatGen(uint64_t seed) : rng_(seed) {}
  uint32_t bits(int n) { return static_cast<uint32_t>(rng_() >> (64 - n)); }
  int range(int lo, int hi) { return lo + static_cast<int>(rng_() % static_cast<uint64_t>(hi - lo + 1)); }
  bool chance(int one_in) { return rng_() % static_cast<uint64_t>(one_in) == 0; }
  template <class T>
  T pick(std::initializer_list<T> v) { return v.begin()[rng_() % v.size()]; }

  // bf16 bits: unbiased exponent e (normal range), random sign and fraction.
  uint16_t bf(int e) { return static_cast<uint16_t>((bits(1) << 15) | ((e + 127) << 7) | bits(7)); }
  uint16_t bf_subnormal() { return static_cast<uint16_t>((bits(1) << 15) | (1 + bits(7) % 127)); }
  uint16_t bf_signed_zero() { return static_cast<uint16_t>(bits(1) << 15); }
  uint16_t bf_any_finite() { return static_cast<uint16_t>((bits(1) << 15) | (range(0, 254) << 7) | bits(7)); }
  // fp32 bits, likewise.
  uint32_t f32(int e) { return (bits(1) << 31) | (static_cast<uint32_t>(e + 127) << 23) | bits(23); }
  uint32_t f32_subnormal() { return (bits(1) << 31) | (1 + bits(23) % 0x7fffffu); }
  uint32_t f32_any_finite() { return (bits(1) << 31) | (static_cast<uint32_t>(range(0, 254)) << 23) | bits(23); }

 private:
  std::mt19937_64 rng_;
};

}  // namespace bp::test
