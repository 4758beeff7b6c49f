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

// A 3-D tensor [dims[2]][dims[1]][dims[0]] of bf16 (dims[0] packed; strides[0] and
// strides[1] elements between consecutive indices of dimensions 1 and 2), read in
// boxes of box[0] × box[1] × box[2], 128-byte swizzled (box[0] · 2 = 128 bytes).
// Attention's keys: [rows][Hkv][D], one head's block of rows a box.
CUtensorMap bf16_tensor_map_3d(const void* base, const uint64_t (&dims)[3], const uint64_t (&strides)[2],
                               const uint32_t (&box)[3]);

}  // namespace bp::cuda
