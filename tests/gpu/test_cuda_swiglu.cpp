// bp::cuda swiglu_fwd / swiglu_bwd against the CPU reference, bit for bit.
#include "optimized/cuda/swiglu.h"
#include "reference/ops/swiglu.h"
#include "tests/gpu/cuda_op_test.h"

namespace bp::test {
namespace {

struct Grads {
  std::vector<bf16> dg, du;
};

struct Inputs {
  std::vector<bf16> g, u, dm;
};

// Every (g, u) pair of special values with dm cycling through them, then random
// bit patterns (silu and its derivative over every exponent).
Inputs edge_and_random_inputs(size_t random_n) {
  Inputs in;
  const std::vector<uint16_t>& s = special_bf16();
  for (size_t a = 0; a < s.size(); ++a)
    for (size_t b = 0; b < s.size(); ++b) {
      in.g.push_back({s[a]});
      in.u.push_back({s[b]});
      in.dm.push_back({s[(a + b) % s.size()]});
    }
  for (auto* v : {&in.g, &in.u, &in.dm}) {
    const std::vector<bf16> r = random_bit_patterns(random_n, 100 + (v == &in.u) + 2 * (v == &in.dm));
    v->insert(v->end(), r.begin(), r.end());
  }
  return in;
}

// Qwen3-0.6B's MLP hidden [4096][3072]: gate values across the range where silu bends.
Inputs real_shape_inputs() {
  const size_t n = size_t{4096} * 3072;
  return {random_inputs(n, 7, 12.0f, 5000), random_inputs(n, 8, 2.0f), random_inputs(n, 9, 1e-2f)};
}

std::vector<bf16> gpu_fwd(const Inputs& in) {
  const int n = static_cast<int>(in.g.size());
  const DeviceBuffer<bf16> g(in.g), u(in.u);
  DeviceBuffer<bf16> m = poisoned<bf16>(n);
  cuda::swiglu_fwd(g.get(), u.get(), m.get(), n);
  return m.download();
}

Grads gpu_bwd(const Inputs& in) {
  const int n = static_cast<int>(in.g.size());
  const DeviceBuffer<bf16> g(in.g), u(in.u), dm(in.dm);
  DeviceBuffer<bf16> dg = poisoned<bf16>(n), du = poisoned<bf16>(n);
  cuda::swiglu_bwd(g.get(), u.get(), dm.get(), dg.get(), du.get(), n);
  return {dg.download(), du.download()};
}

void expect_matches_reference(const Inputs& in) {
  const int n = static_cast<int>(in.g.size());
  std::vector<bf16> m(n);
  Grads want{std::vector<bf16>(n), std::vector<bf16>(n)};
  ref::swiglu_fwd(in.g.data(), in.u.data(), m.data(), n);
  ref::swiglu_bwd(in.g.data(), in.u.data(), in.dm.data(), want.dg.data(), want.du.data(), n);
  EXPECT_TRUE(same_bits(m, gpu_fwd(in))) << "m";
  const Grads got = gpu_bwd(in);
  EXPECT_TRUE(same_bits(want.dg, got.dg)) << "dg";
  EXPECT_TRUE(same_bits(want.du, got.du)) << "du";
}

// swiglu has no knob: one run covers both contracts.
TEST(SwigluGpu, EdgeValuesAndRandomBitPatterns) { expect_matches_reference(edge_and_random_inputs(1 << 22)); }

TEST(SwigluGpu, Qwen3MlpHiddenShape) { expect_matches_reference(real_shape_inputs()); }

TEST(SwigluGpu, RepeatedRunsGiveSameBits) {
  const Inputs in = real_shape_inputs();
  EXPECT_TRUE(identical(gpu_fwd(in), gpu_fwd(in)));
  const Grads a = gpu_bwd(in), b = gpu_bwd(in);
  EXPECT_TRUE(identical(a.dg, b.dg) && identical(a.du, b.du));
}

}  // namespace
}  // namespace bp::test
