// The tensor digest (reference/common/tensor_digest.h): the host's parallel blocks
// give the definition's sequential sums; equal bits (any NaN as the canonical one)
// give equal digests; a changed bit anywhere, a swap of two elements, ±0, and the
// element's place each change it; NaN and Inf counts are right. The GPU's digest is
// held to this one in tests/optimized/cuda/test_cuda_tensor_digest.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/common/tensor_digest.h"
#include "support/digest_inputs.h"

namespace bp {
namespace {

TensorDigest sequential_f32(const std::vector<float>& v) {
  TensorDigest d;
  for (size_t i = 0; i < v.size(); ++i) digest_add_f32(d, i, bits_of(v[i]));
  return d;
}

float with_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// Three blocks and a partial one: the blocks' sums in parallel are the definition's.
TEST(TensorDigest, ParallelBlocksGiveTheSequentialSums) {
  const std::vector<float> v = test::digest_f32_inputs((size_t{3} << 20) + 7, 1);
  EXPECT_EQ(tensor_digest(std::span<const float>(v)), sequential_f32(v));
  const std::vector<bf16> h = test::digest_bf16_inputs((size_t{1} << 20) + 3, 2);
  TensorDigest d;
  for (size_t i = 0; i < h.size(); ++i) digest_add_bf16(d, i, h[i].bits);
  EXPECT_EQ(tensor_digest(std::span<const bf16>(h)), d);
}

TEST(TensorDigest, NansAreOneValueAndCounted) {
  std::vector<float> a = {1.0f, with_bits(0x7fc00000u), std::numeric_limits<float>::infinity(), -0.0f};
  std::vector<float> b = a;
  b[1] = with_bits(0xffc00123u);  // another NaN: a negative one with a payload
  const TensorDigest da = tensor_digest(std::span<const float>(a));
  EXPECT_EQ(da, tensor_digest(std::span<const float>(b)));
  EXPECT_EQ(da.nans, 1u);
  EXPECT_EQ(da.infs, 1u);
  const std::vector<bf16> ha = {bf16{0x7fc1}, bf16{0xff80}, bf16{0x0001}}, hb = {bf16{0xffc0}, bf16{0xff80}, bf16{0x0001}};
  EXPECT_EQ(tensor_digest(std::span<const bf16>(ha)), tensor_digest(std::span<const bf16>(hb)));
  EXPECT_EQ(tensor_digest(std::span<const bf16>(ha)).nans, 1u);
}

// Negative controls: what must change the digest does, in both sums.
TEST(TensorDigest, AnyChangedBitSwapOrSignedZeroChangesIt) {
  const std::vector<float> v = test::digest_f32_inputs(4099, 3);
  const TensorDigest d = tensor_digest(std::span<const float>(v));
  for (size_t i : {size_t{0}, size_t{1}, size_t{2048}, size_t{4098}})
    for (int bit = 0; bit < 32; ++bit) {
      std::vector<float> w = v;
      const float was = w[i];
      w[i] = with_bits(bits_of(was) ^ (1u << bit));
      if (std::isnan(was) && std::isnan(w[i])) continue;  // one NaN for another: equal by the policy
      const TensorDigest e = tensor_digest(std::span<const float>(w));
      EXPECT_NE(e.a, d.a) << i << " bit " << bit;
      EXPECT_NE(e.b, d.b) << i << " bit " << bit;
    }
  std::vector<float> swapped = v;
  std::swap(swapped[10], swapped[11]);
  ASSERT_NE(bits_of(v[10]), bits_of(v[11]));
  EXPECT_NE(tensor_digest(std::span<const float>(swapped)), d);
  const std::vector<float> plus = {0.0f}, minus = {-0.0f};
  EXPECT_NE(tensor_digest(std::span<const float>(plus)), tensor_digest(std::span<const float>(minus)));
}

}  // namespace
}  // namespace bp
