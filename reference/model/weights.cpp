#include "reference/model/weights.h"

#include <cmath>
#include <stdexcept>

#include "reference/common/rng.h"
#include "reference/common/sha256.h"

namespace bp {

namespace {
// Small tensors are generated serially (thread start-up costs more than the work).
constexpr int64_t kParallelMin = int64_t{1} << 16;
}  // namespace

int64_t WeightSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  const int64_t H = c.hidden_size, D = c.head_dim;
  std::vector<WeightSpec> s;
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, H}, WeightKind::Embedding});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    s.push_back({p + "self_attn.q_proj.weight", {c.num_attention_heads * D, H}, WeightKind::Projection});
    s.push_back({p + "self_attn.k_proj.weight", {c.num_key_value_heads * D, H}, WeightKind::Projection});
    s.push_back({p + "self_attn.v_proj.weight", {c.num_key_value_heads * D, H}, WeightKind::Projection});
    s.push_back({p + "self_attn.o_proj.weight", {H, c.num_attention_heads * D}, WeightKind::Projection});
    s.push_back({p + "self_attn.q_norm.weight", {D}, WeightKind::Norm});
    s.push_back({p + "self_attn.k_norm.weight", {D}, WeightKind::Norm});
    if (c.is_moe_layer(i)) {
      const int64_t I = c.moe_intermediate_size;
      s.push_back({p + "mlp.gate.weight", {c.num_experts, H}, WeightKind::Router});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        s.push_back({q + "gate_proj.weight", {I, H}, WeightKind::Projection});
        s.push_back({q + "up_proj.weight", {I, H}, WeightKind::Projection});
        s.push_back({q + "down_proj.weight", {H, I}, WeightKind::Projection});
      }
    } else {
      const int64_t I = c.intermediate_size;
      s.push_back({p + "mlp.gate_proj.weight", {I, H}, WeightKind::Projection});
      s.push_back({p + "mlp.up_proj.weight", {I, H}, WeightKind::Projection});
      s.push_back({p + "mlp.down_proj.weight", {H, I}, WeightKind::Projection});
    }
    s.push_back({p + "input_layernorm.weight", {H}, WeightKind::Norm});
    s.push_back({p + "post_attention_layernorm.weight", {H}, WeightKind::Norm});
  }
  s.push_back({"model.norm.weight", {H}, WeightKind::Norm});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, H}, WeightKind::LmHead});
  return s;
}

const Tensor& Weights::at(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::out_of_range("no weight named " + name);
  return it->second;
}

Tensor& Weights::at(const std::string& name) {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::out_of_range("no weight named " + name);
  return it->second;
}

const Tensor& Weights::lm_head(const ModelConfig& cfg) const {
  return at(cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
}

uint64_t weight_tensor_seed(uint64_t seed, std::string_view name) {
  const std::array<uint8_t, 32> d = Sha256().update(name).digest();
  uint64_t h = 0;
  for (int i = 7; i >= 0; --i) h = (h << 8) | d[static_cast<size_t>(i)];
  return counter_hash(seed, h);
}

Tensor generate_tensor(const WeightSpec& spec, uint64_t seed) {
  Tensor t;
  t.shape = spec.shape;
  const int64_t n = spec.numel();
  t.data.resize(static_cast<size_t>(n));
  const uint64_t ts = weight_tensor_seed(seed, spec.name);
  bf16* out = t.data.data();
  if (spec.kind == WeightKind::Norm) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t k = 0; k < n; ++k)
      out[k] = round_bf16(1.0f + counter_uniform(ts, static_cast<uint64_t>(k)) * 0.125f);
  } else {
    float scale = 1.0f;
    if (spec.kind != WeightKind::Embedding) scale = 1.0f / std::sqrt(static_cast<float>(spec.shape.at(1)));
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t k = 0; k < n; ++k) out[k] = counter_bf16(ts, static_cast<uint64_t>(k), scale);
  }
  return t;
}

Weights generate_weights(const ModelConfig& cfg, uint64_t seed) {
  Weights w;
  for (const WeightSpec& s : weight_specs(cfg)) w.insert(s.name, generate_tensor(s, seed));
  return w;
}

}  // namespace bp
