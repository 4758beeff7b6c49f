// bench_model: the whole model on the GPU (gpu/cuda_model.h) at scale — by
// default a Qwen3-30B-A3B-shaped model cut to --layers layers (all 128 experts per
// layer, generated weights, reference/model/weights.h), or --model: a fixture name
// or a checkpoint directory (its config.json and weights, e.g. the one
// bench/hf_model_peer.py writes, so that both time the same model). One sequence of
// --tokens tokens: forward (extend) and the backward with every parameter
// gradient, each the median of --reps runs after one warmup, timed with CUDA events
// from the call to the end of its last kernel; the peak device memory of each
// phase. CSV on stdout:
//   phase,layers,tokens,seconds,peak_device_bytes
// "upload" is building the model (weights to the device, host clock); "forward"
// returns the logprobs to the host; "forward+backward_on_device" ends when the
// last kernel of the backward has finished, every gradient still in device memory;
// then "gradient_download" copies them into host vectors, as Model::backward
// returns them. The peaks include the resident weights.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.cuh"
#include "harness/engine/models.h"
#include "gpu/cuda_model.h"
#include "reference/common/rng.h"

namespace {

using Clock = std::chrono::steady_clock;

struct ModelOptions {
  std::string model = "qwen3-30b-a3b";
  int layers = 0;  // 0: 4 for a fixture, the checkpoint's own for a directory
  int tokens = 4096, reps = 3;
  std::string contract = bp::default_contract_names().front();
};

ModelOptions parse(int argc, char** argv) {
  ModelOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) o.model = argv[++i];
    else if (a == "--layers" && i + 1 < argc) o.layers = std::atoi(argv[++i]);
    else if (a == "--tokens" && i + 1 < argc) o.tokens = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) o.reps = std::atoi(argv[++i]);
    else if (a == "--contract" && i + 1 < argc) o.contract = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: bench_model [--model FIXTURE|DIR] [--layers N] [--tokens N] [--reps N] [--contract NAME]\n");
      std::exit(bp::kExitBadInput);
    }
  }
  const bool directory = !bp::harness::names_fixture(o.model);
  if (o.layers < 0 || (directory && o.layers != 0) || o.tokens < 2 || o.reps < 1 || !bp::find_contract(o.contract)) {
    std::fprintf(stderr,
                 "bench_model: need --tokens >= 2, --reps >= 1, a known --contract, and --layers >= 1 only with a "
                 "fixture (a checkpoint directory has its own)\n");
    std::exit(bp::kExitBadInput);
  }
  if (!directory && o.layers == 0) o.layers = 4;
  return o;
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void row(const char* phase, const bp::ModelConfig& cfg, const ModelOptions& o, double seconds) {
  std::printf("%s,%d,%d,%.4f,%llu\n", phase, cfg.num_hidden_layers, o.tokens, seconds,
              static_cast<unsigned long long>(bp::cuda::pool_peak_bytes()));
  std::fflush(stdout);
  bp::cuda::reset_pool_peak();
}

// The median over --reps of `phase` timed by CUDA events (from its call to the end
// of its last kernel), after one warmup run; the result of the last run is kept.
template <class F>
double median_seconds(const ModelOptions& o, F&& phase) {
  phase();
  bp::bench::EventTimer timer;
  std::vector<double> us;
  for (int r = 0; r < o.reps; ++r) {
    timer.start();
    phase();
    us.push_back(timer.stop_us());
  }
  return bp::bench::median_of(std::move(us)) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  return bp::bench::guarded_main("bench_model", [&] {
    const ModelOptions o = parse(argc, argv);
    bp::bench::require_hopper("bench_model", bp::bench::Options{0, 1});
    bp::ModelConfig cfg = bp::harness::model_config(o.model, ".", "bench_model", "--model");
    if (o.layers > 0) cfg.num_hidden_layers = o.layers;
    auto t = Clock::now();
    bp::harness::WeightsOrigin origin;
    const bp::Weights w = bp::harness::model_weights(o.model, ".", cfg, 20261122, {}, origin);
    std::fprintf(stderr, "bench_model: %s, %d layers: %s, in %.1f s\n", o.model.c_str(), cfg.num_hidden_layers,
                 bp::harness::weights_text(origin, false).c_str(), since(t));
    std::vector<std::vector<int32_t>> seqs(1);
    for (int j = 0; j < o.tokens; ++j)
      seqs[0].push_back(static_cast<int32_t>(bp::counter_hash(1000, static_cast<uint64_t>(j)) %
                                             static_cast<uint64_t>(cfg.vocab_size)));

    std::printf("phase,layers,tokens,seconds,peak_device_bytes\n");
    bp::cuda::reset_pool_peak();
    t = Clock::now();
    const bp::gpu::Model model(cfg, w, bp::find_contract(o.contract)->knobs);
    BP_CUDA_CHECK(cudaDeviceSynchronize());
    row("upload", cfg, o, since(t));
    const auto forward = [&] { return model.forward(seqs, bp::program::Path::extend()); };
    const auto backward = [&] { return model.backward_resident(seqs, bp::ref::LossCoefficients::generated(11)); };
    std::optional<decltype(forward())> fwd;
    row("forward", cfg, o, median_seconds(o, [&] { fwd = forward(); }));
    std::optional<decltype(backward())> bwd;  // freed before each run: the peak is one backward's
    row("forward+backward_on_device", cfg, o, median_seconds(o, [&] {
          bwd.reset();
          bwd.emplace(backward());
        }));
    t = Clock::now();
    size_t bytes = 0;
    for (auto& [name, g] : bwd->grads) {
      bytes += g.size() * sizeof(float);
      bwd->result.grads[name] = model.backend().take(std::move(g));
    }
    BP_CUDA_CHECK(cudaDeviceSynchronize());
    row("gradient_download", cfg, o, since(t));
    std::fprintf(stderr, "bench_model: logprob[0] %.6f, %zu gradients, %.2f GB\n", fwd->logprob[0][0],
                 bwd->result.grads.size(), bytes * 1e-9);
    return 0;
  });
}
