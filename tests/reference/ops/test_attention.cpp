// attention: accuracy of forward and backward against float64 truth (derived
// bounds), float64 gradients against finite differences, bit identity of every
// path (extend, prefix-cache extend, chunked prefill, decode, ragged batches),
// batch and thread-count invariance, GQA, negative controls, an independent
// transcription of SPEC.md §5.6, edge inputs and golden digests.
//
// ---- Forward error bound (per output element; u = 2^-24, u16 = 2^-8) ----
// Exact: t = Σ_j π_j v_j, π_j = exp(σ_j)/Σ_k exp(σ_k), σ_j = D^-0.5 (q·k_j).
// 1. Scores. s_j = fl(fl(dot)·ŝ) with |dot − q·k_j| ≤ γ_D Σ|q k_j| (bounds.h) and
//    ŝ = sqrt_rn(1/D) within 2u of D^-0.5:  |s_j − σ_j| ≤ Δ_j =
//    D^-0.5·γ_D Σ|q k_j|·(1+2u)(1+u) + |σ_j|·((1+2u)(1+u) − 1).
// 2. Effective weights. Key j ends up weighted by w_j = exp(fl(s_j − m_b))·Π(later
//    alphas)·(merge factors) — the computed fp32 factors, multiplied exactly. Their
//    exact arguments telescope to s_j − M, so w_j = exp(σ_j − M)·(1+ε_j) with
//    log(1+|ε_j|) ≤ L = Δ + F·(u·R + log(1+ε_exp)): F ≤ Sp/B + ns exp factors (own
//    P, alphas within the split, merge factors), each argument a rounded difference
//    of two scores (|error| ≤ u·R, R = score range + 2Δ), each exp within ε_exp.
//    Perturbing softmax weights by factors within (1±ε) moves each normalised
//    weight by at most π_j·2ε/(1−ε), so |Σ π̃_j v_j − t| ≤ 2ε/(1−ε)·A, A = Σπ_j|v_j|,
//    and A' = Σ π̃_j|v_j| ≤ A(1+ε)/(1−ε).
// 3. Sum l. All terms positive; each passes ⌈log2 B⌉ tree levels, ≤ Sp/B fma
//    steps and 2 roundings per merge: l = W(1+θ), |θ| ≤ δ_l = γ_{⌈log2 B⌉+Sp/B+2ns}.
// 4. Accumulator. R(P_j) = P_j(1+ρ_j), |ρ_j| ≤ u16 (the dominant term, u16·A'); the
//    chain over nb·B key slots has the dot model's error γ_PV relative to Σ|terms|,
//    plus one rounding per rescale (≤ Sp/B) and two per merge: γ_PV =
//    γ_model(slots) + (Sp/B + 2ns)·u·(1 + γ_model).
// 5. o = fl(acc/l):  e = 2ε/(1−ε)A + (u16 + γ_PV(1+u16))A'
//                        + A'(1+u16)(1+γ_PV)((1+u)/(1−δ_l) − 1) + abs + truth,
//    and the output |R(o) − t| ≤ u16|t| + (1+u16)e (bounds.h bf16_output_bound).
//    abs covers values in the subnormal range (bf16 P below 2^-126 are off by up to
//    2^-134, exp and rescales below 2^-126 by 2^-149 each): (p+1)(F+2)·2^-133·max|v|,
//    divided by W ≥ 1−ε (the maximal key's weight is exp(0) = 1). truth covers
//    float64's own rounding: (S + D + 16)·2^-52·(A + |t|).
//
// ---- Backward error bound ----
// P̂_ij = fl(exp(fl(s_ij − m))·fl(1/l)) = π_ij(1+ε_P), log(1+|ε_P|) ≤ Δ + u·R +
//   log(1+ε_exp) + 2 log(1+u) + L − log(1−δ_l) (l carries the forward's L and δ_l).
// dv_j: |R(P̂)−π| ≤ π·ε_RP, ε_RP = (1+ε_P)(1+u16) − 1; the chunked chains plus tree
//   have γ_kv = dot_gamma(model, chunks·C·G, chunks): e = Σ π ε_RP|dO| + γ_kv Σ π(1+ε_RP)|dO|.
// dS: x = dp − δ exactly; computed dP and D (δ from the forward's bf16 O) differ by
//   e_dd ≤ γ_D Σ|dO||v| + γ_D Σ|dO||O| + Σ|dO|·fb(O) (fb = the forward bound above);
//   |R(dS) − πx| ≤ β = π(|x|·((1+ε_P)(1+u)²(1+u16) − 1) + e_dd(1+ε_P)(1+u)²(1+u16)) + 2^-133.
// dq_i (dk_j likewise with γ_kv over the (query, head) slots): the chain c has
//   |c − Σ ds k| ≤ e_c = Σβ|k| + γ Σ(|ds|+β)|k|, then |fl(ŝ c) − dq| ≤
//   D^-0.5·e_c(1+2u)(1+u) + |dq|((1+2u)(1+u) − 1), and the output adds u16|dq| as above.
// ---- v2 (softmax_exp = exp2_poly, SPEC.md §5.6 v2) ----
// The weights are 2^(fl(z·c − m_c)) times factors 2^(fl(m_c,old − m_c,new)), whose
// exact arguments telescope to z·c − M_c: the common rounding of each m_c cancels.
// So the bounds above hold with ε_exp of exp2_poly and R widened by u·max|σ| (each
// exponent's rounding sees |z·c − m_c| ≤ R/ln 2 + |m·c − m_c|, the latter ≤ u|m·c|);
// v1's Δ (two roundings of the scale) covers v2's (c's one rounding).
// Every dot and chain also gets 2^-149 per rounding step for results in fp32's
// subnormal range, where relative bounds do not hold (subnormal-input cases).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "reference/common/rng.h"
#include "reference/numerics/math.h"
#include "reference/ops/attention.h"
#include "reference/ops/dot_tiles.h"
#include "reference/truth/attention.h"
#include "support/bounds.h"
#include "support/contracts.h"
#include "support/float_gen.h"
#include "support/golden.h"

namespace bp {
namespace {

using ref::AttnDims;
using ref::AttnSeq;
using test::kU16;
using test::kU32;
using truth::MatD;

// The softmax exponential's largest relative error over all fp32 inputs (SPEC.md
// §2.2, measured over all 2^32): math::exp under v1, math::exp2_poly under v2.
double exp_rel(const Knobs& kn) {
  return (kn.softmax_exp == SoftmaxExp::kExp2Poly ? math::kMaxUlpExp2Poly : math::kMaxUlpExp) * 0x1p-23;
}

// A small contract variant (kv block 16, split 64, token chunk 32) so short
// sequences cross several blocks, splits and chunks.
Knobs small_variant(Knobs kn) {
  kn.attn_kv_block = 16;
  kn.attn_kv_split = 64;
  kn.grad_token_chunk = 32;
  return kn;
}

// ---- inputs and runs ----

size_t qsize(AttnDims d, int tokens) { return static_cast<size_t>(tokens) * d.Hq * d.D; }
size_t kvsize(AttnDims d, int keys) { return static_cast<size_t>(keys) * d.Hkv * d.D; }

// One sequence: queries for all S positions, keys and values 0..S-1.
struct Seq {
  AttnDims dims;
  int S;
  std::vector<bf16> q, k, v;
};

Seq make_seq(AttnDims d, int S, uint64_t seed, float q_scale = 1.0f) {
  return {d, S, random_bf16(qsize(d, S), seed, q_scale), random_bf16(kvsize(d, S), seed + 1, 1.0f),
          random_bf16(kvsize(d, S), seed + 2, 1.0f)};
}

struct Fwd {
  std::vector<bf16> o;
  std::vector<float> m, l;
};

// Queries [past, S) of x as one extend call.
Fwd forward(const Knobs& kn, const Seq& x, int past = 0) {
  const int n = x.S - past;
  Fwd f{std::vector<bf16>(qsize(x.dims, n)), std::vector<float>(size_t(n) * x.dims.Hq),
        std::vector<float>(size_t(n) * x.dims.Hq)};
  const AttnSeq s{0, n, past, 0};
  ref::attention_fwd(kn, x.dims, &s, 1, x.q.data() + qsize(x.dims, past), x.k.data(), x.v.data(), f.o.data(),
                     f.m.data(), f.l.data());
  return f;
}

struct Bwd {
  std::vector<bf16> dq, dk, dv;
};

Bwd backward(const Knobs& kn, const Seq& x, const Fwd& f, const std::vector<bf16>& dout) {
  Bwd b{std::vector<bf16>(x.q.size()), std::vector<bf16>(x.k.size()), std::vector<bf16>(x.v.size())};
  const AttnSeq s{0, x.S, 0, 0};
  ref::attention_bwd(kn, x.dims, &s, 1, x.q.data(), x.k.data(), x.v.data(), f.o.data(), f.m.data(), f.l.data(),
                     dout.data(), b.dq.data(), b.dk.data(), b.dv.data());
  return b;
}

truth::AttnGeometry geometry(AttnDims d, int past = 0) { return {d.Hq, d.Hkv, d.D, past}; }
MatD rows(const std::vector<bf16>& x, AttnDims d, int heads) {
  return truth::widen(x, static_cast<int>(x.size() / (size_t(heads) * d.D)), heads * d.D);
}

// Token range [t0, t1) of a [T][H][D] tensor (or [T][H] stats with D = 1).
template <class T>
std::vector<T> token_slice(const std::vector<T>& x, int per_token, int t0, int t1) {
  return std::vector<T>(x.begin() + size_t(t0) * per_token, x.begin() + size_t(t1) * per_token);
}

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) { return test::digest(a) == test::digest(b); }
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) { return test::digest(a) == test::digest(b); }

void expect_same(const Fwd& a, const Fwd& b, const std::string& what) {
  EXPECT_TRUE(same_bits(a.o, b.o)) << what << ": o";
  EXPECT_TRUE(same_bits(a.m, b.m)) << what << ": m";
  EXPECT_TRUE(same_bits(a.l, b.l)) << what << ": l";
}

// ---- the derived bounds (see the header comment) ----

double gamma_n(int k) { return test::dot_gamma(DotModel::FmaSeq, k); }  // k·u/(1 − k·u)
int ceil_log2(int n) {
  int levels = 0;
  while ((1 << levels) < n) ++levels;
  return levels;
}
const double kScaleGrowth = (1 + 2 * kU32) * (1 + kU32);  // ŝ within 2u, one rounding of the product
// Absolute error of one fp32 rounding step (fma, tensor-core group, product) whose
// result lies in the subnormal range, where the relative bounds above do not hold.
constexpr double kUnderflow = 0x1p-149;

// Per (query, head) constants of the forward bound.
struct RowBudget {
  double delta, range;  // max score error Δ, score range R
  double log_w;         // L: log bound of the effective weights' factors
  double eps, delta_l, gamma_pv;
  int keys, factors;
};

RowBudget row_budget(const Knobs& kn, int D, int p, const double* qk, const double* abs_qk) {
  const double scale = 1.0 / std::sqrt(double(D)), gd = test::dot_gamma(kn.dot, D);
  RowBudget r{};
  double lo = INFINITY, hi = -INFINITY;
  for (int j = 0; j <= p; ++j) {
    r.delta = std::max(r.delta, scale * (gd * abs_qk[j] + D * kUnderflow) * kScaleGrowth +
                                    scale * std::fabs(qk[j]) * (kScaleGrowth - 1));
    lo = std::min(lo, scale * qk[j]);
    hi = std::max(hi, scale * qk[j]);
  }
  const int B = kn.attn_kv_block, split_blocks = kn.attn_kv_split / B, blocks = p / B + 1,
            splits = p / kn.attn_kv_split + 1;
  r.range = hi - lo + 2 * r.delta;
  // v2 (SPEC §5.6 v2) forms each exponent as one rounding of z·c − R(m·c): its error
  // is u·|z·c − m·c| plus u·|R(m·c) − m·c| ≤ u²|m·c|, the latter bounded here in
  // natural units by u·max|σ| on top of the range (the rounding of R(m·c) itself
  // cancels between the weights and the rescaling factors).
  if (kn.softmax_exp == SoftmaxExp::kExp2Poly) r.range += kU32 * std::max(std::fabs(lo), std::fabs(hi));
  r.keys = p + 1;
  r.factors = split_blocks + splits;
  r.log_w = r.delta + r.factors * (kU32 * r.range + std::log1p(exp_rel(kn)));
  r.eps = std::expm1(r.log_w);
  r.delta_l = gamma_n(ceil_log2(B) + split_blocks + 2 * splits);
  const double gm = test::dot_gamma(kn.dot, blocks * ((B + 15) / 16) * 16);
  r.gamma_pv = gm + (split_blocks + 2 * splits) * kU32 * (1 + gm);
  return r;
}

double truth_slack(int S, int D, double magnitude) { return (S + D + 16) * 0x1p-52 * magnitude; }

struct Bounds {
  std::vector<RowBudget> rows;  // [n][Hq]
  MatD fwd;                     // [n][Hq·D]
};

// Forward bounds for queries [past, S) of x against truth t.
Bounds forward_bounds(const Knobs& kn, const Seq& x, int past, const truth::AttnForward& t) {
  const AttnDims d = x.dims;
  const int n = x.S - past, G = d.Hq / d.Hkv;
  const MatD Q = rows(x.q, d, d.Hq).bottomRows(n), K = rows(x.k, d, d.Hkv), V = rows(x.v, d, d.Hkv);
  Bounds b{std::vector<RowBudget>(size_t(n) * d.Hq), MatD(n, d.Hq * d.D)};
  for (int h = 0; h < d.Hq; ++h) {
    const MatD qh = Q.middleCols(h * d.D, d.D), kg = K.middleCols(h / G * d.D, d.D),
               vg = V.middleCols(h / G * d.D, d.D);
    const MatD qk = qh * kg.transpose(), abs_qk = qh.cwiseAbs() * kg.cwiseAbs().transpose();
    const MatD A = t.p[h] * vg.cwiseAbs();
    const double vmax = vg.cwiseAbs().maxCoeff();
    for (int i = 0; i < n; ++i) {
      const RowBudget r = row_budget(kn, d.D, past + i, qk.row(i).data(), abs_qk.row(i).data());
      b.rows[size_t(i) * d.Hq + h] = r;
      const double w_err = 2 * r.eps / (1 - r.eps), grow = (1 + r.eps) / (1 - r.eps);
      const double abs_term = r.keys * (r.factors + 2) * 0x1p-133 * vmax / (1 - r.eps);
      for (int c = 0; c < d.D; ++c) {
        const double a = A(i, c), a2 = a * grow, tv = t.o(i, h * d.D + c);
        const double e = w_err * a + (kU16 + r.gamma_pv * (1 + kU16)) * a2 +
                         a2 * (1 + kU16) * (1 + r.gamma_pv) * ((1 + kU32) / (1 - r.delta_l) - 1) + abs_term +
                         truth_slack(x.S, d.D, a + std::fabs(tv));
        b.fwd(i, h * d.D + c) = test::bf16_output_bound(tv, e);
      }
    }
  }
  return b;
}

// Largest |got − truth| / bound; fails for any element past its bound.
double check_within(const std::vector<bf16>& got, const MatD& truth, const MatD& bound, const char* what) {
  double worst = 0;
  int bad = 0;
  for (int r = 0; r < truth.rows(); ++r)
    for (int c = 0; c < truth.cols(); ++c) {
      const double err = std::fabs(widen(got[size_t(r) * truth.cols() + c]) - truth(r, c));
      worst = std::max(worst, err / bound(r, c));
      if (!(err <= bound(r, c)) && ++bad < 5)
        ADD_FAILURE() << what << " (" << r << "," << c << ") got " << widen(got[size_t(r) * truth.cols() + c])
                      << " truth " << truth(r, c) << " bound " << bound(r, c);
    }
  EXPECT_EQ(bad, 0) << what;
  return worst;
}

struct BackwardBounds {
  MatD dq, dk, dv;
};

BackwardBounds backward_bounds(const Knobs& kn, const Seq& x, const Fwd& f, const std::vector<bf16>& dout,
                               const Bounds& fb, const truth::AttnForward& tf, const truth::AttnBackward& tb) {
  const AttnDims d = x.dims;
  const int S = x.S, G = d.Hq / d.Hkv, C = kn.grad_token_chunk, chunks = (S + C - 1) / C;
  const double scale = 1.0 / std::sqrt(double(d.D)), gd = test::dot_gamma(kn.dot, d.D);
  const double gkv = test::dot_gamma(kn.dot, chunks * C * G, chunks);
  const MatD Q = rows(x.q, d, d.Hq), K = rows(x.k, d, d.Hkv), V = rows(x.v, d, d.Hkv), DO = rows(dout, d, d.Hq),
             O = rows(f.o, d, d.Hq);
  BackwardBounds b{MatD::Zero(S, d.Hq * d.D), MatD::Zero(S, d.Hkv * d.D), MatD::Zero(S, d.Hkv * d.D)};
  // Error sums over heads (fp32 part) and Σ|ds||q| for truth's own rounding.
  MatD ek = MatD::Zero(S, d.Hkv * d.D), ev = MatD::Zero(S, d.Hkv * d.D), mk = MatD::Zero(S, d.Hkv * d.D);
  for (int h = 0; h < d.Hq; ++h) {
    const int g = h / G;
    const MatD qh = Q.middleCols(h * d.D, d.D), kg = K.middleCols(g * d.D, d.D), vg = V.middleCols(g * d.D, d.D),
               doh = DO.middleCols(h * d.D, d.D), oh = O.middleCols(h * d.D, d.D);
    const MatD& pi = tf.p[h];
    const MatD dov = doh.cwiseAbs() * vg.cwiseAbs().transpose();                               // Σ|dO||v|   [S][S]
    const Eigen::VectorXd doo = (doh.cwiseAbs().cwiseProduct(oh.cwiseAbs())).rowwise().sum();  // Σ|dO||O|
    const Eigen::VectorXd dofb =
        (doh.cwiseAbs().cwiseProduct(fb.fwd.middleCols(h * d.D, d.D))).rowwise().sum();  // Σ|dO| fb
    MatD beta = MatD::Zero(S, S);
    Eigen::VectorXd eps_rp(S);
    for (int i = 0; i < S; ++i) {
      const RowBudget& r = fb.rows[size_t(i) * d.Hq + h];
      const double eps_p = std::expm1(r.delta + kU32 * r.range + std::log1p(exp_rel(kn)) + 2 * std::log1p(kU32) + r.log_w -
                                      std::log1p(-r.delta_l));
      eps_rp(i) = (1 + eps_p) * (1 + kU16) - 1;
      const double grow = (1 + eps_p) * (1 + kU32) * (1 + kU32) * (1 + kU16);
      for (int j = 0; j <= i; ++j) {
        const double e_dd = gd * dov(i, j) + gd * doo(i) + dofb(i) + 2 * d.D * kUnderflow;
        const double xv = tb.dp[h](i, j) - tb.delta(i, h);
        beta(i, j) = pi(i, j) * (std::fabs(xv) * (grow - 1) + e_dd * grow) + 0x1p-133;
      }
    }
    const MatD ds_abs = tb.ds[h].cwiseAbs() + beta;
    // dq: one chain per row over the key slots of its blocks.
    const MatD eq_beta = beta * kg.cwiseAbs(), eq_sum = ds_abs * kg.cwiseAbs();
    for (int i = 0; i < S; ++i) {
      const double gq = test::dot_gamma(kn.dot, (i / kn.attn_kv_block + 1) * ((kn.attn_kv_block + 15) / 16) * 16);
      for (int c = 0; c < d.D; ++c) {
        const double tv = tb.dq(i, h * d.D + c), e_c = eq_beta(i, c) + gq * eq_sum(i, c) + S * kUnderflow;
        b.dq(i, h * d.D + c) =
            test::bf16_output_bound(tv, scale * e_c * kScaleGrowth + std::fabs(tv) * (kScaleGrowth - 1) +
                                            truth_slack(S, d.D, scale * eq_sum(i, c)));
      }
    }
    ek.middleCols(g * d.D, d.D) += beta.transpose() * qh.cwiseAbs() + gkv * ds_abs.transpose() * qh.cwiseAbs() +
                                   MatD::Constant(S, d.D, S * kUnderflow);
    mk.middleCols(g * d.D, d.D) += ds_abs.transpose() * qh.cwiseAbs();
    const MatD pi_do = pi.transpose() * doh.cwiseAbs();
    ev.middleCols(g * d.D, d.D) += (eps_rp.asDiagonal() * pi).transpose() * doh.cwiseAbs() +
                                   gkv * (pi_do + (eps_rp.asDiagonal() * pi).transpose() * doh.cwiseAbs()) +
                                   MatD::Constant(S, d.D, S * (0x1p-133 * doh.cwiseAbs().maxCoeff() + kUnderflow)) +
                                   truth_slack(S, d.D, 1.0) * pi_do;
  }
  for (int j = 0; j < S; ++j)
    for (int c = 0; c < d.Hkv * d.D; ++c) {
      const double tk = tb.dk(j, c), tv = tb.dv(j, c);
      b.dk(j, c) = test::bf16_output_bound(tk, scale * ek(j, c) * kScaleGrowth + std::fabs(tk) * (kScaleGrowth - 1) +
                                                   truth_slack(S, d.D, scale * mk(j, c)));
      b.dv(j, c) = test::bf16_output_bound(tv, ev(j, c));
    }
  return b;
}

// ---- an independent transcription of SPEC.md §5.6 (forward) for one (query, head) ----
// Written from the spec text with explicit zero-padded slot arrays (no framed
// chains), so it checks the reference and the spec against each other. round_p =
// false is the negative control: P·V with fp32 P and plain fma.
template <class Model>
std::vector<bf16> spec_row(const Knobs& kn, const Seq& x, int t, int h, bool round_p) {
  const AttnDims d = x.dims;
  const int B = kn.attn_kv_block, g = h / (d.Hq / d.Hkv), p = t;
  const float scale = sqrt_rn(div_rn(1.0f, float(d.D)));
  // v2: raw scores, base-2 exponents t = fma(z, c, −R(m·c)), factors 2^(R(m_old·c) − R(m_new·c)).
  const bool v2 = kn.softmax_exp == SoftmaxExp::kExp2Poly;
  const float c2 = static_cast<float>(std::pow(double(d.D), -0.5) * 1.4426950408889634);  // no tie for D = 64
  auto mc = [&](float m) { return mul_rn(m, c2); };
  auto weight = [&](float s, float m) { return v2 ? math::exp2_poly(fma_rn(s, c2, -mc(m))) : math::exp(sub_rn(s, m)); };
  auto factor = [&](float m_old, float m_new) {
    return v2 ? math::exp2_poly(sub_rn(mc(m_old), mc(m_new))) : math::exp(sub_rn(m_old, m_new));
  };
  auto key = [&](const std::vector<bf16>& c, int j) { return c.data() + (size_t(j) * d.Hkv + g) * d.D; };
  const bf16* qrow = x.q.data() + (size_t(t) * d.Hq + h) * d.D;
  float M = 0, L = 0;
  std::vector<float> O(d.D), acc(d.D);
  for (int s0 = 0; s0 <= p; s0 += kn.attn_kv_split) {
    float m = -INFINITY, l = 0;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int b0 = s0; b0 < std::min(p + 1, s0 + kn.attn_kv_split); b0 += B) {
      std::vector<float> s(B), P(B, 0.0f);
      std::vector<bf16> pb(B, bf16{0}), vcol(B, bf16{0});
      float mb = m;
      for (int j = b0; j <= std::min(p, b0 + B - 1); ++j) {
        const float z = Model::chain(0.0f, qrow, 1, key(x.k, j), 1, d.D);
        s[j - b0] = v2 ? z : mul_rn(z, scale);
        mb = ref::max_num(mb, s[j - b0]);
      }
      const float alpha = factor(m, mb);
      for (int j = b0; j <= std::min(p, b0 + B - 1); ++j) P[j - b0] = weight(s[j - b0], mb);
      for (int j = 0; j < B; ++j) pb[j] = round_bf16(P[j]);
      l = fma_rn(alpha, l, pairwise_tree(std::vector<float>(P).data(), B));
      for (int c = 0; c < d.D; ++c) {
        for (int j = 0; j < B; ++j) vcol[j] = b0 + j <= p ? key(x.v, b0 + j)[c] : bf16{0};
        acc[c] = mul_rn(acc[c], alpha);
        if (round_p) {
          acc[c] = Model::chain(acc[c], pb.data(), 1, vcol.data(), 1, B);
        } else {
          for (int j = 0; j < B; ++j) acc[c] = fma_rn(P[j], widen(vcol[j]), acc[c]);
        }
      }
      m = mb;
    }
    if (s0 == 0) {
      M = m, L = l, O = acc;
    } else {
      const float Mn = ref::max_num(M, m), a = factor(M, Mn), bw = factor(m, Mn);
      L = fma_rn(a, L, mul_rn(bw, l));
      for (int c = 0; c < d.D; ++c) O[c] = fma_rn(a, O[c], mul_rn(bw, acc[c]));
      M = Mn;
    }
  }
  std::vector<bf16> o(d.D);
  for (int c = 0; c < d.D; ++c) o[c] = round_bf16(div_rn(O[c], L));
  return o;
}

std::vector<bf16> spec_forward(const Knobs& kn, const Seq& x, bool round_p) {
  std::vector<bf16> o;
  with_dot_model(kn.dot, [&](auto model) {
    for (int t = 0; t < x.S; ++t)
      for (int h = 0; h < x.dims.Hq; ++h) {
        const auto row = spec_row<decltype(model)>(kn, x, t, h, round_p);
        o.insert(o.end(), row.begin(), row.end());
      }
  });
  return o;
}

class AttentionTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
};

// ---- scalar rules ----

TEST_P(AttentionTest, FramedChainEqualsZeroPaddedChain) {
  with_dot_model(knobs().dot, [&](auto model) {
    using Model = decltype(model);
    for (int trial = 0; trial < 400; ++trial) {
      const uint64_t seed = 1000 + trial;
      const int n = 1 + counter_hash(seed, 0) % 70, lo = counter_hash(seed, 1) % (n + 1),
                hi = lo + counter_hash(seed, 2) % (n - lo + 1);
      auto a = random_bf16(n, seed + 3, 1.0f), b = random_bf16(n, seed + 4, 1.0f);
      const float c = trial % 3 == 0 ? -0.0f : (trial % 3 == 1 ? 0.0f : counter_uniform(seed, 5));
      std::vector<bf16> za(n, bf16{0}), zb(n, bf16{0});
      for (int i = lo; i < hi; ++i) za[i] = a[i], zb[i] = b[i];
      for (int i = 0; i < n; ++i)
        if (i < lo || i >= hi) a[i] = b[i] = bf16{0x7fc0};  // absent slots must never be read
      const float want = Model::chain(c, za.data(), 1, zb.data(), 1, n);
      const float got = ref::framed_chain<Model>(c, a.data() + lo, 1, b.data() + lo, 1, lo, hi, n);
      ASSERT_EQ(bits_of(got), bits_of(want)) << "n " << n << " lo " << lo << " hi " << hi;
    }
  });
}

TEST(AttentionScalars, ScaleExpAndMax) {
  EXPECT_EQ(ref::attn_scale(64), 0.125f);
  EXPECT_EQ(ref::attn_scale(128), static_cast<float>(std::pow(128.0, -0.5))) << "correctly rounded 2^-3.5";
  EXPECT_EQ(bits_of(math::exp(0.0f)), bits_of(1.0f)) << "a single split merges as the identity";
  EXPECT_EQ(bits_of(math::exp(-0.0f)), bits_of(1.0f));
  EXPECT_EQ(bits_of(math::exp(-INFINITY)), bits_of(0.0f)) << "the first block's alpha";
  EXPECT_TRUE(is_nan(math::exp(NAN)));
  EXPECT_EQ(bits_of(ref::max_num(-0.0f, 0.0f)), bits_of(0.0f));
  EXPECT_EQ(bits_of(ref::max_num(0.0f, -0.0f)), bits_of(0.0f));
  EXPECT_EQ(ref::max_num(NAN, 2.0f), 2.0f);
  EXPECT_EQ(ref::max_num(2.0f, NAN), 2.0f);
  EXPECT_EQ(ref::max_num(-INFINITY, 3.0f), 3.0f);
}

// max_num is written with selects only (kernels interleave many): equal to the IEEE
// definition on every bf16 pattern against specials and random fp32, both orders.
// Control: a plain `a > b ? a : b` misses NaNs and the order of the zeros.
// v2's c = RN(D^-0.5 · log2 e): pinned where mpmath gives it (D = 64, 128), and for
// every D up to 1024 the long double evaluation (relative error < 2^-62) lies more
// than 2^-60 from a binary32 midpoint, so its one conversion is the correct rounding.
TEST(AttentionScalars, Exp2ScaleIsCorrectlyRounded) {
  EXPECT_EQ(ref::attn_exp2_scale(64), 0x1.715476p-3f);
  EXPECT_EQ(ref::attn_exp2_scale(128), 0x1.0527dcp-3f);
  for (int D = 1; D <= 1024; ++D) {
    const long double exact = std::sqrt(1.0L / D) * 1.44269504088896340735992468100189214L;
    const float c = ref::attn_exp2_scale(D);
    const float other = std::nextafter(c, exact > c ? INFINITY : -INFINITY);
    const long double midpoint = (static_cast<long double>(c) + other) / 2;
    EXPECT_GT(std::fabs(exact - midpoint), std::ldexp(exact, -60)) << "D = " << D;
    EXPECT_LE(std::fabs(exact - c), std::fabs(exact - other)) << "D = " << D;
  }
}

TEST(AttentionScalars, MaxNumIsMaximumNumber) {
  EXPECT_EQ(test::max_mismatches([](float a, float b) { return ref::max_num(a, b); }, false), 0u);
  EXPECT_GT(test::max_mismatches([](float a, float b) { return a > b ? a : b; }, false), 0u);
}

// ---- accuracy ----

struct BoundCase {
  AttnDims dims;
  int S, past;
  bool small;     // the 16/64 variant (else the contract's knobs)
  float q_scale;  // 6: peaked softmax, large max jumps; 2^-128: subnormal q, near-uniform weights
};

TEST_P(AttentionTest, ForwardWithinDerivedBound) {
  double worst = 0;
  // GQA 4, 2, 1, 2, 8 (the 32/4 real shape), 2, 4; a prefix cache of 40; positions
  // 490..529 across the contract's 512 split.
  for (const BoundCase bc : {BoundCase{{4, 1, 128}, 150, 0, true, 1.0f}, BoundCase{{8, 4, 64}, 100, 0, true, 1.0f},
                             BoundCase{{2, 2, 128}, 100, 40, true, 1.0f}, BoundCase{{4, 2, 64}, 120, 0, true, 6.0f},
                             BoundCase{{32, 4, 128}, 40, 0, false, 1.0f}, BoundCase{{2, 1, 128}, 530, 490, false, 1.0f},
                             BoundCase{{4, 1, 64}, 70, 0, true, 0x1p-128f}}) {
    const Knobs kn = bc.small ? small_variant(knobs()) : knobs();
    const Seq x = make_seq(bc.dims, bc.S, 20 + bc.S, bc.q_scale);
    const Fwd f = forward(kn, x, bc.past);
    const MatD Q = rows(x.q, x.dims, x.dims.Hq).bottomRows(bc.S - bc.past);
    const auto t = truth::attention_fwd(Q, rows(x.k, x.dims, x.dims.Hkv), rows(x.v, x.dims, x.dims.Hkv),
                                        geometry(x.dims, bc.past));
    worst = std::max(worst, check_within(f.o, t.o, forward_bounds(kn, x, bc.past, t).fwd, "o"));
  }
  std::printf("[ attention ] forward: max |o - t| / bound = %.3g\n", worst);
}

TEST_P(AttentionTest, BackwardWithinDerivedBound) {
  double worst = 0;
  for (const BoundCase bc : {BoundCase{{4, 2, 64}, 90, 0, true, 1.0f}, BoundCase{{8, 1, 128}, 40, 0, true, 2.0f},
                             BoundCase{{2, 2, 64}, 70, 0, false, 1.0f}}) {
    const Knobs kn = bc.small ? small_variant(knobs()) : knobs();
    const Seq x = make_seq(bc.dims, bc.S, 40 + bc.S, bc.q_scale);
    const auto dout = random_bf16(x.q.size(), 50 + bc.S, 1.0f);
    const Fwd f = forward(kn, x);
    const Bwd b = backward(kn, x, f, dout);
    const MatD Q = rows(x.q, x.dims, x.dims.Hq), K = rows(x.k, x.dims, x.dims.Hkv), V = rows(x.v, x.dims, x.dims.Hkv);
    const auto tf = truth::attention_fwd(Q, K, V, geometry(x.dims));
    const auto tb = truth::attention_bwd(Q, K, V, rows(dout, x.dims, x.dims.Hq), geometry(x.dims));
    const auto bb = backward_bounds(kn, x, f, dout, forward_bounds(kn, x, 0, tf), tf, tb);
    worst = std::max({worst, check_within(b.dq, tb.dq, bb.dq, "dq"), check_within(b.dk, tb.dk, bb.dk, "dk"),
                      check_within(b.dv, tb.dv, bb.dv, "dv")});
  }
  std::printf("[ attention ] backward: max |g - t| / bound = %.3g\n", worst);
}

// The float64 gradients against central differences of L = Σ c·o, with a prefix
// cache (past 2) so cached keys receive gradients too.
TEST(AttentionTruth, GradientsMatchFiniteDifferences) {
  const truth::AttnGeometry g{4, 2, 3, 2};
  const int n = 4, S = g.past_len + n;
  auto random_mat = [](int r, int c, uint64_t seed) {
    MatD m(r, c);
    for (int i = 0; i < r * c; ++i) m(i / c, i % c) = counter_uniform(seed, i);
    return m;
  };
  const MatD Q = random_mat(n, g.Hq * g.D, 1), K = random_mat(S, g.Hkv * g.D, 2), V = random_mat(S, g.Hkv * g.D, 3),
             C = random_mat(n, g.Hq * g.D, 4);
  const auto grads = truth::attention_bwd(Q, K, V, C, g);
  auto loss = [&](const MatD& q, const MatD& k, const MatD& v) {
    return (truth::attention_fwd(q, k, v, g).o.array() * C.array()).sum();
  };
  const double h = 1e-5, tol = 1e-8;  // O(h²) truncation ~1e-10 and cancellation ~1e-11
  auto check = [&](const MatD& x, const MatD& grad, auto&& perturbed_loss) {
    for (Eigen::Index r = 0; r < x.rows(); ++r)
      for (Eigen::Index c = 0; c < x.cols(); ++c) {
        MatD xp = x, xm = x;
        xp(r, c) += h;
        xm(r, c) -= h;
        EXPECT_NEAR((perturbed_loss(xp) - perturbed_loss(xm)) / (2 * h), grad(r, c), tol);
      }
  };
  check(Q, grads.dq, [&](const MatD& q) { return loss(q, K, V); });
  check(K, grads.dk, [&](const MatD& k) { return loss(Q, k, V); });
  check(V, grads.dv, [&](const MatD& v) { return loss(Q, K, v); });
}

// ---- path invariance ----

// The full extend's outputs for tokens [t0, t1).
Fwd rows_of(const Fwd& f, AttnDims d, int t0, int t1) {
  return {token_slice(f.o, d.Hq * d.D, t0, t1), token_slice(f.m, d.Hq, t0, t1), token_slice(f.l, d.Hq, t0, t1)};
}

// A KV cache filled as a server fills it: rows past the appended ones hold NaN, so
// reading a key that is not yet visible would show.
struct Cache {
  std::vector<bf16> k, v;
  Cache(const Seq& x) : k(x.k.size(), bf16{0x7fc0}), v(x.v.size(), bf16{0x7fc0}) {}
  void append(const Seq& x, int t0, int t1) {
    const size_t w = size_t(x.dims.Hkv) * x.dims.D;
    std::copy(x.k.begin() + t0 * w, x.k.begin() + t1 * w, k.begin() + t0 * w);
    std::copy(x.v.begin() + t0 * w, x.v.begin() + t1 * w, v.begin() + t0 * w);
  }
};

// Chunked prefill with the given chunk lengths (decode: all 1), appending each
// chunk's keys before its call; returns the outputs of all tokens.
Fwd incremental(const Knobs& kn, const Seq& x, const std::vector<int>& chunks) {
  const AttnDims d = x.dims;
  Cache cache(x);
  Fwd f{std::vector<bf16>(x.q.size()), std::vector<float>(size_t(x.S) * d.Hq), std::vector<float>(size_t(x.S) * d.Hq)};
  int past = 0;
  for (int len : chunks) {
    cache.append(x, past, past + len);
    const AttnSeq s{0, len, past, 0};
    ref::attention_fwd(kn, d, &s, 1, x.q.data() + qsize(d, past), cache.k.data(), cache.v.data(),
                       f.o.data() + qsize(d, past), f.m.data() + size_t(past) * d.Hq, f.l.data() + size_t(past) * d.Hq);
    past += len;
  }
  return f;
}

std::vector<int> random_chunks(int S, uint64_t seed, int max_len) {
  std::vector<int> chunks;
  for (int t = 0, i = 0; t < S; ++i) {
    const int len = std::min<int>(S - t, 1 + counter_hash(seed, i) % max_len);
    chunks.push_back(len);
    t += len;
  }
  return chunks;
}

// A ragged batch: x cut into segments (each a sequence of the batch reading x's
// keys), each preceded by `others` unrelated sequences; returns x's outputs.
Fwd ragged(const Knobs& kn, const Seq& x, const std::vector<int>& segments, uint64_t seed, int others = 1) {
  const AttnDims d = x.dims;
  std::vector<bf16> q, k = x.k, v = x.v;
  std::vector<AttnSeq> seqs;
  std::vector<int> mine;  // the batch token where each segment starts
  int T = 0, past = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    for (int r = 0; r < others; ++r) {
      const uint64_t id = i * others + r;
      const int other_len = 1 + counter_hash(seed, 2 * id) % 23, other_past = counter_hash(seed, 2 * id + 1) % 40;
      const Seq other = make_seq(d, other_past + other_len, seed + 7 * id);
      seqs.push_back({T, other_len, other_past, static_cast<int>(k.size() / (size_t(d.Hkv) * d.D))});
      k.insert(k.end(), other.k.begin(), other.k.end());
      v.insert(v.end(), other.v.begin(), other.v.end());
      q.insert(q.end(), other.q.begin() + qsize(d, other_past), other.q.end());
      T += other_len;
    }
    seqs.push_back({T, segments[i], past, 0});
    mine.push_back(T);
    q.insert(q.end(), x.q.begin() + qsize(d, past), x.q.begin() + qsize(d, past + segments[i]));
    T += segments[i];
    past += segments[i];
  }
  Fwd all{std::vector<bf16>(q.size()), std::vector<float>(size_t(T) * d.Hq), std::vector<float>(size_t(T) * d.Hq)};
  ref::attention_fwd(kn, d, seqs.data(), static_cast<int>(seqs.size()), q.data(), k.data(), v.data(), all.o.data(),
                     all.m.data(), all.l.data());
  Fwd f;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Fwd part = rows_of(all, d, mine[i], mine[i] + segments[i]);
    f.o.insert(f.o.end(), part.o.begin(), part.o.end());
    f.m.insert(f.m.end(), part.m.begin(), part.m.end());
    f.l.insert(f.l.end(), part.l.begin(), part.l.end());
  }
  return f;
}

void expect_all_paths_identical(const Knobs& kn, const Seq& x, uint64_t seed) {
  const Fwd full = forward(kn, x);
  const int p0 = x.S / 3;
  expect_same(forward(kn, x, p0), rows_of(full, x.dims, p0, x.S), "extend with a prefix cache");
  expect_same(incremental(kn, x, std::vector<int>(x.S, 1)), full, "decode");
  for (int trial = 0; trial < 2; ++trial) {
    expect_same(incremental(kn, x, random_chunks(x.S, seed + trial, 40)), full, "chunked prefill");
    expect_same(ragged(kn, x, random_chunks(x.S, seed + 10 + trial, 50), seed + 20 + trial), full, "ragged batch");
  }
}

// Small variant: 200 tokens cross 12 kv blocks of 16 and 3 splits of 64.
TEST_P(AttentionTest, AllPathsGiveIdenticalBits) {
  const Knobs kn = small_variant(knobs());
  expect_all_paths_identical(kn, make_seq({4, 2, 64}, 200, 60), 61);
  expect_all_paths_identical(kn, make_seq({2, 1, 128}, 90, 62), 63);
}

// The contract's own knobs (blocks of 64, splits of 512) with 580 keys.
TEST_P(AttentionTest, AllPathsGiveIdenticalBitsAtContractKnobs) {
  const Seq x = make_seq({1, 1, 128}, 580, 64);
  const Fwd full = forward(knobs(), x);
  expect_same(incremental(knobs(), x, std::vector<int>(x.S, 1)), full, "decode");
  expect_same(ragged(knobs(), x, random_chunks(x.S, 66, 200), 67), full, "ragged batch of prefill chunks");
}

// One sequence alone equals the same sequence inside batches of 2..64 others.
TEST_P(AttentionTest, BatchInvariance) {
  const Knobs kn = small_variant(knobs());
  const Seq x = make_seq({4, 2, 64}, 70, 70);
  const Fwd alone = forward(kn, x);
  for (int batch : {2, 3, 17, 64}) expect_same(ragged(kn, x, {x.S}, 71 + batch, batch - 1), alone, "batch");
}

TEST_P(AttentionTest, BackwardBatchInvariance) {
  const Knobs kn = small_variant(knobs());
  const AttnDims d{4, 2, 64};
  const Seq x = make_seq(d, 75, 72), y = make_seq(d, 40, 73);
  const auto dx = random_bf16(x.q.size(), 74, 1.0f), dy = random_bf16(y.q.size(), 75, 1.0f);
  const Fwd fx = forward(kn, x), fy = forward(kn, y);
  const Bwd alone = backward(kn, x, fx, dx);
  // Batch [y, x]: x's tokens and key rows come second.
  auto cat = [](auto a, const auto& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const AttnSeq seqs[2] = {{0, y.S, 0, 0}, {y.S, x.S, 0, y.S}};
  const auto q = cat(y.q, x.q), k = cat(y.k, x.k), v = cat(y.v, x.v), o = cat(fy.o, fx.o), dout = cat(dy, dx);
  const auto m = cat(fy.m, fx.m), l = cat(fy.l, fx.l);
  std::vector<bf16> dq(q.size()), dk(k.size()), dv(v.size());
  ref::attention_bwd(kn, d, seqs, 2, q.data(), k.data(), v.data(), o.data(), m.data(), l.data(), dout.data(), dq.data(),
                     dk.data(), dv.data());
  EXPECT_TRUE(same_bits(token_slice(dq, d.Hq * d.D, y.S, y.S + x.S), alone.dq));
  EXPECT_TRUE(same_bits(token_slice(dk, d.Hkv * d.D, y.S, y.S + x.S), alone.dk));
  EXPECT_TRUE(same_bits(token_slice(dv, d.Hkv * d.D, y.S, y.S + x.S), alone.dv));
}

TEST_P(AttentionTest, ThreadCountInvariance) {
  const Knobs kn = small_variant(knobs());
  const Seq x = make_seq({4, 2, 64}, 60, 76);
  const auto dout = random_bf16(x.q.size(), 77, 1.0f);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Fwd f1 = forward(kn, x);
  const Bwd b1 = backward(kn, x, f1, dout);
  omp_set_num_threads(std::max(2, threads));
  const Fwd f2 = forward(kn, x);
  const Bwd b2 = backward(kn, x, f2, dout);
  omp_set_num_threads(threads);
  expect_same(f1, f2, "threads");
  EXPECT_TRUE(same_bits(b1.dq, b2.dq) && same_bits(b1.dk, b2.dk) && same_bits(b1.dv, b2.dv));
}

// Query head h of GQA equals MHA whose kv head h holds kv head h / (Hq/Hkv).
TEST_P(AttentionTest, GqaEqualsRepeatedKvHeads) {
  const Knobs kn = small_variant(knobs());
  for (const AttnDims d :
       {AttnDims{4, 4, 64}, AttnDims{4, 2, 64}, AttnDims{8, 2, 64}, AttnDims{8, 1, 64}, AttnDims{32, 4, 128}}) {
    const Seq x = make_seq(d, 24, 80 + d.Hq + d.Hkv);
    const int G = d.Hq / d.Hkv;
    auto repeat_heads = [&](const std::vector<bf16>& kv) {
      std::vector<bf16> out;
      for (int j = 0; j < x.S; ++j)
        for (int h = 0; h < d.Hq; ++h) {
          const auto from = kv.begin() + (size_t(j) * d.Hkv + h / G) * d.D;
          out.insert(out.end(), from, from + d.D);
        }
      return out;
    };
    const Seq mha{{d.Hq, d.Hq, d.D}, x.S, x.q, repeat_heads(x.k), repeat_heads(x.v)};
    expect_same(forward(kn, x), forward(kn, mha), "GQA " + std::to_string(G));
  }
}

// ---- the spec transcription and negative controls ----

TEST_P(AttentionTest, MatchesSpecTranscription) {
  for (const Knobs kn : {small_variant(knobs()), knobs()}) {
    const Seq x = make_seq({2, 1, 64}, kn.attn_kv_split + 45, 90);
    EXPECT_TRUE(same_bits(forward(kn, x).o, spec_forward(kn, x, true)));
  }
}

TEST_P(AttentionTest, NegativeControlsChangeBits) {
  const Knobs kn = small_variant(knobs());
  const Seq x = make_seq({2, 1, 64}, 160, 91);
  const Fwd base = forward(kn, x);
  Knobs other_block = kn, other_split = kn, other_dot = kn;
  other_block.attn_kv_block = 32;
  other_split.attn_kv_split = 128;
  other_dot.dot = kn.dot == DotModel::Sm90Tc ? DotModel::FmaSeq : DotModel::Sm90Tc;
  EXPECT_FALSE(same_bits(base.o, forward(other_block, x).o)) << "kv block 32";
  EXPECT_FALSE(same_bits(base.o, forward(other_split, x).o)) << "kv split 128";
  EXPECT_FALSE(same_bits(base.o, forward(other_dot, x).o)) << "other dot model";
  Knobs other_exp = kn;
  other_exp.softmax_exp = kn.softmax_exp == SoftmaxExp::kExp ? SoftmaxExp::kExp2Poly : SoftmaxExp::kExp;
  // The two exponentials differ by an ulp or two of fp32, which R(P) and o's bf16
  // rounding mostly hide (under sm90-tc on this input, everywhere): l shows them.
  EXPECT_FALSE(same_bits(base.l, forward(other_exp, x).l)) << "the other softmax exponential";
  EXPECT_FALSE(same_bits(base.o, spec_forward(kn, x, false))) << "P not rounded to bf16";
}

// The token chunks of dk/dv, on a constructed case where they decide a bf16 bit.
// q = 0, so for key 0 the backward's P = 1/(i+1) exactly at i = 0, 1, 63. With dout
// = 1 (head 0, i = 0), 2^-7 (head 0, i = 1) and 2^-20 (heads 0..5, i = 63), dv[0][0]
// sums 1 + 2^-8 (a bf16 tie) and six terms 2^-26. Chunks of 32 sum the six first
// (1.5·2^-24) and add them with one rounding, to 1 + 2^-8 + 2^-23 -> bf16 rounds up;
// one chunk of 64 adds them to 1 + 2^-8 one at a time (fma-seq: each rounds away;
// sm90-tc: truncated below 2^-25 in their group), leaving the tie -> rounds to even.
TEST_P(AttentionTest, NegativeControlTokenChunkChangesBits) {
  Knobs kn = knobs();
  const AttnDims d{8, 1, 64};
  Seq x = make_seq(d, 64, 97);
  std::fill(x.q.begin(), x.q.end(), bf16{0});
  const Fwd f = forward(kn, x);
  std::vector<bf16> dout(x.q.size(), bf16{0});
  auto at = [&](int i, int h) -> bf16& { return dout[(size_t(i) * d.Hq + h) * d.D]; };
  at(0, 0) = round_bf16(1.0f);
  at(1, 0) = round_bf16(0x1p-7f);
  for (int h = 0; h < 6; ++h) at(63, h) = round_bf16(0x1p-20f);
  kn.grad_token_chunk = 32;
  EXPECT_EQ(backward(kn, x, f, dout).dv[0].bits, 0x3f81);
  kn.grad_token_chunk = 64;
  EXPECT_EQ(backward(kn, x, f, dout).dv[0].bits, 0x3f80);
}

// The combine reads chunk c for key j only where (c+1)·C > j (SPEC §5.6 step 4):
// partials of earlier chunks are +0 by definition, so NaN written there changes no
// bit; the control writes NaN into a chunk that is read (key j's own) and must show.
TEST_P(AttentionTest, CombineSkipsChunksBeforeTheKey) {
  Knobs kn = small_variant(knobs());
  kn.grad_token_chunk = 16;
  const AttnDims d{4, 2, 64};
  const Seq x = make_seq(d, 70, 98);
  const auto dout = random_bf16(x.q.size(), 99, 1.0f);
  const Fwd f = forward(kn, x);
  const Bwd want = backward(kn, x, f, dout);
  const int C = kn.grad_token_chunk, chunks = (x.S + C - 1) / C;
  const size_t part = kvsize(d, x.S), row = kvsize(d, 1);
  std::vector<float> dk_part(chunks * part), dv_part(dk_part.size());
  ASSERT_EQ(chunks, ref::attention_bwd_kv_partials(kn, d, {0, x.S, 0, 0}, x.q.data(), x.k.data(), x.v.data(),
                                                   f.o.data(), f.m.data(), f.l.data(), dout.data(), dk_part.data(),
                                                   dv_part.data()));
  auto combined = [&] {
    Bwd b{{}, std::vector<bf16>(part), std::vector<bf16>(part)};
    ref::attention_bwd_kv_combine(kn, d, x.S, chunks, dk_part.data(), dv_part.data(), b.dk.data(), b.dv.data());
    return b;
  };
  auto poison = [&](int c, int j) {
    const size_t at = c * part + j * row;
    std::fill(dk_part.begin() + at, dk_part.begin() + at + row, NAN);
    std::fill(dv_part.begin() + at, dv_part.begin() + at + row, NAN);
  };
  for (int j = 0; j < x.S; ++j)
    for (int c = 0; (c + 1) * C <= j; ++c) poison(c, j);
  const Bwd skipped = combined();
  EXPECT_TRUE(same_bits(skipped.dk, want.dk) && same_bits(skipped.dv, want.dv));
  poison(2, 2 * C + 5);  // key 2C+5 reads its own chunk
  const Bwd control = combined();
  EXPECT_FALSE(same_bits(control.dk, want.dk));
  EXPECT_FALSE(same_bits(control.dv, want.dv));
}

// ---- edge inputs ----

TEST_P(AttentionTest, SingleTokenAndOneTokenCache) {
  const AttnDims d{2, 2, 128};
  const Seq x = make_seq(d, 2, 93);
  const Seq first{d, 1, token_slice(x.q, d.Hq * d.D, 0, 1), token_slice(x.k, d.Hkv * d.D, 0, 1),
                  token_slice(x.v, d.Hkv * d.D, 0, 1)};
  const Fwd one = forward(knobs(), first);
  EXPECT_TRUE(same_bits(one.o, first.v)) << "one key: R(P) = 1, o = v exactly";
  // v1: P = exp(0) = 1. v2: P = 2^r, r = z·c − R(z·c) the product's rounding error,
  // which is 1 only where |z·c| is small; o = v still (|r| < 2^-10 for |z·c| < 2^14).
  const bool v2 = knobs().softmax_exp == SoftmaxExp::kExp2Poly;
  const float c = ref::attn_exp2_scale(d.D);
  for (int h = 0; h < d.Hq; ++h) {
    const float z = with_dot_model(knobs().dot, [&](auto model) {
      return decltype(model)::chain(0.0f, first.q.data() + h * d.D, 1, first.k.data() + h * d.D, 1, d.D);
    });
    EXPECT_EQ(bits_of(one.l[h]), bits_of(v2 ? math::exp2_poly(fma_rn(z, c, -mul_rn(z, c))) : 1.0f)) << h;
  }
  if (v2) {  // a large score: the residual moves l off 1, and o stays v
    Seq big = first;
    for (bf16& e : big.q) e = round_bf16(mul_rn(widen(e), 64.0f));
    const Fwd f = forward(knobs(), big);
    EXPECT_TRUE(same_bits(f.o, big.v));
    EXPECT_TRUE(std::any_of(f.l.begin(), f.l.end(), [](float l) { return l != 1.0f; }));
  }
  // Decode against a cache of one token equals the extend's second row.
  expect_same(incremental(knobs(), x, {1, 1}), forward(knobs(), x), "one-token cache");
  // Backward of a single token: P = 1 and dP = D exactly (the same dot, O = v), so
  // dS = 0, and dv = R(R(1)·dO) = dO.
  const auto dout = random_bf16(first.q.size(), 94, 1.0f);
  const Bwd b = backward(knobs(), first, one, dout);
  for (bf16 g : b.dq) EXPECT_EQ(g.bits, 0);
  for (bf16 g : b.dk) EXPECT_EQ(g.bits, 0);
  EXPECT_TRUE(same_bits(b.dv, dout));
}

TEST_P(AttentionTest, SignedZerosAndTies) {
  const Knobs kn = small_variant(knobs());
  const AttnDims d{2, 1, 64};
  Seq x = make_seq(d, 40, 95);
  x.q.assign(x.q.size(), bf16{0x8000});  // q = -0: every score is +0, a tie
  Fwd f = forward(kn, x);
  for (int t = 0; t < x.S; ++t)
    for (int h = 0; h < d.Hq; ++h) {
      EXPECT_EQ(bits_of(f.m[size_t(t) * d.Hq + h]), 0u);
      EXPECT_EQ(f.l[size_t(t) * d.Hq + h], float(t + 1)) << "P = exp(0) = 1 for each of t+1 keys";
    }
  x.v.assign(x.v.size(), bf16{0x8000});  // v = -0: zero products, so o = +0
  f = forward(kn, x);
  for (bf16 o : f.o) EXPECT_EQ(o.bits, 0);
}

// A non-finite input reaches exactly the outputs whose inputs contain it.
TEST_P(AttentionTest, NonFiniteInputsPropagateOnlyWhereVisible) {
  const Knobs kn = small_variant(knobs());
  const AttnDims d{4, 2, 64};
  const Seq clean = make_seq(d, 80, 96);
  const Fwd base = forward(kn, clean);
  const int j = 37, h = 1, G = d.Hq / d.Hkv;
  auto per_row = [&](const Fwd& f, int t, int hh) {
    return std::vector<bf16>(f.o.begin() + (size_t(t) * d.Hq + hh) * d.D,
                             f.o.begin() + (size_t(t) * d.Hq + hh + 1) * d.D);
  };
  auto all_nan = [](const std::vector<bf16>& r) {
    return std::all_of(r.begin(), r.end(), [](bf16 x) { return is_nan(x); });
  };
  for (const char* where : {"k", "v", "q", "qinf"}) {
    Seq x = clean;
    const std::string w = where;
    if (w == "k" || w == "v") (w == "k" ? x.k : x.v)[(size_t(j) * d.Hkv + h / G) * d.D + 5] = bf16{0x7fc0};
    if (w == "q") x.q[(size_t(j) * d.Hq + h) * d.D + 5] = bf16{0x7fc0};
    if (w == "qinf") x.q[(size_t(j) * d.Hq + h) * d.D + 5] = bf16{0x7f80};  // keys have both signs there
    const Fwd f = forward(kn, x);
    for (int t = 0; t < x.S; ++t)
      for (int hh = 0; hh < d.Hq; ++hh) {
        const bool hit = (w == "k" || w == "v") ? (t >= j && hh / G == h / G) : (t == j && hh == h);
        std::vector<bf16> want = per_row(base, t, hh);
        if (hit && w == "v") want[5] = bf16{0x7fc0};  // only that component of o reads v[j][5]
        if (hit && w != "v")
          EXPECT_TRUE(all_nan(per_row(f, t, hh))) << where << " row " << t << " head " << hh;
        else
          EXPECT_TRUE(same_bits(per_row(f, t, hh), want)) << where << " row " << t << " head " << hh;
      }
  }
}

// ---- the products in lanes (dot_tiles) against the definition ----

// Digests of everything attention writes for x: queries [past, S) as one extend, the
// whole sequence's forward and backward, and the fp32 dk/dv partials of the queries
// from past on (a context-parallel rank's chunks), with the products in lanes or one
// output at a time (framed_chains_scalar, dot_rows_scalar).
std::string all_outputs(const Knobs& kn, const Seq& x, int past, const std::vector<bf16>& dout, bool lanes) {
  ref::set_dot_simd_enabled(lanes);
  const AttnDims d = x.dims;
  const Fwd part = forward(kn, x, past), f = forward(kn, x);
  const Bwd b = backward(kn, x, f, dout);
  const AttnSeq s{0, x.S - past, past, 0};
  const int C = kn.grad_token_chunk, chunks = (x.S + C - 1) / C - past / C;
  std::vector<float> dk_part(chunks * kvsize(d, x.S)), dv_part(dk_part.size());
  ref::attention_bwd_kv_partials(kn, d, s, x.q.data() + qsize(d, past), x.k.data(), x.v.data(), part.o.data(),
                                 part.m.data(), part.l.data(), dout.data() + qsize(d, past), dk_part.data(),
                                 dv_part.data());
  ref::set_dot_simd_enabled(true);
  std::string all;
  for (const std::vector<bf16>& t : {part.o, f.o, b.dq, b.dk, b.dv}) all += test::digest(t) + " ";
  for (const std::vector<float>& t : {part.m, part.l, f.m, f.l, dk_part, dv_part}) all += test::digest(t) + " ";
  return all;
}

// x with the lanes' and the frame's edge cases: a query of -0 (every score a +0 tie),
// zero and subnormal values of both signs, a large query (P down to fp32 subnormals),
// a NaN key and an Inf value late in the sequence (tiles that see them take the
// definition; earlier ones must not see them).
Seq edge_seq(AttnDims d, int S, uint64_t seed) {
  Seq x = make_seq(d, S, seed);
  const size_t q_row = size_t(d.Hq) * d.D, kv_row = size_t(d.Hkv) * d.D;
  std::fill(x.q.begin() + 3 * q_row, x.q.begin() + 4 * q_row, bf16{0x8000});
  for (size_t i = 5 * q_row; i < 6 * q_row; ++i) x.q[i] = round_bf16(widen(x.q[i]) * 96.0f);
  for (size_t i = 0; i < x.v.size(); i += 7) x.v[i] = bf16{static_cast<uint16_t>(counter_hash(seed, i) & 0x807f)};
  for (size_t i = 3; i < x.k.size(); i += 11) x.k[i] = bf16{static_cast<uint16_t>(counter_hash(seed, i) & 0x8003)};
  x.k[(S - 9) * kv_row + 3] = bf16{0x7fc0};
  x.v[(S - 4) * kv_row + 5] = round_bf16(INFINITY);
  return x;
}

TEST_P(AttentionTest, LanesEqualDefinition) {
  if (!ref::dot_rows_simd_available()) GTEST_SKIP() << "no AVX2/FMA on this host: only the definition runs";
  const Knobs small = small_variant(knobs());
  struct Case {
    Knobs kn;
    Seq x;
    int past;
  };
  // GQA 2, 8 and 1 (tiles of 64, 16 and 128 queries), blocks crossing the tiles,
  // a prefix cache that starts mid-chunk, the contract's own 512 split.
  const Case cases[] = {{small, make_seq({4, 2, 64}, 150, 120), 37},
                        {small, make_seq({8, 1, 64}, 70, 121), 20},
                        {small, make_seq({2, 2, 128}, 90, 122, 8.0f), 0},
                        {small, edge_seq({4, 2, 64}, 80, 123), 10},
                        {knobs(), make_seq({2, 1, 64}, 530, 124), 130}};
  for (const Case& c : cases) {
    const auto dout = random_bf16(c.x.q.size(), 125, 1.0f);
    EXPECT_EQ(all_outputs(c.kn, c.x, c.past, dout, true), all_outputs(c.kn, c.x, c.past, dout, false))
        << "S " << c.x.S << " past " << c.past << " Hq " << c.x.dims.Hq << " Hkv " << c.x.dims.Hkv;
  }
}

// Negative control: the lanes with kv blocks of 16 against the definition with 32
// (the same products, other chains) differ, so the equality above can fail.
TEST_P(AttentionTest, NegativeControlLanesAgainstOtherBlocks) {
  if (!ref::dot_rows_simd_available()) GTEST_SKIP() << "no AVX2/FMA on this host: only the definition runs";
  const Knobs kn = small_variant(knobs());
  Knobs other = kn;
  other.attn_kv_block = 32;
  const Seq x = make_seq({4, 2, 64}, 100, 126);
  const auto dout = random_bf16(x.q.size(), 127, 1.0f);
  EXPECT_NE(all_outputs(kn, x, 0, dout, true), all_outputs(other, x, 0, dout, false));
}

// ---- golden digests ----

TEST_P(AttentionTest, GoldenDigests) {
  const Knobs& kn = knobs();
  const AttnDims d{4, 2, 64};
  // A batch of a 150-token extend (3 kv blocks) and a 20-token extend at positions
  // 500..519 (across the 512 split).
  const Seq a = make_seq(d, 150, 100), b = make_seq(d, 520, 101);
  const AttnSeq seqs[2] = {{0, 150, 0, 0}, {150, 20, 500, 150}};
  std::vector<bf16> q = a.q, k = a.k, v = a.v;
  q.insert(q.end(), b.q.begin() + qsize(d, 500), b.q.end());
  k.insert(k.end(), b.k.begin(), b.k.end());
  v.insert(v.end(), b.v.begin(), b.v.end());
  const int T = 170;
  std::vector<bf16> o(qsize(d, T)), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<float> m(size_t(T) * d.Hq), l(size_t(T) * d.Hq);
  const auto dout = random_bf16(q.size(), 102, 1.0f);
  ref::attention_fwd(kn, d, seqs, 2, q.data(), k.data(), v.data(), o.data(), m.data(), l.data());
  ref::attention_bwd(kn, d, seqs, 2, q.data(), k.data(), v.data(), o.data(), m.data(), l.data(), dout.data(), dq.data(),
                     dk.data(), dv.data());
  const std::string c = contract().name;
  test::expect_golden("ops/attention.txt", c + ".o", test::digest(o));
  test::expect_golden("ops/attention.txt", c + ".m", test::digest(m));
  test::expect_golden("ops/attention.txt", c + ".l", test::digest(l));
  test::expect_golden("ops/attention.txt", c + ".dq", test::digest(dq));
  test::expect_golden("ops/attention.txt", c + ".dk", test::digest(dk));
  test::expect_golden("ops/attention.txt", c + ".dv", test::digest(dv));
}

// ---- heavy: the real Qwen3-30B-A3B head shape ----

TEST_P(AttentionTest, SlowRealShapeWithinBoundAndPathInvariant) {
  const AttnDims d{32, 4, 128};
  const Seq x = make_seq(d, 520, 110);
  const auto dout = random_bf16(x.q.size(), 111, 1.0f);
  const Fwd f = forward(knobs(), x);
  expect_same(incremental(knobs(), x, std::vector<int>(x.S, 1)), f, "decode");
  const Bwd b = backward(knobs(), x, f, dout);
  const MatD Q = rows(x.q, d, d.Hq), K = rows(x.k, d, d.Hkv), V = rows(x.v, d, d.Hkv);
  const auto tf = truth::attention_fwd(Q, K, V, geometry(d));
  const auto tb = truth::attention_bwd(Q, K, V, rows(dout, d, d.Hq), geometry(d));
  const Bounds fb = forward_bounds(knobs(), x, 0, tf);
  const auto bb = backward_bounds(knobs(), x, f, dout, fb, tf, tb);
  std::printf("[ attention ] real shape: o %.3g dq %.3g dk %.3g dv %.3g (max error / bound)\n",
              check_within(f.o, tf.o, fb.fwd, "o"), check_within(b.dq, tb.dq, bb.dq, "dq"),
              check_within(b.dk, tb.dk, bb.dk, "dk"), check_within(b.dv, tb.dv, bb.dv, "dv"));
}

INSTANTIATE_TEST_SUITE_P(Contracts, AttentionTest,
                         ::testing::ValuesIn(test::all_contract_names()),
                         [](const auto& info) { return test::contract_test_name(info.param); });

}  // namespace
}  // namespace bp
