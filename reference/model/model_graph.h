// The model's graph, written once (SPEC.md §6): every parameter with its Hugging
// Face name, and every captured op output in execution order with the captures it
// reads. The reference's programs, the float64 truth model, the loaders, bisect's
// op order and the reports all name parameters and ops through this table, so no
// name is spelled twice.
//
// Names:
//   parameters  model.embed_tokens.weight, model.layers.{i}.<suffix>,
//               model.layers.{i}.mlp.experts.{e}.<suffix>, model.norm.weight,
//               lm_head.weight (absent when tied)
//   captures    embed, layers.{i}.<op>, final_norm, logits
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bp::graph {

// Where a parameter or op exists: once per model, in every layer, in dense or MoE
// layers only (ModelConfig::is_moe_layer), or once per expert of a MoE layer.
enum class Scope { Model, Layer, DenseLayer, MoeLayer, Expert };

// ---- Parameters, in Hugging Face's state_dict order ----

enum class Param {
  Embed,
  QProj, KProj, VProj, OProj, QNorm, KNorm,
  Router, ExpertGate, ExpertUp, ExpertDown,
  MlpGate, MlpUp, MlpDown,
  InputNorm, PostNorm,
  FinalNorm, LmHead,
};

struct ParamRow {
  Param param;
  Scope scope;
  const char* name;  // whole (Model) or the suffix after the layer's or expert's prefix
};

inline constexpr ParamRow kParams[] = {
    {Param::Embed, Scope::Model, "model.embed_tokens.weight"},
    {Param::QProj, Scope::Layer, "self_attn.q_proj.weight"},
    {Param::KProj, Scope::Layer, "self_attn.k_proj.weight"},
    {Param::VProj, Scope::Layer, "self_attn.v_proj.weight"},
    {Param::OProj, Scope::Layer, "self_attn.o_proj.weight"},
    {Param::QNorm, Scope::Layer, "self_attn.q_norm.weight"},
    {Param::KNorm, Scope::Layer, "self_attn.k_norm.weight"},
    {Param::Router, Scope::MoeLayer, "mlp.gate.weight"},
    {Param::ExpertGate, Scope::Expert, "gate_proj.weight"},
    {Param::ExpertUp, Scope::Expert, "up_proj.weight"},
    {Param::ExpertDown, Scope::Expert, "down_proj.weight"},
    {Param::MlpGate, Scope::DenseLayer, "mlp.gate_proj.weight"},
    {Param::MlpUp, Scope::DenseLayer, "mlp.up_proj.weight"},
    {Param::MlpDown, Scope::DenseLayer, "mlp.down_proj.weight"},
    {Param::InputNorm, Scope::Layer, "input_layernorm.weight"},
    {Param::PostNorm, Scope::Layer, "post_attention_layernorm.weight"},
    {Param::FinalNorm, Scope::Model, "model.norm.weight"},
    {Param::LmHead, Scope::Model, "lm_head.weight"},
};

const ParamRow& row(Param p);

// The Hugging Face name of a Model-scope parameter, of a layer's, of an expert's.
// std::logic_error when the scope does not match.
std::string param_name(Param p);
std::string param_name(int64_t layer, Param p);
std::string param_name(int64_t layer, int64_t expert, Param p);

// "model.layers.{i}.mlp.experts.": where a layer's experts' parameters live, and
// where a checkpoint with fused experts keeps its stacked tensors.
std::string experts_prefix(int64_t layer);

// transformers 5.x may store a MoE layer's experts fused: every expert's gate and up
// projections stacked in one [E, 2·Im, H] tensor (gate rows first), the down
// projections in one [E, H, Im]. The loaders split them into the per-expert
// parameters above; these are their names.
enum class FusedExperts { GateUp, Down };
std::string fused_experts_name(int64_t layer, FusedExperts f);

// ---- Captured ops, in execution order ----

enum class Op {
  Embed,
  InputNorm, QProj, KProj, VProj, QNorm, KNorm, QRope, KRope, Attn, AttnOut, ResidAttn, PostNorm,
  RouterLogits, RouterWeights, ExpertOut,
  MlpGate, MlpUp, MlpAct,
  MlpOut, ResidMlp,
  FinalNorm, Logits,
  LayerInput,  // not an op: what a layer reads (embed, or the previous layer's resid_mlp)
};

struct OpRow {
  Op op;
  Scope scope;  // Model, Layer, DenseLayer or MoeLayer
  const char* name;
  Op inputs[3];  // the captures the op reads, in the same layer; unused slots are Op::LayerInput
  int num_inputs;
};

inline constexpr OpRow kOps[] = {
    {Op::Embed, Scope::Model, "embed", {}, 0},
    {Op::InputNorm, Scope::Layer, "input_norm", {Op::LayerInput}, 1},
    {Op::QProj, Scope::Layer, "q_proj", {Op::InputNorm}, 1},
    {Op::KProj, Scope::Layer, "k_proj", {Op::InputNorm}, 1},
    {Op::VProj, Scope::Layer, "v_proj", {Op::InputNorm}, 1},
    {Op::QNorm, Scope::Layer, "q_norm", {Op::QProj}, 1},
    {Op::KNorm, Scope::Layer, "k_norm", {Op::KProj}, 1},
    {Op::QRope, Scope::Layer, "q_rope", {Op::QNorm}, 1},
    {Op::KRope, Scope::Layer, "k_rope", {Op::KNorm}, 1},
    {Op::Attn, Scope::Layer, "attn", {Op::QRope, Op::KRope, Op::VProj}, 3},
    {Op::AttnOut, Scope::Layer, "attn_out", {Op::Attn}, 1},
    {Op::ResidAttn, Scope::Layer, "resid_attn", {Op::LayerInput, Op::AttnOut}, 2},
    {Op::PostNorm, Scope::Layer, "post_norm", {Op::ResidAttn}, 1},
    {Op::RouterLogits, Scope::MoeLayer, "router_logits", {Op::PostNorm}, 1},
    {Op::RouterWeights, Scope::MoeLayer, "router_weights", {Op::RouterLogits}, 1},
    {Op::ExpertOut, Scope::MoeLayer, "expert_out", {Op::PostNorm, Op::RouterWeights}, 2},
    {Op::MlpGate, Scope::DenseLayer, "mlp_gate", {Op::PostNorm}, 1},
    {Op::MlpUp, Scope::DenseLayer, "mlp_up", {Op::PostNorm}, 1},
    {Op::MlpAct, Scope::DenseLayer, "mlp_act", {Op::MlpGate, Op::MlpUp}, 2},
    {Op::MlpOut, Scope::Layer, "mlp_out", {Op::MlpAct, Op::ExpertOut}, 2},  // a layer has one of the two
    {Op::ResidMlp, Scope::Layer, "resid_mlp", {Op::ResidAttn, Op::MlpOut}, 2},
    {Op::FinalNorm, Scope::Model, "final_norm", {Op::LayerInput}, 1},  // the last layer's output
    {Op::Logits, Scope::Model, "logits", {Op::FinalNorm}, 1},
};

const OpRow& row(Op op);

// Capture names: "embed", "final_norm", "logits"; "layers.{i}.<op>".
std::string capture_name(Op op);
std::string capture_name(int64_t layer, Op op);
// What layer i reads: "embed" for the first, "layers.{i−1}.resid_mlp" after it;
// i = num_layers: what the final norm reads (the last layer's output).
std::string layer_input_name(int64_t layer);
// The backward's gradient of layer i's input, dL/d(layer_input_name(i)), bf16
// [tokens, hidden] (i = num_layers: of the final norm's input): "resid_grad.{i}".
std::string resid_grad_name(int64_t layer);

// "layers.<i>.<op>" -> (i, op) (the op a view into `name`); nullopt for other names.
std::optional<std::pair<int, std::string_view>> split_layer_capture(std::string_view name);

// Where a capture stands in execution order: (layer, index in kOps) with layer −1
// for embed and num_layers for final_norm and logits; nullopt for a name that is
// not a capture of a num_layers-layer model.
struct OpPosition {
  int layer;
  int index;
  auto operator<=>(const OpPosition&) const = default;
};
std::optional<OpPosition> op_position(const std::string& capture, int num_layers);

// The captures `capture` reads ("layers.2.q_norm" -> {"layers.2.q_proj"}); empty
// for embed and for names that are not captures. A layer's mlp_out lists both
// mlp_act and expert_out: the layer has one of them.
std::vector<std::string> op_inputs(const std::string& capture, int num_layers);

}  // namespace bp::graph
