// bench_linear: bp::cuda::linear (sm90-tc contract, tensor cores) beside cuBLAS
// bf16 (cublasGemmEx, fp32 compute) on the Qwen3-0.6B and Qwen3-30B-A3B projection
// shapes: the forward (bf16 out) at M = 1, 16, 128, 1024, 4096, and at M = 4096
// tokens the input gradient (linear_dgrad, bf16 out) and the weight gradient
// (linear_wgrad, fp32 out). The chunks are the model's (cuBLAS has no such knob):
// the forward of a row-parallel projection and the dgrad of a column-parallel one
// reduce over the TP-sharded width in k_chunks = tp_tree_width; wgrad reduces over
// the tokens in chunks of grad_token_chunk (k_chunks = their count).
// Each time is bench::median_graph_us's (a graph of back-to-back launches replayed:
// the median of --reps replays after --warmup launches; "launches" in the timing
// columns where a call could not be captured), inputs random (never zeros), the
// weight cycled over copies that exceed the L2 (weight_copies). CSV on stdout:
//   model,proj,pass,M,K,N,k_chunks,ours_us,cublas_us,ours_tflops,cublas_tflops,speed_vs_cublas,ours_peak_bytes,
//   bytes_floor_us,ours_of_bytes_floor,ours_timing,cublas_timing
// pass: fwd, dgrad or wgrad; speed_vs_cublas = cublas_us / ours_us (1.0 = as fast as cuBLAS).
// bytes_floor_us: the operands and the output moved once at the copy bandwidth measured in the same
// run (the weight-read floor of decode sizes); ours_of_bytes_floor = floor / ours.
// ours_peak_bytes: the peak of DeviceBuffer's pool over our calls (bench::measure):
// the inputs, the output and the weight's copies, allocated before and live
// throughout, plus whatever the call allocates from the pool (its chunk-tree
// scratch), each rounded up to the pool's granularity. cuBLAS's calls come after, outside it (its workspace is
// not from the pool anyway).
// --only MODEL/PROJ/M or MODEL/PROJ.PASS/4096 (a substring of it): those rows alone, e.g. for a profiler.
// --grad-token-chunk T (repeatable, a positive multiple of 16): the weight gradients again with T tokens a
// chunk instead of the contract's grad_token_chunk (k_chunks says which; rows labelled MODEL/PROJ.wgrad-tT/4096):
// what another value of that knob would buy, a contract decision, measured beside the contract's own.
// --rows M (repeatable, positive): the forwards at these M instead of 1, 16, 128, 1024, 4096 (e.g. to find
// where one kernel's rows hand over to another's).
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

using bench::Options;

// Enough copies of a weight that cycling through them streams from device memory,
// not from the 50 MB L2: in a model every layer's weight is read once per step.
int weight_copies(size_t weight_bytes) {
  constexpr size_t kStreamedBytes = size_t{256} << 20;
  return static_cast<int>(std::clamp<size_t>((kStreamedBytes + weight_bytes - 1) / weight_bytes, 1, 64));
}

// The input-gradient and weight-gradient passes of a projection, as the model runs
// them: dgrad reduces over N, which TP shards for the column-parallel projections
// (chunked by the tree width), wgrad over the tokens (grad_token_chunk).
enum class Pass { kFwd, kDgrad, kWgrad };
const char* pass_name(Pass p) { return p == Pass::kFwd ? "fwd" : p == Pass::kDgrad ? "dgrad" : "wgrad"; }
int pass_chunks(Pass p, const Knobs& kn, const test::LinearShape& s, int M) {
  if (p == Pass::kWgrad) return (M + kn.grad_token_chunk - 1) / kn.grad_token_chunk;
  return (p == Pass::kFwd) == s.row_parallel ? kn.tp_tree_width : 1;
}

void report(const test::LinearShape& s, Pass pass, int M, int chunks, const bench::Measured& ours,
            const bench::GraphTime& peer, double bytes, double copy_gbps) {
  const double flop = 2.0 * M * s.K * s.N;
  const double floor_us = bytes / copy_gbps * 1e-3;
  const auto timing = [](bool graphed) { return graphed ? "graph" : "launches"; };
  std::printf("%s,%s,%s,%d,%d,%d,%d,%.2f,%.2f,%.1f,%.1f,%.3f,%llu,%.2f,%.3f,%s,%s\n", s.model, s.proj, pass_name(pass),
              M, s.K, s.N, chunks, ours.us, peer.us, flop / ours.us * 1e-6, flop / peer.us * 1e-6, peer.us / ours.us,
              static_cast<unsigned long long>(ours.peak_bytes), floor_us, floor_us / ours.us, timing(ours.graphed),
              timing(peer.graphed));
  std::fflush(stdout);
}

void bench_shape(const Options& opt, const Knobs& kn, test::CublasPeer& cublas, cudaStream_t stream,
                 double copy_gbps, const test::LinearShape& s, int M, Pass pass) {
  const int chunks = pass_chunks(pass, kn, s, M);
  const size_t weight_elems = size_t(s.N) * s.K;
  // The forward and dgrad read a weight per call (cycled over copies, as a model
  // reads each layer's once); wgrad writes the fp32 weight gradient instead.
  const int copies = pass == Pass::kWgrad ? 1 : weight_copies(weight_elems * sizeof(bf16));
  std::vector<cuda::DeviceBuffer<bf16>> w;
  for (int c = 0; c < copies; ++c) {
    w.emplace_back(weight_elems);
    bench::fill(w.back(), 2 + c);
  }
  size_t next = 0;
  const auto weight = [&] { return w[next++ % w.size()].get(); };
  bench::Measured ours{};
  bench::GraphTime peer{};
  double bytes = 2.0 * (double(M) * s.K + double(weight_elems) + double(M) * s.N);
  if (pass == Pass::kFwd) {
    cuda::DeviceBuffer<bf16> x(size_t(M) * s.K), y(size_t(M) * s.N);
    bench::fill(x, 1);
    ours = bench::measure_graph(opt, stream, [&](cudaStream_t st) {
      cuda::linear_fwd(kn, x.get(), weight(), y.get(), M, s.K, s.N, chunks, st);
    });
    peer = bench::median_graph_us(opt, stream, [&](cudaStream_t) {
      cublas.forward(x.get(), weight(), y.get(), CUDA_R_16BF, M, s.K, s.N);  // the handle's stream is `stream`
    });
  } else if (pass == Pass::kDgrad) {
    cuda::DeviceBuffer<bf16> dy(size_t(M) * s.N), dx(size_t(M) * s.K);
    bench::fill(dy, 1);
    ours = bench::measure_graph(opt, stream, [&](cudaStream_t st) {
      cuda::linear_dgrad(kn, dy.get(), weight(), dx.get(), M, s.K, s.N, chunks, st);
    });
    peer = bench::median_graph_us(opt, stream, [&](cudaStream_t) { cublas.dgrad(dy.get(), weight(), dx.get(), M, s.K, s.N); });
  } else {
    cuda::DeviceBuffer<bf16> dy(size_t(M) * s.N), x(size_t(M) * s.K);
    cuda::DeviceBuffer<float> dw(weight_elems);
    bench::fill(dy, 1);
    bench::fill(x, 3);
    bytes += 2.0 * double(weight_elems);  // dw is fp32 and written, not a bf16 weight read
    ours = bench::measure_graph(opt, stream, [&](cudaStream_t st) {
      cuda::linear_wgrad(kn, dy.get(), x.get(), dw.get(), M, s.K, s.N, st);
    });
    peer = bench::median_graph_us(opt, stream, [&](cudaStream_t) { cublas.wgrad(dy.get(), x.get(), dw.get(), M, s.K, s.N); });
  }
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  report(s, pass, M, chunks, ours, peer, bytes, copy_gbps);
}

const std::vector<int> kForwardRows = {1, 16, 128, 1024, 4096};

int run(const Options& opt, const std::vector<int>& forward_rows, const std::vector<int>& other_grad_chunks) {
  bench::require_hopper("bench_linear", opt);
  // The default contract: its grad_token_chunk sets the weight gradients' chunks (v3: 512).
  const Knobs& kn = find_contract(default_contract_names().front())->knobs;
  test::CublasPeer cublas;
  cudaStream_t stream = nullptr;
  BP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublas.set_stream(stream);
  const double copy_gbps = bench::copy_gbps(opt);
  std::printf(
      "model,proj,pass,M,K,N,k_chunks,ours_us,cublas_us,ours_tflops,cublas_tflops,speed_vs_cublas,ours_peak_bytes,"
      "bytes_floor_us,ours_of_bytes_floor,ours_timing,cublas_timing\n");
  std::vector<test::LinearShape> shapes = test::qwen3_linear_shapes();
  for (const test::LinearShape& s : test::qwen3_lm_heads()) shapes.push_back(s);
  for (const test::LinearShape& s : shapes)
    for (int M : forward_rows.empty() ? kForwardRows : forward_rows)
      if (opt.selected(std::string(s.model) + "/" + s.proj + "/" + std::to_string(M)))
        bench_shape(opt, kn, cublas, stream, copy_gbps, s, M, Pass::kFwd);
  // The backward at the training size.
  for (const test::LinearShape& s : shapes)
    for (Pass pass : {Pass::kDgrad, Pass::kWgrad})
      if (opt.selected(std::string(s.model) + "/" + s.proj + "." + pass_name(pass) + "/4096"))
        bench_shape(opt, kn, cublas, stream, copy_gbps, s, 4096, pass);
  for (const int tokens : other_grad_chunks) {
    Knobs other = kn;
    other.grad_token_chunk = tokens;
    for (const test::LinearShape& s : shapes)
      if (opt.selected(std::string(s.model) + "/" + s.proj + ".wgrad-t" + std::to_string(tokens) + "/4096"))
        bench_shape(opt, other, cublas, stream, copy_gbps, s, 4096, Pass::kWgrad);
  }
  return kExitExact;
}

}  // namespace
}  // namespace bp

// Takes the `flag V` pairs out of argv (V a positive multiple of `multiple`); the
// rest stays for parse_options.
static std::vector<int> take_repeated(int& argc, char** argv, const std::string& flag, int multiple) {
  std::vector<int> values;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (argv[i] != flag) {
      argv[kept++] = argv[i];
      continue;
    }
    const int v = i + 1 < argc ? std::atoi(argv[++i]) : 0;
    if (v <= 0 || v % multiple != 0) {
      const std::string need =
          multiple == 1 ? "a positive integer" : "a positive multiple of " + std::to_string(multiple);
      std::fprintf(stderr, "bench_linear: %s needs %s\n", flag.c_str(), need.c_str());
      std::exit(bp::kExitBadInput);
    }
    values.push_back(v);
  }
  argc = kept;
  return values;
}

int main(int argc, char** argv) {
  const std::vector<int> other_grad_chunks = take_repeated(argc, argv, "--grad-token-chunk", 16);
  const std::vector<int> forward_rows = take_repeated(argc, argv, "--rows", 1);
  const bp::bench::Options opt = bp::bench::parse_options("bench_linear", argc, argv, /*labeled=*/true,
                                                          " [--grad-token-chunk T]... [--rows M]...");
  return bp::bench::guarded_main("bench_linear", [&] { return bp::run(opt, forward_rows, other_grad_chunks); });
}
