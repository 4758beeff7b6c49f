#include "host/layouts.h"

#include "host/backend.h"
#include "program/layouts/rank_program.h"
#include "program/layouts/rank_runs.h"

namespace bp::layouts {

template class RankProgram<ref::HostBackend>;

ref::ForwardResult forward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, const Layout& layout,
                           const std::vector<std::vector<int32_t>>& seqs, const ref::Path& path,
                           const ref::ForwardOptions& opt) {
  const auto ranks = run_ranks(cfg, weights, knobs, layout, [&](int rank, RankComms& comms) {
    return RankProgram<ref::HostBackend>(cfg, weights, knobs, layout, rank, comms).forward(seqs, path, opt);
  });
  return assemble_forward(ranks, seqs, opt);
}

ref::BackwardResult backward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, const Layout& layout,
                             const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                             float temperature) {
  const auto ranks = run_ranks(cfg, weights, knobs, layout, [&](int rank, RankComms& comms) {
    return RankProgram<ref::HostBackend>(cfg, weights, knobs, layout, rank, comms).backward(seqs, coefs, temperature);
  });
  return assemble_backward(ranks, weights, seqs, coefs);
}

}  // namespace bp::layouts
