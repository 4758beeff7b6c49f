#include "reference/model/weights.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <stdexcept>
#include <utility>

#include "reference/common/rng.h"
#include "reference/common/sha256.h"
#include "reference/model/model_graph.h"

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

namespace {

using graph::Param;
using graph::ParamRow;
using graph::Scope;

// Parameter p of layer `layer` (−1: the model's) and expert `expert` (−1: none):
// its name, shape ([out][in] as nn.Linear stores it) and generator kind.
// Parameter p's shape ([out][in] as nn.Linear stores it) and generator kind: the
// same in every layer and expert.
std::pair<std::vector<int64_t>, WeightKind> param_shape(const ModelConfig& c, Param p) {
  const int64_t H = c.hidden_size, V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim();
  const int64_t I = c.intermediate_size, Im = c.moe_intermediate_size;
  switch (p) {
    case Param::Embed: return {{V, H}, WeightKind::Embedding};
    case Param::QProj: return {{Q, H}, WeightKind::Projection};
    case Param::KProj:
    case Param::VProj: return {{KV, H}, WeightKind::Projection};
    case Param::OProj: return {{H, Q}, WeightKind::Projection};
    case Param::QNorm:
    case Param::KNorm: return {{c.head_dim}, WeightKind::Norm};
    case Param::Router: return {{c.num_experts, H}, WeightKind::Router};
    case Param::ExpertGate:
    case Param::ExpertUp: return {{Im, H}, WeightKind::Projection};
    case Param::ExpertDown: return {{H, Im}, WeightKind::Projection};
    case Param::MlpGate:
    case Param::MlpUp: return {{I, H}, WeightKind::Projection};
    case Param::MlpDown: return {{H, I}, WeightKind::Projection};
    case Param::InputNorm:
    case Param::PostNorm:
    case Param::FinalNorm: return {{H}, WeightKind::Norm};
    case Param::LmHead: return {{V, H}, WeightKind::LmHead};
  }
  throw std::logic_error("weight_specs: unknown parameter");
}

// Parameter p of layer `layer` (−1: the model's) and expert `expert` (−1: none):
// its name, shape and generator kind.
WeightSpec param_spec(const ModelConfig& c, Param p, int64_t layer = -1, int64_t expert = -1) {
  std::string name = expert >= 0  ? graph::param_name(layer, expert, p)
                     : layer >= 0 ? graph::param_name(layer, p)
                                  : graph::param_name(p);
  auto [shape, kind] = param_shape(c, p);
  return WeightSpec{std::move(name), std::move(shape), kind, p, layer, expert};
}

double numel(const ModelConfig& c, Param p) {
  double n = 1;
  for (const int64_t d : param_shape(c, p).first) n *= static_cast<double>(d);
  return n;
}

}  // namespace

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  const auto* begin = std::begin(graph::kParams);
  const auto* end = std::end(graph::kParams);
  auto is_model = [](const ParamRow& r) { return r.scope == Scope::Model; };
  const auto* layer_begin = std::find_if_not(begin, end, is_model);
  const auto* layer_end = std::find_if(layer_begin, end, is_model);
  std::vector<WeightSpec> s;
  auto add_model = [&](const ParamRow& r) {
    if (r.param != Param::LmHead || !c.tie_word_embeddings) s.push_back(param_spec(c, r.param));
  };
  std::for_each(begin, layer_begin, add_model);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool moe = c.is_moe_layer(i);
    for (const auto* r = layer_begin; r != layer_end; ++r) {
      if (r->scope == Scope::Expert) {  // each expert's parameters together, as HF's ModuleList lists them
        const auto* block_end = std::find_if(r, layer_end, [](const ParamRow& x) { return x.scope != Scope::Expert; });
        if (moe)
          for (int64_t e = 0; e < c.num_experts; ++e)
            for (const auto* x = r; x != block_end; ++x) s.push_back(param_spec(c, x->param, i, e));
        r = block_end - 1;
      } else if (r->scope == Scope::Layer || r->scope == (moe ? Scope::MoeLayer : Scope::DenseLayer)) {
        s.push_back(param_spec(c, r->param, i));
      }
    }
  }
  std::for_each(layer_end, end, add_model);
  return s;
}

double parameter_count(const ModelConfig& c) {
  double model = 0, layer = 0, dense = 0, moe = 0, expert = 0;
  for (const ParamRow& r : graph::kParams) {
    const double n = numel(c, r.param);
    switch (r.scope) {
      case Scope::Model: model += r.param == Param::LmHead && c.tie_word_embeddings ? 0 : n; break;
      case Scope::Layer: layer += n; break;
      case Scope::DenseLayer: dense += n; break;
      case Scope::MoeLayer: moe += n; break;
      case Scope::Expert: expert += n; break;
    }
  }
  const double moe_layers = static_cast<double>(c.moe_layer_count());
  const double dense_layers = static_cast<double>(c.num_hidden_layers) - moe_layers;
  return model + static_cast<double>(c.num_hidden_layers) * layer + dense_layers * dense +
         moe_layers * (moe + static_cast<double>(c.num_experts) * expert);
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
  return at(graph::param_name(cfg.tie_word_embeddings ? graph::Param::Embed : graph::Param::LmHead));
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
