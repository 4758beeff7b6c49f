// libFuzzer target: the Hugging Face config.json parser (harness/io/hf_config.h).
//
// Every input is parsed strictly (allow_unknown_fields false) and leniently (true).
// Contract: only bp::io::BadInput may escape; any other exception, a crash or a
// sanitizer report is a finding. Leniency only ever adds acceptance: a config the
// strict parse accepts, the lenient one accepts with the same result. An accepted
// config holds the invariants the reference model relies on.
#include <cstdint>
#include <optional>
#include <string_view>

#include "fuzz_contract.h"
#include "harness/io/hf_config.h"

namespace {

std::optional<bp::ModelConfig> parse(std::string_view text, bool allow_unknown_fields) {
  std::optional<bp::ModelConfig> c;
  bp::fuzz::allow_bad_input([&] { c = bp::io::parse_hf_config(text, "fuzz/config.json", allow_unknown_fields); });
  return c;
}

bool same(const bp::ModelConfig& a, const bp::ModelConfig& b) {
  return a.model_type == b.model_type && a.hidden_size == b.hidden_size && a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads && a.num_key_value_heads == b.num_key_value_heads &&
         a.head_dim == b.head_dim && a.intermediate_size == b.intermediate_size && a.vocab_size == b.vocab_size &&
         a.max_position_embeddings == b.max_position_embeddings && a.tie_word_embeddings == b.tie_word_embeddings &&
         a.rope_theta == b.rope_theta && a.rms_norm_eps == b.rms_norm_eps && a.num_experts == b.num_experts &&
         a.num_experts_per_tok == b.num_experts_per_tok && a.moe_intermediate_size == b.moe_intermediate_size &&
         a.norm_topk_prob == b.norm_topk_prob && a.decoder_sparse_step == b.decoder_sparse_step &&
         a.mlp_only_layers == b.mlp_only_layers;
}

void check_invariants(const bp::ModelConfig& c) {
  using bp::fuzz::require;
  require(c.model_type == "qwen3" || c.model_type == "qwen3_moe", "accepted an unsupported model_type");
  require(c.hidden_size > 0 && c.num_hidden_layers > 0 && c.num_attention_heads > 0 && c.num_key_value_heads > 0 &&
              c.head_dim > 0 && c.intermediate_size > 0 && c.vocab_size > 0 && c.max_position_embeddings > 0,
          "accepted a non-positive size");
  require(c.num_attention_heads % c.num_key_value_heads == 0, "accepted kv heads that do not divide the heads");
  require(c.head_dim % 2 == 0, "accepted an odd head_dim");
  require(c.rope_theta > 0 && c.rms_norm_eps > 0, "accepted a non-positive rope_theta or rms_norm_eps");
  for (const int64_t i : c.mlp_only_layers)
    require(i >= 0 && i < c.num_hidden_layers, "accepted an mlp_only_layers index outside the model");
  if (c.is_moe_model() && c.num_experts > 0)
    require(c.num_experts_per_tok <= c.num_experts, "accepted more experts per token than experts");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::optional<bp::ModelConfig> strict = parse(text, false);
  const std::optional<bp::ModelConfig> lenient = parse(text, true);
  if (strict) {
    bp::fuzz::require(lenient && same(*strict, *lenient), "allow_unknown_fields changed an accepted config");
    check_invariants(*strict);
  }
  if (lenient) check_invariants(*lenient);
  return 0;
}
