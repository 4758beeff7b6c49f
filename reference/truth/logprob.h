// Float64 twin of reference/ops/logprob.h: log-softmax of x = logit / temp in
// double, no intermediate fp32 rounding. Masked entries (x = −Inf) have p = 0.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor.h"

namespace bp::truth {

// log p[t][v] = x[t][v] − (max_t + log Σ_v exp(x[t][v] − max_t)), x = logits / temp.
inline MatD log_softmax(const MatD& logits, double temp) {
  const MatD x = logits / temp;
  MatD out(x.rows(), x.cols());
  for (int r = 0; r < x.rows(); ++r) {
    const double m = x.row(r).maxCoeff();
    const double lse = m + std::log((x.row(r).array() - m).exp().sum());
    out.row(r) = x.row(r).array() - lse;
  }
  return out;
}

inline VecD logprob_fwd(const MatD& logits, const std::vector<int32_t>& targets, double temp) {
  const MatD lp = log_softmax(logits, temp);
  VecD out(lp.rows());
  for (int r = 0; r < lp.rows(); ++r) out(r) = lp(r, targets[r]);
  return out;
}

// H = −Σ p·log p; entries with p = 0 add 0.
inline VecD entropy(const MatD& logits, double temp) {
  const MatD lp = log_softmax(logits, temp);
  VecD out = VecD::Zero(lp.rows());
  for (int r = 0; r < lp.rows(); ++r)
    for (int v = 0; v < lp.cols(); ++v)
      if (std::isfinite(lp(r, v))) out(r) -= std::exp(lp(r, v)) * lp(r, v);
  return out;
}

// d/dlogits of L = Σ_t c_t·logprob_t: c_t·(δ(v, target_t) − p_v) / temp.
inline MatD logprob_grad(const MatD& logits, const std::vector<int32_t>& targets, const VecD& coef, double temp) {
  MatD g = -log_softmax(logits, temp).array().exp();
  for (int r = 0; r < g.rows(); ++r) {
    g(r, targets[r]) += 1.0;
    g.row(r) *= coef(r) / temp;
  }
  return g;
}

}  // namespace bp::truth
