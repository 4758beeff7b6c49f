// What a model run returns, whichever implementation ran it (the reference model,
// the GPU model, the layouts' ranks put back together): logprobs, entropies,
// captured op outputs and parameter gradients, on the host.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reference/model/loss.h"  // LossCoefficients, which every backward takes
#include "reference/numerics/bf16.h"

namespace bp::ref {

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

}  // namespace bp::ref
