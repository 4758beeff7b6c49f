#include "host/model.h"

#include "host/backend.h"
#include "program/qwen3_program.h"

namespace bp::host {

Model::Model(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs)
    : program_(std::make_unique<const program::Qwen3Program<HostBackend>>(cfg, weights, knobs)) {}

Model::~Model() = default;

program::ForwardResult Model::forward(const std::vector<std::vector<int32_t>>& seqs, const program::Path& path,
                             const program::ForwardOptions& opt) const {
  return program_->forward(seqs, path, opt);
}

program::BackwardResult Model::backward(const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                               float temperature, const program::BackwardOptions& bo) const {
  return program_->backward(seqs, coefs, temperature, bo);
}

const ModelConfig& Model::config() const { return program_->config(); }

}  // namespace bp::host
