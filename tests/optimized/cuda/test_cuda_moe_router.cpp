// bp::cuda router_probs / router_topk / router_fwd / router_bwd against the CPU
// reference, bit for bit, under both v1 contracts (v2 changes no router bits):
// random inputs with special values,
// rows full of ties, ±0, ±Inf and NaN (the top-k order: ties to the lower id, NaN
// above every number), both norm_topk_prob settings, the Qwen3-30B-A3B router
// (H 2048, E 128, top-8) at T = 1 and 200, batch invariance and repeated runs.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "optimized/cuda/moe_router.h"
#include "reference/ops/moe_router.h"
#include "tests/optimized/cuda_op_test.h"

namespace bp::test {
namespace {

struct Shape {
  int T, H, E, k;
  bool norm;
};

struct RouterInputs {
  std::vector<bf16> a, wr, dtopk_w;
};

// Activations with one special value in `one_in`, weights scaled so that the
// logits spread over a few units (a realistic softmax), weight gradients random.
RouterInputs make_inputs(const Shape& s, uint64_t seed, int one_in) {
  return {random_inputs(size_t(s.T) * s.H, seed, 2.0f, one_in), random_inputs(size_t(s.E) * s.H, seed + 1, 0.1f),
          random_inputs(size_t(s.T) * s.k, seed + 2, 1.0f, one_in)};
}

struct RouterOut {
  std::vector<bf16> logits, topk_w, dlogits;
  std::vector<int> ids;
  std::vector<float> da_acc, dwr;
};

RouterOut reference(const Knobs& kn, const Shape& s, const RouterInputs& in) {
  RouterOut o{std::vector<bf16>(size_t(s.T) * s.E),  std::vector<bf16>(size_t(s.T) * s.k),
              std::vector<bf16>(size_t(s.T) * s.E),  std::vector<int>(size_t(s.T) * s.k),
              std::vector<float>(size_t(s.T) * s.H), std::vector<float>(size_t(s.E) * s.H)};
  ref::router_fwd(kn, in.a.data(), in.wr.data(), o.logits.data(), o.ids.data(), o.topk_w.data(), s.T, s.H, s.E, s.k,
                  s.norm);
  ref::router_bwd(kn, in.a.data(), in.wr.data(), o.logits.data(), o.ids.data(), in.dtopk_w.data(), o.dlogits.data(),
                  o.da_acc.data(), o.dwr.data(), s.T, s.H, s.E, s.k, s.norm);
  return o;
}

RouterOut gpu(const Knobs& kn, const Shape& s, const RouterInputs& in) {
  const DeviceBuffer<bf16> a(in.a), wr(in.wr), dtw(in.dtopk_w);
  auto logits = poisoned<bf16>(size_t(s.T) * s.E), topk_w = poisoned<bf16>(size_t(s.T) * s.k),
       dlogits = poisoned<bf16>(size_t(s.T) * s.E);
  auto ids = poisoned<int>(size_t(s.T) * s.k);
  auto da_acc = poisoned<float>(size_t(s.T) * s.H), dwr = poisoned<float>(size_t(s.E) * s.H);
  cuda::router_fwd(kn, a.get(), wr.get(), logits.get(), ids.get(), topk_w.get(), s.T, s.H, s.E, s.k, s.norm);
  cuda::router_bwd(kn, a.get(), wr.get(), logits.get(), ids.get(), dtw.get(), dlogits.get(), da_acc.get(), dwr.get(),
                   s.T, s.H, s.E, s.k, s.norm);
  return {logits.download(), topk_w.download(), dlogits.download(), ids.download(), da_acc.download(), dwr.download()};
}

void expect_same(const RouterOut& want, const RouterOut& got) {
  EXPECT_TRUE(same_bits(want.logits, got.logits)) << "logits";
  EXPECT_EQ(want.ids, got.ids) << "ids";
  EXPECT_TRUE(same_bits(want.topk_w, got.topk_w)) << "topk_w";
  EXPECT_TRUE(same_bits(want.dlogits, got.dlogits)) << "dlogits";
  EXPECT_TRUE(same_bits(want.da_acc, got.da_acc)) << "da_acc";
  EXPECT_TRUE(same_bits(want.dwr, got.dwr)) << "dwr";
}

void expect_matches_reference(const Knobs& kn, const Shape& s, uint64_t seed, int one_in) {
  const RouterInputs in = make_inputs(s, seed, one_in);
  expect_same(reference(kn, s, in), gpu(kn, s, in));
}

using RouterGpu = ContractTest;

TEST_P(RouterGpu, SmallShapesBothNormalisations) {
  for (bool norm : {true, false}) {
    expect_matches_reference(knobs(), {37, 64, 16, 4, norm}, 11, 0);
    expect_matches_reference(knobs(), {19, 96, 24, 24, norm}, 12, 50);  // k = E
    expect_matches_reference(knobs(), {5, 40, 300, 3, norm}, 13, 0);    // E above a warp's 32 runs: block teams
  }
}

TEST_P(RouterGpu, Qwen3MoeRouterShape) {
  for (int T : {1, 200}) expect_matches_reference(knobs(), {T, 2048, 128, 8, true}, 20 + T, T == 1 ? 0 : 2000);
}

// Logits from a small set of values: most rows are all ties, several hold ±0,
// ±Inf and NaN. probs and the selection are compared on them directly.
std::vector<bf16> tie_logits(int T, int E, uint64_t seed) {
  const uint16_t values[] = {0x0000, 0x8000, 0x3f80, 0xbf80, 0x4000, 0x7f80, 0xff80, 0x7fc0, 0x3f81};
  FloatGen g(seed);
  std::vector<bf16> v(size_t(T) * E);
  for (int t = 0; t < T; ++t) {
    const int kinds = 1 + t % 9;  // row t draws from the first `kinds` values: row 0 is all +0
    for (int e = 0; e < E; ++e) v[size_t(t) * E + e].bits = values[g.range(0, kinds - 1)];
  }
  return v;
}

TEST_P(RouterGpu, TiesSignedZerosInfAndNan) {
  const int T = 90, E = 128, k = 8;
  const std::vector<bf16> logits = tie_logits(T, E, 5);
  std::vector<float> probs(size_t(T) * E), weights(size_t(T) * k);
  std::vector<int> ids(size_t(T) * k);
  ref::router_probs(knobs(), logits.data(), probs.data(), T, E);
  const DeviceBuffer<bf16> d_logits(logits);
  auto d_probs = poisoned<float>(probs.size()), d_weights = poisoned<float>(weights.size());
  auto d_ids = poisoned<int>(ids.size());
  cuda::router_probs(knobs(), d_logits.get(), d_probs.get(), T, E);
  EXPECT_TRUE(same_bits(probs, d_probs.download())) << "probs";
  for (bool norm : {true, false}) {
    ref::router_topk(probs.data(), ids.data(), weights.data(), T, E, k, norm);
    cuda::router_topk(d_probs.get(), d_ids.get(), d_weights.get(), T, E, k, norm);
    EXPECT_EQ(ids, d_ids.download()) << "ids, norm " << norm;
    EXPECT_TRUE(same_bits(weights, d_weights.download())) << "weights, norm " << norm;
  }
}

// Probabilities with exact ties, ±0 and NaN given straight to router_topk.
TEST(RouterTopkGpu, TotalOrderOnCraftedProbabilities) {
  const int T = 64, E = 40, k = 6;
  FloatGen g(9);
  const float values[] = {0.5f, 0.25f, 0.0f, -0.0f, 0.125f, float_of(kCanonicalNanF32), float_of(0xffc00001u)};
  std::vector<float> probs(size_t(T) * E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) probs[size_t(t) * E + e] = values[g.range(0, 1 + t % 6)];
  std::vector<float> weights(size_t(T) * k);
  std::vector<int> ids(size_t(T) * k);
  const DeviceBuffer<float> d_probs(probs);
  auto d_weights = poisoned<float>(weights.size());
  auto d_ids = poisoned<int>(ids.size());
  ref::router_topk(probs.data(), ids.data(), weights.data(), T, E, k, false);
  cuda::router_topk(d_probs.get(), d_ids.get(), d_weights.get(), T, E, k, false);
  EXPECT_EQ(ids, d_ids.download());
  EXPECT_TRUE(same_bits(weights, d_weights.download()));
}

// Each token's rows computed alone equal its rows in the batch (GPU against GPU).
TEST_P(RouterGpu, BatchInvariance) {
  const Shape batch{64, 2048, 128, 8, true};
  const RouterInputs in = make_inputs(batch, 31, 0);
  const RouterOut all = gpu(knobs(), batch, in);
  for (int t : {0, 17, 63}) {
    const Shape one{1, batch.H, batch.E, batch.k, batch.norm};
    const RouterInputs single{
        std::vector<bf16>(in.a.begin() + size_t(t) * batch.H, in.a.begin() + size_t(t + 1) * batch.H), in.wr,
        std::vector<bf16>(in.dtopk_w.begin() + size_t(t) * batch.k, in.dtopk_w.begin() + size_t(t + 1) * batch.k)};
    const RouterOut alone = gpu(knobs(), one, single);
    auto row = [t](const auto& v, int width) {
      return std::vector(v.begin() + size_t(t) * width, v.begin() + size_t(t + 1) * width);
    };
    EXPECT_TRUE(identical(row(all.logits, batch.E), alone.logits)) << t;
    EXPECT_EQ(row(all.ids, batch.k), alone.ids) << t;
    EXPECT_TRUE(identical(row(all.topk_w, batch.k), alone.topk_w)) << t;
    EXPECT_TRUE(identical(row(all.dlogits, batch.E), alone.dlogits)) << t;
    EXPECT_TRUE(identical(row(all.da_acc, batch.H), alone.da_acc)) << t;
  }
}

TEST_P(RouterGpu, RepeatedRunsGiveSameBits) {
  const Shape s{200, 2048, 128, 8, true};
  const RouterInputs in = make_inputs(s, 41, 500);
  const RouterOut a = gpu(knobs(), s, in), b = gpu(knobs(), s, in);
  EXPECT_TRUE(identical(a.logits, b.logits) && a.ids == b.ids && identical(a.topk_w, b.topk_w));
  EXPECT_TRUE(identical(a.dlogits, b.dlogits) && identical(a.da_acc, b.da_acc) && identical(a.dwr, b.dwr));
}

TEST_P(RouterGpu, RejectsBadTopkAndIds) {
  const int T = 2, H = 32, E = 4;
  const DeviceBuffer<bf16> a(std::vector<bf16>(T * H)), wr(std::vector<bf16>(E * H)), logits(std::vector<bf16>(T * E)),
      dtw(std::vector<bf16>(T * 2));
  DeviceBuffer<int> ids(T * 2);
  DeviceBuffer<bf16> topk_w(T * 5), dlogits(T * E);
  DeviceBuffer<float> da(T * H), dwr(E * H);
  EXPECT_THROW(cuda::router_fwd(knobs(), a.get(), wr.get(), dlogits.get(), ids.get(), topk_w.get(), T, H, E, 5, true),
               std::invalid_argument);
  const DeviceBuffer<int> bad_ids(std::vector<int>{0, 1, 2, 4});
  EXPECT_THROW(cuda::router_bwd(knobs(), a.get(), wr.get(), logits.get(), bad_ids.get(), dtw.get(), dlogits.get(),
                                da.get(), dwr.get(), T, H, E, 2, true),
               std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Contracts, RouterGpu, BP_V1_CONTRACTS);

}  // namespace
}  // namespace bp::test
