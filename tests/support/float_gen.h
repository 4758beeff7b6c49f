// Random fp32 / bf16 bit patterns for dot-product cases, from std::mt19937_64's raw
// output (defined by the standard, unlike the std:: distributions), so a seed names
// the same cases on every compiler. Shared by test_dot and the GPU hw_truth program.
// Also the operands and the IEEE definition the branch-free max functions are
// checked against (test_attention's max_num, test_logprob's max_nan).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

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

// Max operands: every bf16 pattern widened (all signs, exponents, subnormals, ±0,
// ±Inf and 128 NaN payloads per sign), then fp32 specials and random finite fp32.
inline std::vector<float> max_operands(int random_f32, uint64_t seed) {
  std::vector<uint32_t> bits;
  for (uint32_t b = 0; b < 0x10000u; ++b) bits.push_back(b << 16);
  for (uint32_t b : {0x00000001u, 0x80000001u, 0x7f800001u, 0xffbfffffu, 0x7fffffffu, 0x3f800001u, 0xbf800001u})
    bits.push_back(b);
  FloatGen g(seed);
  for (int i = 0; i < random_f32; ++i) bits.push_back(g.f32_any_finite());
  std::vector<float> v(bits.size());
  std::memcpy(v.data(), bits.data(), bits.size() * sizeof(float));
  return v;
}

// IEEE 754-2019 maximumNumber (nan_propagates = false: a NaN operand is ignored)
// or maximum (true: NaN if either is), both with −0 < +0, by double comparison:
// an independent statement of what the reference's selects compute. A NaN result
// is some NaN.
inline float ieee_maximum(float a, float b, bool nan_propagates) {
  if (std::isnan(a) || std::isnan(b)) return nan_propagates ? NAN : (std::isnan(a) ? b : a);
  const double da = a, db = b;
  if (da != db) return da > db ? a : b;
  return std::signbit(a) ? b : a;  // equal: the same bits, or ±0 giving +0 unless both are −0
}

// Pairs (every bf16 pattern, one of the specials and 200 random fp32), both orders,
// where max(x, y) differs from ieee_maximum (a NaN must be a NaN, and canonical
// where nan_propagates). About 27 million pairs.
template <class Max>
uint64_t max_mismatches(Max max, bool nan_propagates) {
  const std::vector<float> v = max_operands(200, 7);
  constexpr size_t kBf16 = 0x10000;
  uint64_t bad = 0;
  for (size_t j = kBf16; j < v.size(); ++j)
    for (size_t i = 0; i < kBf16; ++i)
      for (const auto& [x, y] : {std::pair{v[i], v[j]}, std::pair{v[j], v[i]}}) {
        const float want = ieee_maximum(x, y, nan_propagates), got = max(x, y);
        uint32_t gb, wb;
        std::memcpy(&gb, &got, 4);
        std::memcpy(&wb, &want, 4);
        bad += std::isnan(want) ? !std::isnan(got) || (nan_propagates && gb != 0x7fc00000u) : gb != wb;
      }
  return bad;
}

}  // namespace bp::test
