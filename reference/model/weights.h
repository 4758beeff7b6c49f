// Model weights: bf16 tensors under Hugging Face parameter names, with the exact
// shapes transformers uses, and a generator with defined bits so that a fixture
// needs no weight file. Loading and saving safetensors checkpoints is
// harness/io/checkpoint.h (the reference does no file I/O).
//
// Names: model_graph.h (Hugging Face's, in its state_dict order); shapes: weight_specs,
// as nn.Linear stores them ([out][in]).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "reference/model/config.h"
#include "reference/model/model_graph.h"
#include "reference/numerics/bf16.h"

namespace bp {

enum class WeightKind { Embedding, Norm, Projection, Router, LmHead };

struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  WeightKind kind = WeightKind::Projection;
  graph::Param param = graph::Param::Embed;
  int64_t layer = -1, expert = -1;  // where the graph's Layer and Expert scopes put it
  int64_t numel() const;
};

// Every parameter a model with this config has, in Hugging Face's state_dict order.
std::vector<WeightSpec> weight_specs(const ModelConfig& cfg);

// The number of parameters weight_specs(cfg) lists (their elements, summed), in
// constant memory: a config may ask for more layers than their specs would fit in
// memory, and the work estimate refuses it from this count.
double parameter_count(const ModelConfig& cfg);

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<bf16> data;  // row-major
  int64_t numel() const;
};

class Weights {
 public:
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws std::out_of_range naming the tensor.
  const Tensor& at(const std::string& name) const;
  Tensor& at(const std::string& name);
  void insert(const std::string& name, Tensor t) { tensors_[name] = std::move(t); }
  // The lm_head parameter, or the embedding when the config ties them.
  const Tensor& lm_head(const ModelConfig& cfg) const;
  const std::map<std::string, Tensor>& all() const { return tensors_; }
  size_t size() const { return tensors_.size(); }

 private:
  std::map<std::string, Tensor> tensors_;
};

// Generated weights. Element k of tensor `name` is a function of (seed, name, k)
// only, so the bits are the same for any thread count, compiler or subset:
//   tseed = counter_hash(seed, first 8 bytes of SHA-256(name) as little-endian u64)
//   u_k   = counter_uniform(tseed, k)                       (uniform in [-1, 1), rng.h)
//   Embedding                    R(u_k)                     (amplitude 1)
//   Norm (all RMSNorm weights)   R(1 + u_k * 0.125)         (in [0.875, 1.125))
//   Projection, Router, LmHead   R(u_k * s), s = 1 / sqrt(fan_in) in fp32, fan_in = shape[1]
uint64_t weight_tensor_seed(uint64_t seed, std::string_view name);
Tensor generate_tensor(const WeightSpec& spec, uint64_t seed);
Weights generate_weights(const ModelConfig& cfg, uint64_t seed);

}  // namespace bp
