// The data movement and partial reductions the rank and model programs call
// (optimized/cuda/rows.h) against the host backend's (reference/model/
// host/backend.h), bit for bit: reduce_partials in the three orders over partials
// at scattered offsets, for partial counts that are and are not powers of two;
// round_to_bf16 over every kind of float; copy_rows. Negative control: the tree
// and the chain differ, so the comparison sees the order.
#include <algorithm>
#include <random>

#include "host/backend.h"
#include "optimized/cuda/rows.h"
#include "tests/optimized/cuda_op_test.h"

namespace bp::test {
namespace {

std::vector<float> wide_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mant(rng), exponent(rng));
  for (size_t i = 0; i < n; i += 97) v[i] = -0.0f;  // signed zeros, where an extra +0 would show
  return v;
}

std::vector<float> gpu_reduce(const std::vector<float>& base, const std::vector<size_t>& offsets, size_t n,
                              PartialSum how) {
  const DeviceBuffer<float> d_base(base);
  DeviceBuffer<float> out = poisoned<float>(n);
  cuda::reduce_partials(d_base.get(), offsets, n, how, out.get());
  return out.download();
}

std::vector<float> host_reduce(const std::vector<float>& base, const std::vector<size_t>& offsets, size_t n,
                               PartialSum how) {
  std::vector<float> out(n);
  host::HostBackend{}.reduce_partials(base.data(), offsets, n, how, out.data());
  return out;
}

TEST(RowsGpu, ReducePartialsMatchesHostInEveryOrder) {
  const size_t n = 3001;
  for (int parts : {1, 2, 3, 4, 5, 8, 33, 100}) {
    const std::vector<float> base = wide_floats(n * static_cast<size_t>(parts) + 7, static_cast<uint32_t>(parts));
    std::vector<size_t> offsets;  // partial j at a scattered place: last first, shifted by 7
    for (int j = 0; j < parts; ++j) offsets.push_back(7 + static_cast<size_t>(parts - 1 - j) * n);
    for (PartialSum how : {PartialSum::Tree, PartialSum::Chain, PartialSum::Ring})
      EXPECT_TRUE(same_bits(host_reduce(base, offsets, n, how), gpu_reduce(base, offsets, n, how)))
          << parts << " partials, order " << static_cast<int>(how);
  }
}

TEST(RowsGpu, NegativeControlTreeAndChainDiffer) {
  const size_t n = 3001;
  const std::vector<float> base = wide_floats(n * 8, 8);
  std::vector<size_t> offsets;
  for (size_t j = 0; j < 8; ++j) offsets.push_back(j * n);
  EXPECT_FALSE(same_bits(gpu_reduce(base, offsets, n, PartialSum::Tree),
                         gpu_reduce(base, offsets, n, PartialSum::Chain)));
}

TEST(RowsGpu, RoundToBf16MatchesHost) {
  std::vector<float> x = wide_floats(1 << 20, 1);
  std::mt19937 rng(2);
  for (int i = 0; i < (1 << 20); ++i) x.push_back(float_of(static_cast<uint32_t>(rng())));  // NaNs, Infs, subnormals
  std::vector<bf16> want(x.size());
  host::HostBackend{}.round_to_bf16(x.data(), want.data(), x.size());
  const DeviceBuffer<float> dx(x);
  DeviceBuffer<bf16> out = poisoned<bf16>(x.size());
  cuda::round_to_bf16(dx.get(), out.get(), x.size());
  EXPECT_TRUE(same_bits(want, out.download()));
}

TEST(RowsGpu, CopyRowsMatchesHost) {
  const size_t width = 37, rows = 500;
  std::vector<int> src(rows * width);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int>(i * 2654435761u);
  std::vector<int> from, to;
  for (int i = 0; i < 300; ++i) {
    from.push_back((i * 7) % static_cast<int>(rows));  // rows may repeat as sources
    to.push_back(static_cast<int>(rows) - 1 - i);      // not as destinations
  }
  std::vector<int> want(rows * width, -1);
  host::HostBackend{}.copy_rows(src.data(), width, from, want.data(), to);
  const DeviceBuffer<int> d_src(src);
  DeviceBuffer<int> d_dst(std::vector<int>(rows * width, -1));
  cuda::copy_rows(d_src.get(), width, from, d_dst.get(), to);
  EXPECT_EQ(want, d_dst.download());
}

}  // namespace
}  // namespace bp::test
