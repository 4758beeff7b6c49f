// Tensor maps for the copy engine (TMA): a 2-D bf16 tensor in global memory
// described once on the host, passed to a kernel by value (__grid_constant__) or
// in device memory.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace bp::cuda {

// A row-major tensor of `outer` rows of `inner` bf16 each, rows `row_stride`
// elements apart, read in boxes of box_inner × box_outer with the 128-byte
// swizzle that wgmma's operand descriptors expect (box_inner · 2 = 128 bytes).
// Reads outside the tensor arrive as zeros. Throws std::runtime_error when the
// driver refuses the map (alignment: base 16 bytes, row_stride a multiple of 8).
CUtensorMap bf16_tensor_map(const void* base, uint64_t inner, uint64_t outer, uint64_t row_stride,
                            uint32_t box_inner, uint32_t box_outer);

}  // namespace bp::cuda
