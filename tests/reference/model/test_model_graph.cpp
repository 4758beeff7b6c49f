// The model graph (reference/model/model_graph.h): parameter names in Hugging
// Face's state_dict order, capture names, execution order and op inputs. The names
// here are written out on purpose: they are what checkpoints and dumps contain.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "reference/model/model_graph.h"
#include "reference/model/weights.h"

namespace bp {
namespace {

using graph::Op;
using graph::Param;

ModelConfig moe_config() {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 12;
  c.vocab_size = 16;
  c.num_experts = 2;
  c.num_experts_per_tok = 1;
  c.moe_intermediate_size = 6;
  c.mlp_only_layers = {0};
  return c;
}

std::vector<std::string> names(const std::vector<WeightSpec>& specs) {
  std::vector<std::string> n;
  for (const WeightSpec& s : specs) n.push_back(s.name);
  return n;
}

TEST(ModelGraph, WeightSpecsFollowHuggingFaceStateDictOrder) {
  const std::vector<std::string> want = {
      "model.embed_tokens.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.self_attn.q_norm.weight",
      "model.layers.0.self_attn.k_norm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.1.self_attn.q_proj.weight",
      "model.layers.1.self_attn.k_proj.weight",
      "model.layers.1.self_attn.v_proj.weight",
      "model.layers.1.self_attn.o_proj.weight",
      "model.layers.1.self_attn.q_norm.weight",
      "model.layers.1.self_attn.k_norm.weight",
      "model.layers.1.mlp.gate.weight",
      "model.layers.1.mlp.experts.0.gate_proj.weight",
      "model.layers.1.mlp.experts.0.up_proj.weight",
      "model.layers.1.mlp.experts.0.down_proj.weight",
      "model.layers.1.mlp.experts.1.gate_proj.weight",
      "model.layers.1.mlp.experts.1.up_proj.weight",
      "model.layers.1.mlp.experts.1.down_proj.weight",
      "model.layers.1.input_layernorm.weight",
      "model.layers.1.post_attention_layernorm.weight",
      "model.norm.weight",
      "lm_head.weight",
  };
  ModelConfig c = moe_config();
  EXPECT_EQ(names(weight_specs(c)), want);
  c.tie_word_embeddings = true;
  EXPECT_EQ(names(weight_specs(c)).back(), "model.norm.weight") << "a tied model has no lm_head.weight";
}

TEST(ModelGraph, WeightShapesAreNnLinearOutByIn) {
  const ModelConfig c = moe_config();
  for (const WeightSpec& s : weight_specs(c)) {
    if (s.name == "model.layers.0.self_attn.o_proj.weight") EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 8}));
    if (s.name == "model.layers.0.self_attn.k_proj.weight") EXPECT_EQ(s.shape, (std::vector<int64_t>{4, 8}));
    if (s.name == "model.layers.0.mlp.down_proj.weight") EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 12}));
    if (s.name == "model.layers.1.mlp.gate.weight") EXPECT_EQ(s.shape, (std::vector<int64_t>{2, 8}));
    if (s.name == "model.layers.1.mlp.experts.1.down_proj.weight") EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 6}));
    if (s.name == "model.layers.1.self_attn.q_norm.weight") EXPECT_EQ(s.shape, (std::vector<int64_t>{4}));
  }
}

TEST(ModelGraph, NamesRefuseTheWrongScope) {
  EXPECT_EQ(graph::param_name(3, 7, Param::ExpertUp), "model.layers.3.mlp.experts.7.up_proj.weight");
  EXPECT_EQ(graph::experts_prefix(3), "model.layers.3.mlp.experts.");
  EXPECT_THROW(graph::param_name(Param::QProj), std::logic_error);
  EXPECT_THROW(graph::param_name(0, Param::Embed), std::logic_error);
  EXPECT_THROW(graph::param_name(0, 0, Param::MlpUp), std::logic_error);
  EXPECT_EQ(graph::capture_name(2, Op::QRope), "layers.2.q_rope");
  EXPECT_EQ(graph::capture_name(Op::Logits), "logits");
  EXPECT_THROW(graph::capture_name(Op::QRope), std::logic_error);
  EXPECT_THROW(graph::capture_name(0, Op::FinalNorm), std::logic_error);
}

TEST(ModelGraph, ExecutionOrderRunsLayerByLayer) {
  const int L = 2;
  const std::vector<std::string> order = {"embed",           "layers.0.input_norm", "layers.0.q_proj",
                                          "layers.0.attn",   "layers.0.resid_mlp",  "layers.1.input_norm",
                                          "layers.1.mlp_out", "final_norm",         "logits"};
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    const auto a = graph::op_position(order[i], L), b = graph::op_position(order[i + 1], L);
    ASSERT_TRUE(a && b) << order[i] << " / " << order[i + 1];
    EXPECT_LT(*a, *b) << order[i] << " runs before " << order[i + 1];
  }
  EXPECT_FALSE(graph::op_position("layers.0.nonsense", L));
  EXPECT_FALSE(graph::op_position("layers.2.q_proj", L)) << "a 2-layer model has no layer 2";
  EXPECT_FALSE(graph::op_position("layers.x.q_proj", L));
  EXPECT_FALSE(graph::op_position("grads.lm_head.weight", L));
}

TEST(ModelGraph, OpInputsNameTheCapturesAnOpReads) {
  const int L = 2;
  using V = std::vector<std::string>;
  EXPECT_EQ(graph::op_inputs("layers.0.input_norm", L), V{"embed"});
  EXPECT_EQ(graph::op_inputs("layers.1.input_norm", L), V{"layers.0.resid_mlp"});
  EXPECT_EQ(graph::op_inputs("layers.1.resid_attn", L), (V{"layers.0.resid_mlp", "layers.1.attn_out"}));
  EXPECT_EQ(graph::op_inputs("layers.0.attn", L), (V{"layers.0.q_rope", "layers.0.k_rope", "layers.0.v_proj"}));
  EXPECT_EQ(graph::op_inputs("layers.1.mlp_out", L), (V{"layers.1.mlp_act", "layers.1.expert_out"}));
  EXPECT_EQ(graph::op_inputs("final_norm", L), V{"layers.1.resid_mlp"});
  EXPECT_EQ(graph::op_inputs("logits", L), V{"final_norm"});
  EXPECT_TRUE(graph::op_inputs("embed", L).empty());
  EXPECT_TRUE(graph::op_inputs("layers.0.bogus", L).empty());
}

}  // namespace
}  // namespace bp
