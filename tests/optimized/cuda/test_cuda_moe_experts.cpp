// bp::cuda moe_experts_fwd / moe_combine_fwd / moe_experts_bwd / moe_combine_bwd /
// moe_layer_fwd / moe_layer_bwd against the CPU reference, bit for bit, under both
// contracts and under a finer variant of each (short token chunks, a narrow lane
// shape): experts without rows, expert subsets [e_begin, e_end) (rows of other
// experts must stay untouched), an expert with several token chunks starting at
// offsets that are not chunk multiples, special values in activations and routing
// weights, the Qwen3-30B-A3B experts (H 2048, I 768, E 128, top-8) at T = 1 and
// 256, batch invariance and repeated runs.
//
// What the comparisons catch (each bug emulated on the CPU with this data): a wrong
// slot order in the combines changes about a fifth of the outputs where slots cancel
// (MoeCombineGpu); a routing weight applied to the rounded output, R(R(acc)·w),
// instead of the fp32 accumulator changes about a quarter of c (and dacc); a row
// scattered to the wrong (t, j) changes c, da_slot and dtopk_w; weight gradients
// token-chunked from the range's first row instead of each expert's (in the skewed
// plan expert 1 starts 300 = 2·128 + 44 rows into [0, E)) change 25-40% of its dW.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include "optimized/cuda/moe_experts.h"
#include "reference/ops/moe_experts.h"
#include "reference/ops/moe_router.h"
#include "tests/optimized/cuda_op_test.h"

namespace bp::test {
namespace {

struct Shape {
  int T, H, I, E, k;
};

// ---- Experts' weights: host copies and device copies, tables of both -------------
struct ExpertSet {
  int E = 0;
  std::vector<std::vector<bf16>> gate, up, down;  // empty for experts not held
  std::vector<DeviceBuffer<bf16>> d_gate, d_up, d_down;
  std::vector<const bf16*> hg, hu, hd, dg, du, dd;

  // Weights of the experts with held[e] only; the others are null in both tables.
  ExpertSet(const Shape& s, uint64_t seed, const std::vector<bool>& held)
      : E(s.E), gate(E), up(E), down(E), d_gate(E), d_up(E), d_down(E), hg(E), hu(E), hd(E), dg(E), du(E), dd(E) {
    const size_t n = size_t(s.I) * s.H;
    for (int e = 0; e < E; ++e) {
      if (!held[e]) continue;
      gate[e] = random_inputs(n, seed + 3 * e, 3.0f / std::sqrt(float(s.H)));
      up[e] = random_inputs(n, seed + 3 * e + 1, 3.0f / std::sqrt(float(s.H)));
      down[e] = random_inputs(n, seed + 3 * e + 2, 1.0f / std::sqrt(float(s.I)));
      d_gate[e] = DeviceBuffer<bf16>(gate[e]);
      d_up[e] = DeviceBuffer<bf16>(up[e]);
      d_down[e] = DeviceBuffer<bf16>(down[e]);
      hg[e] = gate[e].data(), hu[e] = up[e].data(), hd[e] = down[e].data();
      dg[e] = d_gate[e].get(), du[e] = d_up[e].get(), dd[e] = d_down[e].get();
    }
  }
  ref::ExpertWeights host() const { return {hg.data(), hu.data(), hd.data()}; }
  ref::ExpertWeights device() const { return {dg.data(), du.data(), dd.data()}; }
};

// Experts [begin, end) of E.
std::vector<bool> held_range(int E, int begin, int end) {
  std::vector<bool> held(E, false);
  for (int e = begin; e < end; ++e) held[e] = true;
  return held;
}

// ---- Gradients of experts [begin, end): host (NaN) and device (poisoned) ----------
struct GradSet {
  std::vector<std::vector<float>> host[3];  // gate, up, down
  std::vector<DeviceBuffer<float>> device[3];
  std::vector<float*> hp[3], dp[3];

  GradSet(const Shape& s, int begin, int end) {
    const size_t n = size_t(s.I) * s.H;
    for (int m = 0; m < 3; ++m) {
      host[m].resize(s.E);
      device[m].resize(s.E);
      hp[m].assign(s.E, nullptr);
      dp[m].assign(s.E, nullptr);
      for (int e = begin; e < end; ++e) {
        host[m][e].assign(n, NAN);
        device[m][e] = poisoned<float>(n);
        hp[m][e] = host[m][e].data();
        dp[m][e] = device[m][e].get();
      }
    }
  }
  ref::ExpertGrads host_view() { return {hp[0].data(), hp[1].data(), hp[2].data()}; }
  ref::ExpertGrads device_view() { return {dp[0].data(), dp[1].data(), dp[2].data()}; }

  void expect_equal(int begin, int end) const {
    const char* names[3] = {"dWg", "dWu", "dWd"};
    for (int m = 0; m < 3; ++m)
      for (int e = begin; e < end; ++e)
        EXPECT_TRUE(same_bits(host[m][e], device[m][e].download())) << names[m] << " of expert " << e;
  }
};

// ---- Routing: host ids and the reference's dispatch plan ---------------------------
struct Plan {
  std::vector<int> offset, token, slot;
  ref::MoeDispatch view() const {
    return {static_cast<int>(offset.size()) - 1, offset.data(), token.data(), slot.data()};
  }
};

// k distinct experts per token, never one with e % 7 == 3 (those have no rows);
// `skew`: expert 0 in every token's slot t % k, so it has T rows (several token
// chunks) and every other expert's rows start at offsets past them.
Plan make_plan(const Shape& s, uint64_t seed, bool skew) {
  FloatGen g(seed);
  std::vector<int> ids(size_t(s.T) * s.k);
  for (int t = 0; t < s.T; ++t) {
    int* id = &ids[size_t(t) * s.k];
    for (int j = 0; j < s.k; ++j) {
      if (skew && j == t % s.k) {
        id[j] = 0;
        continue;
      }
      int e;
      do e = g.range(skew ? 1 : 0, s.E - 1);
      while (e % 7 == 3 || std::find(id, id + j, e) != id + j || (skew && e == 0));
      id[j] = e;
    }
  }
  Plan p{std::vector<int>(s.E + 1), std::vector<int>(ids.size()), std::vector<int>(ids.size())};
  ref::moe_dispatch(ids.data(), s.T, s.k, s.E, p.offset.data(), p.token.data(), p.slot.data());
  return p;
}

struct Inputs {
  std::vector<bf16> a, topk_w, dout;
};

Inputs make_inputs(const Shape& s, uint64_t seed, int one_in) {
  return {random_inputs(size_t(s.T) * s.H, seed, 2.0f, one_in),
          random_inputs(size_t(s.T) * s.k, seed + 1, 0.5f, one_in),
          random_inputs(size_t(s.T) * s.H, seed + 2, 1.0f, one_in)};
}

// ---- Experts of a range, forward and backward, on both sides -------------------------
const bf16 kPoisonBf16{0x5a5a};
const float kPoisonF32 = float_of(0x5a5a5a5au);  // the bytes of poisoned<>()

void check_experts(const Knobs& kn, const Shape& s, const Plan& plan, const Inputs& in, const ExpertSet& w, int begin,
                   int end) {
  SCOPED_TRACE(::testing::Message() << "experts [" << begin << ", " << end << ")");
  const size_t rows = size_t(s.T) * s.k;
  const DeviceBuffer<bf16> a(in.a), topk_w(in.topk_w), dout(in.dout);
  // forward: rows of other experts keep the poison on both sides
  std::vector<bf16> c(rows * s.H, kPoisonBf16);
  ref::moe_experts_fwd(kn, plan.view(), begin, end, in.a.data(), in.topk_w.data(), w.host(), c.data(), s.k, s.H, s.I);
  auto d_c = poisoned<bf16>(c.size());
  cuda::moe_experts_fwd(kn, plan.view(), begin, end, a.get(), topk_w.get(), w.device(), d_c.get(), s.k, s.H, s.I);
  EXPECT_TRUE(same_bits(c, d_c.download())) << "c";
  // backward
  std::vector<float> da_slot(rows * s.H, kPoisonF32);
  std::vector<bf16> dtopk_w(rows, kPoisonBf16);
  GradSet grads(s, begin, end);
  ref::moe_experts_bwd(kn, plan.view(), begin, end, in.a.data(), in.topk_w.data(), w.host(), in.dout.data(),
                       da_slot.data(), dtopk_w.data(), grads.host_view(), s.k, s.H, s.I);
  auto d_da_slot = poisoned<float>(da_slot.size());
  auto d_dtopk_w = poisoned<bf16>(rows);
  cuda::moe_experts_bwd(kn, plan.view(), begin, end, a.get(), topk_w.get(), w.device(), dout.get(), d_da_slot.get(),
                        d_dtopk_w.get(), grads.device_view(), s.k, s.H, s.I);
  EXPECT_TRUE(same_bits(da_slot, d_da_slot.download())) << "da_slot";
  EXPECT_TRUE(same_bits(dtopk_w, d_dtopk_w.download())) << "dtopk_w";
  grads.expect_equal(begin, end);
}

class MoeExpertsGpu : public ContractTest {
 protected:
  // The contract with short token chunks and a narrow lane shape: more chunk
  // boundaries inside each expert, block row teams at small H.
  Knobs fine_knobs() const {
    Knobs kn = knobs();
    kn.grad_token_chunk = 5;
    kn.row_reduce = LaneShape{32, 1};
    return kn;
  }
};

TEST_P(MoeExpertsGpu, SmallShapesAndExpertRanges) {
  const Shape s{60, 64, 48, 16, 4};
  const Plan plan = make_plan(s, 1, false);
  const Inputs in = make_inputs(s, 2, 300);
  const ExpertSet w(s, 3, held_range(s.E, 0, s.E));
  for (const Knobs& kn : {knobs(), fine_knobs()})
    for (auto [b, e] : std::vector<std::pair<int, int>>{{0, 16}, {2, 9}, {3, 4}, {5, 5}, {15, 16}})
      check_experts(kn, s, plan, in, w, b, e);
}

TEST_P(MoeExpertsGpu, ExpertWithSeveralTokenChunks) {
  const Shape s{300, 96, 32, 8, 3};
  const Plan plan = make_plan(s, 4, true);
  ASSERT_EQ(plan.offset[1] - plan.offset[0], s.T);
  const Inputs in = make_inputs(s, 5, 0);
  const ExpertSet w(s, 6, held_range(s.E, 0, s.E));
  for (const Knobs& kn : {knobs(), fine_knobs()}) {
    check_experts(kn, s, plan, in, w, 0, s.E);
    check_experts(kn, s, plan, in, w, 1, s.E);
  }
}

// The real shape at 256 tokens, experts [40, 48) as on one EP rank (45 has no rows):
// the CPU reference of all 128 experts would take minutes.
TEST_P(MoeExpertsGpu, Qwen3MoeExpertsSubsetAt256Tokens) {
  const Shape s{256, 2048, 768, 128, 8};
  const Plan plan = make_plan(s, 7, false);
  const Inputs in = make_inputs(s, 8, 5000);
  const ExpertSet w(s, 9, held_range(s.E, 40, 48));
  check_experts(knobs(), s, plan, in, w, 40, 48);
}

TEST(MoeCombineGpu, ForwardAndBackwardSlotOrder) {
  const int T = 97, k = 8, H = 200;
  const size_t rows = size_t(T) * k;
  // Slot order shows only where the fp32 sum rounds and the result is far below its
  // partial sums: in every other (t, h) slots 0 and k/2 hold +B and −B, 2^16 above
  // the other slots, so the slots between them keep their bits only to B's ulp and
  // the slots after them keep all (in increasing order; in another order other
  // slots lose bits), and B cancels. Elsewhere small terms and specials.
  FloatGen g(2);
  const std::vector<uint16_t>& special = special_bf16();
  std::vector<bf16> c(rows * H);
  std::vector<float> da_slot(rows * H), router(size_t(T) * H);
  for (size_t i = 0; i < c.size(); ++i) {
    c[i].bits = g.chance(300) ? special[g.range(0, static_cast<int>(special.size()) - 1)] : g.bf(g.range(-4, 4));
    da_slot[i] = float_of(g.f32(g.range(-4, 4)));
  }
  for (size_t th = 0; th < size_t(T) * H; th += 2) {
    const size_t first = (th / H * k) * H + th % H, cancel = first + size_t(k / 2) * H;
    c[first].bits = g.bf(20) & 0x7fff;
    c[cancel].bits = c[first].bits | 0x8000;
    da_slot[first] = float_of(g.f32(20) & 0x7fffffffu);
    da_slot[cancel] = -da_slot[first];
  }
  for (float& x : router)
    x = float_of(g.chance(50) ? g.pick<uint32_t>({0x80000000u, 0x7f800000u, 0x7fc00000u}) : g.f32(g.range(-4, 4)));
  std::vector<bf16> out(size_t(T) * H);
  ref::moe_combine_fwd(c.data(), out.data(), T, k, H);
  const DeviceBuffer<bf16> d_c(c);
  auto d_out = poisoned<bf16>(out.size());
  cuda::moe_combine_fwd(d_c.get(), d_out.get(), T, k, H);
  EXPECT_TRUE(same_bits(out, d_out.download())) << "combine forward";
  const DeviceBuffer<float> d_da_slot(da_slot), d_router(router);
  for (bool with_router : {true, false}) {
    ref::moe_combine_bwd(da_slot.data(), with_router ? router.data() : nullptr, out.data(), T, k, H);
    cuda::moe_combine_bwd(d_da_slot.get(), with_router ? d_router.get() : nullptr, d_out.get(), T, k, H);
    EXPECT_TRUE(same_bits(out, d_out.download())) << "combine backward, router " << with_router;
  }
}

// ---- The whole layer ---------------------------------------------------------------
struct LayerOut {
  std::vector<bf16> out, da;
  std::vector<float> dwr;
};

struct Layer {
  Shape s;
  bool norm;
  std::vector<bf16> wr;
  const ExpertSet* w;
};

LayerOut reference_layer(const Knobs& kn, const Layer& L, const Inputs& in, GradSet& grads) {
  const Shape& s = L.s;
  LayerOut o{std::vector<bf16>(size_t(s.T) * s.H), std::vector<bf16>(size_t(s.T) * s.H),
             std::vector<float>(size_t(s.E) * s.H)};
  ref::moe_layer_fwd(kn, in.a.data(), L.wr.data(), L.w->host(), o.out.data(), s.T, s.H, s.E, s.k, s.I, L.norm);
  ref::moe_layer_bwd(kn, in.a.data(), L.wr.data(), L.w->host(), in.dout.data(), o.da.data(), o.dwr.data(),
                     grads.host_view(), s.T, s.H, s.E, s.k, s.I, L.norm);
  return o;
}

LayerOut gpu_layer(const Knobs& kn, const Layer& L, const Inputs& in, GradSet& grads) {
  const Shape& s = L.s;
  const DeviceBuffer<bf16> a(in.a), wr(L.wr), dout(in.dout);
  auto out = poisoned<bf16>(size_t(s.T) * s.H), da = poisoned<bf16>(size_t(s.T) * s.H);
  auto dwr = poisoned<float>(size_t(s.E) * s.H);
  cuda::moe_layer_fwd(kn, a.get(), wr.get(), L.w->device(), out.get(), s.T, s.H, s.E, s.k, s.I, L.norm);
  cuda::moe_layer_bwd(kn, a.get(), wr.get(), L.w->device(), dout.get(), da.get(), dwr.get(), grads.device_view(), s.T,
                      s.H, s.E, s.k, s.I, L.norm);
  return {out.download(), da.download(), dwr.download()};
}

void check_layer(const Knobs& kn, const Layer& L, const Inputs& in) {
  GradSet grads(L.s, 0, L.s.E);
  const LayerOut want = reference_layer(kn, L, in, grads), got = gpu_layer(kn, L, in, grads);
  EXPECT_TRUE(same_bits(want.out, got.out)) << "out";
  EXPECT_TRUE(same_bits(want.da, got.da)) << "da";
  EXPECT_TRUE(same_bits(want.dwr, got.dwr)) << "dwr";
  grads.expect_equal(0, L.s.E);
}

TEST_P(MoeExpertsGpu, LayerSmallShapes) {
  const Shape s{50, 64, 48, 16, 4};
  const ExpertSet w(s, 11, held_range(s.E, 0, s.E));
  const Inputs in = make_inputs(s, 12, 400);
  for (bool norm : {true, false})
    for (const Knobs& kn : {knobs(), fine_knobs()})
      check_layer(kn, Layer{s, norm, random_inputs(size_t(s.E) * s.H, 13, 0.3f), &w}, in);
}

// The real shape at one token: only the 8 experts its router picks hold weights
// (found by the reference router; the others are null, as on an EP rank).
TEST_P(MoeExpertsGpu, Qwen3MoeLayerOneToken) {
  const Shape s{1, 2048, 768, 128, 8};
  const Inputs in = make_inputs(s, 23, 0);
  const std::vector<bf16> wr = random_inputs(size_t(s.E) * s.H, 22, 0.1f);
  std::vector<bf16> logits(s.E), topk_w(s.k);
  std::vector<int> ids(s.k);
  ref::router_fwd(knobs(), in.a.data(), wr.data(), logits.data(), ids.data(), topk_w.data(), 1, s.H, s.E, s.k, true);
  std::vector<bool> held(s.E, false);
  for (int e : ids) held[e] = true;
  const ExpertSet w(s, 21, held);
  check_layer(knobs(), Layer{s, true, wr, &w}, in);
}

// A token's rows alone equal its rows in a batch: out and da (GPU against GPU).
TEST_P(MoeExpertsGpu, BatchInvariance) {
  const Shape s{48, 256, 128, 32, 4};
  const ExpertSet w(s, 31, held_range(s.E, 0, s.E));
  const Inputs in = make_inputs(s, 32, 0);
  const std::vector<bf16> wr = random_inputs(size_t(s.E) * s.H, 33, 0.3f);
  GradSet grads(s, 0, s.E);
  const LayerOut all = gpu_layer(knobs(), Layer{s, true, wr, &w}, in, grads);
  auto row = [&](const std::vector<bf16>& v, int t) {
    return std::vector<bf16>(v.begin() + size_t(t) * s.H, v.begin() + size_t(t + 1) * s.H);
  };
  for (int t : {0, 21, 47}) {
    const Shape one{1, s.H, s.I, s.E, s.k};
    const Inputs single{row(in.a, t), std::vector<bf16>(s.k), row(in.dout, t)};
    GradSet g1(one, 0, s.E);
    const LayerOut alone = gpu_layer(knobs(), Layer{one, true, wr, &w}, single, g1);
    EXPECT_TRUE(identical(row(all.out, t), alone.out)) << "out of token " << t;
    EXPECT_TRUE(identical(row(all.da, t), alone.da)) << "da of token " << t;
  }
}

TEST_P(MoeExpertsGpu, RepeatedRunsGiveSameBits) {
  const Shape s{200, 256, 128, 32, 8};
  const ExpertSet w(s, 41, held_range(s.E, 0, s.E));
  const Inputs in = make_inputs(s, 42, 1000);
  const Layer L{s, true, random_inputs(size_t(s.E) * s.H, 43, 0.3f), &w};
  GradSet g1(s, 0, s.E), g2(s, 0, s.E);
  const LayerOut a = gpu_layer(knobs(), L, in, g1), b = gpu_layer(knobs(), L, in, g2);
  EXPECT_TRUE(identical(a.out, b.out) && identical(a.da, b.da) && identical(a.dwr, b.dwr));
  for (int m = 0; m < 3; ++m)
    for (int e = 0; e < s.E; ++e)
      EXPECT_TRUE(identical(g1.device[m][e].download(), g2.device[m][e].download())) << m << " " << e;
}

TEST_P(MoeExpertsGpu, RejectsBadRangeAndMissingWeights) {
  const Shape s{4, 32, 16, 8, 2};
  const Plan plan = make_plan(s, 51, false);
  const ExpertSet none(s, 52, held_range(s.E, 0, 0));
  const DeviceBuffer<bf16> a(std::vector<bf16>(size_t(s.T) * s.H)), topk_w(std::vector<bf16>(size_t(s.T) * s.k));
  DeviceBuffer<bf16> c(size_t(s.T) * s.k * s.H);
  EXPECT_THROW(
      cuda::moe_experts_fwd(knobs(), plan.view(), 3, 2, a.get(), topk_w.get(), none.device(), c.get(), s.k, s.H, s.I),
      std::invalid_argument);
  EXPECT_THROW(
      cuda::moe_experts_fwd(knobs(), plan.view(), 0, s.E, a.get(), topk_w.get(), none.device(), c.get(), s.k, s.H, s.I),
      std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Contracts, MoeExpertsGpu, BP_V1_CONTRACTS);

}  // namespace
}  // namespace bp::test
