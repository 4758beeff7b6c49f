// The `cuda` backend in a build without CUDA (BITPARITY_CUDA=OFF or no nvcc).
#include "harness/gpu_backend.h"

namespace bp::harness {

GpuCaseResult run_gpu_case(const GpuCaseInput&) {
  throw CannotTest("no CUDA in this build of bitparity (BITPARITY_CUDA=OFF or no nvcc)");
}

}  // namespace bp::harness
