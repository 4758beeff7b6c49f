// The GPU's tensor digest (optimized/cuda/tensor_digest.h) against the host's
// (reference/common/tensor_digest.h), bit for bit: every bit pattern of fp32 and
// bf16 (NaNs of any payload and sign, Infs, ±0, subnormals), sizes of 0, 1, one
// short of a warp, and past a grid's first sweep. Negative control: one element
// changed on the device changes its digest.
#include "optimized/cuda/tensor_digest.h"
#include "reference/common/tensor_digest.h"
#include "tests/optimized/cuda_op_test.h"
#include "tests/support/digest_inputs.h"

namespace bp::test {
namespace {

const size_t kSizes[] = {0, 1, 31, 4099, (size_t{5} << 20) + 13};

TEST(TensorDigestGpu, Fp32MatchesTheHost) {
  for (size_t n : kSizes) {
    const std::vector<float> v = digest_f32_inputs(n, 10 + n);
    const DeviceBuffer<float> d(v);
    EXPECT_EQ(cuda::tensor_digest(d.get(), n), tensor_digest(std::span<const float>(v))) << n;
  }
}

TEST(TensorDigestGpu, Bf16MatchesTheHost) {
  for (size_t n : kSizes) {
    const std::vector<bf16> v = digest_bf16_inputs(n, 20 + n);
    const DeviceBuffer<bf16> d(v);
    EXPECT_EQ(cuda::tensor_digest(d.get(), n), tensor_digest(std::span<const bf16>(v))) << n;
  }
}

TEST(TensorDigestGpu, OneChangedElementChangesIt) {
  std::vector<float> v = digest_f32_inputs(4099, 30);
  v[77] = 1.0f;
  const DeviceBuffer<float> d(v);
  const TensorDigest before = cuda::tensor_digest(d.get(), v.size());
  v[77] = 1.0f + 0x1p-23f;
  const DeviceBuffer<float> e(v);
  EXPECT_NE(cuda::tensor_digest(e.get(), v.size()), before);
}

}  // namespace
}  // namespace bp::test
