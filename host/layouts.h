// Runs the model under a layout: the sharded rank program (rank_program.h) executed
// by layout.world() emulated ranks on the CPU (emulated.h), and the ranks' shards
// put back together. The results have the shapes and meaning of host::Model's, and
// for every valid layout they are bit-identical to the unsharded model's
// (SPEC.md §7); that is what tests/host/test_layouts.cpp proves.
#pragma once
#include <cstdint>
#include <vector>

#include "program/layouts/layout.h"
#include "program/results.h"
#include "program/path.h"
#include "reference/contract/contract.h"
#include "reference/model/config.h"
#include "reference/model/weights.h"

namespace bp::host {

// Throws std::invalid_argument when shard_check(layout, cfg, knobs) is not empty,
// and what host::Model throws for bad sequences or paths.
program::ForwardResult sharded_forward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                       const layouts::Layout& layout, const std::vector<std::vector<int32_t>>& seqs,
                                       const program::Path& path, const program::ForwardOptions& opt = {});

// Backward of L = Σ c_t·logprob_t over the batch (the packed forward), as
// host::Model::backward: logprobs, coefficients and every parameter's gradient.
program::BackwardResult sharded_backward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                         const layouts::Layout& layout,
                                         const std::vector<std::vector<int32_t>>& seqs,
                                         const ref::LossCoefficients& coefs, float temperature = 1.0f);

}  // namespace bp::host
