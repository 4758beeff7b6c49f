// The Qwen3 / Qwen3-MoE reference model (SPEC.md §6): a composition of the ops in
// reference/ops and nothing else. One forward API serves every path (extend,
// chunked prefill, decode, ragged batches); each yields the teacher-forcing
// logprob of token t+1 at every position t < len−1. The backward differentiates
// L = Σ c_t·logprob_t on the packed extend path and returns the fp32 gradient of
// every parameter under its Hugging Face name.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "reference/contract/contract.h"
#include "reference/model/config.h"
#include "reference/model/weights.h"

namespace bp::ref {

// How a batch of sequences goes through the model.
//   Extend:  each sequence alone, in one call, whole.
//   Chunked: each sequence alone, cut into chunks of sizes chunks[0], chunks[1], …
//            (the list is cycled until the sequence ends; the last chunk may be
//            shorter), each chunk one call extending the sequence's KV cache.
//   Decode:  token by token with the KV cache; every step packs the next token of
//            every unfinished sequence into one call (ragged decode).
//   Ragged:  every sequence, whole, packed into one call.
struct Schedule {
  enum class Kind { Extend, Chunked, Decode, Ragged };
  Kind kind = Kind::Extend;
  std::vector<int> chunks;  // Chunked only; every size >= 1
  static Schedule extend() { return {Kind::Extend, {}}; }
  static Schedule ragged() { return {Kind::Ragged, {}}; }
  static Schedule decode() { return {Kind::Decode, {}}; }
  static Schedule chunked(std::vector<int> c) { return {Kind::Chunked, std::move(c)}; }
};

// One model call of a schedule: `len` tokens of sequence `seq` (its index in the
// batch) at absolute positions start .. start+len−1, extending its KV cache.
struct SchedulePiece {
  int seq;
  int start;
  int len;
};

// The calls a schedule makes, in order, each a list of pieces packed into one call.
// Throws std::invalid_argument for an empty sequence, one longer than
// max_positions, or a chunked schedule without chunks or with a size < 1.
std::vector<std::vector<SchedulePiece>> schedule_steps(const std::vector<std::vector<int32_t>>& seqs,
                                                       const Schedule& sched, int64_t max_positions);

// One captured op output. Rows are tokens in canonical order — sequence by
// sequence in batch order, positions increasing — whatever the path, so two paths'
// captures compare row by row. Exactly one of bf16_bits / f32 is filled.
struct Capture {
  std::string name;             // "layers.3.attn_out", "final_norm", "logits", …
  std::vector<int64_t> shape;   // [tokens, features…]
  std::vector<bf16> bf16_data;  // bf16 outputs
  std::vector<float> f32_data;  // fp32 outputs (none among the current names)
};

struct ForwardOptions {
  float temperature = 1.0f;
  bool entropy = false;
  bool capture = false;
};

struct ForwardResult {
  // logprob[s][t] = log p(tokens[s][t+1] | tokens[s][0..t]), t < len−1 (fp32).
  std::vector<std::vector<float>> logprob;
  std::vector<std::vector<float>> entropy;  // same shape, when asked for
  std::vector<Capture> captures;            // in execution order of first appearance
};

struct BackwardResult {
  std::vector<std::vector<float>> logprob;     // the forward's (== extend's)
  std::vector<std::vector<float>> coef;        // c_t, same shape
  std::map<std::string, std::vector<float>> grads;  // HF names, fp32, row-major
};

// c for target row r (rows numbered over the batch: sequence by sequence, t
// increasing, only t < len−1): counter_uniform(seed, r), uniform in [−1, 1).
float loss_coef(uint64_t seed, uint64_t row);

template <class Backend>
class Qwen3Program;  // qwen3_program.h
struct HostBackend;  // host_backend.h

// The reference model: the program of qwen3_program.h on the reference ops.
class Model {
 public:
  // Validates the config against the weights' shapes (std::invalid_argument).
  // Keeps a reference to `weights`, which must outlive the model.
  Model(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs);
  Model(const ModelConfig&, Weights&&, const Knobs&) = delete;
  ~Model();

  ForwardResult forward(const std::vector<std::vector<int32_t>>& seqs, const Schedule& sched,
                        const ForwardOptions& opt = {}) const;

  // Backward of L = Σ c_t·logprob_t over the batch (all sequences packed, the
  // ragged/extend forward), c from loss_coef(coef_seed, ·).
  BackwardResult backward(const std::vector<std::vector<int32_t>>& seqs, uint64_t coef_seed,
                          float temperature = 1.0f) const;

  const ModelConfig& config() const;

 private:
  std::unique_ptr<const Qwen3Program<HostBackend>> program_;
};

}  // namespace bp::ref
