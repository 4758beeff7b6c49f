// Virtual ranks: the layouts' rank program (program/layouts/rank_program.h) run
// by layout.world() ranks on one GPU — one host thread and one CUDA stream per
// rank, the bp::cuda ops, collectives as device copies between the ranks'
// buffers (CudaBackend) — so that TP/EP/CP layouts run on a single GPU. The API
// and the results are the reference runner's (host/layouts.h), and
// for every valid layout bit-identical to the unsharded model's (SPEC.md §7).
#pragma once
#include <cstdint>
#include <vector>

#include "program/layouts/layout.h"
#include "program/results.h"
#include "program/path.h"
#include "reference/contract/contract.h"
#include "reference/model/config.h"
#include "reference/model/weights.h"

namespace bp::gpu {

using bp::layouts::Layout;

// Throws std::invalid_argument when shard_check(layout, cfg, knobs) is not empty,
// what host::Model throws for bad sequences or paths, and CudaError when a
// CUDA call fails.
program::ForwardResult sharded_forward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                       const layouts::Layout& layout, const std::vector<std::vector<int32_t>>& seqs,
                                       const program::Path& path, const program::ForwardOptions& opt = {});

// Backward of L = Σ c_t·logprob_t over the batch (the packed forward), as
// host::Model::backward: logprobs, coefficients and every parameter's gradient.
program::BackwardResult sharded_backward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                         const layouts::Layout& layout,
                                         const std::vector<std::vector<int32_t>>& seqs,
                                         const ref::LossCoefficients& coefs, float temperature = 1.0f);

}  // namespace bp::gpu
