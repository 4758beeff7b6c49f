// The driver's cuTensorMapEncodeTiled, reached through the runtime's entry-point
// query so that nothing links libcuda directly (the static runtime loads it).
#include "optimized/cuda/tma.h"

#include <cudaTypedefs.h>

#include <stdexcept>
#include <string>

#include "optimized/cuda/common.h"

namespace bp::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    BP_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || p == nullptr)
      throw std::runtime_error("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver >= 12.0)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

template <int Rank>
CUtensorMap encode_swizzled(const void* base, const cuuint64_t (&dims)[Rank],
                            const cuuint64_t (&byte_strides)[Rank - 1], const cuuint32_t (&box)[Rank]) {
  CUtensorMap map{};
  cuuint32_t element_strides[Rank];
  for (int i = 0; i < Rank; ++i) element_strides[i] = 1;
  const CUresult r =
      encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, Rank, const_cast<void*>(base), dims, byte_strides, box,
                     element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::string shape;
    for (int i = Rank - 1; i >= 0; --i) shape += std::to_string(dims[i]) + (i ? " x " : "");
    std::string strides;
    for (int i = Rank - 2; i >= 0; --i) strides += std::to_string(byte_strides[i] / 2) + (i ? ", " : "");
    throw std::runtime_error("cuTensorMapEncodeTiled failed (error " + std::to_string(static_cast<int>(r)) +
                             ") for a " + shape + " bf16 tensor, strides " + strides + " elements");
  }
  return map;
}

}  // namespace

CUtensorMap bf16_tensor_map(const void* base, uint64_t inner, uint64_t outer, uint64_t row_stride,
                            uint32_t box_inner, uint32_t box_outer) {
  return encode_swizzled<2>(base, {inner, outer}, {row_stride * 2}, {box_inner, box_outer});
}

CUtensorMap bf16_tensor_map_3d(const void* base, const uint64_t (&dims)[3], const uint64_t (&strides)[2],
                               const uint32_t (&box)[3]) {
  return encode_swizzled<3>(base, {dims[0], dims[1], dims[2]}, {strides[0] * 2, strides[1] * 2},
                            {box[0], box[1], box[2]});
}

}  // namespace bp::cuda
