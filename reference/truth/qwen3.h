// Float64 truth of the whole Qwen3 / Qwen3-MoE model: the same function as
// bp::host::Model (SPEC.md §4, §6) with no rounding anywhere — the bf16 weights
// widened exactly, double activations, exact softmax, RoPE angles from the exact
// inverse frequencies — built from the truth ops (reference/truth/*.h). It is what
// the bit-defined model approximates and what Hugging Face's float32 model
// approximates; tests/reference/truth/test_hf_crosscheck.cpp measures both against it.
//
// Sequences are independent (no batch composition, no KV blocks); the MoE top-k
// is chosen on the exact router probabilities (ties to the lower expert id).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reference/model/config.h"
#include "reference/model/loss.h"
#include "reference/model/weights.h"
#include "reference/truth/moe_experts.h"
#include "reference/truth/tensor.h"

namespace bp::truth {

struct ForwardResult {
  // logprob[s][t] = log p(tokens[s][t+1] | tokens[s][0..t]), t < len−1.
  std::vector<std::vector<double>> logprob;
  std::vector<std::vector<double>> entropy;  // same shape, when asked for
};

struct BackwardResult {
  std::vector<std::vector<double>> logprob;          // the forward's
  std::vector<std::vector<double>> coef;             // c_t of ref::LossCoefficients, exact
  std::map<std::string, std::vector<double>> grads;  // HF names, row-major; tied: embed_tokens only
};

// Every captured op (SPEC.md §6.3) computed alone from the bf16 values it reads
// (Model::each_op): what `bitparity conform` measures an engine's and the
// contract's outputs against, each op's inputs being the same for all three.
struct EachOp {
  std::map<std::string, MatD> ops;     // by capture name, [tokens][features], canonical rows
  std::vector<VecD> logprob, entropy;  // per sequence (t < len − 1), from the logits that flow
};

struct ForwardOptions {
  double temperature = 1.0;
  bool entropy = false;
  // A rounding model of a float32 implementation (SPEC.md §8.1): every op's output
  // rounded to float32 before the next op reads it; the ops themselves stay exact.
  bool fp32_storage = false;
};

// Parameters in double under Hugging Face names; 1-D weights are one row.
using WeightsD = std::map<std::string, MatD>;

class Model {
 public:
  // Checks every parameter's presence and shape (std::invalid_argument) and widens
  // the weights once; `weights` need not outlive the model.
  Model(const ModelConfig& cfg, const Weights& weights);
  // Weights already in double (e.g. a perturbed copy of weights(), for finite differences).
  Model(const ModelConfig& cfg, WeightsD weights);

  ForwardResult forward(const std::vector<std::vector<int32_t>>& seqs, const ForwardOptions& opt = {}) const;

  // Gradient of L = Σ_r c_r·logprob_r, rows r numbered over the batch as in
  // host::Model::backward (sequence by sequence, t increasing, t < len−1).
  // fp32_storage: the forward's activations as in ForwardOptions (the backward exact).
  BackwardResult backward(const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                          double temperature = 1.0, bool fp32_storage = false) const;

  // Each op alone: an op reads `given`'s value of each capture it reads (by capture
  // name, [tokens][features] in canonical rows: sequence by sequence, positions from
  // 0), and where a capture is not given, that op's own exact value: an engine that
  // captured no expert_out is judged on its MoE block from post_norm, as one op. The
  // MoE top-k is chosen on the exact probabilities of the router logits that flow
  // (the contract's fp32 probabilities choose the same experts but for near-ties),
  // and weighs each expert by the routing weights that flow. std::invalid_argument
  // for a given capture of the wrong size.
  EachOp each_op(const std::vector<std::vector<int32_t>>& seqs, const std::map<std::string, std::vector<bf16>>& given,
                 double temperature) const;

  const ModelConfig& config() const { return cfg_; }
  const WeightsD& weights() const { return w_; }

 private:
  struct Seq;
  Seq run(const std::vector<int32_t>& tokens, bool keep, bool fp32_storage) const;
  const MatD& w(const std::string& name) const;
  const MatD& lm_head() const;
  Experts experts(int64_t layer) const;

  ModelConfig cfg_;
  WeightsD w_;
};

}  // namespace bp::truth
