// residual add: h' = R(f(h) + f(o)) in bf16 storage (SPEC.md §5.3).
#pragma once
#include <cstddef>

#include "reference/contract/contract.h"

namespace bp::ref {

// out[i] = R(f(h[i]) + f(o[i])) for i in [0, n): the correctly rounded bf16 sum.
// out may be h or o (in place); no knob changes its bits. The backward is the
// identity to both inputs; where a gradient has two contributions (the residual
// stream feeds both the skip and the branch), the model adds them with this op.
void residual_fwd(const Knobs& kn, const bf16* h, const bf16* o, bf16* out, size_t n);

// out[i] = R(((+0 + parts[0][i]) + parts[1][i]) + ... + parts[count-1][i]): the fp32
// gradient accumulators of a tensor that feeds several consumers (q, k and v), added
// in the order given and rounded once (SPEC.md §5.3).
void sum_round(const float* const* parts, int count, bf16* out, size_t n);

}  // namespace bp::ref
