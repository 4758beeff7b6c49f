// bp::cuda rope_fwd / rope_bwd against the CPU reference, bit for bit, with the
// tables built on the host by ref::rope_tables and copied to the device.
#include "optimized/cuda/rope.h"
#include "reference/ops/rope.h"
#include "tests/optimized/cuda_op_test.h"

namespace bp::test {
namespace {

constexpr float kTheta = 1e6f;  // Qwen3 rope_theta
constexpr int kMaxPos = 40960;  // Qwen3 max_position_embeddings

struct Tables {
  int head_dim;
  std::vector<bf16> cos, sin;
  DeviceBuffer<bf16> dcos, dsin;
  explicit Tables(int D) : head_dim(D), cos(size_t{kMaxPos} * D / 2), sin(cos.size()) {
    ref::rope_tables(kTheta, D, kMaxPos, cos.data(), sin.data());
    dcos = DeviceBuffer<bf16>(cos);
    dsin = DeviceBuffer<bf16>(sin);
  }
  ref::RopeTable host() const { return {cos.data(), sin.data(), kMaxPos, head_dim}; }
  ref::RopeTable device() const { return {dcos.get(), dsin.get(), kMaxPos, head_dim}; }
};

const Tables& tables(int D) {
  static const Tables t128(128), t64(64);
  return D == 128 ? t128 : t64;
}

struct Case {
  int T, H, D;
};

// Positions over the whole table (0 included), x with a special value in 200.
struct Inputs {
  std::vector<int32_t> pos;
  std::vector<bf16> x;
};
Inputs make_inputs(Case c, uint64_t seed) {
  Inputs in{std::vector<int32_t>(c.T), random_inputs(size_t(c.T) * c.H * c.D, seed, 3.0f, 200)};
  for (int t = 0; t < c.T; ++t) in.pos[t] = t == 0 ? 0 : static_cast<int32_t>(counter_hash(seed + 1, t) % kMaxPos);
  return in;
}

std::vector<bf16> cpu_rope(const Knobs& kn, Case c, const Inputs& in, bool backward) {
  std::vector<bf16> out(in.x.size());
  const ref::RopeTable t = tables(c.D).host();
  if (backward)
    ref::rope_bwd(kn, t, in.pos.data(), in.x.data(), out.data(), c.T, c.H);
  else
    ref::rope_fwd(kn, t, in.pos.data(), in.x.data(), out.data(), c.T, c.H);
  return out;
}

std::vector<bf16> gpu_rope(const Knobs& kn, Case c, const Inputs& in, bool backward) {
  const DeviceBuffer<int32_t> pos(in.pos);
  const DeviceBuffer<bf16> x(in.x);
  DeviceBuffer<bf16> out = poisoned<bf16>(in.x.size());
  const ref::RopeTable t = tables(c.D).device();
  if (backward)
    cuda::rope_bwd(kn, t, pos.get(), x.get(), out.get(), c.T, c.H);
  else
    cuda::rope_fwd(kn, t, pos.get(), x.get(), out.get(), c.T, c.H);
  return out.download();
}

using RopeGpu = ContractTest;

// Qwen3-30B-A3B q and k (32 and 4 heads of 128) at 4096 tokens, a decode step,
// and head_dim 64.
TEST_P(RopeGpu, MatchesReference) {
  for (Case c : {Case{4096, 32, 128}, Case{4096, 4, 128}, Case{1, 16, 128}, Case{7, 16, 64}}) {
    const Inputs in = make_inputs(c, 11 + c.T + c.H);
    for (bool backward : {false, true}) {
      const std::vector<bf16> got = gpu_rope(knobs(), c, in, backward);
      EXPECT_TRUE(same_bits(cpu_rope(knobs(), c, in, backward), got))
          << (backward ? "bwd" : "fwd") << " T=" << c.T << " H=" << c.H << " D=" << c.D;
      EXPECT_TRUE(identical(got, gpu_rope(knobs(), c, in, backward))) << "a second run gave other bits";
    }
  }
}

TEST_P(RopeGpu, InPlace) {
  const Case c{33, 8, 128};
  const Inputs in = make_inputs(c, 21);
  const DeviceBuffer<int32_t> pos(in.pos);
  DeviceBuffer<bf16> x(in.x);
  cuda::rope_fwd(knobs(), tables(c.D).device(), pos.get(), x.get(), x.get(), c.T, c.H);
  EXPECT_TRUE(same_bits(cpu_rope(knobs(), c, in, false), x.download()));
}

// A position outside the table: the reference's exception and message, and
// nothing written.
TEST_P(RopeGpu, RefusesPositionOutsideTable) {
  const Case c{5, 2, 128};
  for (int32_t bad : {kMaxPos, -1}) {
    Inputs in = make_inputs(c, 31);
    in.pos[3] = bad;
    std::string want;
    try {
      cpu_rope(knobs(), c, in, false);
    } catch (const std::invalid_argument& e) {
      want = e.what();
    }
    ASSERT_FALSE(want.empty());
    const DeviceBuffer<int32_t> pos(in.pos);
    const DeviceBuffer<bf16> x(in.x);
    DeviceBuffer<bf16> out = poisoned<bf16>(in.x.size());
    const std::vector<bf16> before = out.download();
    try {
      cuda::rope_fwd(knobs(), tables(c.D).device(), pos.get(), x.get(), out.get(), c.T, c.H);
      ADD_FAILURE() << "position " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(want, e.what());
    }
    EXPECT_TRUE(identical(before, out.download())) << "written before the refusal";
  }
}

INSTANTIATE_TEST_SUITE_P(Contracts, RopeGpu, BP_V1_CONTRACTS);

}  // namespace
}  // namespace bp::test
