// main() of the bp::cuda op suites: exit 125 (CTest: skipped) before running
// anything unless a Hopper GPU is here (the kernels are built for sm_90/sm_90a
// only), then GoogleTest.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "harness/exit_codes.h"
#include "optimized/cuda/common.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string why = bp::cuda::no_hopper_reason();
  if (!why.empty()) {
    std::printf("%s: %s: skipped\n", argv[0], why.c_str());
    return bp::kExitCannotTest;
  }
  return RUN_ALL_TESTS();
}
