// Float64 twin of reference/ops/embedding.h.
#pragma once
#include <cstdint>

#include "tensor.h"

namespace bp::truth {

inline MatD embedding_fwd(const int32_t* tokens, int T, const MatD& table) {  // [T][H]
  MatD out(T, table.cols());
  for (int t = 0; t < T; ++t) out.row(t) = table.row(tokens[t]);
  return out;
}

inline MatD embedding_bwd(const int32_t* tokens, int T, const MatD& dout, int V) {  // [V][H]
  MatD d = MatD::Zero(V, dout.cols());
  for (int t = 0; t < T; ++t) d.row(tokens[t]) += dout.row(t);
  return d;
}

}  // namespace bp::truth
