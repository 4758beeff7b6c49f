// Float64 twin of reference/ops/rmsnorm.h: out = w · x · r with
// r = (mean(x²) + eps)^(-1/2) per row, no intermediate rounding.
#pragma once
#include <cmath>

#include "tensor.h"

namespace bp::truth {

inline VecD rmsnorm_rstd(const MatD& x, double eps) {  // [rows]
  VecD r(x.rows());
  for (int i = 0; i < x.rows(); ++i) r(i) = 1.0 / std::sqrt(x.row(i).squaredNorm() / x.cols() + eps);
  return r;
}

inline MatD rmsnorm_fwd(const MatD& x, const VecD& w, double eps) {  // [rows][n]
  return (rmsnorm_rstd(x, eps).asDiagonal() * x) * w.asDiagonal();
}

struct RmsNormGrads {
  MatD dx;  // [rows][n]
  VecD dw;  // [n]
};

// g = dy·w; dx = r·g − x·r³·mean(g·x); dw = Σ_rows dy·(x·r).
inline RmsNormGrads rmsnorm_bwd(const MatD& x, const VecD& w, double eps, const MatD& dy) {
  const VecD r = rmsnorm_rstd(x, eps);
  const MatD g = dy * w.asDiagonal();
  RmsNormGrads d{MatD(x.rows(), x.cols()), VecD::Zero(x.cols())};
  for (int i = 0; i < x.rows(); ++i) {
    const double mean_gx = g.row(i).dot(x.row(i)) / x.cols();
    d.dx.row(i) = r(i) * g.row(i) - (r(i) * r(i) * r(i) * mean_gx) * x.row(i);
    d.dw += (dy.row(i).array() * x.row(i).array() * r(i)).matrix().transpose();
  }
  return d;
}

}  // namespace bp::truth
