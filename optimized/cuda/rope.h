// CUDA twin of the apply functions of reference/ops/rope.h (SPEC.md §5.5). The
// tables are built on the host by bp::ref::rope_tables and copied to the device;
// `table.cos`, `table.sin`, `pos`, x and out are device pointers.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "reference/contract/contract.h"
#include "reference/ops/rope.h"

namespace bp::cuda {

using ref::RopeTable;

// As ref::rope_fwd, with the same refusal of a position outside [0, max_pos): the
// positions are copied to the host and checked first (the call waits for `stream`).
void rope_fwd(const Knobs& kn, const RopeTable& table, const int32_t* pos, const bf16* x, bf16* out, int T, int H,
              cudaStream_t stream = 0);

void rope_bwd(const Knobs& kn, const RopeTable& table, const int32_t* pos, const bf16* dout, bf16* dx, int T, int H,
              cudaStream_t stream = 0);

}  // namespace bp::cuda
