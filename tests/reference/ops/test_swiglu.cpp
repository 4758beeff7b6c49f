// swiglu and the dense MLP: every rounding point against float64 truth with a
// derived bound (stage by stage, on the stage's own bf16 inputs; the composite is
// then checked to be exactly the chain of stages), truth against finite
// differences, batch invariance, negative controls, golden digests, edge inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "reference/common/rng.h"
#include "reference/numerics/chunked.h"
#include "reference/ops/linear.h"
#include "reference/ops/swiglu.h"
#include "reference/truth/swiglu.h"
#include "support/bounds.h"
#include "support/golden.h"
#include "support/stage_bounds.h"

namespace bp {
namespace {

using test::BoundCheck;
using truth::MatD;

class SwigluTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
};

// Random dense-MLP problem: a [T][H], gate/up [I][H], down [H][I], dd [T][H].
struct Mlp {
  int T, H, I;
  std::vector<bf16> a, wg, wu, wd, dd;
  Mlp(int T_, int H_, int I_, uint64_t seed) : T(T_), H(H_), I(I_) {
    const float gate_scale = 3.0f / std::sqrt(float(H));  // gate values spread over silu's curved range
    a = random_bf16(size_t(T) * H, seed, 1.0f);
    wg = random_bf16(size_t(I) * H, seed + 1, gate_scale);
    wu = random_bf16(size_t(I) * H, seed + 2, gate_scale);
    wd = random_bf16(size_t(H) * I, seed + 3, 1.0f / std::sqrt(float(I)));
    dd = random_bf16(size_t(T) * H, seed + 4, 1.0f);
  }
};

bool same_bits(const std::vector<bf16>& x, const std::vector<bf16>& y) { return test::digest(x) == test::digest(y); }
bool same_bits(const std::vector<float>& x, const std::vector<float>& y) { return test::digest(x) == test::digest(y); }

// Elementwise swiglu over gate values spread across silu's whole range (|g| from
// 2^-20 to 2^7, both signs) and random up / dm values.
TEST(Swiglu, ElementwiseWithinDerivedBound) {
  const size_t n = 16384;
  std::vector<bf16> g(n), u = random_bf16(n, 21, 2.0f), dm = random_bf16(n, 22, 2.0f), m(n), dg(n), du(n);
  for (size_t i = 0; i < n; ++i) {
    const float mant = 1.0f + 0.5f * (counter_uniform(23, i) + 1.0f);  // [1, 2)
    g[i] = round_bf16(std::ldexp(counter_uniform(24, i) < 0 ? -mant : mant, int(i % 28) - 20));
  }
  ref::swiglu_fwd(g.data(), u.data(), m.data(), int(n));
  ref::swiglu_bwd(g.data(), u.data(), dm.data(), dg.data(), du.data(), int(n));
  BoundCheck m_chk("swiglu m"), dg_chk("swiglu dg"), du_chk("swiglu du");
  test::check_swiglu_fwd(g.data(), u.data(), m.data(), n, m_chk);
  test::check_swiglu_bwd(g.data(), u.data(), dm.data(), dg.data(), du.data(), n, dg_chk, du_chk);
}

// Forward: gate and up (dots over H), swiglu, down (dot over I in C chunks), each
// within its bound on its own bf16 inputs; mlp_fwd is exactly that chain.
TEST_P(SwigluTest, ForwardStagesWithinDerivedBound) {
  // tiny; Qwen3-0.6B; I = 100, not a multiple of tp_tree_width (fixed chunks of 13, the last 9: SPEC.md §2.4.1)
  for (const auto& [T, H, I] : {std::tuple{37, 72, 96}, std::tuple{2, 1024, 3072}, std::tuple{9, 40, 100}}) {
    const Mlp p(T, H, I, 31);
    test::HiddenFwdChecks hc("mlp fwd H" + std::to_string(H));
    const test::Hidden h = test::check_mlp_hidden_fwd(knobs(), p.a, p.wg.data(), p.wu.data(), T, H, I, hc);
    std::vector<bf16> d(size_t(T) * H), composite(size_t(T) * H);
    ref::linear_fwd(knobs(), h.m.data(), p.wd.data(), d.data(), T, I, H, knobs().tp_tree_width);
    const MatD M = truth::widen(h.m, T, I), Wd = truth::widen(p.wd, H, I);
    BoundCheck chk("mlp fwd H" + std::to_string(H) + " down");
    test::check_dot(d, truth::linear_fwd(M, Wd), truth::linear_fwd(M.cwiseAbs(), Wd.cwiseAbs()),
                    test::dot_gamma(knobs().dot, I, knobs().tp_tree_width), chk);
    ref::mlp_fwd(knobs(), p.a.data(), p.wg.data(), p.wu.data(), p.wd.data(), composite.data(), T, H, I);
    EXPECT_TRUE(same_bits(d, composite));
  }
}

// Backward: dm (dot over H, unsplit), dWd, swiglu's dg and du, the input-gradient
// accumulator and dWg, dWu, each within its bound; mlp_bwd is exactly that chain.
TEST_P(SwigluTest, BackwardStagesWithinDerivedBound) {
  const int T = 37, H = 72, I = 96;
  Knobs kn = knobs();
  kn.grad_token_chunk = 16;  // several token chunks and tree levels
  const Mlp p(T, H, I, 41);
  test::HiddenFwdChecks hc("mlp bwd recompute");
  const test::Hidden h = test::check_mlp_hidden_fwd(kn, p.a, p.wg.data(), p.wu.data(), T, H, I, hc);
  std::vector<bf16> dm(size_t(T) * I);
  std::vector<float> dwd(size_t(H) * I);
  ref::mlp_down_bwd(kn, p.dd.data(), p.wd.data(), h.m.data(), dm.data(), dwd.data(), T, H, I);
  const MatD DD = truth::widen(p.dd, T, H), Wd = truth::widen(p.wd, H, I), M = truth::widen(h.m, T, I);
  {
    BoundCheck chk("mlp bwd dm");
    test::check_dot(dm, truth::linear_dgrad(DD, Wd), truth::linear_dgrad(DD.cwiseAbs(), Wd.cwiseAbs()),
                    test::dot_gamma(kn.dot, H), chk);
  }
  {
    BoundCheck chk("mlp bwd dWd");
    test::check_dot(dwd, truth::linear_wgrad(DD, M), truth::linear_wgrad(DD.cwiseAbs(), M.cwiseAbs()),
                    test::wgrad_gamma(kn.dot, T, kn.grad_token_chunk), chk);
  }
  test::HiddenBwdChecks hb("mlp bwd");
  const test::HiddenGrads hg = test::check_mlp_hidden_bwd(kn, p.a, p.wg.data(), p.wu.data(), h, dm, T, H, I, hb);

  std::vector<bf16> da(size_t(T) * H), staged_da(size_t(T) * H);
  std::vector<float> dwg(size_t(I) * H), dwu(size_t(I) * H), dwd2(size_t(H) * I);
  ref::mlp_bwd(kn, p.a.data(), p.wg.data(), p.wu.data(), p.wd.data(), p.dd.data(), da.data(), dwg.data(), dwu.data(),
               dwd2.data(), T, H, I);
  for (size_t i = 0; i < staged_da.size(); ++i) staged_da[i] = round_bf16(hg.acc[i]);
  EXPECT_TRUE(same_bits(da, staged_da));
  EXPECT_TRUE(same_bits(dwg, hg.dwg));
  EXPECT_TRUE(same_bits(dwu, hg.dwu));
  EXPECT_TRUE(same_bits(dwd2, dwd));
}

// The cheap GPU form of the input gradient: one split-K dgrad over the merged
// [dg | du]·[Wg ; Wu] (K = 2I in 2C chunks, gate's first) has the same bits,
// because the pairwise tree over 2C partials (C a power of two) is
// tree(gate's C) + tree(up's C).
TEST_P(SwigluTest, MergedInputGradientEqualsSeparateTrees) {
  const int T = 5, H = 40, I = 64, C = knobs().tp_tree_width;
  const auto dg = random_bf16(size_t(T) * I, 51, 1.0f), du = random_bf16(size_t(T) * I, 52, 1.0f);
  const auto wg = random_bf16(size_t(I) * H, 53, 1.0f), wu = random_bf16(size_t(I) * H, 54, 1.0f);
  std::vector<bf16> merged_dy(size_t(T) * 2 * I), merged_w(wg);
  merged_w.insert(merged_w.end(), wu.begin(), wu.end());  // [2I][H]
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < I; ++i) {
      merged_dy[size_t(t) * 2 * I + i] = dg[size_t(t) * I + i];
      merged_dy[size_t(t) * 2 * I + I + i] = du[size_t(t) * I + i];
    }
  std::vector<float> acc(size_t(T) * H), merged(size_t(T) * H);
  ref::mlp_input_grad_acc(knobs(), dg.data(), du.data(), wg.data(), wu.data(), acc.data(), T, H, I);
  ref::linear_dgrad_acc(knobs(), merged_dy.data(), merged_w.data(), merged.data(), T, H, 2 * I, 2 * C,
                        fixed_chunk_len(2 * I, 2 * C));
  EXPECT_TRUE(same_bits(acc, merged));
}

// L = Σ c·mlp(a): the twin's gradients against central differences. With
// h = 2^-16 the truncation error h²/6·|L'''| and the cancellation error
// 2^-52·|L|/h are both below 1e-8 for these O(1) inputs.
TEST(SwigluTruth, GradientsMatchFiniteDifferences) {
  const int T = 2, H = 5, I = 4;
  const MatD A = test::random_matd(T, H, 1), Wg = test::random_matd(I, H, 2), Wu = test::random_matd(I, H, 3),
             Wd = test::random_matd(H, I, 4), C = test::random_matd(T, H, 5);
  const double h = 0x1p-16;
  const truth::MlpGrads g = truth::mlp_bwd(A, Wg, Wu, Wd, C);
  auto loss = [&](const MatD& a, const MatD& wg, const MatD& wu, const MatD& wd) {
    return (truth::mlp_fwd(a, wg, wu, wd).array() * C.array()).sum();
  };
  auto check = [&](const MatD& x, const MatD& grad, auto&& loss_of) {
    for (int r = 0; r < x.rows(); ++r)
      for (int c = 0; c < x.cols(); ++c) {
        MatD xp = x, xm = x;
        xp(r, c) += h;
        xm(r, c) -= h;
        EXPECT_NEAR((loss_of(xp) - loss_of(xm)) / (2 * h), grad(r, c), 1e-8);
      }
  };
  check(A, g.da, [&](const MatD& x) { return loss(x, Wg, Wu, Wd); });
  check(Wg, g.dwg, [&](const MatD& x) { return loss(A, x, Wu, Wd); });
  check(Wu, g.dwu, [&](const MatD& x) { return loss(A, Wg, x, Wd); });
  check(Wd, g.dwd, [&](const MatD& x) { return loss(A, Wg, Wu, x); });
}

// One row alone equals the same row inside batches of 2..64 other rows, forward
// output and input gradient.
TEST_P(SwigluTest, BatchInvariance) {
  const int H = 64, I = 64;
  const Mlp one(1, H, I, 61);
  std::vector<bf16> d_alone(H), da_alone(H);
  std::vector<float> dwg(size_t(I) * H), dwu(size_t(I) * H), dwd(size_t(H) * I);
  ref::mlp_fwd(knobs(), one.a.data(), one.wg.data(), one.wu.data(), one.wd.data(), d_alone.data(), 1, H, I);
  ref::mlp_bwd(knobs(), one.a.data(), one.wg.data(), one.wu.data(), one.wd.data(), one.dd.data(), da_alone.data(),
               dwg.data(), dwu.data(), dwd.data(), 1, H, I);
  for (int batch : {2, 3, 17, 64}) {
    auto a = random_bf16(size_t(batch) * H, 100 + batch, 1.0f), dd = random_bf16(size_t(batch) * H, 200 + batch, 1.0f);
    const int at = batch / 2;
    std::copy(one.a.begin(), one.a.end(), a.begin() + size_t(at) * H);
    std::copy(one.dd.begin(), one.dd.end(), dd.begin() + size_t(at) * H);
    std::vector<bf16> d(size_t(batch) * H), da(size_t(batch) * H);
    ref::mlp_fwd(knobs(), a.data(), one.wg.data(), one.wu.data(), one.wd.data(), d.data(), batch, H, I);
    ref::mlp_bwd(knobs(), a.data(), one.wg.data(), one.wu.data(), one.wd.data(), dd.data(), da.data(), dwg.data(),
                 dwu.data(), dwd.data(), batch, H, I);
    EXPECT_TRUE(std::equal(d_alone.begin(), d_alone.end(), d.begin() + size_t(at) * H)) << "batch " << batch;
    EXPECT_TRUE(std::equal(da_alone.begin(), da_alone.end(), da.begin() + size_t(at) * H)) << "batch " << batch;
  }
}

// Negative controls: each deviation from the contract changes bits on the same
// inputs, so the equalities above can fail. A change of reduction order moves the
// fp32 accumulator by a few ulps, which flips a bf16 output only rarely, so those
// controls compare the fp32 accumulators the contract defines.
TEST_P(SwigluTest, NegativeControlsChangeBits) {
  const int T = 16, H = 256, I = 128, C = knobs().tp_tree_width;
  const Mlp p(T, H, I, 71);
  const size_t hidden = size_t(T) * I;

  // A merged gate_up GEMM: in the same K order it is harmless; with K split into
  // C chunks (another order) it changes the accumulators.
  std::vector<bf16> wgu(p.wg);
  wgu.insert(wgu.end(), p.wu.begin(), p.wu.end());  // [2I][H]
  std::vector<float> acc_g(hidden), acc_u(hidden), same(2 * hidden), split(2 * hidden), gu;
  ref::linear_acc(knobs(), p.a.data(), p.wg.data(), acc_g.data(), T, H, I, 1, H);
  ref::linear_acc(knobs(), p.a.data(), p.wu.data(), acc_u.data(), T, H, I, 1, H);
  ref::linear_acc(knobs(), p.a.data(), wgu.data(), same.data(), T, H, 2 * I, 1, H);
  ref::linear_acc(knobs(), p.a.data(), wgu.data(), split.data(), T, H, 2 * I, C, fixed_chunk_len(H, C));
  for (int t = 0; t < T; ++t) {
    gu.insert(gu.end(), acc_g.begin() + size_t(t) * I, acc_g.begin() + size_t(t + 1) * I);
    gu.insert(gu.end(), acc_u.begin() + size_t(t) * I, acc_u.begin() + size_t(t + 1) * I);
  }
  EXPECT_TRUE(same_bits(gu, same));
  EXPECT_FALSE(same_bits(gu, split));

  // down_proj as one chain over K instead of the C-chunk tree.
  std::vector<bf16> g(hidden), u(hidden), m(hidden);
  ref::mlp_hidden_fwd(knobs(), p.a.data(), p.wg.data(), p.wu.data(), g.data(), u.data(), m.data(), T, H, I);
  std::vector<float> down_tree(size_t(T) * H), down_chain(size_t(T) * H);
  ref::linear_acc(knobs(), m.data(), p.wd.data(), down_tree.data(), T, I, H, C, fixed_chunk_len(I, C));
  ref::linear_acc(knobs(), m.data(), p.wd.data(), down_chain.data(), T, I, H, 1, I);
  EXPECT_FALSE(same_bits(down_tree, down_chain));

  // The input gradient rounded per path and summed in bf16 (autograd's
  // accumulation) instead of one rounding of the fp32 sum.
  const auto dg = random_bf16(hidden, 72, 1.0f), du = random_bf16(hidden, 73, 1.0f);
  std::vector<float> acc(size_t(T) * H), from_g(size_t(T) * H), from_u(size_t(T) * H);
  ref::mlp_input_grad_acc(knobs(), dg.data(), du.data(), p.wg.data(), p.wu.data(), acc.data(), T, H, I);
  ref::linear_dgrad_acc(knobs(), dg.data(), p.wg.data(), from_g.data(), T, H, I, C, fixed_chunk_len(I, C));
  ref::linear_dgrad_acc(knobs(), du.data(), p.wu.data(), from_u.data(), T, H, I, C, fixed_chunk_len(I, C));
  std::vector<bf16> da(acc.size()), da_twice(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    da[i] = round_bf16(acc[i]);
    da_twice[i] = round_bf16(add_rn(through_bf16(from_g[i]), through_bf16(from_u[i])));
  }
  EXPECT_FALSE(same_bits(da, da_twice));

  // swiglu backward: ds kept in fp32 changes dg; silu' in PyTorch's order
  // σ·(1 + x·(1 − σ)) without the fma changes its fp32 value.
  std::vector<bf16> dg_ref(hidden), du_ref(hidden), dg_fp32_ds(hidden);
  std::vector<float> dsilu(hidden), dsilu_torch(hidden);
  const auto dm = random_bf16(hidden, 74, 1.0f);
  ref::swiglu_bwd(g.data(), u.data(), dm.data(), dg_ref.data(), du_ref.data(), int(hidden));
  for (size_t i = 0; i < hidden; ++i) {
    const float x = widen(g[i]), sig = math::sigmoid(x);
    dg_fp32_ds[i] = round_bf16(mul_rn(mul_rn(widen(dm[i]), widen(u[i])), ref::silu_grad(x)));
    dsilu[i] = ref::silu_grad(x);
    dsilu_torch[i] = mul_rn(sig, add_rn(1.0f, mul_rn(x, sub_rn(1.0f, sig))));
  }
  EXPECT_FALSE(same_bits(dg_ref, dg_fp32_ds));
  EXPECT_FALSE(same_bits(dsilu, dsilu_torch));
}

// SPEC.md §5.7's edge cases, element by element.
TEST(Swiglu, EdgeInputs) {
  const bf16 one = round_bf16(1.0f), zero{0x0000}, neg_zero{0x8000}, inf{0x7f80}, ninf{0xff80},
             nan{kCanonicalNanBf16}, big = round_bf16(1e30f), nbig = round_bf16(-1e30f);
  bf16 m, dg, du;
  auto fwd_bwd = [&](bf16 g, bf16 u, bf16 d) {
    m = ref::swiglu_value(g, u);
    ref::swiglu_grads(g, u, d, dg, du);
  };
  fwd_bwd(zero, one, one);  // silu(0) = 0, silu'(0) = 1/2
  EXPECT_EQ(m.bits, 0x0000);
  EXPECT_EQ(dg.bits, round_bf16(0.5f).bits);
  EXPECT_EQ(du.bits, 0x0000);
  fwd_bwd(one, neg_zero, one);  // −0 up: m = silu(1)·(−0) = −0
  EXPECT_EQ(m.bits, 0x8000);
  fwd_bwd(nan, one, one);
  EXPECT_TRUE(is_nan(m) && is_nan(dg) && is_nan(du));
  fwd_bwd(one, nan, one);
  EXPECT_TRUE(is_nan(m) && is_nan(dg));
  fwd_bwd(big, one, one);  // σ = 1: silu(x) = x, silu'(x) = 1·fma(x, 0, 1) = 1
  EXPECT_EQ(m.bits, big.bits);
  EXPECT_EQ(dg.bits, one.bits);
  fwd_bwd(nbig, one, one);  // σ = 0: silu(x) = −0, silu'(x) = 0·(x + 1) = −0
  EXPECT_EQ(m.bits, 0x8000);
  EXPECT_EQ(dg.bits, 0x8000);
  fwd_bwd(inf, one, one);  // silu(+Inf) = +Inf; silu' = 1·fma(Inf, 0, 1) = NaN (IEEE, as autograd)
  EXPECT_EQ(m.bits, inf.bits);
  EXPECT_TRUE(is_nan(dg));
  fwd_bwd(ninf, one, one);  // silu'(−Inf) = 0·(−Inf) = NaN
  EXPECT_TRUE(is_nan(dg));
  fwd_bwd(bf16{0x0001}, one, one);  // smallest subnormal x = 2^-133: silu = x/2 ties to even 0; silu' = 1/2
  EXPECT_EQ(m.bits, 0x0000);
  EXPECT_EQ(dg.bits, round_bf16(0.5f).bits);
}

// A one-token MLP whose input is all −0: both dot models give +0 sums, and
// everything downstream is +0.
TEST_P(SwigluTest, NegativeZeroInputGivesPositiveZeros) {
  const int T = 1, H = 32, I = 16;
  const Mlp p(T, H, I, 91);
  std::vector<bf16> a(size_t(H), bf16{0x8000}), d(H), da(H);
  std::vector<float> dwg(size_t(I) * H), dwu(size_t(I) * H), dwd(size_t(H) * I);
  ref::mlp_fwd(knobs(), a.data(), p.wg.data(), p.wu.data(), p.wd.data(), d.data(), T, H, I);
  ref::mlp_bwd(knobs(), a.data(), p.wg.data(), p.wu.data(), p.wd.data(), p.dd.data(), da.data(), dwg.data(),
               dwu.data(), dwd.data(), T, H, I);
  for (bf16 x : d) EXPECT_EQ(x.bits, 0x0000);
  for (float x : dwd) EXPECT_EQ(bits_of(x), 0u);  // m = +0 everywhere
}

TEST_P(SwigluTest, GoldenDigests) {
  const int T = 9, H = 96, I = 64;
  Knobs kn = knobs();
  const Mlp p(T, H, I, 101);
  const size_t hidden = size_t(T) * I;
  std::vector<bf16> g(hidden), u(hidden), m(hidden), d(size_t(T) * H), da(size_t(T) * H), dg(hidden), du(hidden);
  std::vector<float> acc(size_t(T) * H), dwg(size_t(I) * H), dwu(size_t(I) * H), dwd(size_t(H) * I);
  const auto dm = random_bf16(hidden, 102, 1.0f);
  ref::mlp_hidden_fwd(kn, p.a.data(), p.wg.data(), p.wu.data(), g.data(), u.data(), m.data(), T, H, I);
  ref::mlp_fwd(kn, p.a.data(), p.wg.data(), p.wu.data(), p.wd.data(), d.data(), T, H, I);
  ref::swiglu_bwd(g.data(), u.data(), dm.data(), dg.data(), du.data(), int(hidden));
  ref::mlp_input_grad_acc(kn, dg.data(), du.data(), p.wg.data(), p.wu.data(), acc.data(), T, H, I);
  ref::mlp_bwd(kn, p.a.data(), p.wg.data(), p.wu.data(), p.wd.data(), p.dd.data(), da.data(), dwg.data(), dwu.data(),
               dwd.data(), T, H, I);
  const std::string c = contract().name;
  test::expect_golden("ops/swiglu.txt", c + ".m", test::digest(m));
  test::expect_golden("ops/swiglu.txt", c + ".dg", test::digest(dg));
  test::expect_golden("ops/swiglu.txt", c + ".du", test::digest(du));
  test::expect_golden("ops/swiglu.txt", c + ".input_grad_acc", test::digest(acc));
  test::expect_golden("ops/swiglu.txt", c + ".mlp_fwd", test::digest(d));
  test::expect_golden("ops/swiglu.txt", c + ".mlp_da", test::digest(da));
  test::expect_golden("ops/swiglu.txt", c + ".mlp_dwg", test::digest(dwg));
  test::expect_golden("ops/swiglu.txt", c + ".mlp_dwu", test::digest(dwu));
  test::expect_golden("ops/swiglu.txt", c + ".mlp_dwd", test::digest(dwd));
}

// Qwen3-0.6B's MLP (H 1024, I 3072), backward, a few tokens.
TEST_P(SwigluTest, SlowRealShapeBackwardWithinDerivedBound) {
  const int T = 4, H = 1024, I = 3072;
  const Mlp p(T, H, I, 111);
  test::HiddenFwdChecks hc("0.6B fwd");
  const test::Hidden h = test::check_mlp_hidden_fwd(knobs(), p.a, p.wg.data(), p.wu.data(), T, H, I, hc);
  std::vector<bf16> dm(size_t(T) * I);
  std::vector<float> dwd(size_t(H) * I);
  ref::mlp_down_bwd(knobs(), p.dd.data(), p.wd.data(), h.m.data(), dm.data(), dwd.data(), T, H, I);
  const MatD DD = truth::widen(p.dd, T, H), Wd = truth::widen(p.wd, H, I);
  {
    BoundCheck chk("0.6B dm");
    test::check_dot(dm, truth::linear_dgrad(DD, Wd), truth::linear_dgrad(DD.cwiseAbs(), Wd.cwiseAbs()),
                    test::dot_gamma(knobs().dot, H), chk);
  }
  test::HiddenBwdChecks hb("0.6B bwd");
  test::check_mlp_hidden_bwd(knobs(), p.a, p.wg.data(), p.wu.data(), h, dm, T, H, I, hb);
}

INSTANTIATE_TEST_SUITE_P(Contracts, SwigluTest, ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1"),
                         [](const auto& info) { return std::string(info.param).substr(5, 6); });

}  // namespace
}  // namespace bp
