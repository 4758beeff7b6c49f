// Float64 truth: the ops with no intermediate rounding, on Eigen. The only thing
// the bit-defined ops are compared against with a tolerance.
#pragma once
#include <Eigen/Dense>
#include <vector>

#include "reference/numerics/bf16.h"

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

}  // namespace bp::truth
