// moe_router: logits, fp32 softmax, top-k and routing weights against float64 truth
// with derived bounds (each stage on its own rounded inputs: the truth softmax is
// that of the bf16 logits, the truth weights use the reference's selection), the
// total order of the top-k (ties, NaN), backward bounds, batch invariance, negative
// controls, golden digests, edge inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "reference/common/rng.h"
#include "reference/ops/linear.h"
#include "reference/ops/moe_router.h"
#include "reference/truth/moe_router.h"
#include "support/bounds.h"
#include "support/golden.h"
#include "support/stage_bounds.h"

namespace bp {
namespace {

using test::BoundCheck;
using test::kU32;
using truth::MatD;

class RouterTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
};

struct Router {
  int T, H, E, k;
  std::vector<bf16> a, wr;
  Router(int T_, int H_, int E_, int k_, uint64_t seed) : T(T_), H(H_), E(E_), k(k_) {
    a = random_bf16(size_t(T) * H, seed, 1.0f);
    wr = random_bf16(size_t(E) * H, seed + 1, 4.0f / std::sqrt(float(H)));  // logits of a few units
  }
};

// The reference's router forward with its fp32 intermediates.
struct Routed {
  std::vector<bf16> logits, topk_w;
  std::vector<float> probs, weights;
  std::vector<int> ids;
};
Routed route(const Knobs& kn, const Router& r, bool norm) {
  Routed o{std::vector<bf16>(size_t(r.T) * r.E), std::vector<bf16>(size_t(r.T) * r.k),
           std::vector<float>(size_t(r.T) * r.E), std::vector<float>(size_t(r.T) * r.k),
           std::vector<int>(size_t(r.T) * r.k)};
  ref::router_fwd(kn, r.a.data(), r.wr.data(), o.logits.data(), o.ids.data(), o.topk_w.data(), r.T, r.H, r.E, r.k, norm);
  ref::router_probs(kn, o.logits.data(), o.probs.data(), r.T, r.E);
  std::vector<int> ids(o.ids.size());
  ref::router_topk(o.probs.data(), ids.data(), o.weights.data(), r.T, r.E, r.k, norm);
  EXPECT_EQ(ids, o.ids);
  return o;
}

std::vector<float> as_floats(const std::vector<int>& v) { return std::vector<float>(v.begin(), v.end()); }

// Relative error bound of each p_i of one row (u = 2^-24):
//   y_i = fl(x_i − max):      |y_i − (x_i − max)| <= u·|x_i − max|
//   e_i = exp(y_i):           e_i = e^(x_i−max)·(1 + ρ_i), 1 + |ρ_i| <= (1 + n_exp·2^-23)·e^(u|x_i − max|)
//   s = lane_sum(e):          s/Σe^(x−max) within (1 ± ρ_max)(1 ± γ_D), D the lane tree depth
//   p_i = fl(e_i / s):        |p_i/p_i* − 1| <= (1 + ρ_i)(1 + u) / ((1 − ρ_max)(1 − γ_D)) − 1
std::vector<double> prob_rel_bounds(const bf16* logits, int E, LaneShape shape) {
  double mx = -INFINITY;
  for (int i = 0; i < E; ++i) mx = std::max(mx, double(widen(logits[i])));
  std::vector<double> rho(E);
  for (int i = 0; i < E; ++i)
    rho[i] = (1 + test::kExpUlps * 0x1p-23) * std::exp(kU32 * std::fabs(widen(logits[i]) - mx)) - 1;
  const double rho_max = *std::max_element(rho.begin(), rho.end()), g = test::lane_sum_gamma(E, shape);
  std::vector<double> rel(E);
  for (int i = 0; i < E; ++i) rel[i] = (1 + rho[i]) * (1 + kU32) / ((1 - rho_max) * (1 - g)) - 1;
  return rel;
}

// Relative error bound of each fp32 weight of one row: the selected p's bounds, and
// with renormalisation the slot-order sum (k − 1 roundings) and the division.
std::vector<double> weight_rel_bounds(const std::vector<double>& p_rel, const int* ids, int k, bool norm) {
  std::vector<double> rel(k);
  for (int j = 0; j < k; ++j) rel[j] = p_rel[ids[j]];
  if (!norm) return rel;
  const double r_max = *std::max_element(rel.begin(), rel.end()), g = test::gamma_n(k - 1);
  for (int j = 0; j < k; ++j) rel[j] = (1 + rel[j]) * (1 + kU32) / ((1 - r_max) * (1 - g)) - 1;
  return rel;
}

// Slot j ranks before slot j+1, and slot k−1 before every unselected expert, in the
// contract's order on the reference's own fp32 probabilities.
void expect_topk_order(const float* p, const int* ids, int E, int k) {
  auto before = [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
  for (int j = 0; j + 1 < k; ++j) EXPECT_TRUE(before(ids[j], ids[j + 1])) << "slot " << j;
  for (int e = 0; e < E; ++e) {
    const bool unselected = std::find(ids, ids + k, e) == ids + k;
    EXPECT_TRUE(!unselected || before(ids[k - 1], e)) << "expert " << e;
  }
}

TEST_P(RouterTest, ForwardStagesWithinDerivedBound) {
  struct Case {
    int T, H, E, k;
  };
  for (const Case c : {Case{7, 64, 16, 4}, Case{9, 40, 8, 2}, Case{4, 2048, 128, 8}})  // last: Qwen3-30B-A3B
    for (bool norm : {true, false}) {
      const Router r(c.T, c.H, c.E, c.k, 10 + c.E);
      const Routed o = route(knobs(), r, norm);
      const MatD A = truth::widen(r.a, r.T, r.H), Wr = truth::widen(r.wr, r.E, r.H);
      const std::string what = "router E" + std::to_string(c.E) + (norm ? " norm" : "");
      {
        BoundCheck chk(what + " logits");
        test::check_dot(o.logits, truth::linear_fwd(A, Wr), truth::linear_fwd(A.cwiseAbs(), Wr.cwiseAbs()),
                        test::dot_gamma(knobs().dot, r.H), chk);
      }
      const MatD L = truth::widen(o.logits, r.T, r.E), P = truth::softmax_rows(L);
      const MatD W = truth::router_weights(L, o.ids, r.k, norm);
      BoundCheck p_chk(what + " probs"), w_chk(what + " weights fp32"), wb_chk(what + " weights bf16");
      for (int t = 0; t < r.T; ++t) {
        const std::vector<double> p_rel = prob_rel_bounds(&o.logits[size_t(t) * r.E], r.E, knobs().row_reduce);
        for (int e = 0; e < r.E; ++e) p_chk(o.probs[size_t(t) * r.E + e], P(t, e), p_rel[e] * P(t, e), e);
        const int* ids = &o.ids[size_t(t) * r.k];
        expect_topk_order(&o.probs[size_t(t) * r.E], ids, r.E, r.k);
        const std::vector<double> w_rel = weight_rel_bounds(p_rel, ids, r.k, norm);
        for (int j = 0; j < r.k; ++j) {
          const size_t i = size_t(t) * r.k + j;
          w_chk(o.weights[i], W(t, j), w_rel[j] * W(t, j), i);
          wb_chk(widen(o.topk_w[i]), W(t, j), test::round_bound(W(t, j), w_rel[j] * W(t, j)), i);
          EXPECT_EQ(o.topk_w[i], round_bf16(o.weights[i]));
        }
      }
    }
}

// Backward (u = 2^-24), with P the fp32 probabilities the weights are (relative
// bounds r from the forward), G the weight gradient and σ = Σ_j G_j·P_j:
//   σ_hat (k fma from +0):       |σ_hat − σ| <= γ_k·Σ|G_j|(1 + r_j)P_j + Σ|G_j|·r_j·P_j = E_σ
//   d = fl(G_e − σ_hat):         |d − (G_e − σ)| <= E_σ + u·(|G_e − σ| + E_σ) = E_d
//   dx = fl(P_hat_e·d):          |dx − P_e(G_e − σ)| <= r_e·P_e(|G_e − σ| + E_d) + P_e·E_d
//                                                        + u·(1 + r_e)P_e(|G_e − σ| + E_d)
// then dlogits = R(dx); da_acc is a dot over E, dwr a token-chunked wgrad.
TEST_P(RouterTest, BackwardStagesWithinDerivedBound) {
  for (bool norm : {true, false}) {
    Knobs kn = knobs();
    kn.grad_token_chunk = 8;  // several token chunks
    const Router r(21, 48, 16, 4, 30);
    const Routed o = route(kn, r, norm);
    const auto dw = random_bf16(size_t(r.T) * r.k, 31, 1.0f);
    std::vector<bf16> dlogits(size_t(r.T) * r.E);
    std::vector<float> da_acc(size_t(r.T) * r.H), dwr(size_t(r.E) * r.H);
    ref::router_bwd(kn, r.a.data(), r.wr.data(), o.logits.data(), o.ids.data(), dw.data(), dlogits.data(),
                    da_acc.data(), dwr.data(), r.T, r.H, r.E, r.k, norm);
    const MatD L = truth::widen(o.logits, r.T, r.E), DW = truth::widen(dw, r.T, r.k);
    const MatD P = truth::softmax_rows(L), W = truth::router_weights(L, o.ids, r.k, norm);
    const MatD DL = truth::router_dlogits(L, o.ids, DW, r.k, norm);
    const std::string what = std::string("router bwd") + (norm ? " norm" : "");
    {
      BoundCheck chk(what + " dlogits");
      for (int t = 0; t < r.T; ++t) {
        const int* ids = &o.ids[size_t(t) * r.k];
        const std::vector<double> p_rel = prob_rel_bounds(&o.logits[size_t(t) * r.E], r.E, kn.row_reduce);
        const std::vector<double> w_rel = weight_rel_bounds(p_rel, ids, r.k, norm);
        double sigma = 0, abs_terms = 0, e_rel = 0;
        for (int j = 0; j < r.k; ++j) {
          sigma += DW(t, j) * W(t, j);
          abs_terms += std::fabs(DW(t, j)) * (1 + w_rel[j]) * W(t, j);
          e_rel += std::fabs(DW(t, j)) * w_rel[j] * W(t, j);
        }
        const double e_sigma = test::gamma_n(r.k) * abs_terms + e_rel;
        for (int e = 0; e < r.E; ++e) {
          const int j = int(std::find(ids, ids + r.k, e) - ids);
          const bool selected = j < r.k;
          if (norm && !selected) {
            EXPECT_EQ(dlogits[size_t(t) * r.E + e].bits, 0x0000) << "unselected logit with renormalised weights";
            continue;
          }
          const double Pe = selected && norm ? W(t, j) : P(t, e), re = selected ? w_rel[j] : p_rel[e];
          const double Ge = selected ? DW(t, j) : 0.0, diff = std::fabs(Ge - sigma);
          const double e_d = e_sigma + kU32 * (diff + e_sigma);
          const double err = re * Pe * (diff + e_d) + Pe * e_d + kU32 * (1 + re) * Pe * (diff + e_d);
          chk(widen(dlogits[size_t(t) * r.E + e]), DL(t, e), test::round_bound(DL(t, e), err), e);
        }
      }
    }
    const MatD DLr = truth::widen(dlogits, r.T, r.E), A = truth::widen(r.a, r.T, r.H), Wr = truth::widen(r.wr, r.E, r.H);
    {
      BoundCheck chk(what + " da_acc");
      test::check_dot(da_acc, truth::linear_dgrad(DLr, Wr), truth::linear_dgrad(DLr.cwiseAbs(), Wr.cwiseAbs()),
                      test::dot_gamma(kn.dot, r.E), chk);
    }
    BoundCheck chk(what + " dWr");
    test::check_dot(dwr, truth::linear_wgrad(DLr, A), truth::linear_wgrad(DLr.cwiseAbs(), A.cwiseAbs()),
                    test::wgrad_gamma(kn.dot, r.T, kn.grad_token_chunk), chk);
  }
}

// L = Σ c·w(logits) for a fixed selection: the twin's dlogits against central
// differences (h = 2^-16: truncation h²/6·|L'''| and cancellation 2^-52·|L|/h are
// both below 1e-9 for O(1) logits).
TEST(RouterTruth, GradientsMatchFiniteDifferences) {
  const int T = 3, E = 6, k = 3;
  const MatD L = 2.0 * test::random_matd(T, E, 1), C = test::random_matd(T, k, 2);
  const std::vector<int> ids = truth::topk_ids(truth::softmax_rows(L), k);
  const double h = 0x1p-16;
  for (bool norm : {true, false}) {
    const MatD grad = truth::router_dlogits(L, ids, C, k, norm);
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        MatD lp = L, lm = L;
        lp(t, e) += h;
        lm(t, e) -= h;
        const double fd = ((truth::router_weights(lp, ids, k, norm).array() * C.array()).sum() -
                           (truth::router_weights(lm, ids, k, norm).array() * C.array()).sum()) /
                          (2 * h);
        EXPECT_NEAR(fd, grad(t, e), 1e-9) << "norm " << norm;
      }
  }
}

// All-equal logits (a zero router weight): every probability is 1/E, the ties go
// to the lowest ids, and the weights are 1/k (renormalised) or 1/E.
TEST_P(RouterTest, AllEqualLogitsSelectLowestIds) {
  const int T = 2, H = 32, E = 16, k = 4;
  const auto a = random_bf16(size_t(T) * H, 40, 1.0f);
  const std::vector<bf16> wr(size_t(E) * H, bf16{0x0000});
  for (bool norm : {true, false}) {
    std::vector<bf16> logits(size_t(T) * E), w(size_t(T) * k);
    std::vector<int> ids(size_t(T) * k);
    ref::router_fwd(knobs(), a.data(), wr.data(), logits.data(), ids.data(), w.data(), T, H, E, k, norm);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(ids[size_t(t) * k + j], j);
        EXPECT_EQ(w[size_t(t) * k + j], round_bf16(norm ? 0.25f : 1.0f / 16));
      }
  }
}

// The top-k's total order on hand-made probabilities: NaN above every number
// (ties among NaNs to the lower id), descending value, ties (+0 = −0 included)
// to the lower id.
TEST(Router, TopkTotalOrder) {
  const float nan = float_of(kCanonicalNanF32);
  const std::vector<float> p = {0.1f, nan, 0.5f, nan, 0.25f, 0.5f, -0.0f, 0.0f};
  std::vector<int> ids(8);
  std::vector<float> w(8);
  ref::router_topk(p.data(), ids.data(), w.data(), 1, 8, 8, false);
  EXPECT_EQ(ids, (std::vector<int>{1, 3, 2, 5, 4, 0, 6, 7}));
  const std::vector<float> q = {0.0f, -0.0f};
  ids.assign(2, -1);
  ref::router_topk(q.data(), ids.data(), w.data(), 1, 2, 2, false);
  EXPECT_EQ(ids, (std::vector<int>{0, 1}));
}

// Non-finite logits: NaN anywhere makes the row's max NaN, so every probability
// and weight is NaN and the ids are 0..k−1; +Inf gives Inf − Inf = NaN likewise;
// −Inf logits get probability +0 unless all are −Inf (NaN).
TEST_P(RouterTest, NonFiniteLogits) {
  const int E = 8, k = 2;
  auto run = [&](std::vector<bf16> logits, std::vector<int>& ids, std::vector<float>& w) {
    std::vector<float> p(E);
    ref::router_probs(knobs(), logits.data(), p.data(), 1, E);
    ref::router_topk(p.data(), ids.data(), w.data(), 1, E, k, true);
    return p;
  };
  std::vector<int> ids(k);
  std::vector<float> w(k);
  std::vector<bf16> logits(E, round_bf16(1.0f));
  logits[5] = bf16{kCanonicalNanBf16};
  for (float x : run(logits, ids, w)) EXPECT_TRUE(is_nan(x));
  EXPECT_EQ(ids, (std::vector<int>{0, 1}));
  EXPECT_TRUE(is_nan(w[0]) && is_nan(w[1]));
  logits[5] = bf16{0x7f80};
  for (float x : run(logits, ids, w)) EXPECT_TRUE(is_nan(x));
  logits.assign(E, round_bf16(1.0f));
  logits[3] = bf16{0xff80};
  logits[6] = round_bf16(2.0f);
  const std::vector<float> p = run(logits, ids, w);
  EXPECT_EQ(bits_of(p[3]), 0u);
  EXPECT_EQ(ids, (std::vector<int>{6, 0}));
  logits.assign(E, bf16{0xff80});
  for (float x : run(logits, ids, w)) EXPECT_TRUE(is_nan(x));
}

// One token alone equals the same token inside batches of 2..64: ids, weights,
// dlogits and its input-gradient accumulator.
TEST_P(RouterTest, BatchInvariance) {
  const int H = 64, E = 16, k = 4;
  const Router one(1, H, E, k, 50);
  const auto dw_one = random_bf16(k, 51, 1.0f);
  auto run = [&](const std::vector<bf16>& a, const std::vector<bf16>& dw, int T, std::vector<int>& ids,
                 std::vector<bf16>& w, std::vector<bf16>& dl, std::vector<float>& da) {
    std::vector<bf16> logits(size_t(T) * E);
    std::vector<float> dwr(size_t(E) * H);
    ids.resize(size_t(T) * k);
    w.resize(size_t(T) * k);
    dl.resize(size_t(T) * E);
    da.resize(size_t(T) * H);
    ref::router_fwd(knobs(), a.data(), one.wr.data(), logits.data(), ids.data(), w.data(), T, H, E, k, true);
    ref::router_bwd(knobs(), a.data(), one.wr.data(), logits.data(), ids.data(), dw.data(), dl.data(), da.data(),
                    dwr.data(), T, H, E, k, true);
  };
  std::vector<int> ids1, ids;
  std::vector<bf16> w1, dl1, w, dl;
  std::vector<float> da1, da;
  run(one.a, dw_one, 1, ids1, w1, dl1, da1);
  for (int batch : {2, 3, 17, 64}) {
    auto a = random_bf16(size_t(batch) * H, 100 + batch, 1.0f), dw = random_bf16(size_t(batch) * k, 200 + batch, 1.0f);
    const int at = batch / 2;
    std::copy(one.a.begin(), one.a.end(), a.begin() + size_t(at) * H);
    std::copy(dw_one.begin(), dw_one.end(), dw.begin() + size_t(at) * k);
    run(a, dw, batch, ids, w, dl, da);
    EXPECT_TRUE(std::equal(ids1.begin(), ids1.end(), ids.begin() + size_t(at) * k)) << batch;
    EXPECT_TRUE(std::equal(w1.begin(), w1.end(), w.begin() + size_t(at) * k)) << batch;
    EXPECT_TRUE(std::equal(dl1.begin(), dl1.end(), dl.begin() + size_t(at) * E)) << batch;
    EXPECT_EQ(test::digest(da1), test::digest(std::vector<float>(da.begin() + size_t(at) * H,
                                                                 da.begin() + size_t(at + 1) * H)))
        << batch;
  }
}

// Negative controls on the same inputs: a sequential softmax sum instead of the
// lane tree, the renormalisation sum in reversed slot order, ties to the higher
// id, and autograd's chain rule through the full softmax for renormalised weights
// (which leaves rounding noise on unselected logits where the contract has +0).
TEST_P(RouterTest, NegativeControlsChangeBits) {
  const Router r(64, 64, 128, 8, 60);
  const Routed o = route(knobs(), r, true);
  std::vector<float> seq_probs(o.probs.size()), rev_weights(o.weights.size());
  for (int t = 0; t < r.T; ++t) {
    const size_t row = size_t(t) * r.E;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < r.E; ++e) mx = std::max(mx, widen(o.logits[row + e]));
    for (int e = 0; e < r.E; ++e) sum = add_rn(sum, math::exp(sub_rn(widen(o.logits[row + e]), mx)));
    for (int e = 0; e < r.E; ++e) seq_probs[row + e] = div_rn(math::exp(sub_rn(widen(o.logits[row + e]), mx)), sum);
    float s = 0.0f;
    for (int j = r.k - 1; j >= 0; --j) s = add_rn(s, o.probs[row + o.ids[size_t(t) * r.k + j]]);
    for (int j = 0; j < r.k; ++j) rev_weights[size_t(t) * r.k + j] = div_rn(o.probs[row + o.ids[size_t(t) * r.k + j]], s);
  }
  EXPECT_NE(test::digest(o.probs), test::digest(seq_probs));
  EXPECT_NE(test::digest(o.weights), test::digest(rev_weights));

  // Ties to the higher id on all-equal probabilities.
  const std::vector<float> equal(16, 1.0f / 16);
  std::vector<int> ids(4);
  std::vector<float> w(4);
  ref::router_topk(equal.data(), ids.data(), w.data(), 1, 16, 4, true);
  EXPECT_NE(ids, (std::vector<int>{15, 14, 13, 12}));

  // Chain rule through renormalisation then the full softmax.
  const auto dw = random_bf16(size_t(r.T) * r.k, 61, 1.0f);
  std::vector<bf16> dlogits(o.logits.size()), chain(o.logits.size());
  std::vector<float> da(size_t(r.T) * r.H), dwr(size_t(r.E) * r.H);
  ref::router_bwd(knobs(), r.a.data(), r.wr.data(), o.logits.data(), o.ids.data(), dw.data(), dlogits.data(), da.data(),
                  dwr.data(), r.T, r.H, r.E, r.k, true);
  for (int t = 0; t < r.T; ++t) {
    const float* p = &o.probs[size_t(t) * r.E];
    const int* id = &o.ids[size_t(t) * r.k];
    float S = 0.0f, d = 0.0f, sigma = 0.0f;
    std::vector<float> dq(r.E, 0.0f);
    for (int j = 0; j < r.k; ++j) S = add_rn(S, p[id[j]]);
    for (int j = 0; j < r.k; ++j) d = fma_rn(widen(dw[size_t(t) * r.k + j]), o.weights[size_t(t) * r.k + j], d);
    for (int j = 0; j < r.k; ++j) dq[id[j]] = div_rn(sub_rn(widen(dw[size_t(t) * r.k + j]), d), S);
    for (int j = 0; j < r.k; ++j) sigma = fma_rn(dq[id[j]], p[id[j]], sigma);
    for (int e = 0; e < r.E; ++e) chain[size_t(t) * r.E + e] = round_bf16(mul_rn(p[e], sub_rn(dq[e], sigma)));
  }
  EXPECT_NE(test::digest(dlogits), test::digest(chain));
}

TEST_P(RouterTest, RejectsBadTopkAndIds) {
  std::vector<float> p(4, 0.25f), w(5);
  std::vector<int> ids(5);
  EXPECT_THROW(ref::router_topk(p.data(), ids.data(), w.data(), 1, 4, 5, true), std::invalid_argument);
  const Router r(1, 16, 4, 2, 70);
  std::vector<bf16> logits(4), dw(2), dl(4);
  std::vector<float> da(16), dwr(64);
  const std::vector<int> bad = {0, 4};
  EXPECT_THROW(ref::router_bwd(knobs(), r.a.data(), r.wr.data(), logits.data(), bad.data(), dw.data(), dl.data(),
                               da.data(), dwr.data(), 1, 16, 4, 2, true),
               std::invalid_argument);
}

TEST_P(RouterTest, GoldenDigests) {
  Knobs kn = knobs();
  kn.grad_token_chunk = 8;
  const Router r(13, 96, 16, 4, 80);
  const auto dw = random_bf16(size_t(r.T) * r.k, 81, 1.0f);
  const std::string c = contract().name;
  for (bool norm : {true, false}) {
    const Routed o = route(kn, r, norm);
    std::vector<bf16> dlogits(o.logits.size());
    std::vector<float> da(size_t(r.T) * r.H), dwr(size_t(r.E) * r.H);
    ref::router_bwd(kn, r.a.data(), r.wr.data(), o.logits.data(), o.ids.data(), dw.data(), dlogits.data(), da.data(),
                    dwr.data(), r.T, r.H, r.E, r.k, norm);
    const std::string n = c + (norm ? ".norm" : ".raw");
    test::expect_golden("ops/moe_router.txt", n + ".logits", test::digest(o.logits));
    test::expect_golden("ops/moe_router.txt", n + ".probs", test::digest(o.probs));
    test::expect_golden("ops/moe_router.txt", n + ".ids", test::digest(as_floats(o.ids)));
    test::expect_golden("ops/moe_router.txt", n + ".weights_fp32", test::digest(o.weights));
    test::expect_golden("ops/moe_router.txt", n + ".topk_w", test::digest(o.topk_w));
    test::expect_golden("ops/moe_router.txt", n + ".dlogits", test::digest(dlogits));
    test::expect_golden("ops/moe_router.txt", n + ".da_acc", test::digest(da));
    test::expect_golden("ops/moe_router.txt", n + ".dwr", test::digest(dwr));
  }
}

INSTANTIATE_TEST_SUITE_P(Contracts, RouterTest, ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1"),
                         [](const auto& info) { return std::string(info.param).substr(5, 6); });

}  // namespace
}  // namespace bp
