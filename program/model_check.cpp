#include "program/model_check.h"

#include <stdexcept>
#include <string>

namespace bp::program {

void check_model(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs) {
  const std::string bad = validate(knobs);
  if (!bad.empty()) throw std::invalid_argument("model: " + bad);
  for (const WeightSpec& s : weight_specs(cfg)) {
    if (!weights.contains(s.name)) throw std::invalid_argument("model: missing weight " + s.name);
    if (weights.at(s.name).shape != s.shape) throw std::invalid_argument("model: wrong shape for " + s.name);
  }
  if (cfg.head_dim % 2 != 0 || cfg.num_key_value_heads <= 0 || cfg.num_attention_heads % cfg.num_key_value_heads)
    throw std::invalid_argument("model: bad head geometry");
}

}  // namespace bp::program
