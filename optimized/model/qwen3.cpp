#include "optimized/model/qwen3.h"

template class bp::ref::Qwen3Program<bp::cuda::CudaBackend>;
