#include "program/layouts/layout.h"

#include <regex>

#include "program/layouts/sharding.h"

namespace bp::layouts {

std::string Layout::name() const {
  std::string s = "tp" + std::to_string(tp) + "-ep" + std::to_string(ep) + "-cp" + std::to_string(cp);
  if (cp_split == CpSplit::Zigzag) s += "z";
  if (reduction == Reduction::Ring) s += "+ring";
  if (reduction == Reduction::NcclBf16Sum) s += "+nccl-bf16sum";
  return s;
}

std::optional<Layout> parse_layout(const std::string& s, std::string* why) {
  static const std::regex form(R"(tp([1-9][0-9]{0,2})-ep([1-9][0-9]{0,2})-cp([1-9][0-9]{0,2})(z?)(\+ring|\+nccl-bf16sum)?)");
  std::smatch m;
  if (!std::regex_match(s, m, form)) {
    // The caller quotes the name (cut to a readable length: it may be anything a user typed).
    if (why) *why = "not of the form tp<N>-ep<N>-cp<N>[z][+ring|+nccl-bf16sum] (N at most 3 digits)";
    return std::nullopt;
  }
  Layout l;
  l.tp = std::stoi(m[1]);
  l.ep = std::stoi(m[2]);
  l.cp = std::stoi(m[3]);
  l.cp_split = m[4].length() ? CpSplit::Zigzag : CpSplit::Contiguous;
  l.reduction = m[5] == "+ring" ? Reduction::Ring : m[5].length() ? Reduction::NcclBf16Sum : Reduction::Tree;
  return l;
}

namespace {
std::string not_dividing(const char* what, int n, const char* field, int64_t value) {
  return std::string(what) + " " + std::to_string(n) + " does not divide " + field + " " + std::to_string(value);
}
}  // namespace

std::string shard_check(const Layout& l, const ModelConfig& cfg, const Knobs& kn) {
  if (l.tp < 1 || l.ep < 1 || l.cp < 1) return "layout sizes must be >= 1";
  if (l.world() > 64) return "layout " + l.name() + " has " + std::to_string(l.world()) + " ranks; at most 64 are emulated";
  const int C = kn.tp_tree_width;
  // Row-parallel K and vocabulary reductions are C fixed chunks; a rank must hold
  // whole chunks, so tp divides C (C a power of two: every aligned subtree is a tree).
  if (C % l.tp != 0) return not_dividing("tp", l.tp, "the contract's tp_tree_width", C);
  if (cfg.num_attention_heads % l.tp) return not_dividing("tp", l.tp, "num_attention_heads", cfg.num_attention_heads);
  // kv heads are sharded whole (tp divides them) or replicated whole (tp a multiple of them).
  if (cfg.num_key_value_heads % l.tp && l.tp % cfg.num_key_value_heads)
    return "tp " + std::to_string(l.tp) + " neither divides num_key_value_heads " +
           std::to_string(cfg.num_key_value_heads) +
           " nor is a multiple of it (kv heads are sharded whole or replicated whole)";
  // A tp shard holds C/tp of the C fixed chunks (SPEC.md §2.4.1, §7). TP splits heads
  // evenly, so q and kv dims need whole chunks; intermediate and vocab take any size
  // (the tail ranks' slices shorter) as long as every rank holds some.
  if (l.tp > 1) {
    for (auto [field, value] :
         {std::pair{"q dim (heads x head_dim)", cfg.q_dim()}, std::pair{"kv dim (kv heads x head_dim)", cfg.kv_dim()}})
      if (value % C)
        return "tp " + std::to_string(l.tp) + " needs " + field + " " + std::to_string(value) +
               " to be a multiple of tp_tree_width " + std::to_string(C) +
               " (heads are split evenly, so each rank's chunks must be whole; such models run at tp 1)";
    bool dense_layers = false;
    for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) dense_layers |= !cfg.is_moe_layer(i);
    for (auto [field, value] : {std::pair{"intermediate_size", dense_layers ? cfg.intermediate_size : int64_t{0}},
                                std::pair{"vocab_size", cfg.vocab_size}}) {
      const int size = static_cast<int>(value), last = l.tp - 1, n = fixed_chunk_len(size, C);
      if (size > 0 && Slice::of_chunks(size, C, l.tp, last).len == 0)
        return "tp " + std::to_string(l.tp) + " would leave rank " + std::to_string(last) + " no element of " + field +
               " " + std::to_string(size) + " (" + std::to_string(C) + " chunks of " + std::to_string(n) + "; rank " +
               std::to_string(last) + "'s start at element " + std::to_string(int64_t{n} * (C - C / l.tp)) + ")";
    }
  }
  if (l.ep > 1 && !cfg.is_moe_model()) return "ep " + std::to_string(l.ep) + " needs a MoE model (model_type qwen3_moe)";
  if (cfg.is_moe_model() && cfg.num_experts % l.ep) return not_dividing("ep", l.ep, "num_experts", cfg.num_experts);
  return "";
}

}  // namespace bp::layouts
