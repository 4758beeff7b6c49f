// moe_experts and combine: the dispatch plan, every rounding point of the experts
// against float64 truth with a derived bound (stage by stage on each stage's own
// bf16 inputs, then the composite checked to be exactly that chain), the twins'
// gradients against finite differences, invariance to the batch, to the order
// experts run in and to the EP split, negative controls, golden digests, edges.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "reference/common/rng.h"
#include "reference/numerics/chunked.h"
#include "reference/ops/linear.h"
#include "reference/ops/moe_experts.h"
#include "reference/ops/moe_router.h"
#include "reference/ops/swiglu.h"
#include "reference/truth/moe_experts.h"
#include "support/bounds.h"
#include "support/golden.h"
#include "support/stage_bounds.h"

namespace bp {
namespace {

using test::BoundCheck;
using test::kU32;
using truth::MatD;

class MoeTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
};

// Pointer tables of per-expert weights; null where an expert is not held.
struct WeightTables {
  std::vector<const bf16*> gate, up, down;
  ref::ExpertWeights view() const { return {gate.data(), up.data(), down.data()}; }
};

// Per-expert weights owned by the test, only for the experts in `held`.
struct ExpertStore {
  std::vector<std::vector<bf16>> gate, up, down;
  WeightTables all;
  ExpertStore(int E, int H, int I, uint64_t seed, const std::vector<bool>& held) : gate(E), up(E), down(E) {
    const float in_scale = 3.0f / std::sqrt(float(H));
    for (int e = 0; e < E; ++e)
      if (held[e]) {
        gate[e] = random_bf16(size_t(I) * H, seed + 3 * e, in_scale);
        up[e] = random_bf16(size_t(I) * H, seed + 3 * e + 1, in_scale);
        down[e] = random_bf16(size_t(H) * I, seed + 3 * e + 2, 1.0f / std::sqrt(float(I)));
      }
    all = tables(0, E);
  }
  ref::ExpertWeights weights() const { return all.view(); }
  // Experts [begin, end) only: what one EP rank holds.
  WeightTables tables(int begin, int end) const {
    WeightTables t{std::vector<const bf16*>(gate.size()), std::vector<const bf16*>(gate.size()),
                   std::vector<const bf16*>(gate.size())};
    for (int e = begin; e < end; ++e) {
      t.gate[e] = gate[e].empty() ? nullptr : gate[e].data();
      t.up[e] = up[e].empty() ? nullptr : up[e].data();
      t.down[e] = down[e].empty() ? nullptr : down[e].data();
    }
    return t;
  }
};

// Per-expert fp32 gradients for the held experts, NaN until written.
struct GradStore {
  std::vector<std::vector<float>> gate, up, down;
  std::vector<float*> pg, pu, pd;
  GradStore(int E, int H, int I, const std::vector<bool>& held) : gate(E), up(E), down(E) {
    for (int e = 0; e < E; ++e) {
      if (held[e]) {
        gate[e].assign(size_t(I) * H, NAN);
        up[e].assign(size_t(I) * H, NAN);
        down[e].assign(size_t(H) * I, NAN);
      }
      pg.push_back(gate[e].empty() ? nullptr : gate[e].data());
      pu.push_back(up[e].empty() ? nullptr : up[e].data());
      pd.push_back(down[e].empty() ? nullptr : down[e].data());
    }
  }
  GradStore(int E, int H, int I) : GradStore(E, H, I, std::vector<bool>(E, true)) {}
  ref::ExpertGrads grads() { return {pg.data(), pu.data(), pd.data()}; }
  std::vector<float> flat() const {
    std::vector<float> v;
    for (size_t e = 0; e < gate.size(); ++e)
      for (const auto* m : {&gate[e], &up[e], &down[e]}) v.insert(v.end(), m->begin(), m->end());
    return v;
  }
};

// A routed problem with a hand-made routing: each token picks the k experts with
// the largest counter hashes, never `empty_expert`; positive weights in
// descending slot order (as the router gives them).
struct Moe {
  int T, H, E, k, I;
  std::vector<bf16> a, topk_w, dout;
  std::vector<int> ids, offset, token, slot;
  Moe(int T_, int H_, int E_, int k_, int I_, uint64_t seed, int empty_expert = -1)
      : T(T_), H(H_), E(E_), k(k_), I(I_) {
    a = random_bf16(size_t(T) * H, seed, 1.0f);
    dout = random_bf16(size_t(T) * H, seed + 1, 1.0f);
    for (int t = 0; t < T; ++t) {
      std::vector<std::pair<uint64_t, int>> score;
      for (int e = 0; e < E; ++e)
        if (e != empty_expert) score.push_back({counter_hash(seed + 2, uint64_t(t) * E + e), e});
      std::sort(score.rbegin(), score.rend());
      for (int j = 0; j < k; ++j) {
        ids.push_back(score[j].second);
        topk_w.push_back(round_bf16(0.9f / float(j + 2) + 0.05f * counter_uniform(seed + 3, uint64_t(t) * k + j)));
      }
    }
    build_plan();
  }
  void build_plan() {
    offset.assign(E + 1, 0);
    token.assign(size_t(T) * k, 0);
    slot.assign(size_t(T) * k, 0);
    ref::moe_dispatch(ids.data(), T, k, E, offset.data(), token.data(), slot.data());
  }
  ref::MoeDispatch plan() const { return {E, offset.data(), token.data(), slot.data()}; }
  std::vector<bool> used() const {
    std::vector<bool> u(E, false);
    for (int e : ids) u[e] = true;
    return u;
  }
  // The rows of expert e in plan order, and their (token, slot) positions.
  std::vector<bf16> gather(const std::vector<bf16>& src, int e, int width) const {
    std::vector<bf16> rows;
    for (int n = offset[e]; n < offset[e + 1]; ++n)
      rows.insert(rows.end(), src.begin() + size_t(token[n]) * width, src.begin() + size_t(token[n] + 1) * width);
    return rows;
  }
  size_t slot_row(int n) const { return size_t(token[n]) * k + slot[n]; }
};

std::vector<bf16> run_fwd(const Knobs& kn, const Moe& p, const ref::ExpertWeights& w, std::vector<bf16>* c_out = nullptr) {
  std::vector<bf16> c(size_t(p.T) * p.k * p.H), out(size_t(p.T) * p.H);
  ref::moe_experts_fwd(kn, p.plan(), 0, p.E, p.a.data(), p.topk_w.data(), w, c.data(), p.k, p.H, p.I);
  ref::moe_combine_fwd(c.data(), out.data(), p.T, p.k, p.H);
  if (c_out) *c_out = c;
  return out;
}

TEST(MoeDispatch, PlanByHand) {
  // 4 tokens, top-2 of 5 experts; expert 3 receives no token.
  const std::vector<int> ids = {2, 0, 0, 4, 1, 2, 4, 0};
  std::vector<int> offset(6), token(8), slot(8);
  ref::moe_dispatch(ids.data(), 4, 2, 5, offset.data(), token.data(), slot.data());
  EXPECT_EQ(offset, (std::vector<int>{0, 3, 4, 6, 6, 8}));
  EXPECT_EQ(token, (std::vector<int>{0, 1, 3, 2, 0, 2, 1, 3}));
  EXPECT_EQ(slot, (std::vector<int>{1, 0, 1, 0, 0, 1, 1, 0}));
  const std::vector<int> twice = {1, 1}, outside = {0, 5};
  EXPECT_THROW(ref::moe_dispatch(twice.data(), 1, 2, 5, offset.data(), token.data(), slot.data()),
               std::invalid_argument);
  EXPECT_THROW(ref::moe_dispatch(outside.data(), 1, 2, 5, offset.data(), token.data(), slot.data()),
               std::invalid_argument);
}

// Forward, per expert: gate, up, swiglu (as the dense MLP), the down accumulator
// (dot over I in C chunks, fp32), then
//   c = R(fl(acc·w)):      |fl(acc·w) − w·acc*| <= |w|·γ·Σ|m Wd| + u·|acc·w|
// and the combine
//   out = R(Σ_j c_j):      k terms from +0 in slot order, k − 1 roundings: γ_(k−1)·Σ|c_j|.
// The composite moe_experts_fwd / moe_combine_fwd must be exactly this chain.
void check_forward(const Knobs& kn, const Moe& p, const ExpertStore& ws, const std::string& what) {
  std::vector<bf16> c;
  const std::vector<bf16> out = run_fwd(kn, p, ws.weights(), &c);
  std::vector<bf16> staged_c(c.size());
  const double gamma = test::dot_gamma(kn.dot, p.I, kn.tp_tree_width);
  test::HiddenFwdChecks hc(what);
  BoundCheck acc_chk(what + " down acc"), c_chk(what + " c");
  for (int e = 0; e < p.E; ++e) {
    const int n = p.offset[e + 1] - p.offset[e];
    if (n == 0) continue;
    const std::vector<bf16> x = p.gather(p.a, e, p.H);
    const test::Hidden h = test::check_mlp_hidden_fwd(kn, x, ws.all.gate[e], ws.all.up[e], n, p.H, p.I, hc);
    std::vector<float> acc(size_t(n) * p.H);
    ref::linear_acc(kn, h.m.data(), ws.all.down[e], acc.data(), n, p.I, p.H, kn.tp_tree_width,
                    fixed_chunk_len(p.I, kn.tp_tree_width));
    const MatD M = truth::widen(h.m, n, p.I), Wd = truth::widen(ws.all.down[e], p.H, p.I);
    const MatD t = truth::linear_fwd(M, Wd), abs_sum = truth::linear_fwd(M.cwiseAbs(), Wd.cwiseAbs());
    test::check_dot(acc, t, abs_sum, gamma, acc_chk);
    for (int i = 0; i < n; ++i) {
      const size_t row = p.slot_row(p.offset[e] + i);
      const double w = widen(p.topk_w[row]);
      for (int hh = 0; hh < p.H; ++hh) {
        const size_t at = size_t(i) * p.H + hh;
        staged_c[row * p.H + hh] = round_bf16(mul_rn(acc[at], float(w)));
        const double tc = w * t(i, hh), e_acc = std::fabs(w) * gamma * abs_sum(i, hh);
        c_chk(widen(c[row * p.H + hh]), tc, test::round_bound(tc, e_acc + kU32 * (std::fabs(tc) + e_acc)), at);
      }
    }
  }
  EXPECT_EQ(test::digest(c), test::digest(staged_c)) << what;
  BoundCheck out_chk(what + " combine");
  for (int t = 0; t < p.T; ++t)
    for (int hh = 0; hh < p.H; ++hh) {
      double sum = 0, abs_sum = 0;
      for (int j = 0; j < p.k; ++j) {
        const double v = widen(c[(size_t(t) * p.k + j) * p.H + hh]);
        sum += v;
        abs_sum += std::fabs(v);
      }
      out_chk(widen(out[size_t(t) * p.H + hh]), sum, test::round_bound(sum, test::gamma_n(p.k - 1) * abs_sum),
              size_t(t) * p.H + hh);
    }
}

TEST_P(MoeTest, ForwardStagesWithinDerivedBound) {
  const Moe p(13, 48, 8, 3, 32, 10, /*empty_expert=*/5);
  const ExpertStore ws(p.E, p.H, p.I, 20, p.used());
  check_forward(knobs(), p, ws, "moe");
}

// Qwen3-30B-A3B: the real router (H 2048, 128 experts, top-8, renormalised) picks
// the experts of two tokens; expert weights exist only for the experts chosen
// (I = 768), as an EP rank would hold them.
TEST_P(MoeTest, RealShapeForwardWithinDerivedBound) {
  const int T = 2, H = 2048, E = 128, k = 8, I = 768;
  Moe p(T, H, E, k, I, 30);
  const auto wr = random_bf16(size_t(E) * H, 31, 4.0f / std::sqrt(float(H)));
  std::vector<bf16> logits(size_t(T) * E);
  ref::router_fwd(knobs(), p.a.data(), wr.data(), logits.data(), p.ids.data(), p.topk_w.data(), T, H, E, k, true);
  p.build_plan();
  const ExpertStore ws(E, H, I, 40, p.used());
  check_forward(knobs(), p, ws, "30B-A3B");
}

// Backward, per expert (y = dout of the row's token, w its routing weight):
//   dw_route = R(lane_sum(fl(y_h·acc_h))): each product rounds once and passes the
//       lane tree, and acc is within γ_dot·Σ|m Wd| of acc*:
//       |sum − Σ y·acc*| <= (γ_lane + u(1 + γ_lane))·Σ|y·acc| + Σ|y|·γ_dot·Σ|m Wd|
//   dacc = R(y·w): the product of two bf16 is exact in fp32, one rounding
//   dm = R(dacc·Wd) (dot over H), dWd (token-chunked over the expert's rows)
//   dg, du, the input-gradient accumulator, dWg, dWu as the dense MLP.
// moe_experts_bwd, run one expert at a time (only the experts with rows, so that
// only those need gradient storage), must be exactly this chain.
void check_backward(const Knobs& kn, const Moe& p, const ExpertStore& ws, const std::vector<bool>& held,
                    const std::string& what) {
  const size_t rows = size_t(p.T) * p.k;
  std::vector<float> da_slot(rows * p.H), staged_slot(rows * p.H);
  std::vector<bf16> dtopk_w(rows), staged_dw(rows);
  GradStore g(p.E, p.H, p.I, held), staged(p.E, p.H, p.I, held);
  const double g_dot = test::dot_gamma(kn.dot, p.I, kn.tp_tree_width), g_lane = test::lane_sum_gamma(p.H, kn.row_reduce);
  test::HiddenFwdChecks hc(what + " recompute");
  test::HiddenBwdChecks hb(what);
  BoundCheck dw_chk(what + " dtopk_w"), dacc_chk(what + " dacc"), dm_chk(what + " dm"), dwd_chk(what + " dWd");
  for (int e = 0; e < p.E; ++e) {
    const int n = p.offset[e + 1] - p.offset[e];
    if (n == 0) continue;
    ref::moe_experts_bwd(kn, p.plan(), e, e + 1, p.a.data(), p.topk_w.data(), ws.weights(), p.dout.data(),
                         da_slot.data(), dtopk_w.data(), g.grads(), p.k, p.H, p.I);
    const std::vector<bf16> x = p.gather(p.a, e, p.H), y = p.gather(p.dout, e, p.H);
    const test::Hidden h = test::check_mlp_hidden_fwd(kn, x, ws.all.gate[e], ws.all.up[e], n, p.H, p.I, hc);
    std::vector<float> acc(size_t(n) * p.H);
    ref::linear_acc(kn, h.m.data(), ws.all.down[e], acc.data(), n, p.I, p.H, kn.tp_tree_width,
                    fixed_chunk_len(p.I, kn.tp_tree_width));
    const MatD M = truth::widen(h.m, n, p.I), Wd = truth::widen(ws.all.down[e], p.H, p.I), Y = truth::widen(y, n, p.H);
    const MatD acc_t = truth::linear_fwd(M, Wd), acc_abs = truth::linear_fwd(M.cwiseAbs(), Wd.cwiseAbs());
    std::vector<bf16> dacc(size_t(n) * p.H);
    std::vector<float> lanes(kn.row_reduce.lanes);
    for (int i = 0; i < n; ++i) {
      const size_t row = p.slot_row(p.offset[e] + i);
      const float w = widen(p.topk_w[row]);
      const bf16* yi = &y[size_t(i) * p.H];
      const float* ai = &acc[size_t(i) * p.H];
      staged_dw[row] =
          round_bf16(lane_sum(p.H, kn.row_reduce, lanes.data(), [&](int hh) { return mul_rn(widen(yi[hh]), ai[hh]); }));
      double t = 0, abs_terms = 0, acc_err = 0;
      for (int hh = 0; hh < p.H; ++hh) {
        t += Y(i, hh) * acc_t(i, hh);
        abs_terms += std::fabs(Y(i, hh) * ai[hh]);
        acc_err += std::fabs(Y(i, hh)) * g_dot * acc_abs(i, hh);
        const size_t at = size_t(i) * p.H + hh;
        dacc[at] = round_bf16(mul_rn(widen(yi[hh]), w));
        dacc_chk(widen(dacc[at]), Y(i, hh) * w, test::round_bound(Y(i, hh) * w, test::kF32Tiny), at);
      }
      dw_chk(widen(dtopk_w[row]), t, test::round_bound(t, (g_lane + kU32 * (1 + g_lane)) * abs_terms + acc_err), row);
    }
    std::vector<bf16> dm(size_t(n) * p.I);
    ref::mlp_down_bwd(kn, dacc.data(), ws.all.down[e], h.m.data(), dm.data(), staged.down[e].data(), n, p.H, p.I);
    const MatD DA = truth::widen(dacc, n, p.H);
    test::check_dot(dm, truth::linear_dgrad(DA, Wd), truth::linear_dgrad(DA.cwiseAbs(), Wd.cwiseAbs()),
                    test::dot_gamma(kn.dot, p.H), dm_chk);
    test::check_dot(staged.down[e], truth::linear_wgrad(DA, M), truth::linear_wgrad(DA.cwiseAbs(), M.cwiseAbs()),
                    test::wgrad_gamma(kn.dot, n, kn.grad_token_chunk), dwd_chk);
    const test::HiddenGrads hg = test::check_mlp_hidden_bwd(kn, x, ws.all.gate[e], ws.all.up[e], h, dm, n, p.H, p.I, hb);
    staged.gate[e] = hg.dwg;
    staged.up[e] = hg.dwu;
    for (int i = 0; i < n; ++i)
      std::copy(hg.acc.begin() + size_t(i) * p.H, hg.acc.begin() + size_t(i + 1) * p.H,
                staged_slot.begin() + p.slot_row(p.offset[e] + i) * p.H);
  }
  EXPECT_EQ(test::digest(da_slot), test::digest(staged_slot)) << what;
  EXPECT_EQ(test::digest(dtopk_w), test::digest(staged_dw)) << what;
  EXPECT_EQ(test::digest(g.flat()), test::digest(staged.flat())) << what;
}

TEST_P(MoeTest, BackwardStagesWithinDerivedBound) {
  Knobs kn = knobs();
  kn.grad_token_chunk = 4;  // experts with several token chunks
  const Moe p(21, 40, 8, 3, 24, 50, /*empty_expert=*/2);
  const ExpertStore ws(p.E, p.H, p.I, 60, p.used());
  check_backward(kn, p, ws, p.used(), "moe bwd");
}

// The input-gradient combine: da = R(Σ_j da_slot_j + router_acc), k + 1 terms
// from +0 (slots in order, the router last), k roundings: γ_k·Σ|terms|.
TEST(MoeCombine, BackwardWithinDerivedBound) {
  const int T = 9, k = 4, H = 33;
  const std::vector<float> da_slot = random_f32(size_t(T) * k * H, 65, 1.0f), router = random_f32(size_t(T) * H, 66, 1.0f);
  std::vector<bf16> da(size_t(T) * H);
  ref::moe_combine_bwd(da_slot.data(), router.data(), da.data(), T, k, H);
  BoundCheck chk("moe combine bwd");
  for (int t = 0; t < T; ++t)
    for (int hh = 0; hh < H; ++hh) {
      double sum = router[size_t(t) * H + hh], abs_sum = std::fabs(sum);
      for (int j = 0; j < k; ++j) {
        const double v = da_slot[(size_t(t) * k + j) * H + hh];
        sum += v;
        abs_sum += std::fabs(v);
      }
      chk(widen(da[size_t(t) * H + hh]), sum, test::round_bound(sum, test::gamma_n(k) * abs_sum), size_t(t) * H + hh);
    }
}

// The twins' gradients against central differences of L = Σ c·out: the experts
// for fixed routing (da, the routing weights, every expert weight) and the whole
// layer for a fixed selection (da, dWr). h = 2^-16: truncation h²/6·|L'''| and
// cancellation 2^-52·|L|/h stay below 1e-8 for these O(1) inputs.
TEST(MoeTruth, GradientsMatchFiniteDifferences) {
  const int T = 3, H = 4, E = 4, k = 2, I = 3;
  const double h = 0x1p-16;
  const MatD A = test::random_matd(T, H, 1), C = test::random_matd(T, H, 2), Wr = test::random_matd(E, H, 3);
  truth::Experts ex;
  for (int e = 0; e < E; ++e) {
    ex.gate.push_back(test::random_matd(I, H, 10 + e));
    ex.up.push_back(test::random_matd(I, H, 20 + e));
    ex.down.push_back(test::random_matd(H, I, 30 + e));
  }
  const std::vector<int> ids = truth::topk_ids(truth::softmax_rows(truth::linear_fwd(A, Wr)), k);
  const MatD W = truth::router_weights(truth::linear_fwd(A, Wr), ids, k, true);
  auto fd = [&](MatD& x, int r, int c, auto&& loss) {
    const double keep = x(r, c);
    x(r, c) = keep + h;
    const double lp = loss();
    x(r, c) = keep - h;
    const double lm = loss();
    x(r, c) = keep;
    return (lp - lm) / (2 * h);
  };
  auto check_all = [&](MatD& x, const MatD& grad, auto&& loss) {
    for (int r = 0; r < x.rows(); ++r)
      for (int c = 0; c < x.cols(); ++c) EXPECT_NEAR(fd(x, r, c, loss), grad(r, c), 1e-8);
  };
  MatD a = A, w = W;
  auto experts_loss = [&] { return (truth::moe_fwd(a, ids, w, ex, k).array() * C.array()).sum(); };
  const truth::MoeGrads g = truth::moe_bwd(A, ids, W, ex, C, k);
  check_all(a, g.da, experts_loss);
  check_all(w, g.dw, experts_loss);
  for (int e = 0; e < E; ++e) {
    check_all(ex.gate[e], g.dgate[e], experts_loss);
    check_all(ex.up[e], g.dup[e], experts_loss);
    check_all(ex.down[e], g.ddown[e], experts_loss);
  }
  for (bool norm : {true, false}) {
    MatD wr = Wr;
    auto layer_loss = [&] { return (truth::moe_layer_fwd(a, wr, ex, ids, k, norm).array() * C.array()).sum(); };
    const truth::MoeLayerGrads lg = truth::moe_layer_bwd(A, Wr, ex, ids, C, k, norm);
    check_all(a, lg.da, layer_loss);
    check_all(wr, lg.dwr, layer_loss);
  }
}

// The layer's output and input gradient for one token alone equal that token's
// inside batches of 2..64 routed by the same router (other tokens share its
// experts), and inside a batch where its experts see no other token.
TEST_P(MoeTest, BatchInvariance) {
  const int H = 32, E = 8, k = 2, I = 16;
  const auto wr = random_bf16(size_t(E) * H, 80, 4.0f / std::sqrt(float(H)));
  const ExpertStore ws(E, H, I, 81, std::vector<bool>(E, true));
  GradStore g(E, H, I);
  std::vector<float> dwr(size_t(E) * H);
  const auto a1 = random_bf16(H, 82, 1.0f), d1 = random_bf16(H, 83, 1.0f);
  std::vector<bf16> out1(H), da1(H);
  ref::moe_layer_fwd(knobs(), a1.data(), wr.data(), ws.weights(), out1.data(), 1, H, E, k, I, true);
  ref::moe_layer_bwd(knobs(), a1.data(), wr.data(), ws.weights(), d1.data(), da1.data(), dwr.data(), g.grads(), 1, H,
                     E, k, I, true);
  for (int batch : {2, 3, 17, 64}) {
    auto a = random_bf16(size_t(batch) * H, 100 + batch, 1.0f), d = random_bf16(size_t(batch) * H, 200 + batch, 1.0f);
    const int at = batch / 2;
    std::copy(a1.begin(), a1.end(), a.begin() + size_t(at) * H);
    std::copy(d1.begin(), d1.end(), d.begin() + size_t(at) * H);
    std::vector<bf16> out(size_t(batch) * H), da(size_t(batch) * H);
    ref::moe_layer_fwd(knobs(), a.data(), wr.data(), ws.weights(), out.data(), batch, H, E, k, I, true);
    ref::moe_layer_bwd(knobs(), a.data(), wr.data(), ws.weights(), d.data(), da.data(), dwr.data(), g.grads(), batch, H,
                       E, k, I, true);
    EXPECT_TRUE(std::equal(out1.begin(), out1.end(), out.begin() + size_t(at) * H)) << batch;
    EXPECT_TRUE(std::equal(da1.begin(), da1.end(), da.begin() + size_t(at) * H)) << batch;
  }
  // Token 0 alone on experts {0, 1}; three more tokens on experts {2..7} only.
  Moe p(4, H, E, k, I, 90);
  p.ids = {0, 1, 2, 3, 4, 5, 6, 7};
  p.build_plan();
  const std::vector<bf16> out = run_fwd(knobs(), p, ws.weights());
  Moe alone(1, H, E, k, I, 90);
  alone.ids = {0, 1};
  alone.build_plan();
  const std::vector<bf16> out_alone = run_fwd(knobs(), alone, ws.weights());
  EXPECT_TRUE(std::equal(out_alone.begin(), out_alone.end(), out.begin()));
}

// The experts in one call, one at a time in reverse order, and split over
// 2, 4 and 8 EP ranks that each hold only their own experts' weights: the
// per-slot rows, routing-weight gradients and expert gradients are the same bits.
TEST_P(MoeTest, ExpertOrderAndEpSplitInvariance) {
  const Moe p(19, 32, 8, 3, 16, 110, /*empty_expert=*/6);
  const ExpertStore ws(p.E, p.H, p.I, 120, std::vector<bool>(p.E, true));
  const size_t rows = size_t(p.T) * p.k;
  auto run = [&](const std::vector<std::pair<int, int>>& ranges, bool own_tables) {
    std::vector<bf16> c(rows * p.H), dw(rows);
    std::vector<float> da_slot(rows * p.H);
    GradStore g(p.E, p.H, p.I);
    for (const auto& [begin, end] : ranges) {
      const WeightTables held = ws.tables(begin, end);
      const ref::ExpertWeights w = own_tables ? held.view() : ws.weights();
      ref::moe_experts_fwd(knobs(), p.plan(), begin, end, p.a.data(), p.topk_w.data(), w, c.data(), p.k, p.H, p.I);
      ref::moe_experts_bwd(knobs(), p.plan(), begin, end, p.a.data(), p.topk_w.data(), w, p.dout.data(),
                           da_slot.data(), dw.data(), g.grads(), p.k, p.H, p.I);
    }
    return test::digest(c) + test::digest(dw) + test::digest(da_slot) + test::digest(g.flat());
  };
  const std::string all = run({{0, p.E}}, false);
  std::vector<std::pair<int, int>> reversed;
  for (int e = p.E - 1; e >= 0; --e) reversed.push_back({e, e + 1});
  EXPECT_EQ(run(reversed, false), all);
  for (int ranks : {2, 4, 8}) {
    std::vector<std::pair<int, int>> split;
    for (int r = 0; r < ranks; ++r) split.push_back({r * p.E / ranks, (r + 1) * p.E / ranks});
    EXPECT_EQ(run(split, true), all) << ranks << " ranks";
  }
}

// Negative controls: the routing weight applied after rounding (R(R(acc)·w)) and
// gate/up taken from a merged gate_up GEMM with K split into C chunks each change
// the expert rows c on the same inputs (a reordered fp32 dot flips a bf16 value
// only rarely, so the problem is large enough for some g or u to flip).
TEST_P(MoeTest, NegativeControlsChangeBits) {
  const Moe p(32, 512, 8, 4, 128, 130);
  const ExpertStore ws(p.E, p.H, p.I, 140, std::vector<bool>(p.E, true));
  std::vector<bf16> c;
  run_fwd(knobs(), p, ws.weights(), &c);
  std::vector<bf16> late_weight(c.size()), merged_c(c.size());
  for (int e = 0; e < p.E; ++e) {
    const int n = p.offset[e + 1] - p.offset[e];
    const std::vector<bf16> x = p.gather(p.a, e, p.H);
    const size_t hidden = size_t(n) * p.I;
    std::vector<bf16> g(hidden), u(hidden), m(hidden), gu(2 * hidden), wgu(ws.gate[e]);
    wgu.insert(wgu.end(), ws.up[e].begin(), ws.up[e].end());  // [2I][H]
    std::vector<float> acc(size_t(n) * p.H), acc_merged(size_t(n) * p.H);
    ref::mlp_hidden_fwd(knobs(), x.data(), ws.all.gate[e], ws.all.up[e], g.data(), u.data(), m.data(), n, p.H, p.I);
    ref::linear_acc(knobs(), m.data(), ws.all.down[e], acc.data(), n, p.I, p.H, knobs().tp_tree_width,
                    fixed_chunk_len(p.I, knobs().tp_tree_width));
    ref::linear_fwd(knobs(), x.data(), wgu.data(), gu.data(), n, p.H, 2 * p.I, knobs().tp_tree_width);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < p.I; ++j) {
        g[size_t(i) * p.I + j] = gu[size_t(i) * 2 * p.I + j];
        u[size_t(i) * p.I + j] = gu[size_t(i) * 2 * p.I + p.I + j];
      }
    ref::swiglu_fwd(g.data(), u.data(), m.data(), int(hidden));
    ref::linear_acc(knobs(), m.data(), ws.all.down[e], acc_merged.data(), n, p.I, p.H, knobs().tp_tree_width,
                    fixed_chunk_len(p.I, knobs().tp_tree_width));
    for (int i = 0; i < n; ++i) {
      const size_t row = p.slot_row(p.offset[e] + i);
      const float w = widen(p.topk_w[row]);
      for (int hh = 0; hh < p.H; ++hh) {
        late_weight[row * p.H + hh] = round_bf16(mul_rn(through_bf16(acc[size_t(i) * p.H + hh]), w));
        merged_c[row * p.H + hh] = round_bf16(mul_rn(acc_merged[size_t(i) * p.H + hh], w));
      }
    }
  }
  EXPECT_NE(test::digest(c), test::digest(late_weight));
  EXPECT_NE(test::digest(c), test::digest(merged_c));
}

// Negative control of the combine order. A sum of k bf16 values is usually exact
// in fp32, so the order shows only where the slots span more than 24 bits; on
// c = (1, 2^-8, 2^-24, 2^-24) slot order gives 1 + 2^-8 (each 2^-24 is a tie to
// even in fp32), a bf16 tie that rounds to 1, while the reversed order sums the
// small slots first, 1 + 2^-8 + 2^-23, which rounds up to 1 + 2^-7.
TEST(MoeCombine, NegativeControlReversedSlotOrder) {
  const std::vector<bf16> c = {round_bf16(1.0f), round_bf16(0x1p-8f), round_bf16(0x1p-24f), round_bf16(0x1p-24f)};
  std::vector<bf16> out(1), reversed_c(c.rbegin(), c.rend()), reversed(1);
  ref::moe_combine_fwd(c.data(), out.data(), 1, 4, 1);
  ref::moe_combine_fwd(reversed_c.data(), reversed.data(), 1, 4, 1);
  EXPECT_EQ(out[0], round_bf16(1.0f));
  EXPECT_EQ(reversed[0], round_bf16(1.0f + 0x1p-7f));
}

// Edge cases of SPEC.md §5.9.
TEST_P(MoeTest, EdgeInputs) {
  // An expert receiving no tokens: weights never read (null here), rows
  // untouched, gradients +0.
  const Moe p(5, 16, 4, 2, 8, 150, /*empty_expert=*/3);
  std::vector<bool> held(4, true);
  held[3] = false;
  const ExpertStore ws(4, 16, 8, 151, held);
  const size_t rows = size_t(p.T) * p.k;
  std::vector<bf16> c(rows * p.H), dw(rows);
  std::vector<float> da_slot(rows * p.H);
  GradStore g(4, 16, 8);
  ref::moe_experts_fwd(knobs(), p.plan(), 0, 4, p.a.data(), p.topk_w.data(), ws.weights(), c.data(), p.k, p.H, p.I);
  ref::moe_experts_bwd(knobs(), p.plan(), 0, 4, p.a.data(), p.topk_w.data(), ws.weights(), p.dout.data(),
                       da_slot.data(), dw.data(), g.grads(), p.k, p.H, p.I);
  for (const auto* v : {&g.gate[3], &g.up[3], &g.down[3]})
    for (float x : *v) EXPECT_EQ(bits_of(x), 0u);

  // An expert with rows but no weights is refused, as is a range outside [0, E].
  Moe q = p;
  q.ids[0] = 3;
  q.ids[1] = q.ids[1] == 3 ? 0 : q.ids[1];
  q.build_plan();
  EXPECT_THROW(ref::moe_experts_fwd(knobs(), q.plan(), 0, 4, q.a.data(), q.topk_w.data(), ws.weights(), c.data(),
                                    q.k, q.H, q.I),
               std::invalid_argument);
  EXPECT_THROW(ref::moe_experts_fwd(knobs(), p.plan(), 0, 5, p.a.data(), p.topk_w.data(), ws.weights(), c.data(),
                                    p.k, p.H, p.I),
               std::invalid_argument);

  // The combine starts from +0: slots that are all −0 give +0 (from slot 0's
  // value it would be −0); one slot passes through unchanged otherwise.
  const std::vector<bf16> neg_zero(3 * 4, bf16{0x8000});
  std::vector<bf16> out(4);
  ref::moe_combine_fwd(neg_zero.data(), out.data(), 1, 3, 4);
  for (bf16 x : out) EXPECT_EQ(x.bits, 0x0000);
  const std::vector<bf16> single = {round_bf16(1.5f), bf16{0x0001}};
  std::vector<bf16> out1(2);
  ref::moe_combine_fwd(single.data(), out1.data(), 1, 1, 2);
  EXPECT_EQ(out1, single);

  // A NaN token poisons its own output only.
  Moe r(6, 16, 4, 2, 8, 160);
  r.a[size_t(2) * 16 + 5] = bf16{kCanonicalNanBf16};
  const ExpertStore all(4, 16, 8, 161, std::vector<bool>(4, true));
  const std::vector<bf16> o = run_fwd(knobs(), r, all.weights());
  for (int t = 0; t < r.T; ++t)
    for (int hh = 0; hh < 16; ++hh) EXPECT_EQ(is_nan(o[size_t(t) * 16 + hh]), t == 2) << t << "," << hh;
}

TEST_P(MoeTest, GoldenDigests) {
  Knobs kn = knobs();
  kn.grad_token_chunk = 4;
  const Moe p(11, 48, 8, 3, 32, 170, /*empty_expert=*/1);
  const ExpertStore ws(p.E, p.H, p.I, 180, std::vector<bool>(p.E, true));
  const size_t rows = size_t(p.T) * p.k;
  std::vector<bf16> c, dw(rows), da(size_t(p.T) * p.H);
  const std::vector<bf16> out = run_fwd(kn, p, ws.weights(), &c);
  std::vector<float> da_slot(rows * p.H);
  GradStore g(p.E, p.H, p.I);
  ref::moe_experts_bwd(kn, p.plan(), 0, p.E, p.a.data(), p.topk_w.data(), ws.weights(), p.dout.data(), da_slot.data(),
                       dw.data(), g.grads(), p.k, p.H, p.I);
  ref::moe_combine_bwd(da_slot.data(), nullptr, da.data(), p.T, p.k, p.H);
  // The whole layer with its router.
  const auto wr = random_bf16(size_t(p.E) * p.H, 190, 4.0f / std::sqrt(float(p.H)));
  std::vector<bf16> layer_out(size_t(p.T) * p.H), layer_da(size_t(p.T) * p.H);
  std::vector<float> dwr(size_t(p.E) * p.H);
  GradStore lg(p.E, p.H, p.I);
  ref::moe_layer_fwd(kn, p.a.data(), wr.data(), ws.weights(), layer_out.data(), p.T, p.H, p.E, p.k, p.I, true);
  ref::moe_layer_bwd(kn, p.a.data(), wr.data(), ws.weights(), p.dout.data(), layer_da.data(), dwr.data(), lg.grads(),
                     p.T, p.H, p.E, p.k, p.I, true);
  const std::string n = contract().name;
  test::expect_golden("ops/moe_experts.txt", n + ".c", test::digest(c));
  test::expect_golden("ops/moe_experts.txt", n + ".out", test::digest(out));
  test::expect_golden("ops/moe_experts.txt", n + ".da_slot", test::digest(da_slot));
  test::expect_golden("ops/moe_experts.txt", n + ".dtopk_w", test::digest(dw));
  test::expect_golden("ops/moe_experts.txt", n + ".expert_grads", test::digest(g.flat()));
  test::expect_golden("ops/moe_experts.txt", n + ".da", test::digest(da));
  test::expect_golden("ops/moe_experts.txt", n + ".layer_out", test::digest(layer_out));
  test::expect_golden("ops/moe_experts.txt", n + ".layer_da", test::digest(layer_da));
  test::expect_golden("ops/moe_experts.txt", n + ".layer_dwr", test::digest(dwr));
  test::expect_golden("ops/moe_experts.txt", n + ".layer_expert_grads", test::digest(lg.flat()));
}

// Qwen3-30B-A3B backward at the real shape (H 2048, 128 experts, top-8, I 768),
// routed by the real router: every stage within its bound.
TEST_P(MoeTest, SlowRealShapeBackwardWithinDerivedBound) {
  const int T = 3, H = 2048, E = 128, k = 8, I = 768;
  Moe p(T, H, E, k, I, 200);
  const auto wr = random_bf16(size_t(E) * H, 201, 4.0f / std::sqrt(float(H)));
  std::vector<bf16> logits(size_t(T) * E);
  ref::router_fwd(knobs(), p.a.data(), wr.data(), logits.data(), p.ids.data(), p.topk_w.data(), T, H, E, k, true);
  p.build_plan();
  const ExpertStore ws(E, H, I, 202, p.used());
  check_backward(knobs(), p, ws, p.used(), "30B-A3B bwd");
}

INSTANTIATE_TEST_SUITE_P(Contracts, MoeTest, ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1"),
                         [](const auto& info) { return std::string(info.param).substr(5, 6); });

}  // namespace
}  // namespace bp
