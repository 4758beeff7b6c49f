// bench_linear: bp::cuda::linear_fwd (sm90-tc contract, tensor cores) beside cuBLAS
// bf16 (cublasGemmEx, fp32 compute, bf16 out) on the Qwen3-0.6B and Qwen3-30B-A3B
// projection shapes at M = 1, 16, 128, 1024, 4096. Row-parallel projections run
// with k_chunks = tp_tree_width, as the model does (cuBLAS has no such knob).
// Each time is the median of --reps event-timed launches after --warmup launches,
// inputs random (never zeros). CSV on stdout:
//   model,proj,M,K,N,k_chunks,ours_us,cublas_us,ours_tflops,cublas_tflops,speed_vs_cublas,ours_peak_bytes
// speed_vs_cublas = cublas_us / ours_us (1.0 = as fast as cuBLAS).
// ours_peak_bytes: the peak of DeviceBuffer's pool over our calls (bench::measure):
// x, w and y, (M·K + N·K + M·N)·2 bytes allocated before and live throughout, plus
// whatever linear_fwd allocates from the pool per call (its scratch), each rounded up
// to the pool's granularity. cuBLAS's calls come after, outside it (its workspace is
// not from the pool anyway).
// Exit 125 without a Hopper GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "harness/exit_codes.h"
#include "optimized/cuda/common.h"
#include "optimized/cuda/linear.h"
#include "tests/support/cublas_peer.h"
#include "tests/support/qwen3_linear_shapes.h"

namespace bp {
namespace {

using bench::Measured;
using bench::median_us;
using bench::Options;

void bench_shape(const Options& opt, const Knobs& kn, test::CublasPeer& cublas, const test::LinearShape& s, int M) {
  const int chunks = s.row_parallel ? kn.tp_tree_width : 1;
  cuda::DeviceBuffer<bf16> x(size_t(M) * s.K), w(size_t(s.N) * s.K), y(size_t(M) * s.N);
  bench::fill(x, 1);
  bench::fill(w, 2);
  const Measured ours =
      bench::measure(opt, [&] { cuda::linear_fwd(kn, x.get(), w.get(), y.get(), M, s.K, s.N, chunks); });
  const double peer = median_us(opt, [&] { cublas.forward(x.get(), w.get(), y.get(), CUDA_R_16BF, M, s.K, s.N); });
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  const double flop = 2.0 * M * s.K * s.N;
  std::printf("%s,%s,%d,%d,%d,%d,%.2f,%.2f,%.1f,%.1f,%.3f,%llu\n", s.model, s.proj, M, s.K, s.N, chunks, ours.us,
              peer, flop / ours.us * 1e-6, flop / peer * 1e-6, peer / ours.us,
              static_cast<unsigned long long>(ours.peak_bytes));
  std::fflush(stdout);
}

int run(const Options& opt) {
  bench::require_hopper("bench_linear", opt);
  const Knobs& kn = find_contract("bf16-sm90tc-v1")->knobs;
  test::CublasPeer cublas;
  std::printf(
      "model,proj,M,K,N,k_chunks,ours_us,cublas_us,ours_tflops,cublas_tflops,speed_vs_cublas,ours_peak_bytes\n");
  std::vector<test::LinearShape> shapes = test::qwen3_linear_shapes();
  for (const test::LinearShape& s : test::qwen3_lm_heads()) shapes.push_back(s);
  for (const test::LinearShape& s : shapes)
    for (int M : {1, 16, 128, 1024, 4096}) bench_shape(opt, kn, cublas, s, M);
  return kExitExact;
}

}  // namespace
}  // namespace bp

int main(int argc, char** argv) {
  const bp::bench::Options opt = bp::bench::parse_options("bench_linear", argc, argv);
  return bp::bench::guarded_main("bench_linear", [&] { return bp::run(opt); });
}
