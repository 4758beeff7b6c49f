// What every benchmark binary shares: random device inputs, event-timed medians
// (with the peak device memory meanwhile), the copy-bandwidth ceiling, the Hopper
// check (exit 125 without one) and the --warmup/--reps/--only options.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
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
  std::string only;  // --only: the rows whose label contains it (benchmarks that label rows)
  bool selected(const std::string& label) const { return only.empty() || label.find(only) != std::string::npos; }
};

// --warmup N --reps N, and --only TEXT where the benchmark labels its rows
// (labeled); anything else: usage on stderr (with the benchmark's own options,
// extra_usage, which it takes out of argv first), exit 2.
inline Options parse_options(const char* name, int argc, char** argv, bool labeled = false,
                             const char* extra_usage = "") {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--warmup" && i + 1 < argc) o.warmup = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) o.reps = std::atoi(argv[++i]);
    else if (labeled && a == "--only" && i + 1 < argc) o.only = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--warmup N] [--reps N]%s%s\n", name, labeled ? " [--only TEXT]" : "",
                   extra_usage);
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

// Two CUDA events timing the work queued on one stream between start() and stop_us().
class EventTimer {
 public:
  explicit EventTimer(cudaStream_t stream = nullptr) : stream_(stream) {
    BP_CUDA_CHECK(cudaEventCreate(&start_));
    BP_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {  // no throw from a destructor
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start() { BP_CUDA_CHECK(cudaEventRecord(start_, stream_)); }
  double stop_us() {
    BP_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    BP_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    BP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return 1000.0 * ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_, stop_;
};

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Launches per timed sample, from one launch's time: about 100 µs of them, at most 50.
inline int batch_for(double single_us) { return std::clamp(static_cast<int>(100.0 / std::max(single_us, 1e-3)), 1, 50); }

// Median time of one `launch` in microseconds. Each sample times a batch of
// back-to-back launches (batch_for) and divides: a decode-sized kernel runs in a
// few µs, less than the host takes to launch it, and in a model the next kernel is
// already queued, so the launch cost is not the kernel's.
template <class F>
double median_us(const Options& opt, F&& launch) {
  for (int i = 0; i < opt.warmup; ++i) launch();
  EventTimer timer;
  timer.start();
  launch();
  const int batch = batch_for(timer.stop_us());
  std::vector<double> us;
  for (int i = 0; i < opt.reps; ++i) {
    timer.start();
    for (int b = 0; b < batch; ++b) launch();
    us.push_back(timer.stop_us() / batch);
  }
  return median_of(std::move(us));
}

// Median host time inside one `launch`, the GPU idle before each: what a caller
// waits for the call to return and, with nothing queued, how long the GPU idles
// before the call's first kernel (a part of median_us's time for a call longer
// than its batch, as decode's was: bench/DECISIONS.md, method: host time inside a call).
template <class F>
double host_us(const Options& opt, F&& launch) {
  std::vector<double> us;
  for (int i = 0; i < opt.reps; ++i) {
    BP_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    launch();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  return median_of(std::move(us));
}

// Median time of one `launch(stream)` replayed from a CUDA graph: batch_for's
// launches captured once, the graph replayed --reps times. Host launch overhead
// stays out, as in an engine that replays its decode step from a graph; back-to-
// back launches (median_us) would time the host for kernels of a few µs. `graphed`
// says whether the capture worked; where it did not (a call that cannot be
// captured), the time is median_us's.
struct GraphTime {
  double us;
  bool graphed;
};
template <class F>
GraphTime median_graph_us(const Options& opt, cudaStream_t stream, F&& launch) {
  for (int i = 0; i < opt.warmup; ++i) launch(stream);
  EventTimer timer(stream);
  timer.start();
  launch(stream);
  const int batch = batch_for(timer.stop_us());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  bool recorded = true;
  try {
    for (int b = 0; b < batch; ++b) launch(stream);
  } catch (const std::logic_error&) {  // cuda::refuse_capture: a call a graph cannot hold
    recorded = false;
  }
  const bool ended = cudaStreamEndCapture(stream, &graph) == cudaSuccess;  // always: the stream leaves capture
  const bool captured = ended && recorded && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  std::vector<double> us;
  if (captured) {
    BP_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // the first replay uploads the graph
    for (int i = 0; i < opt.reps; ++i) {
      timer.start();
      BP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      us.push_back(timer.stop_us() / batch);
    }
  }
  if (exec) BP_CUDA_CHECK(cudaGraphExecDestroy(exec));
  if (graph) BP_CUDA_CHECK(cudaGraphDestroy(graph));
  (void)cudaGetLastError();  // a failed capture's error is answered by the fallback
  if (!captured) return {median_us(opt, [&] { launch(stream); }), false};
  return {median_of(std::move(us)), true};
}

// Device-to-device copy bandwidth of a 1 GiB buffer (read + write counted): the
// bandwidth ceiling of the memory-bound rows, measured in the same run.
inline double copy_gbps(const Options& opt) {
  const size_t n = size_t{1} << 30;
  cuda::DeviceBuffer<char> a(n), b(n);
  const double us =
      median_us(opt, [&] { BP_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice)); });
  return 2.0 * n / us * 1e-3;
}

struct Measured {
  double us;             // median_us (median_graph_us for measure_graph)
  uint64_t peak_bytes;   // the pool's high watermark over the warmup and timed calls
  bool graphed = false;  // timed from a graph's replays (measure_graph, where the capture worked)
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

// measure with median_graph_us's time.
template <class F>
Measured measure_graph(const Options& opt, cudaStream_t stream, F&& launch) {
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  cuda::reset_pool_peak();
  const GraphTime t = median_graph_us(opt, stream, launch);
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  return {t.us, cuda::pool_peak_bytes(), t.graphed};
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
