// bp::cuda swiglu_fwd / swiglu_bwd and the dense MLP composites (mlp_fwd, mlp_bwd,
// which run every other mlp_* function) against the CPU reference, bit for bit.
#include "optimized/cuda/swiglu.h"
#include "reference/ops/swiglu.h"
#include "tests/optimized/cuda_op_test.h"

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

// ---- The dense MLP composites, both contracts -----------------------------------
struct MlpShape {
  int T, H, I;
};

struct MlpOut {
  std::vector<bf16> d, da;
  std::vector<float> dwg, dwu, dwd;
};

struct MlpInputs {
  std::vector<bf16> a, wg, wu, wd, dd;
};

MlpInputs mlp_inputs(const MlpShape& s, uint64_t seed) {
  const size_t w = size_t(s.I) * s.H;
  return {random_inputs(size_t(s.T) * s.H, seed, 2.0f, 3000), random_inputs(w, seed + 1, 0.05f),
          random_inputs(w, seed + 2, 0.05f), random_inputs(w, seed + 3, 0.05f),
          random_inputs(size_t(s.T) * s.H, seed + 4, 1.0f, 3000)};
}

MlpOut mlp_reference(const Knobs& kn, const MlpShape& s, const MlpInputs& in) {
  const size_t rows = size_t(s.T) * s.H, w = size_t(s.I) * s.H;
  MlpOut o{std::vector<bf16>(rows), std::vector<bf16>(rows), std::vector<float>(w), std::vector<float>(w),
           std::vector<float>(w)};
  ref::mlp_fwd(kn, in.a.data(), in.wg.data(), in.wu.data(), in.wd.data(), o.d.data(), s.T, s.H, s.I);
  ref::mlp_bwd(kn, in.a.data(), in.wg.data(), in.wu.data(), in.wd.data(), in.dd.data(), o.da.data(), o.dwg.data(),
               o.dwu.data(), o.dwd.data(), s.T, s.H, s.I);
  return o;
}

MlpOut mlp_gpu(const Knobs& kn, const MlpShape& s, const MlpInputs& in) {
  const size_t rows = size_t(s.T) * s.H, w = size_t(s.I) * s.H;
  const DeviceBuffer<bf16> a(in.a), wg(in.wg), wu(in.wu), wd(in.wd), dd(in.dd);
  auto d = poisoned<bf16>(rows), da = poisoned<bf16>(rows);
  auto dwg = poisoned<float>(w), dwu = poisoned<float>(w), dwd = poisoned<float>(w);
  cuda::mlp_fwd(kn, a.get(), wg.get(), wu.get(), wd.get(), d.get(), s.T, s.H, s.I);
  cuda::mlp_bwd(kn, a.get(), wg.get(), wu.get(), wd.get(), dd.get(), da.get(), dwg.get(), dwu.get(), dwd.get(), s.T,
                s.H, s.I);
  return {d.download(), da.download(), dwg.download(), dwu.download(), dwd.download()};
}

using MlpGpu = ContractTest;

// Small odd shapes (a partial token chunk, chunks not multiples of 8) and
// Qwen3-0.6B's MLP (H 1024, I 3072) over more than one token chunk.
TEST_P(MlpGpu, ForwardAndBackwardMatchReference) {
  for (const MlpShape& s : {MlpShape{37, 64, 40}, MlpShape{130, 1024, 3072}}) {
    const MlpInputs in = mlp_inputs(s, 60 + s.T);
    const MlpOut want = mlp_reference(knobs(), s, in), got = mlp_gpu(knobs(), s, in);
    EXPECT_TRUE(same_bits(want.d, got.d)) << "d, T " << s.T;
    EXPECT_TRUE(same_bits(want.da, got.da)) << "da, T " << s.T;
    EXPECT_TRUE(same_bits(want.dwg, got.dwg)) << "dwg, T " << s.T;
    EXPECT_TRUE(same_bits(want.dwu, got.dwu)) << "dwu, T " << s.T;
    EXPECT_TRUE(same_bits(want.dwd, got.dwd)) << "dwd, T " << s.T;
  }
}

INSTANTIATE_TEST_SUITE_P(Contracts, MlpGpu, BP_V1_CONTRACTS);

}  // namespace
}  // namespace bp::test
