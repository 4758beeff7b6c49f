// A tensor's bits in 128 bits, with its NaN and Inf counts: how a comparison of a
// tensor left where a GPU computed it starts (docs/cli.md, "Gradients compared where
// they live"). Element i with bits w (a NaN's canonical bits) adds fmix64(key ^ s1)
// and fmix64(key ^ s2), key = i·2^32 + w, to two sums mod 2^64. A sum mod 2^64 is the
// same in any order, so the GPU forms it in a parallel reduction (integer adds) and
// the host in parallel blocks, both with these bits. Equal tensors have equal
// digests; unequal ones share one only where both 64-bit sums collide. Up to 2^32
// elements, so that the key is injective.
#pragma once
#include <cstdint>
#include <span>

#include "reference/numerics/bf16.h"
#include "reference/numerics/fp.h"

namespace bp {

struct TensorDigest {
  uint64_t a = 0, b = 0;  // the two sums
  uint64_t nans = 0, infs = 0;
  bool operator==(const TensorDigest&) const = default;
};

inline constexpr uint64_t kMaxDigestElements = uint64_t{1} << 32;

// murmur3's 64-bit finaliser: a bijection in which every output bit depends on every input bit.
BP_HD inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  return k ^ (k >> 33);
}

BP_HD inline void digest_merge(TensorDigest& into, const TensorDigest& part) {
  into.a += part.a;
  into.b += part.b;
  into.nans += part.nans;
  into.infs += part.infs;
}

// Element i of a tensor, its bits already canonical where it is a NaN.
BP_HD inline void digest_add(TensorDigest& d, uint64_t i, uint32_t canonical, bool nan, bool inf) {
  const uint64_t key = (i << 32) | canonical;
  d.a += fmix64(key ^ 0x9e3779b97f4a7c15ull);
  d.b += fmix64(key ^ 0x632be59bd9b4e019ull);
  d.nans += nan;
  d.infs += inf;
}

BP_HD inline void digest_add_f32(TensorDigest& d, uint64_t i, uint32_t bits) {
  const uint32_t magnitude = bits & 0x7fffffffu;
  const bool nan = magnitude > 0x7f800000u;
  digest_add(d, i, nan ? kCanonicalNanF32 : bits, nan, magnitude == 0x7f800000u);
}

BP_HD inline void digest_add_bf16(TensorDigest& d, uint64_t i, uint16_t bits) {
  const uint32_t magnitude = bits & 0x7fffu;
  const bool nan = magnitude > 0x7f80u;
  digest_add(d, i, nan ? kCanonicalNanBf16 : bits, nan, magnitude == 0x7f80u);
}

// The host's digests (parallel over fixed blocks). Throw std::invalid_argument past
// kMaxDigestElements.
TensorDigest tensor_digest(std::span<const float> values);
TensorDigest tensor_digest(std::span<const bf16> values);

}  // namespace bp
