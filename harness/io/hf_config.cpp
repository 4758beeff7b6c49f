#include "harness/io/hf_config.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "harness/io/files.h"
#include "harness/io/json_strict.h"

namespace bp::io {

using nlohmann::json;

namespace {

constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;  // any one size or count

// "an integer 64", "a string \"64\"", "null" (long values cut).
std::string describe(const json& v) {
  if (v.is_null()) return "null";
  std::string d = v.dump();
  if (d.size() > 60) d = d.substr(0, 57) + "...";
  return std::string(json_type_word(v)) + " " + d;
}

class Reader {
 public:
  Reader(const json& root, const std::string& path) : root_(root), path_(path) {}

  bool has(const std::string& k) const { return root_.contains(k); }
  const json& get(const std::string& k) {
    used_.insert(k);
    return root_.at(k);
  }
  void use(const std::string& k) { used_.insert(k); }
  const std::set<std::string>& used() const { return used_; }

  [[noreturn]] void bad(const std::string& field, const std::string& msg) const { throw BadInput(path_, field, msg); }

  void need(const std::string& k, const std::string& why = "") const {
    if (!root_.contains(k))
      bad(k, "required field is missing" + (why.empty() ? std::string() : " (" + why + ")") +
                 "; bitparity does not fill in a default for it");
  }

  int64_t integer(const std::string& k, const json& v, int64_t lo, int64_t hi) const {
    if (v.is_boolean() || !v.is_number_integer())
      bad(k, "must be an integer, got " + describe(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi) : v.get<int64_t>() > hi)
      bad(k, v.dump() + " is too large (at most " + std::to_string(hi) + ")");
    const int64_t x = v.get<int64_t>();
    if (x < lo) bad(k, v.dump() + " is out of range (at least " + std::to_string(lo) + ")");
    return x;
  }
  int64_t req_int(const std::string& k, int64_t lo = 1, int64_t hi = kMaxSize) {
    need(k);
    return integer(k, get(k), lo, hi);
  }
  int64_t opt_int(const std::string& k, int64_t def, int64_t lo = 1, int64_t hi = kMaxSize) {
    if (!has(k)) return def;
    return integer(k, get(k), lo, hi);
  }
  double number(const std::string& k, const json& v) const {
    if (v.is_boolean() || !v.is_number()) bad(k, "must be a number, got " + describe(v));
    const double x = v.get<double>();
    if (!std::isfinite(x)) bad(k, "must be finite, got " + v.dump());
    return x;
  }
  bool boolean(const std::string& k, const json& v) const {
    if (!v.is_boolean()) bad(k, "must be true or false, got " + describe(v));
    return v.get<bool>();
  }
  std::string string(const std::string& k, const json& v) const {
    if (!v.is_string()) bad(k, "must be a string, got " + describe(v));
    return v.get<std::string>();
  }
  bool req_bool(const std::string& k) {
    need(k);
    return boolean(k, get(k));
  }

 private:
  const json& root_;
  const std::string& path_;
  std::set<std::string> used_;
};

// Read and ignored: they do not change the bits bitparity computes (the value's
// type is still checked so that a garbled file is caught).
enum class Harmless { Any, String, Number, Bool, TokenId, StringList };
const std::map<std::string, Harmless>& harmless_fields() {
  static const std::map<std::string, Harmless> m = {
      {"transformers_version", Harmless::String},
      {"torch_dtype", Harmless::String},  // storage dtype; weights are converted to bf16 on load
      {"dtype", Harmless::String},
      {"_name_or_path", Harmless::String},
      {"initializer_range", Harmless::Number},
      {"use_cache", Harmless::Bool},
      {"output_attentions", Harmless::Bool},
      {"output_hidden_states", Harmless::Bool},
      {"return_dict", Harmless::Bool},
      {"use_bfloat16", Harmless::Bool},
      {"bos_token_id", Harmless::TokenId},
      {"eos_token_id", Harmless::TokenId},
      {"pad_token_id", Harmless::TokenId},
      {"output_router_logits", Harmless::Bool},   // router aux loss is outside the contract
      {"router_aux_loss_coef", Harmless::Number},  // likewise
      {"sliding_window", Harmless::Any},           // only meaningful with use_sliding_window (refused)
      {"max_window_layers", Harmless::Any},        // likewise
  };
  return m;
}

// Fields of the other model type, for a clearer refusal.
const std::set<std::string>& moe_only_fields() {
  static const std::set<std::string> s = {"num_experts",      "num_local_experts",     "num_experts_per_tok",
                                          "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
                                          "mlp_only_layers",  "output_router_logits",  "router_aux_loss_coef"};
  return s;
}

void check_harmless(Reader& r, const std::string& k, Harmless kind, const json& v) {
  switch (kind) {
    case Harmless::Any: return;
    case Harmless::String: r.string(k, v); return;
    case Harmless::Number: r.number(k, v); return;
    case Harmless::Bool: r.boolean(k, v); return;
    case Harmless::StringList: return;
    case Harmless::TokenId:
      if (v.is_null() || (v.is_number_integer() && !v.is_boolean())) return;
      if (v.is_array()) {
        for (const json& e : v)
          if (!e.is_number_integer() || e.is_boolean()) r.bad(k, "must be an integer, a list of integers or null, got " + describe(v));
        return;
      }
      r.bad(k, "must be an integer, a list of integers or null, got " + describe(v));
  }
}

// RoPE: the default (unscaled, full-rotary) RoPE only. Returns theta.
double parse_rope(Reader& r, const json& root) {
  std::optional<double> theta;
  std::string theta_from;
  auto take_theta = [&](const std::string& field, double t) {
    if (!(t > 0)) r.bad(field, "rope theta must be positive, got " + std::to_string(t));
    if (theta && *theta != t)
      r.bad(field, "rope theta " + std::to_string(t) + " disagrees with " + theta_from + " = " + std::to_string(*theta));
    theta = t;
    theta_from = field;
  };
  if (root.contains("rope_theta")) take_theta("rope_theta", r.number("rope_theta", r.get("rope_theta")));

  auto rope_object = [&](const std::string& name) {
    const json& o = r.get(name);
    if (o.is_null()) return;
    if (!o.is_object()) r.bad(name, std::string("must be an object or null, got ") + json_type_word(o));
    for (const char* key : {"rope_type", "type"})  // the type first: it explains the other keys
      if (o.contains(key)) {
        const std::string f = name + "." + key;
        const std::string t = r.string(f, o[key]);
        if (t != "default")
          r.bad(f, "RoPE type \"" + t + "\" is not supported: bitparity implements the default (unscaled) RoPE only");
      }
    for (auto it = o.begin(); it != o.end(); ++it) {
      const std::string f = name + "." + it.key();
      const json& v = it.value();
      if (it.key() == "rope_type" || it.key() == "type") {
        // checked above
      } else if (it.key() == "rope_theta") {
        take_theta(f, r.number(f, v));
      } else if (it.key() == "partial_rotary_factor") {
        if (r.number(f, v) != 1.0) r.bad(f, "partial rotary embeddings are not supported (must be 1.0)");
      } else {
        r.bad(f, "RoPE parameter \"" + it.key() + "\" is not supported: bitparity implements the default (unscaled) RoPE only");
      }
    }
  };
  if (root.contains("rope_scaling")) rope_object("rope_scaling");
  if (root.contains("rope_parameters")) rope_object("rope_parameters");
  if (root.contains("partial_rotary_factor")) {
    if (r.number("partial_rotary_factor", r.get("partial_rotary_factor")) != 1.0)
      r.bad("partial_rotary_factor", "partial rotary embeddings are not supported (must be 1.0)");
  }
  if (!theta)
    r.bad("rope_theta", "required field is missing (neither rope_theta nor rope_parameters.rope_theta is given)");
  if (!(static_cast<float>(*theta) > 0) || !std::isfinite(static_cast<float>(*theta)))
    r.bad(theta_from, "rope theta is not a positive finite fp32 value");
  return *theta;
}

}  // namespace

ModelConfig parse_hf_config(std::string_view json_text, const std::string& path, bool allow_unknown_fields) {
  const json root = parse_json_strict(json_text, path);
  if (!root.is_object()) throw BadInput(path, "", std::string("config.json is ") + json_type_word(root) + ", not an object");
  Reader r(root, path);
  ModelConfig c;

  r.need("model_type");
  c.model_type = r.string("model_type", r.get("model_type"));
  if (c.model_type != "qwen3" && c.model_type != "qwen3_moe")
    r.bad("model_type", "unsupported model_type \"" + c.model_type + "\" (bitparity supports qwen3 and qwen3_moe)");
  const bool moe = c.is_moe_model();

  if (r.has("architectures")) {
    const json& a = r.get("architectures");
    const std::string want = moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM";
    if (!a.is_null()) {
      if (!a.is_array() || a.size() != 1 || !a[0].is_string() || a[0].get<std::string>() != want)
        r.bad("architectures", "must be [\"" + want + "\"] for model_type " + c.model_type + ", got " + describe(a) +
                                   " (other heads are not supported)");
    }
  }

  c.hidden_size = r.req_int("hidden_size");
  c.num_hidden_layers = r.req_int("num_hidden_layers");
  c.num_attention_heads = r.req_int("num_attention_heads");
  r.need("num_key_value_heads");
  {
    const json& v = r.get("num_key_value_heads");
    if (v.is_null() && !moe)
      c.num_key_value_heads = c.num_attention_heads;  // Qwen3Config: None means multi-head attention
    else
      c.num_key_value_heads = r.integer("num_key_value_heads", v, 1, kMaxSize);
  }
  if (r.has("head_dim")) {
    c.head_dim = r.integer("head_dim", r.get("head_dim"), 1, kMaxSize);
  } else if (moe) {
    // Qwen3MoeAttention: getattr(config, "head_dim", hidden_size // num_attention_heads).
    c.head_dim = c.hidden_size / c.num_attention_heads;
    if (c.head_dim == 0) r.bad("head_dim", "absent, and hidden_size / num_attention_heads is 0");
  } else {
    c.head_dim = 128;  // Qwen3Config's class default (not hidden_size / heads)
  }
  c.intermediate_size = r.req_int("intermediate_size");
  c.vocab_size = r.req_int("vocab_size");
  c.max_position_embeddings = r.req_int("max_position_embeddings");
  c.tie_word_embeddings = r.req_bool("tie_word_embeddings");

  r.need("rms_norm_eps");
  c.rms_norm_eps = r.number("rms_norm_eps", r.get("rms_norm_eps"));
  if (!(c.rms_norm_eps > 0) || !(static_cast<float>(c.rms_norm_eps) > 0))
    r.bad("rms_norm_eps", "must be positive (and not zero in fp32)");
  c.rope_theta = parse_rope(r, root);

  // Values that bitparity implements in one setting only.
  if (r.has("hidden_act")) {
    const std::string act = r.string("hidden_act", r.get("hidden_act"));
    if (act != "silu") r.bad("hidden_act", "activation \"" + act + "\" is not supported (only silu)");
  }
  if (r.has("attention_bias") && r.boolean("attention_bias", r.get("attention_bias")))
    r.bad("attention_bias", "attention biases are not supported (Qwen3 has none; must be false)");
  if (r.has("use_sliding_window") && r.boolean("use_sliding_window", r.get("use_sliding_window")))
    r.bad("use_sliding_window", "sliding-window attention is not supported (must be false)");
  if (r.has("attention_dropout") && r.number("attention_dropout", r.get("attention_dropout")) != 0.0)
    r.bad("attention_dropout", "attention dropout changes training numerics and is not supported (must be 0)");
  if (r.has("layer_types")) {
    const json& lt = r.get("layer_types");
    if (!lt.is_null()) {
      if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_hidden_layers)
        r.bad("layer_types", "must be a list of num_hidden_layers (" + std::to_string(c.num_hidden_layers) + ") strings");
      for (size_t i = 0; i < lt.size(); ++i)
        if (!lt[i].is_string() || lt[i].get<std::string>() != "full_attention")
          r.bad("layer_types", "layer " + std::to_string(i) + " is " + lt[i].dump() +
                                   "; only \"full_attention\" is supported");
    }
  }
  if (r.has("quantization_config")) r.bad("quantization_config", "quantized checkpoints are not supported");

  if (moe) {
    const bool a = r.has("num_experts"), b = r.has("num_local_experts");
    if (!a && !b) r.bad("num_experts", "required field is missing; bitparity does not fill in a default for it");
    if (a) c.num_experts = r.integer("num_experts", r.get("num_experts"), 0, kMaxSize);
    if (b) {
      const int64_t n = r.integer("num_local_experts", r.get("num_local_experts"), 0, kMaxSize);
      if (a && n != c.num_experts)
        r.bad("num_local_experts", std::to_string(n) + " disagrees with num_experts = " + std::to_string(c.num_experts));
      c.num_experts = n;
    }
    c.num_experts_per_tok = r.req_int("num_experts_per_tok");
    c.moe_intermediate_size = r.req_int("moe_intermediate_size");
    c.norm_topk_prob = r.req_bool("norm_topk_prob");
    c.decoder_sparse_step = r.opt_int("decoder_sparse_step", 1);
    if (r.has("mlp_only_layers")) {
      const json& v = r.get("mlp_only_layers");
      if (!v.is_null()) {
        if (!v.is_array()) r.bad("mlp_only_layers", std::string("must be a list of layer indices, got ") + json_type_word(v));
        std::set<int64_t> seen;
        for (const json& e : v) {
          const int64_t i = r.integer("mlp_only_layers", e, 0, c.num_hidden_layers - 1);
          if (!seen.insert(i).second) r.bad("mlp_only_layers", "layer " + std::to_string(i) + " is listed twice");
          c.mlp_only_layers.push_back(i);
        }
      }
    }
    for (const char* k : {"output_router_logits", "router_aux_loss_coef"})
      if (r.has(k)) check_harmless(r, k, harmless_fields().at(k), r.get(k));
  }

  // Everything not consumed above: harmless, other model type's, or unknown.
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& k = it.key();
    if (r.used().count(k)) continue;
    const auto h = harmless_fields().find(k);
    if (h != harmless_fields().end() && !(moe_only_fields().count(k) && !moe)) {
      check_harmless(r, k, h->second, it.value());
      continue;
    }
    if (allow_unknown_fields) continue;
    if (!moe && moe_only_fields().count(k))
      r.bad(k, "field \"" + k + "\" belongs to qwen3_moe configs but model_type is qwen3; bitparity refuses to guess");
    r.bad(k, "unknown field \"" + k + "\" in config.json; bitparity refuses to guess (allow_unknown_fields ignores it)");
  }

  // Consistency.
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.bad("num_key_value_heads", std::to_string(c.num_key_value_heads) + " does not divide num_attention_heads = " +
                                     std::to_string(c.num_attention_heads));
  if (c.head_dim % 2 != 0) r.bad("head_dim", std::to_string(c.head_dim) + " is odd; RoPE's half split needs it even");
  if (c.num_attention_heads * c.head_dim > kMaxSize) r.bad("head_dim", "num_attention_heads * head_dim is too large");
  if (moe && c.num_experts > 0) {
    if (c.num_experts_per_tok > c.num_experts)
      r.bad("num_experts_per_tok", std::to_string(c.num_experts_per_tok) + " exceeds num_experts = " +
                                       std::to_string(c.num_experts));
  }
  return c;
}

ModelConfig load_hf_config(const std::string& path, bool allow_unknown_fields) {
  std::string file = path;
  if (path_type(path) == std::filesystem::file_type::directory)
    file = (std::filesystem::path(path) / "config.json").string();
  return parse_hf_config(read_text_file(file), file, allow_unknown_fields);
}

}  // namespace bp::io
