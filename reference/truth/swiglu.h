// Float64 twin of reference/ops/swiglu.h: silu, swiglu and the dense MLP with no
// intermediate rounding.
#pragma once
#include <cmath>

#include "linear.h"

namespace bp::truth {

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x * sigmoid(x); }
inline double silu_grad(double x) { return sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x))); }

inline MatD swiglu_fwd(const MatD& g, const MatD& u) {
  return g.unaryExpr([](double x) { return silu(x); }).cwiseProduct(u);
}

struct SwigluGrads {
  MatD dg, du;
};
inline SwigluGrads swiglu_bwd(const MatD& g, const MatD& u, const MatD& dm) {
  return {dm.cwiseProduct(u).cwiseProduct(g.unaryExpr([](double x) { return silu_grad(x); })),
          dm.cwiseProduct(g.unaryExpr([](double x) { return silu(x); }))};
}

// Dense MLP: a [T][H], wg and wu [I][H], wd [H][I].
inline MatD mlp_fwd(const MatD& a, const MatD& wg, const MatD& wu, const MatD& wd) {
  return linear_fwd(swiglu_fwd(linear_fwd(a, wg), linear_fwd(a, wu)), wd);
}

struct MlpGrads {
  MatD da, dwg, dwu, dwd;
};
inline MlpGrads mlp_bwd(const MatD& a, const MatD& wg, const MatD& wu, const MatD& wd, const MatD& dd) {
  const MatD g = linear_fwd(a, wg), u = linear_fwd(a, wu), m = swiglu_fwd(g, u);
  const MatD dm = linear_dgrad(dd, wd);
  const SwigluGrads s = swiglu_bwd(g, u, dm);
  return {linear_dgrad(s.dg, wg) + linear_dgrad(s.du, wu), linear_wgrad(s.dg, a), linear_wgrad(s.du, a),
          linear_wgrad(dd, m)};
}

}  // namespace bp::truth
