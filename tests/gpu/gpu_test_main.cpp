// main() of the bp::cuda op suites: exit 125 (CTest: skipped) before running
// anything unless a Hopper GPU is here (the kernels are built for sm_90/sm_90a
// only), then GoogleTest.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "harness/exit_codes.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device (%s): skipped\n", argv[0], cudaGetErrorString(err));
    return bp::kExitCannotTest;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9 || prop.minor != 0) {
    std::printf("%s: %s is not a Hopper GPU (sm_90): skipped\n", argv[0], prop.name);
    return bp::kExitCannotTest;
  }
  return RUN_ALL_TESTS();
}
