// Per-element error bounds of the rounding points of composite ops (SPEC.md §5.7-5.9):
// shared by the dense MLP, MoE router and MoE expert suites. Each stage of a chain is checked
// against float64 truth evaluated on the stage's own inputs (the bf16 values the
// contract rounds to), so every bound is that of one rounding point, derived below.
#pragma once
#include "reference/numerics/math.h"
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "reference/common/rng.h"
#include "reference/contract/contract.h"
#include "reference/ops/linear.h"
#include "reference/ops/swiglu.h"
#include "reference/truth/swiglu.h"
#include "support/bounds.h"

namespace bp::test {

using truth::MatD;

// A float64 matrix of counter-generated values uniform in [−1, 1) (defined bits, for
// the float64 twins' finite-difference checks).
inline MatD random_matd(int rows, int cols, uint64_t seed) {
  MatD m(rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) m(r, c) = counter_uniform(seed, static_cast<uint64_t>(r) * cols + c);
  return m;
}

// Absolute floors of one rounding where the result is subnormal: half the spacing
// of bf16 (2^-133) and of fp32 (2^-149) subnormals.
constexpr double kBf16Tiny = 0x1p-134;
constexpr double kF32Tiny = 0x1p-150;

// Bounds on the errors of the contract's functions over all 2^32 fp32 inputs, in
// ulps of the exact result (measured; SPEC.md §2.2).
constexpr double kSiluUlps = math::kMaxUlpSilu;
constexpr double kSigmoidUlps = math::kMaxUlpSigmoid;
constexpr double kExpUlps = math::kMaxUlpExp;

// An error of n ulps of v: an ulp is at most 2^-23·|v|, or 2^-149 below 2^-126.
inline double ulps_error(double v, double n) { return n * (0x1p-23 * std::fabs(v) + 0x1p-149); }

// |R(y) − t| for a bf16 result whose fp32 value y has |y − t| <= err, subnormal
// results included.
inline double round_bound(double t, double err) { return bf16_output_bound(t, err) + kBf16Tiny; }

// |computed − exact| <= wgrad_gamma · Σ|terms| for a weight gradient over T tokens
// cut into chunks of `chunk`: one chunk's dot, then ceil(log2 chunks) tree levels.
inline double wgrad_gamma(DotModel model, int T, int chunk) {
  const int chunks = (T + chunk - 1) / chunk;
  int levels = 0;
  while ((1 << levels) < chunks) ++levels;
  const double g = dot_gamma(model, std::min(T, chunk));
  return g + levels * kU32 * (1.0 + g);
}

// Checks |got − truth| <= bound element by element; reports the first failures and
// prints the largest |got − truth| / bound (the measured error against the bound).
class BoundCheck {
 public:
  explicit BoundCheck(std::string what) : what_(std::move(what)) {}
  BoundCheck(const BoundCheck&) = delete;
  BoundCheck& operator=(const BoundCheck&) = delete;
  ~BoundCheck() {
    std::printf("[bound] %-44s max |err|/bound %.3g over %zu\n", what_.c_str(), max_ratio_, count_);
    EXPECT_EQ(bad_, 0) << what_;
  }
  void operator()(double got, double truth, double bound, size_t index) {
    ++count_;
    const double err = std::fabs(got - truth);
    if (bound > 0) max_ratio_ = std::max(max_ratio_, err / bound);
    if (!(err <= bound) && ++bad_ <= 5)
      ADD_FAILURE() << what_ << " [" << index << "] got " << got << " truth " << truth << " bound " << bound;
  }

 private:
  std::string what_;
  double max_ratio_ = 0;
  size_t count_ = 0;
  int bad_ = 0;
};

// A dot stage: y (bf16, rounded once) or acc (fp32) against truth with
// |acc − t| <= gamma·Σ|a b| (Σ|a b| in `abs_sum`).
inline void check_dot(const std::vector<bf16>& y, const MatD& t, const MatD& abs_sum, double gamma, BoundCheck& chk) {
  for (int r = 0; r < t.rows(); ++r)
    for (int c = 0; c < t.cols(); ++c) {
      const size_t i = static_cast<size_t>(r) * t.cols() + c;
      chk(widen(y[i]), t(r, c), round_bound(t(r, c), gamma * abs_sum(r, c)), i);
    }
}
inline void check_dot(const std::vector<float>& acc, const MatD& t, const MatD& abs_sum, double gamma,
                      BoundCheck& chk) {
  for (int r = 0; r < t.rows(); ++r)
    for (int c = 0; c < t.cols(); ++c) {
      const size_t i = static_cast<size_t>(r) * t.cols() + c;
      chk(acc[i], t(r, c), gamma * abs_sum(r, c), i);
    }
}

// silu stage: s = R(silu_hat(x)), |silu_hat − silu| <= kSiluUlps ulps.
inline double silu_stage_error(double x) {
  return round_bound(truth::silu(x), ulps_error(truth::silu(x), kSiluUlps));
}

// |silu_grad(x) − silu'(x)| for the contract's order (SPEC.md §5.7), with the true
// σ and |σ_hat − σ| <= e_σ (kSigmoidUlps ulps); u = 2^-24 per fp32 rounding:
//   t1 = fl(1 − σ_hat):        |t1 − (1−σ)| <= e_σ + u·(|1−σ| + e_σ) = E1
//   t2 = fma(x, t1, 1):        |t2 − T| <= |x|·E1 + u·(|T| + |x|·E1) = E2, T = 1 + x(1−σ)
//   D  = fl(σ_hat·t2):         |D − σT| <= e_σ·(|T| + E2) + σ·E2 + u·(σ + e_σ)(|T| + E2)
inline double silu_grad_error(double x) {
  const double sg = truth::sigmoid(x), e_sg = ulps_error(sg, kSigmoidUlps);
  const double T = 1.0 + x * (1.0 - sg);
  const double e1 = e_sg + kU32 * (std::fabs(1.0 - sg) + e_sg);
  const double e2 = std::fabs(x) * e1 + kU32 * (std::fabs(T) + std::fabs(x) * e1);
  return e_sg * (std::fabs(T) + e2) + sg * e2 + kU32 * (sg + e_sg) * (std::fabs(T) + e2) + kF32Tiny;
}

// swiglu forward on n elements: m = R(s·u), the product of two bf16 exact in fp32
// (up to underflow), against silu(g)·u: |m − t| <= u16|t| + (1+u16)|u|·E_s + tiny.
inline void check_swiglu_fwd(const bf16* g, const bf16* u, const bf16* m, size_t n, BoundCheck& chk) {
  for (size_t i = 0; i < n; ++i) {
    const double x = widen(g[i]), uu = widen(u[i]), t = truth::silu(x) * uu;
    chk(widen(m[i]), t, round_bound(t, std::fabs(uu) * silu_stage_error(x) + kF32Tiny), i);
  }
}

// swiglu backward on n elements, against truth without the ds rounding:
//   du = R(dm·s):            |du − dm·silu| <= u16|t| + (1+u16)|dm|·E_s + tiny
//   ds = R(dm·u):            |ds − dm·u| <= u16|dm·u| + tiny = E_ds
//   dg = R(fl(ds·D)):        fp32 error |ds−dm·u|·|D| + |dm·u|·E_D + u·|ds·D| (+ tiny)
inline void check_swiglu_bwd(const bf16* g, const bf16* u, const bf16* dm, const bf16* dg, const bf16* du, size_t n,
                             BoundCheck& dg_chk, BoundCheck& du_chk) {
  for (size_t i = 0; i < n; ++i) {
    const double x = widen(g[i]), uu = widen(u[i]), d = widen(dm[i]);
    const double tu = d * truth::silu(x);
    du_chk(widen(du[i]), tu, round_bound(tu, std::fabs(d) * silu_stage_error(x) + kF32Tiny), i);
    const double D = truth::silu_grad(x), eD = silu_grad_error(x), ds = d * uu;
    const double e_ds = kU16 * std::fabs(ds) + kBf16Tiny + kF32Tiny;
    const double tg = ds * D;
    const double err = e_ds * (std::fabs(D) + eD) + std::fabs(ds) * eD +
                       kU32 * (std::fabs(ds) + e_ds) * (std::fabs(D) + eD) + kF32Tiny;
    dg_chk(widen(dg[i]), tg, round_bound(tg, err), i);
  }
}

// The bound checks of the MLP's hidden forward and backward stages, created once by
// a test and fed by every call (e.g. one per expert).
struct HiddenFwdChecks {
  BoundCheck gate, up, swiglu;
  explicit HiddenFwdChecks(const std::string& what) : gate(what + " gate"), up(what + " up"), swiglu(what + " swiglu") {}
};
struct HiddenBwdChecks {
  BoundCheck dg, du, acc, dwg, dwu;
  explicit HiddenBwdChecks(const std::string& what)
      : dg(what + " swiglu dg"), du(what + " swiglu du"), acc(what + " input grad acc"), dwg(what + " dWg"),
        dwu(what + " dWu") {}
};

// The MLP hidden forward of rows a [T][H] by the reference, each stage checked:
// g and u (one dot over H each), then swiglu. Returns g, u, m.
struct Hidden {
  std::vector<bf16> g, u, m;
};
inline Hidden check_mlp_hidden_fwd(const Knobs& kn, const std::vector<bf16>& a, const bf16* wg, const bf16* wu, int T,
                                   int H, int I, HiddenFwdChecks& chk) {
  Hidden h{std::vector<bf16>(size_t(T) * I), std::vector<bf16>(size_t(T) * I), std::vector<bf16>(size_t(T) * I)};
  ref::mlp_hidden_fwd(kn, a.data(), wg, wu, h.g.data(), h.u.data(), h.m.data(), T, H, I);
  const MatD A = truth::widen(a, T, H), Wg = truth::widen(wg, I, H), Wu = truth::widen(wu, I, H);
  const double gamma = dot_gamma(kn.dot, H);
  check_dot(h.g, truth::linear_fwd(A, Wg), truth::linear_fwd(A.cwiseAbs(), Wg.cwiseAbs()), gamma, chk.gate);
  check_dot(h.u, truth::linear_fwd(A, Wu), truth::linear_fwd(A.cwiseAbs(), Wu.cwiseAbs()), gamma, chk.up);
  check_swiglu_fwd(h.g.data(), h.u.data(), h.m.data(), h.m.size(), chk.swiglu);
  return h;
}

// The gate/up/swiglu backward for the hidden gradient dm, each stage checked:
// dg and du (swiglu), acc = tree_C(dg·Wg) + tree_C(du·Wu) (fp32: each tree within
// gamma·Σ|terms| of its exact value, their sum adds u·|sum| <= u·(|t| + gamma·Σ|terms|)),
// dWg and dWu (token-chunked).
struct HiddenGrads {
  std::vector<float> acc, dwg, dwu;
};
inline HiddenGrads check_mlp_hidden_bwd(const Knobs& kn, const std::vector<bf16>& a, const bf16* wg, const bf16* wu,
                                        const Hidden& h, const std::vector<bf16>& dm, int T, int H, int I,
                                        HiddenBwdChecks& chk) {
  const size_t hidden = size_t(T) * I;
  std::vector<bf16> dg(hidden), du(hidden);
  HiddenGrads out{std::vector<float>(size_t(T) * H), std::vector<float>(size_t(I) * H),
                  std::vector<float>(size_t(I) * H)};
  ref::swiglu_bwd(h.g.data(), h.u.data(), dm.data(), dg.data(), du.data(), T * I);
  check_swiglu_bwd(h.g.data(), h.u.data(), dm.data(), dg.data(), du.data(), hidden, chk.dg, chk.du);
  ref::mlp_input_grad_acc(kn, dg.data(), du.data(), wg, wu, out.acc.data(), T, H, I);
  ref::linear_wgrad(kn, dg.data(), a.data(), out.dwg.data(), T, H, I);
  ref::linear_wgrad(kn, du.data(), a.data(), out.dwu.data(), T, H, I);
  const MatD A = truth::widen(a, T, H), Wg = truth::widen(wg, I, H), Wu = truth::widen(wu, I, H);
  const MatD DG = truth::widen(dg, T, I), DU = truth::widen(du, T, I);
  const double gamma = dot_gamma(kn.dot, I, kn.tp_tree_width);
  const MatD t = truth::linear_dgrad(DG, Wg) + truth::linear_dgrad(DU, Wu);
  const MatD abs_sum =
      truth::linear_dgrad(DG.cwiseAbs(), Wg.cwiseAbs()) + truth::linear_dgrad(DU.cwiseAbs(), Wu.cwiseAbs());
  for (int r = 0; r < T; ++r)
    for (int c = 0; c < H; ++c) {
      const double e = gamma * abs_sum(r, c);
      chk.acc(out.acc[size_t(r) * H + c], t(r, c), e + kU32 * (std::fabs(t(r, c)) + e) + kF32Tiny, size_t(r) * H + c);
    }
  const double gw = wgrad_gamma(kn.dot, T, kn.grad_token_chunk);
  check_dot(out.dwg, truth::linear_wgrad(DG, A), truth::linear_wgrad(DG.cwiseAbs(), A.cwiseAbs()), gw, chk.dwg);
  check_dot(out.dwu, truth::linear_wgrad(DU, A), truth::linear_wgrad(DU.cwiseAbs(), A.cwiseAbs()), gw, chk.dwu);
  return out;
}

}  // namespace bp::test
