// logprob: accuracy against float64 truth (derived bounds), truth gradients by
// finite differences, batch invariance, vocab-parallel split invariance with
// negative controls, refusals, edge inputs, golden digests.
//
// Error bound (SPEC.md §5.10), per row, u = 2^-24, ε_e and ε_l the relative
// errors of the contract's exp and log (their ulp bounds × 2^-23, SPEC.md §2.2).
// Write x̂ for the op's scaled logits (fp32, exact in double) and x = f(l)/temp
// for truth's. First bound the op against the exact function of x̂, then add the
// effect of x̂ − x (zero when temp = 1).
//  • M = max x̂ is exact; d̂_v = x̂_v − M has |d̂ − d| <= u|d|, so
//    |ê_v − e_v| <= a_v = e_v·((1+ε_e)·exp(u|d_v|) − 1) + ε_e·2^-126
//    (the last term covers results in exp's subnormal range, where an ulp is 2^-149).
//  • S: every term is >= 0 and passes through at most h rounded additions (its
//    lane's run minus one, log2 L lane-tree levels, log2 C chunk-tree levels), so
//    |Ŝ − S| <= ΔS = A + γ_h·(S + A), A = Σ a_v, γ_h = h·u/(1 − h·u).
//  • log: with r = ΔS/S, |log Ŝ − log S| <= r/(1−r), plus the log's own error
//    ε_l·|log Ŝ|: E_L = r/(1−r) + ε_l·(log S + r/(1−r)).
//  • logprob = (x̂_t − M) − log Ŝ with two roundings:
//    E_lp = u|x̂_t − M| + E_L, then + u·(|lp| + E_lp).
//  • entropy H = log S − W/S with W = Σ e_v d_v <= 0 (same-sign terms, no
//    cancellation): term error b_v = a_v|d_v|(1+u) + e_v·u|d_v| + u(e_v+a_v)|d_v|(1+u),
//    ΔW = B + γ_h(|W| + B); E_Q = (ΔW + |W/S|·ΔS)/(S − ΔS), then + u(|W/S| + E_Q);
//    E_H = E_L + E_Q, then + u(H + E_H).
//  • gradient g_v = c·(δ − p_v)/temp, p̂_v = ê_v ÷ Ŝ: E_p = P + u(p + P) with
//    P = (a_v + p·ΔS)/(S − ΔS); δ − p̂ adds u(|q| + E_p) when δ = 1 (δ = 0 is an
//    exact negation); c·q ÷ temp: |c|/temp·(E_q + ((1+u)² − 1)(|q| + E_q)); then R()
//    by test::bf16_output_bound.
//  • x̂ − x: logprob is 1-Lipschitz in x_t plus 1-Lipschitz in max-norm through
//    lse, so + |Δx_t| + max|Δx|; |∂H/∂x|_1 = Σ p|log p + H| <= 2H <= 2 log n, so
//    + 2 log(n)·max|Δx|; log p moves by at most κ = 2 max|Δx|, so p by
//    p̂·e^κ(e^κ − 1), times |c|/temp.
//  • v2 (SPEC.md §5.10 v2; analyse_row_base2): the sums are of e'_v = 2^(x̂_v·c − M_c)
//    in the root's frame; each element's exponent errs by E_v through its own fma and
//    k = log2 C merge factors (the rounded scaled maxima telescope), its factors by
//    exp2_poly's ε and one product rounding per level; W is in base 2 and reaches
//    nats through ln 2's fp32; logprob = fma(t̂_t, ln2, −λ̂) carries t̂_t's rounding.
//    What remains is exact: the computed c has c·ln 2 = 1 + ε_c, so the op computes
//    the softmax of x̂(1+ε_c); the mean value theorem bounds what that moves.
//  • truth and the bound itself are evaluated in double: (n + 8)·2^-53 < 2^-30
//    relative for n <= 2^22, added as 2^-30·(1 + |value| + |M|) (gradients:
//    2^-30·|c|/temp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "reference/numerics/math.h"
#include <cstdio>

#include "reference/common/rng.h"
#include "reference/ops/attention.h"
#include "reference/ops/logprob.h"
#include "reference/truth/logprob.h"
#include "support/bounds.h"
#include "support/contracts.h"
#include "support/float_gen.h"
#include "support/golden.h"
#include "support/logprob_cases.h"

namespace bp {
namespace {

using truth::MatD;
using truth::VecD;

constexpr double kU = test::kU32;
constexpr double kTruthRel = 0x1p-30;
constexpr int kQwenVocab = 151936;

// Worst-case errors of the contract's exp and log in ulps of the result, over all
// 2^32 inputs (SPEC.md §2.2; tools/ulp_scan measured 0.5175 and 0.5164), rounded up.
constexpr double kExpUlps = math::kMaxUlpExp;  // SPEC §2.2
constexpr double kLogUlps = math::kMaxUlpLog;
constexpr double kExpRel = kExpUlps * 0x1p-23, kExpAbs = kExpRel * 0x1p-126, kLogRel = kLogUlps * 0x1p-23;

using Inputs = test::LogprobInputs;
using Outputs = test::LogprobOutputs;
Inputs make_inputs(int T, int V, float temp, uint64_t seed, float scale = 8.0f) {
  return test::make_logprob_inputs(T, V, temp, seed, scale);
}
Outputs run(const Knobs& kn, const Inputs& in) { return test::reference_logprob(kn, in); }

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  EXPECT_EQ(test::digest(a), test::digest(b)) << what;
}

// Rounded additions on any term's path: its lane's run (the first add to +0 is
// exact), the lane tree's log2(lanes) levels and the chunk tree's levels.
int sum_depth(int chunk_len, LaneShape s, int chunks) {
  const int runs = (chunk_len + s.vec - 1) / s.vec;
  const int per_lane = std::min(chunk_len, (runs + s.lanes - 1) / s.lanes * s.vec);
  int depth = per_lane - 1;
  for (int l = 1; l < s.lanes; l *= 2) ++depth;
  for (int c = 1; c < chunks; c *= 2) ++depth;
  return depth;
}

// One row's exact sums on the op's own scaled logits x̂ and the error bounds of
// the computed ones (header comment): the part every bound below shares. Under v2
// the sums are of e'_v = 2^(x̂_v·c − M_c) and W is in base 2; `lp_shift`,
// `H_shift` and `p_shift` bound what c's own rounding (x̂ read as x̂·c·ln 2) moves.
struct RowSums {
  bool base2 = false;
  double M = -INFINITY, S = 0, dS = 0, W = 0, dW = 0, E_L = 0, dx_max = 0;
  double Mc = 0, lp_shift_rel = 0, H_shift = 0, p_shift = 0;
  int finite = 0;
  std::vector<double> x_hat, dx, e, a, a_bwd;  // x̂_v, |x̂_v − x_v|, e_v, |ê_v − e_v| bounds (sum, backward)
};

// The v2 constants as doubles: c = RN(log2 e), ln 2's fp32, and c·ln 2 − 1.
const double kC2 = ref::kLog2eF, kLn2f = ref::kLn2F, kLn2 = std::log(2.0), kEpsC = kC2 * kLn2 - 1;
const double kExp2Rel = math::kMaxUlpExp2Poly * 0x1p-23;

void finish_sums(RowSums& r, double A, double B, double W_abs, double gamma) {
  r.dS = A + gamma * (r.S + A);
  r.dW = B + gamma * (W_abs + B);
  const double rel = r.dS / r.S, log_err = rel / (1 - rel);
  r.E_L = log_err + kLogRel * (std::fabs(std::log(r.S)) + log_err);
}

// v2 (SPEC.md §5.10 v2). Element v of chunk j passes one exponent fma, exp2_poly,
// and at most k = log2 C merge levels, each a factor exp2_poly(δ) of a rounded
// difference δ of two rounded scaled maxima, one product and one fma for w. The
// scaled maxima's own roundings telescope away, so against e'_v the exponent errs
// by E_v <= u·c·((m_j − x̂_v) + k(M − m_j))(1+4u) + 4(k+1)u²|M|c (each rounding u·|its
// argument|, the arguments bounded by the distances to the maxima plus R(m·c)'s
// own rounding), and the factors by (1+ε)^(k+1)(1+u)^k. exp2_poly flushes below
// 2^-125 and products may round in the subnormal range: 2^-124 per level. w's term
// e·t carries t's error E_v, and its products and fma per level one rounding each.
void analyse_row_base2(const Knobs& kn, const Inputs& in, RowSums& r, double gamma) {
  const int V = in.V, C = kn.tp_tree_width, n = (V + C - 1) / C;  // fixed chunks (SPEC.md §2.4.1)
  int k = 0;
  while ((1 << k) < C) ++k;
  r.Mc = ref::scaled_max_base2(static_cast<float>(r.M));
  double A = 0, B = 0, W_abs = 0, range = 0;
  for (int j = 0; j < C; ++j) {
    double mj = -INFINITY;
    const int end = std::min((j + 1) * n, V);
    for (int v = j * n; v < end; ++v) mj = std::max(mj, r.x_hat[v]);
    for (int v = j * n; v < end; ++v) {
      if (std::isinf(r.x_hat[v])) continue;
      const double tv = r.x_hat[v] * kC2 - r.Mc;  // exact: a 24×24-bit product, then one double rounding
      const double E = kU * kC2 * ((mj - r.x_hat[v]) + k * (r.M - mj)) * (1 + 4 * kU) + 4 * (k + 1) * kU * kU * std::fabs(r.M) * kC2;
      r.e[v] = std::exp2(tv);
      r.a[v] = r.e[v] * (std::pow(1 + kExp2Rel, k + 1) * std::pow(1 + kU, k) * std::exp(kLn2 * E) - 1) + (k + 1) * 0x1p-124;
      r.a_bwd[v] = r.e[v] * ((1 + kExp2Rel) * std::exp(kLn2 * kU * std::fabs(tv) * (1 + kU)) - 1) + 0x1p-125;
      r.S += r.e[v];
      r.W += r.e[v] * tv;
      W_abs += r.e[v] * std::fabs(tv);
      A += r.a[v];
      B += r.a[v] * std::fabs(tv) + (r.e[v] + r.a[v]) * (E + (std::fabs(tv) + E) * (std::pow(1 + kU, 2 * k + 1) - 1));
      range = std::max(range, r.M - r.x_hat[v]);
    }
  }
  finish_sums(r, A, B, W_abs, gamma);
  // x̂ read as x̂·(1+ε_c): Δ_v = ε_c(x̂_v − M), m = |ε_c|·range. logprob moves by
  // <= |Δ_t| + e^{2m}Σp|Δ| (mean value theorem on lse); H by Σ|∂H/∂x̂_v(ξ)||Δ_v| with
  // |∂H/∂x_v| = p_v|log p_v + H|, p within e^{±2m} and log p, H within 2m(1 + log n).
  const double m = std::fabs(kEpsC) * range, grow = std::exp(2 * m);
  double spread = 0, h_spread = 0;
  const double H = std::log(r.S) - kLn2 * r.W / r.S;
  for (int v = 0; v < V; ++v) {
    if (std::isinf(r.x_hat[v])) continue;
    const double p = r.e[v] / r.S, d = r.M - r.x_hat[v];
    spread += p * d;
    h_spread += p * grow * (std::fabs(std::log(p) + H) + 2 * m * (1 + std::log(double(r.finite)))) * d;
  }
  r.lp_shift_rel = grow * spread;  // times |ε_c|, plus |ε_c|·|x̂_t − M|
  r.H_shift = std::fabs(kEpsC) * h_spread;
  r.p_shift = grow * (grow - 1);  // relative, on p
}

RowSums analyse_row(const Knobs& kn, const Inputs& in, int t) {
  const int V = in.V, C = kn.tp_tree_width;
  const double h = sum_depth((V + C - 1) / C, kn.row_reduce, C), gamma = h * kU / (1 - h * kU);
  RowSums r{};
  r.base2 = kn.softmax_exp == SoftmaxExp::kExp2Poly;
  r.x_hat.assign(V, 0.0), r.dx.assign(V, 0.0), r.e.assign(V, 0.0), r.a.assign(V, 0.0), r.a_bwd.assign(V, 0.0);
  for (int v = 0; v < V; ++v) {
    r.x_hat[v] = ref::scaled_logit(in.at(t, v), in.temp);
    r.M = std::max(r.M, r.x_hat[v]);
    if (std::isinf(r.x_hat[v])) continue;
    ++r.finite;
    r.dx[v] = std::fabs(r.x_hat[v] - widen(in.at(t, v)) / double(in.temp));
    r.dx_max = std::max(r.dx_max, r.dx[v]);
  }
  if (r.base2) {
    analyse_row_base2(kn, in, r, gamma);
    return r;
  }
  double A = 0, B = 0;
  for (int v = 0; v < V; ++v) {
    if (std::isinf(r.x_hat[v])) continue;  // masked: ê = e = 0 exactly, term +0
    const double d = r.x_hat[v] - r.M, ad = std::fabs(d);
    r.e[v] = std::exp(d);
    r.a[v] = r.a_bwd[v] = r.e[v] * ((1 + kExpRel) * std::exp(kU * ad) - 1) + kExpAbs;
    r.S += r.e[v];
    r.W += r.e[v] * d;
    A += r.a[v];
    B += r.a[v] * ad * (1 + kU) + r.e[v] * kU * ad + kU * (r.e[v] + r.a[v]) * ad * (1 + kU);
  }
  finish_sums(r, A, B, std::fabs(r.W), gamma);
  return r;
}

double logprob_bound(const RowSums& r, int target) {
  if (r.base2) {  // lp = fma(t̂_t, ln2_f, −λ̂): t̂_t within u|t_t|, ln2_f within |ln2_f − ln 2|
    const double tt = r.x_hat[target] * kC2 - r.Mc, lp = tt * kLn2 - std::log(r.S);
    double E = std::fabs(tt) * (kU * kLn2f + std::fabs(kLn2f - kLn2)) * (1 + kU) + r.E_L;
    E += kU * (std::fabs(lp) + E);
    E += std::fabs(kEpsC) * (std::fabs(r.x_hat[target] - r.M) + r.lp_shift_rel);
    return E + r.dx[target] + r.dx_max + kTruthRel * (1 + std::fabs(lp) + std::fabs(r.M));
  }
  const double lp = r.x_hat[target] - r.M - std::log(r.S);
  double E = kU * std::fabs(r.x_hat[target] - r.M) + r.E_L;
  E += kU * (std::fabs(lp) + E);
  return E + r.dx[target] + r.dx_max + kTruthRel * (1 + std::fabs(lp) + std::fabs(r.M));
}

double entropy_bound(const RowSums& r) {
  // v2: Q = (W·ln2_f) ÷ S, two roundings and ln2_f's own error on top of W's and S's.
  const double to_nat = r.base2 ? kLn2 : 1.0, Q = to_nat * r.W / r.S, H = std::log(r.S) - Q;
  double E_Q = to_nat * (r.dW + std::fabs(r.W / r.S) * r.dS) / (r.S - r.dS);
  if (r.base2) E_Q += (std::fabs(Q) + E_Q) * (std::fabs(kLn2f - kLn2) / kLn2 + 2 * kU);
  else E_Q += kU * (std::fabs(Q) + E_Q);
  double E = r.E_L + E_Q;
  E += kU * (H + E);
  return E + r.H_shift + 2 * std::log(double(r.finite)) * r.dx_max + kTruthRel * (1 + H + std::fabs(r.M));
}

// Bounds of the fp32 gradient values before their bf16 rounding.
std::vector<double> grad_bounds(const RowSums& r, int target, float coef, float temp) {
  const double kappa = 2 * r.dx_max, scale = std::fabs(coef) / temp;
  std::vector<double> b(r.e.size());
  for (size_t v = 0; v < b.size(); ++v) {
    const double p = r.e[v] / r.S, P = (r.a_bwd[v] + p * r.dS) / (r.S - r.dS) + p * r.p_shift, E_p = P + kU * (p + P);
    const bool is_target = int(v) == target;
    const double q = (is_target ? 1.0 : 0.0) - p;
    const double E_q = E_p + (is_target ? kU * (std::fabs(q) + E_p) : 0.0);
    const double fp32 = E_q + ((1 + kU) * (1 + kU) - 1) * (std::fabs(q) + E_q);
    b[v] = scale * (fp32 + p * std::exp(kappa) * (std::exp(kappa) - 1) + kTruthRel);
  }
  return b;
}

// Largest err/bound seen per quantity, printed so the report can quote it.
struct Ratios {
  double logprob = 0, entropy = 0, grad = 0;
  void print(const char* what) const {
    std::printf("[ratio] %s: logprob %.3g entropy %.3g grad %.3g\n", what, logprob, entropy, grad);
  }
};

// Every logprob, entropy and gradient element of `in` within its derived bound.
void expect_within_bounds(const Knobs& kn, const Inputs& in, Ratios& ratios) {
  const Outputs o = run(kn, in);
  const MatD L = truth::widen(in.logits, in.T, in.V);
  const VecD lp = truth::logprob_fwd(L, in.targets, in.temp), H = truth::entropy(L, in.temp);
  const VecD coef = Eigen::Map<const Eigen::VectorXf>(in.coef.data(), in.T).cast<double>();
  const MatD g = truth::logprob_grad(L, in.targets, coef, in.temp);
  auto check = [](double got, double want, double bound, double& ratio, const char* what, int t, int v) {
    const double err = std::fabs(got - want);
    if (!(err <= bound)) ADD_FAILURE() << what << " row " << t << " v " << v << ": got " << got << " truth " << want
                                        << " bound " << bound;
    if (bound > 0) ratio = std::max(ratio, err / bound);
  };
  for (int t = 0; t < in.T; ++t) {
    const RowSums r = analyse_row(kn, in, t);
    if (std::isinf(lp(t))) EXPECT_EQ(o.logprob[t], lp(t)) << "masked target of row " << t;
    else check(o.logprob[t], lp(t), logprob_bound(r, in.targets[t]), ratios.logprob, "logprob", t, -1);
    check(o.entropy[t], H(t), entropy_bound(r), ratios.entropy, "entropy", t, -1);
    const std::vector<double> gb = grad_bounds(r, in.targets[t], in.coef[t], in.temp);
    for (int v = 0; v < in.V; ++v)
      check(widen(o.dlogits[size_t(t) * in.V + v]), g(t, v), test::bf16_output_bound(g(t, v), gb[v]), ratios.grad,
            "dlogit", t, v);
  }
}

class LogprobTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
};

TEST_P(LogprobTest, WithinDerivedBound) {
  struct Shape {
    int T, V;
  };
  Ratios ratios;
  // 300, 211, 9: vocabularies that are not multiples of C (fixed chunks, the last short or empty);
  // 151669: Qwen3's resized to its tokenizer.
  for (const Shape s : {Shape{6, 64}, Shape{6, 1000}, Shape{3, kQwenVocab}, Shape{6, 300}, Shape{6, 211}, Shape{6, 9},
                        Shape{3, 151669}})
    for (float temp : {1.0f, 0.7f}) expect_within_bounds(knobs(), make_inputs(s.T, s.V, temp, 1000 + s.V), ratios);
  ratios.print(GetParam());
}

TEST_P(LogprobTest, SlowWithinDerivedBoundManyRealVocabRows) {
  Ratios ratios;
  for (float temp : {1.0f, 0.7f, 1.3f}) expect_within_bounds(knobs(), make_inputs(48, kQwenVocab, temp, 77), ratios);
  ratios.print(GetParam());
}

// Truth's gradient against central differences of L = Σ c_t·logprob_t. The
// difference quotient errs by <= h²/6·|L'''| + 2ε/(2h), ε the error of one loss
// evaluation. Along one logit, logprob''' = −p(1−p)(1−2p)/temp³, at most
// 1/(4·temp³) in magnitude; each row's log-softmax is a few roundings of values
// below |x| + log V, so ε <= 2^-48·Σ|c_t|·(1 + 2·max|x|).
// max_nan is written with selects only (kernels interleave many): IEEE maximum
// (NaN wins, canonical; −0 < +0) on every bf16 pattern against specials and random
// fp32, both orders. Control: max_num, which ignores NaNs, is caught.
TEST(LogprobScalars, MaxNanIsMaximum) {
  EXPECT_EQ(test::max_mismatches([](float a, float b) { return ref::max_nan(a, b); }, true), 0u);
  EXPECT_GT(test::max_mismatches([](float a, float b) { return ref::max_num(a, b); }, true), 0u);
}

TEST(LogprobTruth, GradientMatchesFiniteDifferences) {
  const int T = 3, V = 7;
  const double temp = 0.7, h = 1e-5;
  const MatD L = 4 * MatD::Random(T, V);
  const VecD c = VecD::Random(T);
  const std::vector<int32_t> targets = {0, 3, 6};
  const MatD g = truth::logprob_grad(L, targets, c, temp);
  auto loss = [&](const MatD& l) { return truth::logprob_fwd(l, targets, temp).dot(c); };
  const double sum_c = c.cwiseAbs().sum(), max_x = L.cwiseAbs().maxCoeff() / temp;
  const double tol = h * h / 6 * sum_c / (4 * temp * temp * temp) + 0x1p-48 * sum_c * (1 + 2 * max_x) / h;
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < V; ++v) {
      MatD lp = L, lm = L;
      lp(t, v) += h;
      lm(t, v) -= h;
      EXPECT_NEAR((loss(lp) - loss(lm)) / (2 * h), g(t, v), tol) << t << "," << v;
    }
}

// One row alone equals the same row inside batches of 2..64 other rows.
TEST_P(LogprobTest, BatchInvariance) {
  const Inputs one = make_inputs(1, 4096, 0.7f, 21);
  const Outputs alone = run(knobs(), one);
  for (int batch : {2, 3, 17, 64}) {
    Inputs in = make_inputs(batch, 4096, 0.7f, 300 + batch);
    const int at = batch / 2;
    std::copy(one.logits.begin(), one.logits.end(), in.logits.begin() + size_t(at) * in.V);
    in.targets[at] = one.targets[0];
    in.coef[at] = one.coef[0];
    const Outputs o = run(knobs(), in);
    EXPECT_EQ(bits_of(o.logprob[at]), bits_of(alone.logprob[0])) << batch;
    EXPECT_EQ(bits_of(o.entropy[at]), bits_of(alone.entropy[0])) << batch;
    EXPECT_EQ(bits_of(o.row_max[at]), bits_of(alone.row_max[0])) << batch;
    EXPECT_EQ(bits_of(o.row_sum[at]), bits_of(alone.row_sum[0])) << batch;
    EXPECT_TRUE(std::equal(alone.dlogits.begin(), alone.dlogits.end(), o.dlogits.begin() + size_t(at) * in.V))
        << batch;
  }
}

// Without the entropy the other outputs keep their bits.
TEST_P(LogprobTest, EntropyIsOptional) {
  const Inputs in = make_inputs(5, 1024, 0.7f, 25);
  const Outputs with = run(knobs(), in);
  std::vector<float> lp(in.T), m(in.T), s(in.T);
  ref::logprob_fwd(knobs(), in.logits.data(), in.targets.data(), in.T, in.V, in.temp, lp.data(), m.data(), s.data(),
                   nullptr);
  expect_same_bits(lp, with.logprob, "logprob");
  expect_same_bits(m, with.row_max, "row max");
  expect_same_bits(s, with.row_sum, "row sum");
}

// R vocab-parallel ranks, each holding C/R whole chunks in its own [T][width] slab,
// compute their partials alone; the combines run on the gathered [T][C] partials.
// For V not a multiple of C the slabs are those of the padded vocabulary C·⌈V/C⌉
// (as Megatron pads it): rank r holds [r·width, min((r+1)·width, V)), the tail absent.
Outputs run_vocab_parallel(const Knobs& kn, const Inputs& in, int ranks) {
  const int T = in.T, C = kn.tp_tree_width, chunk = (in.V + C - 1) / C, per_rank = C / ranks, width = per_rank * chunk;
  std::vector<std::vector<bf16>> slab(ranks, std::vector<bf16>(size_t(T) * width));
  std::vector<int> len(ranks);
  for (int r = 0; r < ranks; ++r) {
    len[r] = std::clamp(in.V - r * width, 0, width);
    for (int t = 0; t < T; ++t)
      std::copy_n(in.logits.begin() + size_t(t) * in.V + size_t(r) * width, len[r], slab[r].begin() + size_t(t) * width);
  }
  std::vector<float> chunk_max(size_t(T) * C), chunk_sum(size_t(T) * C), chunk_tsum(size_t(T) * C), x_target(T);
  Outputs o{std::vector<float>(T), std::vector<float>(T), std::vector<float>(T), std::vector<float>(T),
            std::vector<bf16>(size_t(T) * in.V)};
  if (kn.log_softmax == LogSoftmax::kOnePass) {  // v2: one stage, one gather of states
    for (int r = 0; r < ranks; ++r) {
      ref::logprob_chunk_states(kn, slab[r].data(), width, T, len[r], chunk, per_rank, in.temp, chunk_max.data() + r * per_rank,
                                chunk_sum.data() + r * per_rank, chunk_tsum.data() + r * per_rank, C);
      ref::logprob_target_logit(kn, slab[r].data(), width, T, r * width, len[r], in.targets.data(), in.temp,
                                x_target.data());
    }
    ref::logprob_merge_states(kn, chunk_max.data(), chunk_sum.data(), chunk_tsum.data(), x_target.data(), T,
                              o.row_max.data(), o.row_sum.data(), o.logprob.data(), o.entropy.data());
  } else {
    for (int r = 0; r < ranks; ++r)
      ref::logprob_chunk_max(kn, slab[r].data(), width, T, len[r], chunk, per_rank, in.temp, chunk_max.data() + r * per_rank,
                             C);
    ref::logprob_row_max(kn, chunk_max.data(), T, o.row_max.data());
    for (int r = 0; r < ranks; ++r) {
      ref::logprob_chunk_sums(kn, slab[r].data(), width, T, len[r], chunk, per_rank, in.temp, o.row_max.data(),
                              chunk_sum.data() + r * per_rank, chunk_tsum.data() + r * per_rank, C);
      ref::logprob_target_logit(kn, slab[r].data(), width, T, r * width, len[r], in.targets.data(), in.temp,
                                x_target.data());
    }
    ref::logprob_combine(kn, chunk_sum.data(), chunk_tsum.data(), x_target.data(), o.row_max.data(), T,
                         o.row_sum.data(), o.logprob.data(), o.entropy.data());
  }
  for (int r = 0; r < ranks; ++r) {
    std::vector<bf16> dslab(size_t(T) * width);
    ref::logprob_bwd_slice(kn, slab[r].data(), width, T, r * width, len[r], in.targets.data(), in.coef.data(),
                           o.row_max.data(), o.row_sum.data(), in.temp, dslab.data());
    for (int t = 0; t < T; ++t)
      std::copy_n(dslab.begin() + size_t(t) * width, len[r], o.dlogits.begin() + size_t(t) * in.V + size_t(r) * width);
  }
  return o;
}

TEST_P(LogprobTest, VocabParallelSplitGivesSameBits) {
  for (const int V : {kQwenVocab, 151669, 300, 9}) {  // the odd ones: a padded tail, empty chunks at V = 9
  SCOPED_TRACE(V);
  const Inputs in = make_inputs(4, V, 0.7f, 31);
  const Outputs whole = run(knobs(), in);
  for (int ranks : {1, 2, 4, 8}) {
    const Outputs split = run_vocab_parallel(knobs(), in, ranks);
    expect_same_bits(split.logprob, whole.logprob, "logprob");
    expect_same_bits(split.entropy, whole.entropy, "entropy");
    expect_same_bits(split.row_max, whole.row_max, "row max");
    expect_same_bits(split.row_sum, whole.row_sum, "row sum");
    EXPECT_EQ(test::digest(split.dlogits), test::digest(whole.dlogits)) << ranks << " ranks";
  }
  }
}

// ---- Vocabularies that are not multiples of C (SPEC.md §2.4.1, §5.10) -----------

// The inputs with each row padded by −Inf logits to C·⌈V/C⌉.
Inputs minus_inf_padded(const Inputs& in, int C) {
  const int Vp = (in.V + C - 1) / C * C;
  Inputs p{in.T, Vp, in.temp, std::vector<bf16>(size_t(in.T) * Vp, round_bf16(-INFINITY)), in.targets, in.coef};
  for (int t = 0; t < in.T; ++t) std::copy_n(in.logits.begin() + size_t(t) * in.V, in.V, p.logits.begin() + size_t(t) * Vp);
  return p;
}

// An odd vocabulary's fixed chunks (the last short or empty) give the −Inf-padded
// computation's bits: every forward output, and the gradient on the real columns.
TEST_P(LogprobTest, OddVocabularyIsMinusInfPadded) {
  const int C = knobs().tp_tree_width;
  for (const int V : {300, 211, 9, 3, 1}) {
    SCOPED_TRACE(V);
    for (float temp : {1.0f, 0.7f}) {
      const Inputs in = make_inputs(7, V, temp, 500 + V), padded = minus_inf_padded(in, C);
      const Outputs o = run(knobs(), in), p = run(knobs(), padded);
      expect_same_bits(o.logprob, p.logprob, "logprob");
      expect_same_bits(o.entropy, p.entropy, "entropy");
      expect_same_bits(o.row_max, p.row_max, "row max");
      expect_same_bits(o.row_sum, p.row_sum, "row sum");
      std::vector<bf16> real;
      for (int t = 0; t < in.T; ++t)
        real.insert(real.end(), p.dlogits.begin() + size_t(t) * padded.V, p.dlogits.begin() + size_t(t) * padded.V + V);
      EXPECT_EQ(test::digest(o.dlogits), test::digest(real));
    }
  }
}

// Negative control: another split of the same odd vocabulary (C chunks of
// ⌈V/C⌉ + 1 = 39 instead of 38 at V = 300) changes the row sums.
TEST_P(LogprobTest, OddVocabularyOtherSplitChangesBits) {
  const Knobs kn = knobs();
  const int C = kn.tp_tree_width, V = 300, T = 16, other = (V + C - 1) / C + 1;
  const Inputs in = make_inputs(T, V, 1.0f, 61);
  const Outputs o = run(kn, in);
  std::vector<float> chunk_max(size_t(T) * C), chunk_sum(size_t(T) * C), row_max(T), row_sum(T), lp(T), x_target(T);
  ref::logprob_target_logit(kn, in.logits.data(), V, T, 0, V, in.targets.data(), in.temp, x_target.data());
  if (kn.log_softmax == LogSoftmax::kOnePass) {
    ref::logprob_chunk_states(kn, in.logits.data(), V, T, V, other, C, in.temp, chunk_max.data(), chunk_sum.data(),
                              nullptr, C);
    ref::logprob_merge_states(kn, chunk_max.data(), chunk_sum.data(), nullptr, x_target.data(), T, row_max.data(),
                              row_sum.data(), lp.data(), nullptr);
  } else {
    ref::logprob_chunk_max(kn, in.logits.data(), V, T, V, other, C, in.temp, chunk_max.data(), C);
    ref::logprob_row_max(kn, chunk_max.data(), T, row_max.data());
    ref::logprob_chunk_sums(kn, in.logits.data(), V, T, V, other, C, in.temp, row_max.data(), chunk_sum.data(),
                            nullptr, C);
    ref::logprob_combine(kn, chunk_sum.data(), nullptr, x_target.data(), row_max.data(), T, row_sum.data(), lp.data(),
                         nullptr);
  }
  EXPECT_NE(test::digest(row_sum), test::digest(o.row_sum));
}

// Row sums by other orders over the same exp terms: each must differ somewhere,
// so the equalities above can fail. (S is compared: a last-ulp change of S often
// vanishes in log S, whose ulp is up to 2^4 times coarser.)
TEST_P(LogprobTest, NegativeControlsOtherOrdersChangeBits) {
  const Knobs kn = knobs();
  const Inputs in = make_inputs(32, kQwenVocab, 1.0f, 41);
  const int T = in.T, V = in.V, C = kn.tp_tree_width;
  const Outputs o = run(kn, in);
  std::vector<float> sequential(T), ring(T), chunk_sum(size_t(T) * C), tsum(size_t(T) * C);
  if (kn.log_softmax == LogSoftmax::kOnePass) {
    // v2: the chunk states merged left to right instead of by the tree, and every
    // exponent taken against the row's maximum (v1's schedule) with exp2_poly.
    std::vector<float> chunk_max(size_t(T) * C);
    ref::logprob_chunk_states(kn, in.logits.data(), V, T, V, V / C, C, in.temp, chunk_max.data(), chunk_sum.data(),
                              tsum.data(), C);
    for (int t = 0; t < T; ++t) {
      ref::ChunkState acc{chunk_max[size_t(t) * C], chunk_sum[size_t(t) * C], 0.0f};
      for (int c = 1; c < C; ++c)
        acc = ref::merge_chunk_states(acc, {chunk_max[size_t(t) * C + c], chunk_sum[size_t(t) * C + c], 0.0f});
      float s = 0.0f;
      const float mc = ref::scaled_max_base2(o.row_max[t]);
      for (int v = 0; v < V; ++v)
        s = add_rn(s, math::exp2_poly(ref::exponent_base2(ref::scaled_logit(in.at(t, v), in.temp), mc)));
      ring[t] = acc.s;
      sequential[t] = s;
    }
    EXPECT_NE(test::digest(ring), test::digest(o.row_sum)) << "chunk states merged left to right";
    EXPECT_NE(test::digest(sequential), test::digest(o.row_sum)) << "one pass against the row maximum";
    Knobs narrow = kn;
    narrow.row_reduce = LaneShape{128, 4};
    EXPECT_NE(test::digest(run(narrow, in).row_sum), test::digest(o.row_sum)) << "lane shape 128 x 4";
    return;
  }
  ref::logprob_chunk_sums(kn, in.logits.data(), V, T, V, V / C, C, in.temp, o.row_max.data(), chunk_sum.data(),
                          tsum.data(), C);
  for (int t = 0; t < T; ++t) {
    float s = 0.0f, r = 0.0f;
    for (int v = 0; v < V; ++v) s = add_rn(s, ref::shifted_exp(ref::scaled_logit(in.at(t, v), in.temp), o.row_max[t]));
    for (int c = 0; c < C; ++c) r = add_rn(r, chunk_sum[size_t(t) * C + c]);
    sequential[t] = s;
    ring[t] = r;
  }
  EXPECT_NE(test::digest(sequential), test::digest(o.row_sum)) << "plain sequential sum over the vocabulary";
  EXPECT_NE(test::digest(ring), test::digest(o.row_sum)) << "ring order over the chunk sums";
  Knobs narrow = kn;
  narrow.row_reduce = LaneShape{128, 4};
  EXPECT_NE(test::digest(run(narrow, in).row_sum), test::digest(o.row_sum)) << "lane shape 128 x 4";
  // Multiplying by a rounded reciprocal is not dividing by the temperature.
  int differ = 0;
  for (int v = 0; v < V; ++v)
    differ += bits_of(ref::scaled_logit(in.logits[v], 0.7f)) != bits_of(mul_rn(widen(in.logits[v]), 1.0f / 0.7f));
  EXPECT_GT(differ, 0) << "x · (1/temp)";
}

TEST_P(LogprobTest, RefusesBadArguments) {
  Inputs in = make_inputs(2, 1000, 1.0f, 51);
  std::vector<float> lp(2), m(2), s(2), h(2);
  std::vector<bf16> d(2000);
  auto fwd = [&](int V, float temp) {
    ref::logprob_fwd(knobs(), in.logits.data(), in.targets.data(), 2, V, temp, lp.data(), m.data(), s.data(), h.data());
  };
  auto bwd = [&](int V, float temp) {
    ref::logprob_bwd(knobs(), in.logits.data(), in.targets.data(), in.coef.data(), m.data(), s.data(), 2, V, temp,
                     d.data());
  };
  in.targets = {3, 5};
  EXPECT_NO_THROW(fwd(1000, 1.0f));
  EXPECT_NO_THROW(fwd(999, 1.0f)) << "any V: fixed chunks, the last shorter";
  EXPECT_NO_THROW(bwd(999, 1.0f));
  EXPECT_THROW(fwd(0, 1.0f), std::invalid_argument) << "V = 0";
  std::vector<float> part(16);
  EXPECT_THROW(ref::logprob_chunk_max(knobs().log_softmax == LogSoftmax::kOnePass ? find_contract("bf16-sm90tc-v1")->knobs
                                                                                   : knobs(),
                                      in.logits.data(), 1000, 2, 1000, 124, 8, 1.0f, part.data(), 8),
               std::invalid_argument)
      << "8 chunks of 124 do not cover 1000 logits";
  for (float temp : {0.0f, -1.0f, NAN, INFINITY}) {
    EXPECT_THROW(fwd(1000, temp), std::invalid_argument) << temp;
    EXPECT_THROW(bwd(1000, temp), std::invalid_argument) << temp;
  }
  for (int32_t bad : {-1, 1000}) {
    in.targets = {3, bad};
    EXPECT_THROW(fwd(1000, 1.0f), std::invalid_argument) << bad;
    EXPECT_THROW(bwd(1000, 1.0f), std::invalid_argument) << bad;
  }
}

// Each stage serves one schedule: a v1 (two-pass) stage refuses v2's knobs and the
// v2 (one-pass) stage refuses v1's; a pair of knobs that is no contract's is refused.
TEST(LogprobKnobs, StagesServeTheirScheduleOnly) {
  Inputs in = make_inputs(2, 1000, 1.0f, 52);
  std::vector<float> lp(2), m(2), s(2), part(2 * 8), part2(2 * 8);
  const Knobs v1 = find_contract("bf16-sm90tc-v1")->knobs, v2 = find_contract("bf16-sm90tc-v2")->knobs;
  EXPECT_THROW(ref::logprob_chunk_max(v2, in.logits.data(), 1000, 2, 1000, 125, 8, 1.0f, part.data(), 8),
               std::invalid_argument);
  EXPECT_THROW(ref::logprob_chunk_sums(v2, in.logits.data(), 1000, 2, 1000, 125, 8, 1.0f, m.data(), part.data(), nullptr, 8),
               std::invalid_argument);
  EXPECT_THROW(ref::logprob_chunk_states(v1, in.logits.data(), 1000, 2, 1000, 125, 8, 1.0f, part.data(), part2.data(),
                                         nullptr, 8),
               std::invalid_argument);
  EXPECT_NO_THROW(ref::logprob_chunk_states(v2, in.logits.data(), 1000, 2, 1000, 125, 8, 1.0f, part.data(), part2.data(),
                                            nullptr, 8));
  Knobs mixed = v1;
  mixed.log_softmax = LogSoftmax::kOnePass;
  EXPECT_THROW(ref::logprob_fwd(mixed, in.logits.data(), in.targets.data(), 2, 1000, 1.0f, lp.data(), m.data(),
                                s.data(), nullptr),
               std::invalid_argument);
}

// v3's sign clamp (SPEC.md §5.10 v3): on rows whose exact logprob and entropy are
// about 0, v3 gives logprob <= 0 and entropy >= 0 everywhere, v2's bits wherever v2's
// signs were already right, and v2's M, S and gradient. The negative control: v2
// itself gives both wrong signs on these rows.
TEST(LogprobKnobs, SignClampGivesTheExactSigns) {
  for (const char* dot : {"sm90tc", "fmaseq"}) {
    const Knobs v2 = find_contract(std::string("bf16-") + dot + "-v2")->knobs;
    const Knobs v3 = find_contract(std::string("bf16-") + dot + "-v3")->knobs;
    size_t v2_positive = 0, v2_negative_entropy = 0;
    for (const Inputs& in : test::sign_probe_inputs()) {
      const Outputs a = run(v2, in), b = run(v3, in);
      for (int t = 0; t < in.T; ++t) {
        EXPECT_FALSE(b.logprob[t] > 0.0f) << dot << " V=" << in.V << " row " << t;
        EXPECT_FALSE(b.entropy[t] < 0.0f) << dot << " V=" << in.V << " row " << t;
        v2_positive += a.logprob[t] > 0.0f;
        v2_negative_entropy += a.entropy[t] < 0.0f;
        if (!(a.logprob[t] > 0.0f)) EXPECT_EQ(bits_of(a.logprob[t]), bits_of(b.logprob[t])) << t;
        if (!(a.entropy[t] < 0.0f)) EXPECT_EQ(bits_of(a.entropy[t]), bits_of(b.entropy[t])) << t;
      }
      expect_same_bits(a.row_max, b.row_max, "M");
      expect_same_bits(a.row_sum, b.row_sum, "S");
      EXPECT_EQ(test::digest(a.dlogits), test::digest(b.dlogits)) << "the gradient reads M and S only";
    }
    std::printf("[sign clamp] %s: v2 gives %zu logprobs > 0 and %zu entropies < 0 on the probe rows\n", dot,
                v2_positive, v2_negative_entropy);
    EXPECT_GT(v2_positive, 0u) << "negative control: v2's logprob above 0 somewhere";
    EXPECT_GT(v2_negative_entropy, 0u) << "negative control: v2's entropy below 0 somewhere";
  }
}

// All-equal rows: every term is exp(±0) = 1 and integer partial sums below 2^24
// are exact, so S = V exactly and logprob = −log(V) with the log's one rounding.
TEST_P(LogprobTest, AllEqualLogitsGiveMinusLogV) {
  const float log_v = math::log(float(kQwenVocab));
  for (float temp : {1.0f, 0.7f})
    for (uint16_t fill : {uint16_t(0x4040) /* 3 */, uint16_t(0x0000) /* ±0, alternating */, uint16_t(0x0001)}) {
      Inputs in = make_inputs(1, kQwenVocab, temp, 61);
      for (int v = 0; v < in.V; ++v) in.at(0, v) = bf16{uint16_t(fill == 0 && v % 2 ? 0x8000 : fill)};
      const Outputs o = run(knobs(), in);
      EXPECT_LE(std::fabs(o.logprob[0] + std::log(double(kQwenVocab))), logprob_bound(analyse_row(knobs(), in, 0), in.targets[0]));
      // v2's exponent fma(x, c, −R(x·c)) is the product's rounding error, 0 only where x·c is exact (x = ±0).
      if (knobs().softmax_exp == SoftmaxExp::kExp2Poly && fill != 0) continue;
      EXPECT_EQ(o.row_sum[0], float(kQwenVocab)) << fill;
      EXPECT_EQ(bits_of(o.logprob[0]), bits_of(-log_v)) << fill;
      EXPECT_EQ(bits_of(o.entropy[0]), bits_of(log_v)) << "W = 0 exactly; " << fill;
      if (fill == 0) {
        EXPECT_EQ(bits_of(o.row_max[0]), 0u) << "max(+0, −0) = +0";
      }
    }
}

// −Inf logits (masked vocabulary entries) add exactly 0; a masked target has
// logprob −Inf and gradient c/temp; masked non-targets have zero gradient.
TEST_P(LogprobTest, MaskedLogitsAreExcluded) {
  Inputs in = make_inputs(4, 4096, 0.7f, 71);
  for (int t = 0; t < in.T; ++t)
    for (int v = 0; v < in.V; v += 3) in.at(t, v) = bf16{0xff80};
  in.targets = {1, 2, 3, 4};  // row 2's target is masked (3 % 3 == 0), the others are open
  Ratios ratios;
  expect_within_bounds(knobs(), in, ratios);
  const Outputs o = run(knobs(), in);
  EXPECT_EQ(o.logprob[2], -INFINITY);
  EXPECT_EQ(o.dlogits[size_t(2) * in.V + 3], round_bf16(div_rn(in.coef[2], in.temp)));
  EXPECT_EQ(o.dlogits[size_t(0) * in.V + 0].bits & 0x7fffu, 0u);
}

// A NaN logit, an all −Inf row and a +Inf logit each make their own row NaN
// (canonical bits); the rows beside them keep their bits.
TEST_P(LogprobTest, NonFiniteRowsGiveCanonicalNan) {
  Inputs in = make_inputs(5, 1024, 1.0f, 81);
  in.at(1, 17) = bf16{0xffc1};  // a negative NaN with a payload
  for (int v = 0; v < in.V; ++v) in.at(2, v) = bf16{0xff80};
  in.at(3, 100) = bf16{0x7f80};
  const Outputs o = run(knobs(), in);
  const bool one_pass = knobs().log_softmax == LogSoftmax::kOnePass;
  for (int t : {1, 2, 3}) {
    EXPECT_EQ(bits_of(o.logprob[t]), kCanonicalNanF32) << t;
    EXPECT_EQ(bits_of(o.entropy[t]), kCanonicalNanF32) << t;
    // v2: an all −Inf row is empty at the root, S = +0 (v1: M − M = NaN).
    EXPECT_EQ(bits_of(o.row_sum[t]), one_pass && t == 2 ? 0u : kCanonicalNanF32) << t;
    for (int v = 0; v < in.V; ++v) ASSERT_EQ(o.dlogits[size_t(t) * in.V + v].bits, kCanonicalNanBf16) << t;
  }
  EXPECT_EQ(bits_of(o.row_max[1]), kCanonicalNanF32);
  EXPECT_EQ(o.row_max[2], -INFINITY);
  EXPECT_EQ(o.row_max[3], INFINITY);
  for (int t : {0, 4}) {
    Inputs one{1, in.V, in.temp, std::vector<bf16>(in.logits.begin() + size_t(t) * in.V,
                                                   in.logits.begin() + size_t(t + 1) * in.V),
               {in.targets[t]}, {in.coef[t]}};
    const Outputs alone = run(knobs(), one);
    EXPECT_EQ(bits_of(o.logprob[t]), bits_of(alone.logprob[0])) << t;
    EXPECT_EQ(bits_of(o.entropy[t]), bits_of(alone.entropy[0])) << t;
  }
}

TEST_P(LogprobTest, GoldenDigests) {
  const Knobs kn = knobs();
  Inputs in = make_inputs(6, 4096, 0.7f, 91);
  in.at(0, 5) = bf16{0xff80};
  const Outputs o = run(kn, in);
  const int C = kn.tp_tree_width;
  std::vector<float> chunk_max(size_t(in.T) * C), chunk_sum(size_t(in.T) * C), chunk_tsum(size_t(in.T) * C);
  if (kn.log_softmax == LogSoftmax::kOnePass)
    ref::logprob_chunk_states(kn, in.logits.data(), in.V, in.T, in.V, in.V / C, C, in.temp, chunk_max.data(),
                              chunk_sum.data(), chunk_tsum.data(), C);
  else
    ref::logprob_chunk_sums(kn, in.logits.data(), in.V, in.T, in.V, in.V / C, C, in.temp, o.row_max.data(),
                            chunk_sum.data(), chunk_tsum.data(), C);
  const std::string c = contract().name;
  test::expect_golden("ops/logprob.txt", c + ".logprob", test::digest(o.logprob));
  test::expect_golden("ops/logprob.txt", c + ".entropy", test::digest(o.entropy));
  test::expect_golden("ops/logprob.txt", c + ".row_max", test::digest(o.row_max));
  test::expect_golden("ops/logprob.txt", c + ".row_sum", test::digest(o.row_sum));
  test::expect_golden("ops/logprob.txt", c + ".chunk_sum", test::digest(chunk_sum));
  test::expect_golden("ops/logprob.txt", c + ".chunk_tsum", test::digest(chunk_tsum));
  test::expect_golden("ops/logprob.txt", c + ".dlogits", test::digest(o.dlogits));
}

INSTANTIATE_TEST_SUITE_P(Contracts, LogprobTest,
                         ::testing::ValuesIn(test::all_contract_names()),
                         [](const auto& info) { return test::contract_test_name(info.param); });

}  // namespace
}  // namespace bp
