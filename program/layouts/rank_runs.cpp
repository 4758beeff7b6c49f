#include "program/layouts/rank_runs.h"

#include <map>
#include <stdexcept>

#include "program/layouts/emulated.h"
#include "program/model_check.h"
#include "reference/model/loss.h"

namespace bp::layouts {
namespace {

// Per-sequence logprobs (and entropies) from every rank's values.
void place_values(const std::vector<RankResult>& ranks, const std::vector<std::vector<int32_t>>& seqs, bool entropy,
                  std::vector<std::vector<float>>& logprob, std::vector<std::vector<float>>& ent) {
  for (const auto& s : seqs) {
    logprob.emplace_back(s.size() - 1, 0.0f);
    if (entropy) ent.emplace_back(s.size() - 1, 0.0f);
  }
  for (const RankResult& r : ranks)
    for (const RankResult::Value& v : r.values) {
      logprob[static_cast<size_t>(v.seq)][static_cast<size_t>(v.pos)] = v.logprob;
      if (entropy) ent[static_cast<size_t>(v.seq)][static_cast<size_t>(v.pos)] = v.entropy;
    }
}

// Captures in the order rank 0 (which records every name) made them.
std::vector<program::Capture> place_captures(const std::vector<RankResult>& ranks, int64_t total) {
  std::vector<program::Capture> out;
  std::map<std::string, size_t> index;
  for (const RankResult::CaptureBlock& b : ranks.at(0).captures)
    if (!index.count(b.name)) {
      index[b.name] = out.size();
      out.push_back({b.name, {total, b.width}, std::vector<bf16>(static_cast<size_t>(total * b.width), bf16{0})});
    }
  for (const RankResult& r : ranks)
    for (const RankResult::CaptureBlock& b : r.captures) {
      program::Capture& c = out.at(index.at(b.name));
      for (size_t i = 0; i < b.rows.size(); ++i)
        std::copy_n(b.data.begin() + static_cast<int64_t>(i) * b.cols, b.cols,
                    c.bf16_data.begin() + b.rows[i] * b.width + b.col0);
    }
  return out;
}

}  // namespace

std::vector<RankResult> run_ranks(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                  const Layout& layout,
                                  const std::function<RankResult(int rank, RankComms& comms)>& body) {
  const std::string why = shard_check(layout, cfg, knobs);
  if (!why.empty()) throw std::invalid_argument("layout " + layout.name() + ": " + why);
  if (layout.reduction == Reduction::NcclBf16Sum)
    throw std::invalid_argument("layout " + layout.name() +
                                ": NCCL's bf16 all-reduce runs on real ranks only (implementation nccl)");
  program::check_model(cfg, weights, knobs);  // as the unsharded model checks them
  std::vector<RankResult> results(static_cast<size_t>(layout.world()));
  run_emulated(layout, [&](int rank, RankComms& comms) { results[static_cast<size_t>(rank)] = body(rank, comms); });
  return results;
}

program::ForwardResult assemble_forward(const std::vector<RankResult>& ranks,
                                    const std::vector<std::vector<int32_t>>& seqs, const program::ForwardOptions& opt) {
  program::ForwardResult r;
  place_values(ranks, seqs, opt.entropy, r.logprob, r.entropy);
  int64_t total = 0;
  for (const auto& s : seqs) total += static_cast<int64_t>(s.size());
  if (opt.capture) r.captures = place_captures(ranks, total);
  return r;
}

program::BackwardResult assemble_backward(const std::vector<RankResult>& ranks, const Weights& weights,
                                      const std::vector<std::vector<int32_t>>& seqs,
                                      const ref::LossCoefficients& coefs) {
  program::BackwardResult r;
  std::vector<std::vector<float>> unused;
  place_values(ranks, seqs, false, r.logprob, unused);
  r.coef = coefs.for_batch(seqs);
  for (const RankResult& rank : ranks)
    for (const RankResult::GradBlock& b : rank.grads) {
      std::vector<float>& g = r.grads[b.name];
      g.resize(static_cast<size_t>(weights.at(b.name).numel()), 0.0f);
      for (int64_t i = 0; i < b.rows; ++i)
        std::copy_n(b.data.begin() + i * b.cols, b.cols, g.begin() + (b.row0 + i) * b.width + b.col0);
    }
  return r;
}

}  // namespace bp::layouts
