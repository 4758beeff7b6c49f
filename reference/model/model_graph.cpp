#include "reference/model/model_graph.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string_view>

namespace bp::graph {

namespace {

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

const ParamRow& scoped(Param p, bool expert) {
  const ParamRow& r = row(p);
  const bool layer = r.scope == Scope::Layer || r.scope == Scope::DenseLayer || r.scope == Scope::MoeLayer;
  if (expert ? r.scope != Scope::Expert : !layer)
    throw std::logic_error(std::string("graph: ") + r.name + " used out of scope");
  return r;
}

const OpRow* find_op(std::string_view name, bool in_layer) {
  for (const OpRow& r : kOps)
    if (name == r.name && (r.scope != Scope::Model) == in_layer) return &r;
  return nullptr;
}

// What `input` of an op of layer `layer` names: the layer's input is embed for the
// first layer and the previous layer's resid_mlp after it (final_norm reads "layer"
// num_layers' input: the last layer's output).
std::string input_name(int layer, Op input) {
  if (input == Op::LayerInput) return layer_input_name(layer);
  return row(input).scope == Scope::Model ? capture_name(input) : capture_name(layer, input);
}

}  // namespace

std::optional<std::pair<int, std::string_view>> split_layer_capture(std::string_view name) {
  constexpr std::string_view kPrefix = "layers.";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string_view::npos || dot == kPrefix.size()) return std::nullopt;
  int layer = 0;
  for (size_t i = kPrefix.size(); i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9' || layer > 1'000'000) return std::nullopt;
    layer = layer * 10 + (name[i] - '0');
  }
  return std::make_pair(layer, name.substr(dot + 1));
}


const ParamRow& row(Param p) {
  const auto it = std::find_if(std::begin(kParams), std::end(kParams), [&](const ParamRow& r) { return r.param == p; });
  if (it == std::end(kParams)) throw std::logic_error("graph: parameter missing from kParams");
  return *it;
}

const OpRow& row(Op op) {
  const auto it = std::find_if(std::begin(kOps), std::end(kOps), [&](const OpRow& r) { return r.op == op; });
  if (it == std::end(kOps)) throw std::logic_error("graph: op missing from kOps");
  return *it;
}

std::string param_name(Param p) {
  const ParamRow& r = row(p);
  if (r.scope != Scope::Model) throw std::logic_error(std::string("graph: ") + r.name + " is a layer's parameter");
  return r.name;
}

std::string param_name(int64_t layer, Param p) { return layer_prefix(layer) + scoped(p, false).name; }

std::string param_name(int64_t layer, int64_t expert, Param p) {
  return experts_prefix(layer) + std::to_string(expert) + "." + scoped(p, true).name;
}

std::string experts_prefix(int64_t layer) { return layer_prefix(layer) + "mlp.experts."; }

std::string fused_experts_name(int64_t layer, FusedExperts f) {
  return experts_prefix(layer) + (f == FusedExperts::GateUp ? "gate_up_proj" : "down_proj");
}

std::string layer_input_name(int64_t layer) {
  return layer == 0 ? capture_name(Op::Embed) : capture_name(layer - 1, Op::ResidMlp);
}

std::string resid_grad_name(int64_t layer) { return "resid_grad." + std::to_string(layer); }

std::string capture_name(Op op) {
  const OpRow& r = row(op);
  if (r.scope != Scope::Model) throw std::logic_error(std::string("graph: ") + r.name + " is a layer's op");
  return r.name;
}

std::string capture_name(int64_t layer, Op op) {
  const OpRow& r = row(op);
  if (r.scope == Scope::Model) throw std::logic_error(std::string("graph: ") + r.name + " is not a layer's op");
  return "layers." + std::to_string(layer) + "." + r.name;
}

std::optional<OpPosition> op_position(const std::string& capture, int num_layers) {
  if (const OpRow* r = find_op(capture, false))
    return OpPosition{r->op == Op::Embed ? -1 : num_layers, static_cast<int>(r - std::begin(kOps))};
  const auto lc = split_layer_capture(capture);
  if (!lc || lc->first >= num_layers) return std::nullopt;
  const OpRow* r = find_op(lc->second, true);
  if (!r) return std::nullopt;
  return OpPosition{lc->first, static_cast<int>(r - std::begin(kOps))};
}

std::vector<std::string> op_inputs(const std::string& capture, int num_layers) {
  const OpRow* r = find_op(capture, false);
  int layer = num_layers;
  if (!r) {
    const auto lc = split_layer_capture(capture);
    if (!lc || lc->first >= num_layers) return {};
    r = find_op(lc->second, true);
    layer = lc->first;
  }
  if (!r) return {};
  std::vector<std::string> in;
  for (int i = 0; i < r->num_inputs; ++i)
    in.push_back(input_name(layer, r->inputs[i]));
  return in;
}

}  // namespace bp::graph
