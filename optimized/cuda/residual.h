// CUDA twin of reference/ops/residual.h (SPEC.md §5.3). Device pointers;
// asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "reference/contract/contract.h"

namespace bp::cuda {

// out[i] = R(f(h[i]) + f(o[i])); out may be h or o.
void residual_fwd(const Knobs& kn, const bf16* h, const bf16* o, bf16* out, size_t n, cudaStream_t stream = 0);

// Most summands sum_round takes (the pointers travel by value in the kernel's arguments).
constexpr int kMaxSumParts = 16;

// out[i] = R(((+0 + parts[0][i]) + parts[1][i]) + ...): `parts` is a host array of
// `count` device pointers, count <= kMaxSumParts (else std::invalid_argument).
void sum_round(const float* const* parts, int count, bf16* out, size_t n, cudaStream_t stream = 0);

}  // namespace bp::cuda
