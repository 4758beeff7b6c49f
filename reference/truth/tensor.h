// Float64 truth: the ops with no intermediate rounding, on Eigen. The only thing
// the bit-defined ops are compared against with a tolerance.
#pragma once
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/numerics/bf16.h"
#include "reference/truth/ulp.h"

namespace bp::truth {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VecD = Eigen::VectorXd;

inline MatD widen(const bf16* p, int rows, int cols) {
  MatD m(rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) m(r, c) = widen(p[static_cast<size_t>(r) * cols + c]);
  return m;
}
inline MatD widen(const std::vector<bf16>& v, int rows, int cols) { return widen(v.data(), rows, cols); }

// A [1][n] weight row as a vector.
inline VecD vec(const MatD& row) { return row.row(0).transpose(); }

// [T][H·D] viewed as [T·H][D] (per-head RMSNorm) and back.
inline MatD heads(const MatD& x, int D) { return Eigen::Map<const MatD>(x.data(), x.size() / D, D); }
inline MatD unheads(const MatD& x, Eigen::Index rows) {
  return Eigen::Map<const MatD>(x.data(), rows, x.size() / rows);
}

// x rounded once to bf16, to nearest even (through float, x would round twice):
// on the grid of x's binade, subnormals on the grid of 2^-133; past the largest
// finite bf16 by half an ulp or more, an infinity.
inline bf16 nearest_bf16(double x) {
  if (!std::isfinite(x) || x == 0) return round_bf16(static_cast<float>(x));
  const double ulp = ulp_of(x, 7);
  const double r = std::nearbyint(x / ulp) * ulp;  // the default rounding mode: to nearest even
  constexpr double kMax = 0x1.fep127;
  if (std::fabs(r) > kMax) return round_bf16(static_cast<float>(std::copysign(INFINITY, x)));
  return round_bf16(static_cast<float>(r));  // exact
}

}  // namespace bp::truth
