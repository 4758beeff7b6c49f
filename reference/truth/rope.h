// Float64 twin of reference/ops/rope.h (neox half-split rotation).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor.h"

namespace bp::truth {

// 1 / theta^(2j/D), j < D/2.
inline VecD rope_inv_freq(double theta, int D) {
  VecD f(D / 2);
  for (int j = 0; j < D / 2; ++j) f(j) = 1.0 / std::pow(theta, 2.0 * j / D);
  return f;
}

// The cos and sin [T][D/2] of each token's position (positions[t]) at each frequency.
inline void rope_angles(const VecD& inv, const std::vector<int32_t>& positions, MatD& c, MatD& s) {
  const auto T = static_cast<Eigen::Index>(positions.size());
  c.resize(T, inv.size());
  s.resize(T, inv.size());
  for (Eigen::Index t = 0; t < T; ++t)
    for (Eigen::Index j = 0; j < inv.size(); ++j) {
      c(t, j) = std::cos(positions[t] * inv(j));
      s(t, j) = std::sin(positions[t] * inv(j));
    }
}

// x is [T][H·D]; c and s are [T][D/2] (the cos and sin at each token's position).
// First half x1·c − x2·s, second half x2·c + x1·s.
inline MatD rope_fwd(const MatD& x, const MatD& c, const MatD& s, int H, int D) {
  const int half = D / 2;
  MatD y(x.rows(), x.cols());
  for (int t = 0; t < x.rows(); ++t)
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < half; ++j) {
        const double x1 = x(t, h * D + j), x2 = x(t, h * D + half + j);
        y(t, h * D + j) = x1 * c(t, j) - x2 * s(t, j);
        y(t, h * D + half + j) = x2 * c(t, j) + x1 * s(t, j);
      }
  return y;
}

// The transpose of a rotation is the rotation by the opposite angle.
inline MatD rope_bwd(const MatD& dy, const MatD& c, const MatD& s, int H, int D) { return rope_fwd(dy, c, -s, H, D); }

}  // namespace bp::truth
