#include "reference/common/tensor_digest.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace bp {
namespace {

// Blocks of 2^20 elements, each summed by one thread, then the block digests in order
// (any order would do: the sums are mod 2^64).
template <class T, class Add>
TensorDigest blocked_digest(std::span<const T> v, Add add) {
  const uint64_t n = v.size();
  if (n > kMaxDigestElements)
    throw std::invalid_argument("tensor_digest: " + std::to_string(n) + " elements, more than 2^32");
  constexpr uint64_t kBlock = uint64_t{1} << 20;
  const int64_t blocks = static_cast<int64_t>((n + kBlock - 1) / kBlock);
  std::vector<TensorDigest> part(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint64_t end = std::min<uint64_t>(n, (blk + 1) * kBlock);
    for (uint64_t i = blk * kBlock; i < end; ++i) add(part[blk], i, v[i]);
  }
  TensorDigest d;
  for (const TensorDigest& p : part) digest_merge(d, p);
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
