// What a model run returns, whichever implementation ran it (the reference model,
// the GPU model, the layouts' ranks put back together): logprobs, entropies,
// captured op outputs and parameter gradients, on the host.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "reference/model/loss.h"  // LossCoefficients, which every backward takes
#include "reference/numerics/bf16.h"

namespace bp::program {

// One captured op output. Rows are tokens in canonical order — sequence by
// sequence in batch order, positions increasing — whatever the path, so two paths'
// captures compare row by row; names: reference/model/model_graph.h.
struct Capture {
  std::string name;             // "layers.3.attn_out", "final_norm", "logits", …
  std::vector<int64_t> shape;   // [tokens, features…]
  std::vector<bf16> bf16_data;  // every captured op output is bf16
};

struct ForwardOptions {
  float temperature = 1.0f;
  bool entropy = false;
  bool capture = false;
  // With capture: only these layers' ops (and every model-scope op: embed,
  // final_norm, logits); null: every layer's. Bounds a real-size model's captures.
  const std::set<int64_t>* capture_layers = nullptr;
  // Layer-sliced replay (extend path only): each layer's output bits depend only on
  // its input bits and the weights, so a layer can be re-run alone from a captured
  // input. Key: a layer index, or num_hidden_layers for the head (final norm,
  // logits, logprobs); value: that stage's input rows [tokens × hidden] in canonical
  // order (the embed or the previous layer's resid_mlp). Only those stages run (the
  // embedding always does); without the head's key the logprobs stay 0.
  const std::map<int64_t, std::vector<bf16>>* replay = nullptr;
  // Conformance (`bitparity conform`): another engine's captured op outputs by
  // capture name ("layers.3.q_proj"), canonical rows [tokens × features]. With
  // capture, each such op's output is recorded as this model computes it, then
  // replaced by the engine's before the next op reads it: every op is computed from
  // the engine's own inputs. Within the MoE router the routing (the experts chosen)
  // follows this model's own logits; the engine's router_weights, where given, weight
  // the experts.
  const std::map<std::string, std::vector<bf16>>* substitute = nullptr;
};

struct ForwardResult {
  // logprob[s][t] = log p(tokens[s][t+1] | tokens[s][0..t]), t < len−1 (fp32).
  std::vector<std::vector<float>> logprob;
  std::vector<std::vector<float>> entropy;  // same shape, when asked for
  std::vector<Capture> captures;            // in execution order of first appearance
};

// What a backward does beyond the gradients, for layer-sliced verification.
struct BackwardOptions {
  // Capture each layer's input gradient and the final norm's (graph::resid_grad_name).
  bool capture_resid_grads = false;
  // Replay: the forward's stage inputs (as ForwardOptions::replay, the head's
  // included) and, per replayed layer i, the gradient of its output (resid_grad
  // i + 1), canonical rows. Only those layers and the head run their backward: the
  // other layers' parameter gradients are absent, and the embedding's unless layer 0
  // is replayed.
  const std::map<int64_t, std::vector<bf16>>* replay_inputs = nullptr;
  const std::map<int64_t, std::vector<bf16>>* replay_output_grads = nullptr;
};

struct BackwardResult {
  std::vector<std::vector<float>> logprob;     // the forward's (== extend's)
  std::vector<std::vector<float>> coef;        // c_t, same shape
  std::map<std::string, std::vector<float>> grads;  // HF names, fp32, row-major
  std::vector<Capture> captures;  // with BackwardOptions::capture_resid_grads, from the head down
};

}  // namespace bp::program
