// The `cuda` implementation of the case engine: one case on the GPU — the GPU model
// (gpu/cuda_model.h) for the unsharded layout, virtual GPU ranks
// (gpu/virtual_ranks.h) for the others — with the peak device
// memory it took. A build without CUDA, or a machine without a Hopper GPU, throws
// CannotTest saying why (exit code 125 when nothing else ran).
//
// The GPU model's upload (every weight to the device: gigabytes for a real
// checkpoint) is kept between cases: a sweep runs a (model, contract)'s cases one
// after another (CaseEngine::cases), so its tp1-ep1-cp1 cases, one per path, share
// one upload. The model is stateless between runs (forward and backward make their
// KV caches and activations per call), so a kept one gives the results of a fresh
// one bit for bit. Virtual ranks are not kept: each rank's model is bound to the
// case's own rank threads, streams and communicators, and slices its shard from the
// host weights per case.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/engine/cases.h"
#include "harness/report/report.h"
#include "host/model.h"
#include "program/layouts/layout.h"

namespace bp::harness {

// A gradient left in device memory: its digest, taken there, and its values on demand.
struct GpuTensor {
  TensorDigest digest;
  std::function<std::vector<float>()> fetch;
};

struct GpuCaseResult {
  program::ForwardResult forward;
  std::optional<program::BackwardResult> backward;  // when asked for
  // With GpuCaseInput::grads_stay_on_gpu, the gradients the unsharded GPU model
  // left on the device (backward's grads then holds none of them).
  std::map<std::string, GpuTensor> gpu_grads;
  // The pool's high watermark over the case. It starts at the memory in use, so
  // the weights count in every case: the kept model's (resident when the case
  // starts) or the virtual ranks' shards (uploaded inside the case); then KV
  // caches, activations and scratch.
  uint64_t peak_device_bytes = 0;
  // Real ranks (the nccl implementation; engine/nccl_implementation.h): the
  // processes the case ran on, and NCCL's traffic per collective kind summed over
  // them; the peak above is the largest rank's.
  std::optional<int> ranks;
  std::vector<CollectiveTraffic> communication;
};

// A case's model and contract: the weights to upload and the knobs to build the GPU
// model with, and (by address) the key its device copy is kept under.
struct GpuModelSource {
  const ModelEntry& model;
  const Contract& contract;
  const Weights& weights;
};

struct GpuCaseInput {
  GpuModelSource model;
  const layouts::Layout& layout;
  const std::vector<std::vector<int32_t>>& seqs;
  const program::Path& path;
  const program::ForwardOptions& options;
  bool grads;  // also the backward (L = Σ c_t·logprob_t)
  const ref::LossCoefficients& coefs;
  program::BackwardOptions backward_options = {};  // the unsharded GPU model's (a canonical run's captures)
  // The unsharded GPU model's gradients stay on the device, digested there, for a
  // comparison that fetches only those whose digests differ (virtual ranks bring
  // theirs to the host whatever this says).
  bool grads_stay_on_gpu = false;
};

// What `bitparity list` says of the cuda implementation in this build.
const char* cuda_implementation_summary();

// Why cuda cases cannot run here (no CUDA in this build, no Hopper GPU), or nothing.
std::optional<std::string> cuda_unavailable_reason();

// Why the CUDA kernels cannot run a model of `config` (a head_dim the attention does
// not take), or nothing: its cuda and nccl cases skip saying so, the others go on.
std::optional<std::string> cuda_model_problem(const ModelConfig& config);

// This process's GPU (the current device), for a report's environment; a failed
// query is named in its field. nullopt in a build without CUDA (the fields stay null).
std::optional<GpuIdentity> gpu_identity();

// Whether `plan` runs anything on a GPU: cuda or nccl as an implementation or its canonical.
inline bool uses_gpu(const SweepPlan& plan) {
  auto gpu = [](Implementation i) { return i == Implementation::kCuda || i == Implementation::kNccl; };
  return gpu(plan.canonical) || std::any_of(plan.implementations.begin(), plan.implementations.end(), gpu);
}

// Runs cuda cases, keeping at most one uploaded GPU model: the last unsharded
// case's. One is enough (a sweep never comes back to a (model, contract) it has
// left), and it bounds the device memory to one copy of a model's weights.
class GpuRunner {
 public:
  GpuRunner();
  ~GpuRunner();  // frees the kept model
  GpuRunner(const GpuRunner&) = delete;
  GpuRunner& operator=(const GpuRunner&) = delete;

  // Readies the device for a case of `layout`: for the unsharded layout, m's GPU
  // model, uploaded unless it is the kept one (a different kept model is freed
  // first); for virtual ranks, which upload their own shards, no kept model (freed,
  // so that the device never holds two copies of the weights). The engine calls it
  // before it starts a case's clock (as it loads the host weights before); run()
  // calls it too. Throws CannotTest.
  void prepare(const GpuModelSource& m, const layouts::Layout& layout);
  // Frees the kept model: a case on real ranks needs this device for its own shards.
  void release();
  GpuCaseResult run(const GpuCaseInput& in);

 private:
  struct Kept;
  std::unique_ptr<Kept> kept_;
};

}  // namespace bp::harness
