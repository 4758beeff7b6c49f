// bp::cuda residual_fwd and sum_round against the CPU reference, bit for bit.
#include "optimized/cuda/residual.h"
#include "reference/ops/residual.h"
#include "tests/optimized/cuda_op_test.h"

namespace bp::test {
namespace {

using ResidualGpu = ContractTest;

std::vector<bf16> gpu_residual(const Knobs& kn, const std::vector<bf16>& h, const std::vector<bf16>& o) {
  const DeviceBuffer<bf16> dh(h), d_o(o);
  DeviceBuffer<bf16> out = poisoned<bf16>(h.size());
  cuda::residual_fwd(kn, dh.get(), d_o.get(), out.get(), h.size());
  return out.download();
}

std::vector<bf16> cpu_residual(const Knobs& kn, const std::vector<bf16>& h, const std::vector<bf16>& o) {
  std::vector<bf16> out(h.size());
  ref::residual_fwd(kn, h.data(), o.data(), out.data(), h.size());
  return out;
}

// Every pair of special values, then random bit patterns (all exponents, so the
// sum's rounding is met at every distance), then a Qwen3-30B-A3B residual stream.
TEST_P(ResidualGpu, MatchesReference) {
  std::vector<bf16> h, o;
  for (uint16_t a : special_bf16())
    for (uint16_t b : special_bf16()) h.push_back({a}), o.push_back({b});
  const std::vector<bf16> rh = random_bit_patterns(1 << 22, 1), ro = random_bit_patterns(1 << 22, 2);
  h.insert(h.end(), rh.begin(), rh.end());
  o.insert(o.end(), ro.begin(), ro.end());
  EXPECT_TRUE(same_bits(cpu_residual(knobs(), h, o), gpu_residual(knobs(), h, o)));

  const size_t n = size_t{4096} * 2048;
  const std::vector<bf16> sh = random_inputs(n, 3, 4.0f), so = random_inputs(n, 4, 0.5f, 1000);
  const std::vector<bf16> first = gpu_residual(knobs(), sh, so);
  EXPECT_TRUE(same_bits(cpu_residual(knobs(), sh, so), first));
  EXPECT_TRUE(identical(first, gpu_residual(knobs(), sh, so))) << "a second run gave other bits";
}

TEST_P(ResidualGpu, InPlace) {
  const std::vector<bf16> h = random_inputs(5000, 5, 2.0f, 50), o = random_inputs(5000, 6, 2.0f);
  DeviceBuffer<bf16> dh(h);
  const DeviceBuffer<bf16> d_o(o);
  cuda::residual_fwd(knobs(), dh.get(), d_o.get(), dh.get(), h.size());
  EXPECT_TRUE(same_bits(cpu_residual(knobs(), h, o), dh.download()));
}

// sum_round over 0, 1, 3 (q, k, v) and the most parts, with specials among them.
TEST(SumRoundGpu, MatchesReference) {
  const size_t n = 1 << 20;
  for (int count : {0, 1, 3, cuda::kMaxSumParts}) {
    std::vector<std::vector<float>> parts;
    std::vector<DeviceBuffer<float>> device;
    std::vector<const float*> host_ptrs, device_ptrs;
    for (int p = 0; p < count; ++p) {
      parts.push_back(random_f32(n, 10 + p, p % 2 ? 1e-3f : 8.0f));
      const std::vector<bf16> special = random_inputs(n, 40 + p, 1.0f, 2000);
      for (size_t i = 0; i < n; i += 997) parts[p][i] = widen(special[i]);
      device.emplace_back(parts[p]);
      host_ptrs.push_back(parts[p].data());
      device_ptrs.push_back(device[p].get());
    }
    std::vector<bf16> want(n);
    ref::sum_round(host_ptrs.data(), count, want.data(), n);
    DeviceBuffer<bf16> out = poisoned<bf16>(n);
    cuda::sum_round(device_ptrs.data(), count, out.get(), n);
    EXPECT_TRUE(same_bits(want, out.download())) << count << " parts";
  }
}

TEST(SumRoundGpu, RefusesTooManyParts) {
  std::vector<const float*> ptrs(cuda::kMaxSumParts + 1, nullptr);
  EXPECT_THROW(cuda::sum_round(ptrs.data(), cuda::kMaxSumParts + 1, nullptr, 1), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Contracts, ResidualGpu, BP_V1_CONTRACTS);

}  // namespace
}  // namespace bp::test
