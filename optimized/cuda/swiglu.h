// CUDA twin of the elementwise part of reference/ops/swiglu.h (SPEC.md §5.7):
// swiglu forward and backward. The MLP compositions (mlp_*) are built on the
// CUDA linear. Device pointers; asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include "reference/numerics/bf16.h"

namespace bp::cuda {

// m = R(f(R(silu(f(g))))·f(u)) per element.
void swiglu_fwd(const bf16* g, const bf16* u, bf16* m, int n, cudaStream_t stream = 0);

// du = R(f(dm)·f(s)), dg = R(f(R(f(dm)·f(u)))·silu'(f(g))) per element.
void swiglu_bwd(const bf16* g, const bf16* u, const bf16* dm, bf16* dg, bf16* du, int n, cudaStream_t stream = 0);

}  // namespace bp::cuda
