// Tensors for the tensor digest's tests (tests/reference/common/test_tensor_digest.cpp
// on the host, tests/optimized/cuda/test_cuda_tensor_digest.cpp on the GPU): values of
// every kind, with NaNs of several payloads and signs, ±Inf, ±0 and subnormals.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "reference/common/rng.h"
#include "reference/numerics/bf16.h"

namespace bp::test {

inline std::vector<float> digest_f32_inputs(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(counter_hash(seed, i));
    std::memcpy(&v[i], &bits, 4);  // every bit pattern: NaNs (any payload), Infs, subnormals
  }
  return v;
}

inline std::vector<bf16> digest_bf16_inputs(size_t n, uint64_t seed) {
  std::vector<bf16> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = bf16{static_cast<uint16_t>(counter_hash(seed, i))};
  return v;
}

}  // namespace bp::test
