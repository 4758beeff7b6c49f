// The harness's tensor digest (reference/common/tensor_digest.h) of a tensor in
// device memory: what a GPU case's gradients are compared by before any of them
// leaves the device (harness/engine/cuda_implementation.cpp). Not an op of the
// contract: the bits it reads are the op's outputs, as they are.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "reference/common/tensor_digest.h"

namespace bp::cuda {

// The digest of n values at `device`, once the stream's earlier work is done.
// Throws std::invalid_argument past kMaxDigestElements.
TensorDigest tensor_digest(const float* device, size_t n, cudaStream_t stream = 0);
TensorDigest tensor_digest(const bf16* device, size_t n, cudaStream_t stream = 0);

}  // namespace bp::cuda
