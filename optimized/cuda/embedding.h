// CUDA twin of reference/ops/embedding.h (SPEC.md §5.1). Device pointers. Both
// calls copy the token ids to the host and refuse an id outside [0, V) with the
// reference's std::invalid_argument before writing anything (so they wait for
// `stream`); the kernels then never read out of bounds.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "reference/contract/contract.h"

namespace bp::cuda {

void embedding_fwd(const Knobs& kn, const int32_t* tokens, const bf16* table, bf16* out, int T, int V, int H,
                   cudaStream_t stream = 0);

// No atomics: the positions are grouped by id on the host (stable, increasing t),
// and one thread owns each (id, h) of the hit rows; every other row is set to +0.
void embedding_bwd(const Knobs& kn, const int32_t* tokens, const bf16* dout, float* dtable, int T, int V, int H,
                   cudaStream_t stream = 0);

}  // namespace bp::cuda
