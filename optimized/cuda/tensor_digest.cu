#include "optimized/cuda/tensor_digest.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"

namespace bp::cuda {
namespace {

__device__ uint32_t bits_at(const float* p, size_t i) { return __float_as_uint(p[i]); }
__device__ uint16_t bits_at(const bf16* p, size_t i) { return p[i].bits; }
__device__ void add_at(TensorDigest& d, const float* p, size_t i) { digest_add_f32(d, i, bits_at(p, i)); }
__device__ void add_at(TensorDigest& d, const bf16* p, size_t i) { digest_add_bf16(d, i, bits_at(p, i)); }

__device__ uint64_t warp_sum(uint64_t v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  return v;
}

// Each thread's grid-stride share, summed over the warp, the block (shared memory)
// and the grid (integer atomics: sums mod 2^64, so their order is free).
template <class T>
__global__ void digest_kernel(const T* __restrict__ p, size_t n, TensorDigest* __restrict__ out) {
  TensorDigest d;
  for_each_index(n, [&](size_t i) { add_at(d, p, i); });
  uint64_t field[4] = {warp_sum(d.a), warp_sum(d.b), warp_sum(d.nans), warp_sum(d.infs)};
  __shared__ uint64_t warps[kBlockThreads / kWarp][4];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0)
    for (int f = 0; f < 4; ++f) warps[warp][f] = field[f];
  __syncthreads();
  if (threadIdx.x >= 4) return;
  uint64_t total = 0;
  for (int w = 0; w < kBlockThreads / kWarp; ++w) total += warps[w][threadIdx.x];
  uint64_t* target[4] = {&out->a, &out->b, &out->nans, &out->infs};
  atomicAdd(reinterpret_cast<unsigned long long*>(target[threadIdx.x]), static_cast<unsigned long long>(total));
}

template <class T>
TensorDigest launch(const T* device, size_t n, cudaStream_t stream) {
  if (n > kMaxDigestElements)
    throw std::invalid_argument("tensor_digest: " + std::to_string(n) + " elements, more than 2^32");
  DeviceBuffer<TensorDigest> out(1, stream);
  BP_CUDA_CHECK(cudaMemsetAsync(out.get(), 0, sizeof(TensorDigest), stream));
  if (n > 0) {
    // Enough blocks to fill the GPU; more would only queue on the four atomic adds.
    const unsigned blocks = std::min(grid_for(n), 2048u);
    digest_kernel<T><<<blocks, kBlockThreads, 0, stream>>>(device, n, out.get());
    BP_CUDA_CHECK_LAUNCH();
  }
  return out.download()[0];
}

}  // namespace

TensorDigest tensor_digest(const float* device, size_t n, cudaStream_t stream) { return launch(device, n, stream); }
TensorDigest tensor_digest(const bf16* device, size_t n, cudaStream_t stream) { return launch(device, n, stream); }

}  // namespace bp::cuda
