#include "host/layouts.h"

#include "host/backend.h"
#include "program/layouts/rank_program.h"
#include "program/layouts/rank_runs.h"

template class bp::layouts::RankProgram<bp::host::HostBackend>;

namespace bp::host {

program::ForwardResult sharded_forward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                       const layouts::Layout& layout, const std::vector<std::vector<int32_t>>& seqs,
                                       const program::Path& path, const program::ForwardOptions& opt) {
  const auto ranks = layouts::run_ranks(cfg, weights, knobs, layout, [&](int rank, layouts::RankComms& comms) {
    return layouts::RankProgram<HostBackend>(cfg, weights, knobs, layout, rank, comms).forward(seqs, path, opt);
  });
  return layouts::assemble_forward(ranks, seqs, opt);
}

program::BackwardResult sharded_backward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                         const layouts::Layout& layout,
                                         const std::vector<std::vector<int32_t>>& seqs,
                                         const ref::LossCoefficients& coefs, float temperature) {
  const auto ranks = layouts::run_ranks(cfg, weights, knobs, layout, [&](int rank, layouts::RankComms& comms) {
    return layouts::RankProgram<HostBackend>(cfg, weights, knobs, layout, rank, comms)
        .backward(seqs, coefs, temperature);
  });
  return layouts::assemble_backward(ranks, weights, seqs, coefs);
}

}  // namespace bp::host
