// Float64 twin of reference/ops/residual.h.
#pragma once
#include "tensor.h"

namespace bp::truth {

inline MatD residual_fwd(const MatD& h, const MatD& o) { return h + o; }

// d/dh and d/do of h + o: the incoming gradient, to both inputs.
struct ResidualGrads {
  MatD dh, d_o;
};
inline ResidualGrads residual_bwd(const MatD& dout) { return {dout, dout}; }

}  // namespace bp::truth
