// Counter-based random bits with a defined value for every (seed, index): test
// inputs and generated fixture weights are the same on every compiler and thread
// count (std:: distributions are implementation-defined, so none are used).
#pragma once
#include <cstdint>
#include <vector>

#include "reference/numerics/bf16.h"

namespace bp {

// splitmix64 finaliser of (seed, index).
inline uint64_t counter_hash(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1): (u - 2^23) · 2^-23 for a 24-bit u; exact in fp32.
inline float counter_uniform(uint64_t seed, uint64_t index) {
  const int32_t u = static_cast<int32_t>(counter_hash(seed, index) >> 40);
  return static_cast<float>(u - (1 << 23)) * 0x1p-23f;
}

// R(scale · uniform[-1,1)): the defined-bits generator for weights and inputs.
inline bf16 counter_bf16(uint64_t seed, uint64_t index, float scale) {
  return round_bf16(counter_uniform(seed, index) * scale);
}

inline std::vector<bf16> random_bf16(size_t n, uint64_t seed, float scale) {
  std::vector<bf16> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = counter_bf16(seed, i, scale);
  return v;
}

inline std::vector<float> random_f32(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = counter_uniform(seed, i) * scale;
  return v;
}

}  // namespace bp
