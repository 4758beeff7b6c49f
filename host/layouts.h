// Runs the model under a layout: the sharded rank program (rank_program.h) executed
// by layout.world() emulated ranks on the CPU (emulated.h), and the ranks' shards
// put back together. The results have the shapes and meaning of ref::Model's, and
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

namespace bp::layouts {

// Throws std::invalid_argument when shard_check(layout, cfg, knobs) is not empty,
// and what ref::Model throws for bad sequences or paths.
ref::ForwardResult forward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, const Layout& layout,
                           const std::vector<std::vector<int32_t>>& seqs, const ref::Path& path,
                           const ref::ForwardOptions& opt = {});

// Backward of L = Σ c_t·logprob_t over the batch (the packed forward), as
// ref::Model::backward: logprobs, coefficients and every parameter's gradient.
ref::BackwardResult backward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, const Layout& layout,
                             const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                             float temperature = 1.0f);

}  // namespace bp::layouts
