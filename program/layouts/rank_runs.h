// What the layouts' runners share (runner.h: emulated ranks on the CPU;
// gpu/virtual_ranks.h: virtual ranks on one GPU): the checks and
// threads of a run, and the ranks' shares put back together into the results of
// host::Model.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "program/layouts/comm.h"
#include "program/layouts/layout.h"
#include "program/layouts/rank_result.h"
#include "program/results.h"
#include "program/path.h"
#include "reference/contract/contract.h"
#include "reference/model/config.h"
#include "reference/model/weights.h"

namespace bp::layouts {

// Checks the layout (shard_check) and the config and weights (as host::Model
// does), std::invalid_argument if they do not fit; then runs body(rank, comms)
// on every rank of the layout, one thread each (run_emulated), and returns the
// ranks' results in rank order.
std::vector<RankResult> run_ranks(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                  const Layout& layout,
                                  const std::function<RankResult(int rank, RankComms& comms)>& body);

// The forward's logprobs (entropies, captures when asked for) from the ranks' shares.
program::ForwardResult assemble_forward(const std::vector<RankResult>& ranks,
                                    const std::vector<std::vector<int32_t>>& seqs, const program::ForwardOptions& opt);

// The backward's logprobs, coefficients and every parameter's gradient from the ranks' shares.
program::BackwardResult assemble_backward(const std::vector<RankResult>& ranks, const Weights& weights,
                                      const std::vector<std::vector<int32_t>>& seqs,
                                      const ref::LossCoefficients& coefs);

}  // namespace bp::layouts
