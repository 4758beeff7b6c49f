#include "gpu/cuda_model.h"

template class bp::program::Qwen3Program<bp::gpu::CudaBackend>;
