// The model's shape: a Qwen3 dense or Qwen3-MoE configuration, as Hugging Face's
// config.json describes it (harness/io/hf_config.h parses and validates one).
// Plain data; the reference model reads it, nothing here does I/O.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace bp {

struct ModelConfig {
  std::string model_type;  // "qwen3" or "qwen3_moe"

  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;           // from config.json; hidden_size / heads only when absent (HF's rule)
  int64_t intermediate_size = 0;  // dense MLP layers
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;  // lm_head is model.embed_tokens.weight

  double rope_theta = 0;    // the reference rounds it to fp32 (as HF's inv_freq computation does)
  double rms_norm_eps = 0;  // likewise fp32 in the RMSNorm

  // Qwen3-MoE (zero / empty / false for a dense model).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  bool is_moe_model() const { return model_type == "qwen3_moe"; }

  // Hugging Face's rule (Qwen3MoeDecoderLayer): layer i has the sparse MoE block iff
  // i is not in mlp_only_layers, num_experts > 0 and (i + 1) % decoder_sparse_step == 0;
  // otherwise a dense MLP of intermediate_size. Always false for model_type qwen3.
  bool is_moe_layer(int64_t i) const {
    if (!is_moe_model() || num_experts <= 0 || decoder_sparse_step <= 0) return false;
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end()) return false;
    return (i + 1) % decoder_sparse_step == 0;
  }
  // How many layers is_moe_layer; one comparison of the model type for all of them.
  int64_t moe_layer_count() const {
    if (!is_moe_model() || num_experts <= 0 || decoder_sparse_step <= 0) return 0;
    int64_t n = 0;
    for (int64_t i = decoder_sparse_step - 1; i < num_hidden_layers; i += decoder_sparse_step)
      n += std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) == mlp_only_layers.end();
    return n;
  }

  int64_t q_dim() const { return num_attention_heads * head_dim; }   // q_proj out, o_proj in
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }  // k_proj / v_proj out
};

}  // namespace bp
