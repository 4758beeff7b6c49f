// rmsnorm (HF Qwen3RMSNorm in bf16): the layer norms, the final norm and the
// per-head q/k norms (SPEC.md §5.2). x is [T][heads][n], normalised over n; heads
// is 1 for the layer and final norms and the head count for q/k norms (n = head_dim).
#pragma once
#include "reference/contract/contract.h"

namespace bp::ref {

// Per row (t, head): r = rsqrt(lane_sum(x²)/n + eps), t = R(x·r), out = R(f(w)·f(t)).
// rstd[T·heads] receives r (fp32), which the backward takes as input.
void rmsnorm_fwd(const Knobs& kn, const bf16* x, const bf16* w, float eps, bf16* out, float* rstd, int T, int heads,
                 int n);

// dx (bf16, [T][heads][n]) with g = f(dy)·f(w): dx = R(r·g − f(x)·(r³·lane_sum(g·f(x))/n)).
// dw (fp32, [n]): token-chunked dot of dy and t = R(f(x)·r) over the rows, a chunk
// being grad_token_chunk tokens (grad_token_chunk·heads rows, in row order).
void rmsnorm_bwd(const Knobs& kn, const bf16* x, const bf16* w, const float* rstd, const bf16* dy, bf16* dx, float* dw,
                 int T, int heads, int n);

}  // namespace bp::ref
