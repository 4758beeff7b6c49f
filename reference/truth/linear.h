// Float64 twin of reference/ops/linear.h.
#pragma once
#include "tensor.h"

namespace bp::truth {

inline MatD linear_fwd(const MatD& x, const MatD& w) { return x * w.transpose(); }      // [T][N]
inline MatD linear_dgrad(const MatD& dy, const MatD& w) { return dy * w; }              // [T][K]
inline MatD linear_wgrad(const MatD& dy, const MatD& x) { return dy.transpose() * x; }  // [N][K]

}  // namespace bp::truth
