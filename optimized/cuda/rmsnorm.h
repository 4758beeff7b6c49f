// CUDA twin of reference/ops/rmsnorm.h (SPEC.md §5.2): same arguments, device
// pointers, bit-identical results under every contract. Asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include "reference/contract/contract.h"

namespace bp::cuda {

void rmsnorm_fwd(const Knobs& kn, const bf16* x, const bf16* w, float eps, bf16* out, float* rstd, int T, int heads,
                 int n, cudaStream_t stream = 0);

// Uses stream-ordered scratch: [T·heads][n] bf16 (the recomputed t) and the dw chunk partials.
void rmsnorm_bwd(const Knobs& kn, const bf16* x, const bf16* w, const float* rstd, const bf16* dy, bf16* dx, float* dw,
                 int T, int heads, int n, cudaStream_t stream = 0);

}  // namespace bp::cuda
