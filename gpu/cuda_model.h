// The Qwen3 / Qwen3-MoE model on a GPU: the reference's model program
// (program/qwen3_program.h) over the bp::cuda ops, so every path (extend,
// chunked prefill, decode, ragged) keeps its KV caches in device memory and the
// backward runs on the device. Same API and results as host::Model, bit for bit;
// the constructor uploads every weight (the host copy may go away afterwards).
#pragma once
#include "gpu/cuda_backend.h"
#include "program/qwen3_program.h"

namespace bp::gpu {

using Model = program::Qwen3Program<CudaBackend>;

}  // namespace bp::gpu

extern template class bp::program::Qwen3Program<bp::gpu::CudaBackend>;
