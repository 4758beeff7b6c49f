#include "reference/common/tensor_digest.h"

#include <stdexcept>
#include <string>

#include "reference/common/parallel_blocks.h"

namespace bp {
namespace {

// Blocks of 2^20 elements, each summed by one thread, then the block digests (any
// order would do: the sums are mod 2^64).
template <class T, class Add>
TensorDigest blocked_digest(std::span<const T> v, Add add) {
  const uint64_t n = v.size();
  if (n > kMaxDigestElements)
    throw std::invalid_argument("tensor_digest: " + std::to_string(n) + " elements, more than 2^32");
  TensorDigest d;
  for (const TensorDigest& p : parallel_blocks<TensorDigest>(n, uint64_t{1} << 20, [&](uint64_t begin, uint64_t end) {
         TensorDigest part;
         for (uint64_t i = begin; i < end; ++i) add(part, i, v[i]);
         return part;
       }))
    digest_merge(d, p);
  return d;
}

}  // namespace

TensorDigest tensor_digest(std::span<const float> values) {
  return blocked_digest(values, [](TensorDigest& d, uint64_t i, float x) { digest_add_f32(d, i, bits_of(x)); });
}

TensorDigest tensor_digest(std::span<const bf16> values) {
  return blocked_digest(values, [](TensorDigest& d, uint64_t i, bf16 x) { digest_add_bf16(d, i, x.bits); });
}

}  // namespace bp
