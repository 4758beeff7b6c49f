// The `cuda` backend of the case engine: one case on the GPU — the GPU model
// (optimized/model/qwen3.h) for the unsharded layout, virtual GPU ranks
// (optimized/layouts/virtual_ranks.h) for the others — with the peak device
// memory it took. A build without CUDA, or a
// machine without a Hopper GPU, throws CannotTest saying why (exit code 125 when
// nothing else ran).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "harness/cases.h"
#include "reference/layouts/layout.h"
#include "reference/model/qwen3.h"

namespace bp::harness {

struct GpuCaseResult {
  ref::ForwardResult forward;
  std::optional<ref::BackwardResult> backward;  // when asked for
  uint64_t peak_device_bytes = 0;               // weights, caches, activations, scratch
};

struct GpuCaseInput {
  const ModelConfig& cfg;
  const Weights& weights;
  const Knobs& knobs;
  const layouts::Layout& layout;
  const std::vector<std::vector<int32_t>>& seqs;
  const ref::Schedule& path;
  const ref::ForwardOptions& options;
  bool grads;  // also the backward (L = Σ c_t·logprob_t, c from coef_seed)
  uint64_t coef_seed;
};

GpuCaseResult run_gpu_case(const GpuCaseInput& in);

}  // namespace bp::harness
