// bench_model: the whole model on the GPU (optimized/model/qwen3.h) at scale — a
// Qwen3-30B-A3B-shaped model cut to --layers layers (all 128 experts per layer),
// one sequence of --tokens tokens: forward (extend) and the backward with every
// parameter gradient, wall time and the peak device memory of each phase.
// The weights are the generated ones (reference/model/weights.h). CSV on stdout:
//   phase,layers,tokens,seconds,peak_device_bytes
// "upload" is building the model (weights to the device); "forward" returns the
// logprobs to the host; "forward+backward_on_device" ends when the last kernel of
// the backward has finished, every gradient still in device memory; then
// "gradient_download" copies them into host vectors, as Model::backward returns
// them. The peaks include the resident weights.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/bench_util.cuh"
#include "harness/engine/models.h"
#include "optimized/model/qwen3.h"
#include "reference/common/rng.h"

namespace {

using Clock = std::chrono::steady_clock;

struct ModelOptions {
  int layers = 4, tokens = 4096;
  std::string contract = "bf16-sm90tc-v1";
};

ModelOptions parse(int argc, char** argv) {
  ModelOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--layers" && i + 1 < argc) o.layers = std::atoi(argv[++i]);
    else if (a == "--tokens" && i + 1 < argc) o.tokens = std::atoi(argv[++i]);
    else if (a == "--contract" && i + 1 < argc) o.contract = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_model [--layers N] [--tokens N] [--contract NAME]\n");
      std::exit(bp::kExitBadInput);
    }
  }
  if (o.layers < 1 || o.tokens < 2 || !bp::find_contract(o.contract)) {
    std::fprintf(stderr, "bench_model: need --layers >= 1, --tokens >= 2 and a known --contract\n");
    std::exit(bp::kExitBadInput);
  }
  return o;
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One phase, timed from `start` to the end of its last kernel.
void row(const char* phase, const ModelOptions& o, Clock::time_point start) {
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  const double seconds = since(start);
  std::printf("%s,%d,%d,%.3f,%llu\n", phase, o.layers, o.tokens, seconds,
              static_cast<unsigned long long>(bp::cuda::pool_peak_bytes()));
  std::fflush(stdout);
  bp::cuda::reset_pool_peak();
}

}  // namespace

int main(int argc, char** argv) {
  return bp::bench::guarded_main("bench_model", [&] {
    const ModelOptions o = parse(argc, argv);
    bp::bench::require_hopper("bench_model", bp::bench::Options{0, 1});
    bp::ModelConfig cfg = bp::harness::model_config("qwen3-30b-a3b", ".", "bench_model", "model");
    cfg.num_hidden_layers = o.layers;
    auto t = Clock::now();
    const bp::Weights w = bp::generate_weights(cfg, 20261122);
    std::fprintf(stderr, "bench_model: %d layers generated on the host in %.1f s\n", o.layers, since(t));
    std::vector<std::vector<int32_t>> seqs(1);
    for (int j = 0; j < o.tokens; ++j)
      seqs[0].push_back(static_cast<int32_t>(bp::counter_hash(1000, static_cast<uint64_t>(j)) %
                                             static_cast<uint64_t>(cfg.vocab_size)));

    std::printf("phase,layers,tokens,seconds,peak_device_bytes\n");
    bp::cuda::reset_pool_peak();
    t = Clock::now();
    const bp::cuda::Model model(cfg, w, bp::find_contract(o.contract)->knobs);
    row("upload", o, t);
    t = Clock::now();
    const auto fwd = model.forward(seqs, bp::ref::Path::extend());
    row("forward", o, t);
    t = Clock::now();
    auto bwd = model.backward_resident(seqs, bp::ref::LossCoefficients::generated(11));
    row("forward+backward_on_device", o, t);
    t = Clock::now();
    size_t bytes = 0;
    for (auto& [name, g] : bwd.grads) {
      bytes += g.size() * sizeof(float);
      bwd.result.grads[name] = model.backend().take(std::move(g));
    }
    row("gradient_download", o, t);
    std::fprintf(stderr, "bench_model: logprob[0] %.6f, %zu gradients, %.2f GB\n", fwd.logprob[0][0],
                 bwd.result.grads.size(), bytes * 1e-9);
    return 0;
  });
}
