// Host-side helpers of the CUDA backend: CUDA error checks that throw with the
// call and file:line, a move-only device buffer, and host copies of small index
// arrays (token ids, positions, targets) for the argument checks the reference
// makes before writing anything. Plain C++ over the runtime API, so host code
// compiled by g++ (tests, the harness) can include it.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace bp::cuda {

// A CUDA runtime call failed: the message names the call, CUDA's text and file:line.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess)
    throw CudaError(std::string(what) + " failed: " + cudaGetErrorString(err) + " (" + file + ":" +
                    std::to_string(line) + ")");
}

}  // namespace bp::cuda

#define BP_CUDA_CHECK(call) ::bp::cuda::check_cuda((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows here, not at the next sync.
#define BP_CUDA_CHECK_LAUNCH() ::bp::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

namespace bp::cuda {

// n elements of T in device memory, allocated and freed in the order of `stream`
// (cudaMallocAsync / cudaFreeAsync), so a temporary may go out of scope while the
// kernels that use it are still queued on that stream.
// The default pool would hand freed memory back to the driver at every
// synchronisation, and the next allocation map it again (tens to hundreds of
// microseconds for a large temporary, e.g. linear's chunk-tree scratch); the
// process keeps it instead, once per device.
inline void keep_freed_pool_memory() {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  BP_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev % 64);
  if (done.load(std::memory_order_relaxed) & bit) return;
  cudaMemPool_t pool;
  BP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  uint64_t keep_all = UINT64_MAX;
  BP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  done.fetch_or(bit, std::memory_order_relaxed);
}

// A copy from host memory recorded by a stream capture re-reads that memory at each
// replay of the CUDA graph, long after the caller released it (a grouped GEMM's
// tile table: an illegal address in bench_linear's replay). Such a call refuses a
// capturing stream, saying why.
inline void refuse_capture(cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  BP_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone)
    throw std::logic_error(std::string(what) +
                           " copies from host memory, which a CUDA graph would re-read after its release: "
                           "it cannot be captured");
}

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n, cudaStream_t stream = 0) : n_(n), stream_(stream) {
    if (n == 0) return;
    keep_freed_pool_memory();
    BP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ptr_), n * sizeof(T), stream));
  }
  // A copy of `host`. A pageable source is staged before the call returns, so
  // `host` may be released at once (never on a capturing stream: refuse_capture).
  explicit DeviceBuffer(const std::vector<T>& host, cudaStream_t stream = 0) : DeviceBuffer(host.size(), stream) {
    refuse_capture(stream_, "a device copy of a host vector");
    if (n_ > 0) BP_CUDA_CHECK(cudaMemcpyAsync(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream_));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)), stream_(o.stream_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    std::swap(stream_, o.stream_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);  // no throw from a destructor; a failed free leaks at worst
  }

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  T* data() { return ptr_; }  // the std::vector spelling, for code written over both (model/)
  const T* data() const { return ptr_; }
  size_t size() const { return n_; }

  // The whole buffer, once the stream's earlier work is done.
  std::vector<T> download() const;

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
  cudaStream_t stream_ = 0;
};

// n values at `device`, copied to the host once the stream's earlier work is done.
template <class T>
std::vector<T> copy_to_host(const T* device, size_t n, cudaStream_t stream) {
  std::vector<T> host(n);
  if (n > 0) {
    BP_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
    BP_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return host;
}

template <class T>
std::vector<T> DeviceBuffer<T>::download() const {
  return copy_to_host(ptr_, n_, stream_);
}

// Why the kernels cannot run here (they are built for Hopper, sm_90 / sm_90a
// only): no device, or device 0 is not sm_90; empty when they can.
inline std::string no_hopper_reason() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) return std::string("no CUDA device (") + cudaGetErrorString(err) + ")";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9 || prop.minor != 0)
    return std::string(prop.name) + " is not a Hopper GPU (sm_90)";
  return {};
}

// The peak of device memory that DeviceBuffer (the stream-ordered allocator's
// default pool of the current device) has held since the last reset, in bytes.
inline cudaMemPool_t current_default_pool() {
  int dev = 0;
  BP_CUDA_CHECK(cudaGetDevice(&dev));
  cudaMemPool_t pool;
  BP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  return pool;
}
inline void reset_pool_peak() {
  const cudaMemPool_t pool = current_default_pool();
  uint64_t zero = 0;
  BP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
}
// A case's start: the memory the pool kept from earlier cases goes back to the
// driver (keep_freed_pool_memory keeps it for the temporaries within a case; across
// cases of other layouts or models its blocks do not fit, and kept plus new ran a
// 80 GB GPU out of memory in a sweep of a 30B-shaped model on real ranks), and the
// watermark restarts at the memory in use.
inline void start_case_memory() {
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  BP_CUDA_CHECK(cudaMemPoolTrimTo(current_default_pool(), 0));
  reset_pool_peak();
}
inline uint64_t pool_peak_bytes() {
  const cudaMemPool_t pool = current_default_pool();
  uint64_t high = 0;
  BP_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  return high;
}

}  // namespace bp::cuda
