#include "optimized/cuda/rows.h"

#include <algorithm>
#include <stdexcept>

#include "optimized/cuda/common.h"

namespace bp::cuda {

namespace {

constexpr int kThreads = 256;

// One CTA per listed row: dst row (dst_rows ? dst_rows[i] : i) = src row
// (src_rows ? src_rows[i] : i).
template <class T>
__global__ void copy_rows_kernel(const T* __restrict__ src, size_t width, const int* __restrict__ src_rows,
                                 T* __restrict__ dst, const int* __restrict__ dst_rows) {
  const size_t from = static_cast<size_t>(src_rows ? src_rows[blockIdx.x] : static_cast<int>(blockIdx.x)) * width;
  const size_t to = static_cast<size_t>(dst_rows ? dst_rows[blockIdx.x] : static_cast<int>(blockIdx.x)) * width;
  for (size_t i = threadIdx.x; i < width; i += kThreads) dst[to + i] = src[from + i];
}

// `count` rows; a null list stands for 0, 1, 2, …
template <class T>
void launch_copy_rows(const T* src, size_t width, const std::vector<int>* src_rows, T* dst,
                      const std::vector<int>* dst_rows, size_t count, cudaStream_t stream) {
  if (count == 0 || width == 0) return;
  const DeviceBuffer<int> from = src_rows ? DeviceBuffer<int>(*src_rows, stream) : DeviceBuffer<int>();
  const DeviceBuffer<int> to = dst_rows ? DeviceBuffer<int>(*dst_rows, stream) : DeviceBuffer<int>();
  copy_rows_kernel<T><<<static_cast<unsigned>(count), kThreads, 0, stream>>>(src, width, from.get(), dst, to.get());
  BP_CUDA_CHECK_LAUNCH();
}

unsigned blocks_for(size_t n) { return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 4096)); }

__global__ void add_f32_kernel(float* __restrict__ acc, const float* __restrict__ x, size_t n) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < n; i += size_t{gridDim.x} * kThreads)
    acc[i] = __fadd_rn(acc[i], x[i]);
}

__global__ void round_kernel(const float* __restrict__ x, bf16* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < n; i += size_t{gridDim.x} * kThreads)
    out[i] = round_bf16(x[i]);
}

__global__ void reduce_partials_kernel(const float* __restrict__ base, const size_t* __restrict__ offsets, int parts,
                                       size_t n, PartialSum how, float* __restrict__ out) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < n; i += size_t{gridDim.x} * kThreads)
    out[i] = sum_partials(how, parts, i, n, [&](int j) { return base[offsets[j] + i]; });
}

}  // namespace

template <class T>
void gather_rows(const T* src, size_t width, const std::vector<int>& rows, T* dst, cudaStream_t stream) {
  launch_copy_rows(src, width, &rows, dst, nullptr, rows.size(), stream);
}

template <class T>
void scatter_rows(const T* src, size_t width, const std::vector<int>& rows, T* dst, cudaStream_t stream) {
  launch_copy_rows(src, width, nullptr, dst, &rows, rows.size(), stream);
}

template <class T>
void copy_rows(const T* src, size_t width, const std::vector<int>& src_rows, T* dst, const std::vector<int>& dst_rows,
               cudaStream_t stream) {
  if (src_rows.size() != dst_rows.size()) throw std::invalid_argument("copy_rows: row lists of different lengths");
  launch_copy_rows(src, width, &src_rows, dst, &dst_rows, src_rows.size(), stream);
}

void add_f32(float* acc, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(acc, x, n);
  BP_CUDA_CHECK_LAUNCH();
}

void round_to_bf16(const float* x, bf16* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  round_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, out, n);
  BP_CUDA_CHECK_LAUNCH();
}

void reduce_partials(const float* base, const std::vector<size_t>& offsets, size_t n, PartialSum how, float* out,
                     cudaStream_t stream) {
  if (n == 0) return;
  const DeviceBuffer<size_t> offs(offsets, stream);
  reduce_partials_kernel<<<blocks_for(n), kThreads, 0, stream>>>(base, offs.get(), static_cast<int>(offsets.size()),
                                                                 n, how, out);
  BP_CUDA_CHECK_LAUNCH();
}

#define BP_ROWS_INSTANTIATE(T)                                                                                    \
  template void gather_rows<T>(const T*, size_t, const std::vector<int>&, T*, cudaStream_t);                     \
  template void scatter_rows<T>(const T*, size_t, const std::vector<int>&, T*, cudaStream_t);                    \
  template void copy_rows<T>(const T*, size_t, const std::vector<int>&, T*, const std::vector<int>&, cudaStream_t);
BP_ROWS_INSTANTIATE(bf16)
BP_ROWS_INSTANTIATE(float)
BP_ROWS_INSTANTIATE(int)
#undef BP_ROWS_INSTANTIATE

}  // namespace bp::cuda
