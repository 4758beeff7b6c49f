// The Qwen3 / Qwen3-MoE reference model (SPEC.md §6): the model program
// (program/qwen3_program.h) on the host backend, that is on the ops of
// reference/ops and nothing else. One forward API serves every path (extend,
// chunked prefill, decode, ragged batches); each yields the teacher-forcing
// logprob of token t+1 at every position t < len−1. The backward differentiates
// L = Σ c_t·logprob_t on the packed extend path and returns the fp32 gradient of
// every parameter under its Hugging Face name.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "program/results.h"
#include "program/path.h"
#include "reference/contract/contract.h"
#include "reference/model/config.h"
#include "reference/model/loss.h"
#include "reference/model/weights.h"

namespace bp::program {
template <class Backend>
class Qwen3Program;  // program/qwen3_program.h
}  // namespace bp::program

namespace bp::host {

struct HostBackend;  // host/backend.h

// The reference model: the program of qwen3_program.h on the reference ops.
class Model {
 public:
  // Validates the config against the weights' shapes (std::invalid_argument).
  // Keeps a reference to `weights`, which must outlive the model.
  Model(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs);
  Model(const ModelConfig&, Weights&&, const Knobs&) = delete;
  ~Model();

  program::ForwardResult forward(const std::vector<std::vector<int32_t>>& seqs, const program::Path& path,
                                 const program::ForwardOptions& opt = {}) const;

  // Backward of L = Σ c_t·logprob_t over the batch (all sequences packed, the
  // ragged/extend forward), c from `coefs` (generated or
  // explicit; std::invalid_argument when explicit ones miss the batch's shape).
  program::BackwardResult backward(const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                                   float temperature = 1.0f, const program::BackwardOptions& bo = {}) const;

  const ModelConfig& config() const;

 private:
  std::unique_ptr<const program::Qwen3Program<HostBackend>> program_;
};

}  // namespace bp::host
