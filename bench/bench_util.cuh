// What every benchmark binary shares: random device inputs, event-timed medians
// (with the peak device memory meanwhile), the Hopper check (exit 125 without one)
// and the --warmup/--reps options.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness/exit_codes.h"
#include "optimized/cuda/common.h"
#include "reference/contract/contract.h"

namespace bp::bench {

// Random non-zero-heavy bf16 in (-1, 1): timing data only, never compared.
static __global__ void fill_random(bf16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t z = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed * 0x85EBCA6Bu;
    z = (z ^ (z >> 16)) * 0x7FEB352Du;
    z = (z ^ (z >> 15)) * 0x846CA68Bu;
    z ^= z >> 16;
    // sign, exponent in [-16, -1], 7 fraction bits
    p[i] = bf16{static_cast<uint16_t>((z & 0x8000u) | ((127 - 1 - (z >> 28)) << 7) | (z & 0x7fu))};
  }
}

inline void fill(cuda::DeviceBuffer<bf16>& b, uint32_t seed) {
  fill_random<<<1024, 256>>>(b.get(), b.size(), seed);
  BP_CUDA_CHECK_LAUNCH();
}

struct Options {
  int warmup = 5, reps = 30;
};

// --warmup N --reps N; anything else: usage on stderr, exit 2.
inline Options parse_options(const char* name, int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--warmup" && i + 1 < argc) o.warmup = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) o.reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--warmup N] [--reps N]\n", name);
      std::exit(kExitBadInput);
    }
  }
  if (o.warmup < 0 || o.reps < 1) {
    std::fprintf(stderr, "%s: --warmup must be >= 0 and --reps >= 1\n", name);
    std::exit(kExitBadInput);
  }
  return o;
}

// Device 0's properties, or exit 125 when it is not a Hopper GPU.
inline cudaDeviceProp require_hopper(const char* name, const Options& opt) {
  const std::string why = cuda::no_hopper_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "%s: %s: skipped\n", name, why.c_str());
    std::exit(kExitCannotTest);
  }
  cudaDeviceProp prop{};
  BP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(stderr, "%s: %s, %d SMs, warmup %d, reps %d\n", name, prop.name, prop.multiProcessorCount, opt.warmup,
               opt.reps);
  return prop;
}

// Median time of `launch` in microseconds.
template <class F>
double median_us(const Options& opt, F&& launch) {
  for (int i = 0; i < opt.warmup; ++i) launch();
  cudaEvent_t start, stop;
  BP_CUDA_CHECK(cudaEventCreate(&start));
  BP_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int i = 0; i < opt.reps; ++i) {
    BP_CUDA_CHECK(cudaEventRecord(start));
    launch();
    BP_CUDA_CHECK(cudaEventRecord(stop));
    BP_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1000.0 * ms);
  }
  BP_CUDA_CHECK(cudaEventDestroy(start));
  BP_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

struct Measured {
  double us;            // median_us
  uint64_t peak_bytes;  // the pool's high watermark over the warmup and timed calls
};

// median_us, and the peak of the pool DeviceBuffer allocates from (pool_peak_bytes)
// while it ran. The reset comes after a device sync (queued frees done), and a reset
// restarts the watermark at the memory in use: the peak counts the caller's live
// buffers (the inputs and outputs) and what the calls allocate from the pool, not
// memory from outside it (cuBLAS's workspace, the context). The sync only precedes
// the warmup: the timed calls are median_us's.
template <class F>
Measured measure(const Options& opt, F&& launch) {
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  cuda::reset_pool_peak();
  const double us = median_us(opt, launch);
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  return {us, cuda::pool_peak_bytes()};
}

// Runs body() and maps exceptions to exit 3 with the binary's name.
template <class F>
int guarded_main(const char* name, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return kExitInternal;
  }
}

}  // namespace bp::bench
