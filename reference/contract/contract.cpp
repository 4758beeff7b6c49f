#include "contract.h"

#include "reference/common/sha256.h"

namespace bp {
namespace {

Contract make_v1(std::string name, DotModel dot) {
  // v1 knob values; SPEC.md §1.2 gives the reason for each.
  return Contract{std::move(name), Knobs{dot, LaneShape{256, 8}, 64, 512, 8, 128}};
}

// v2: v1 with the GPU-native softmax (SPEC.md §1.3).
Contract make_v2(std::string name, DotModel dot) {
  Contract c = make_v1(std::move(name), dot);
  c.knobs.softmax_exp = SoftmaxExp::kExp2Poly;
  c.knobs.log_softmax = LogSoftmax::kOnePass;
  return c;
}

// v3: v2 with 512-token gradient chunks and logprob ≤ 0, entropy ≥ 0 (SPEC.md §1.4).
Contract make_v3(std::string name, DotModel dot) {
  Contract c = make_v2(std::move(name), dot);
  c.knobs.grad_token_chunk = 512;
  c.knobs.sign_clamp = true;
  return c;
}

bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

std::string_view dot_model_name(DotModel m) { return m == DotModel::Sm90Tc ? "sm90-tc" : "fma-seq"; }

std::optional<DotModel> parse_dot_model(std::string_view name) {
  if (name == "fma-seq") return DotModel::FmaSeq;
  if (name == "sm90-tc") return DotModel::Sm90Tc;
  return std::nullopt;
}

std::string_view softmax_exp_name(SoftmaxExp e) { return e == SoftmaxExp::kExp2Poly ? "exp2_poly" : "exp"; }
std::string_view log_softmax_name(LogSoftmax l) { return l == LogSoftmax::kOnePass ? "one-pass" : "two-pass"; }

std::string Contract::canonical_knobs() const {
  const Knobs& k = knobs;
  const Knobs v1 = make_v1("", k.dot).knobs;
  // Keys sorted; a later knob at its v1 value is left out (v1's texts predate it).
  std::string log_softmax, sign_clamp, softmax_exp;
  if (k.log_softmax != v1.log_softmax) log_softmax = ",\"log_softmax\":\"" + std::string(log_softmax_name(k.log_softmax)) + "\"";
  if (k.sign_clamp != v1.sign_clamp) sign_clamp = ",\"sign_clamp\":true";
  if (k.softmax_exp != v1.softmax_exp) softmax_exp = ",\"softmax_exp\":\"" + std::string(softmax_exp_name(k.softmax_exp)) + "\"";
  return "{\"attn_kv_block\":" + std::to_string(k.attn_kv_block) +
         ",\"attn_kv_split\":" + std::to_string(k.attn_kv_split) + ",\"dot\":\"" +
         std::string(dot_model_name(k.dot)) + "\",\"grad_token_chunk\":" + std::to_string(k.grad_token_chunk) +
         log_softmax + ",\"row_reduce_lanes\":" + std::to_string(k.row_reduce.lanes) +
         ",\"row_reduce_vec\":" + std::to_string(k.row_reduce.vec) + sign_clamp + softmax_exp +
         ",\"tp_tree_width\":" + std::to_string(k.tp_tree_width) + "}";
}

std::string Contract::knob_hash() const { return sha256_hex(canonical_knobs()).substr(0, 16); }

const std::vector<Contract>& contracts() {
  static const std::vector<Contract> all = {
      make_v1("bf16-sm90tc-v1", DotModel::Sm90Tc), make_v1("bf16-fmaseq-v1", DotModel::FmaSeq),
      make_v2("bf16-sm90tc-v2", DotModel::Sm90Tc), make_v2("bf16-fmaseq-v2", DotModel::FmaSeq),
      make_v3("bf16-sm90tc-v3", DotModel::Sm90Tc), make_v3("bf16-fmaseq-v3", DotModel::FmaSeq)};
  return all;
}

const std::vector<std::string>& default_contract_names() {
  static const std::vector<std::string> names = {"bf16-sm90tc-v3", "bf16-fmaseq-v3"};
  return names;
}

const Contract* find_contract(std::string_view name) {
  for (const Contract& c : contracts())
    if (c.name == name) return &c;
  return nullptr;
}

std::string validate(const Knobs& k) {
  if (k.row_reduce.lanes < 32 || !power_of_two(k.row_reduce.lanes))
    return "row_reduce_lanes must be a power of two >= 32";
  if (k.row_reduce.vec < 1) return "row_reduce_vec must be >= 1";
  if (k.attn_kv_block < 1) return "attn_kv_block must be >= 1";
  if (k.attn_kv_split < k.attn_kv_block || k.attn_kv_split % k.attn_kv_block != 0)
    return "attn_kv_split must be a positive multiple of attn_kv_block";
  if (!power_of_two(k.tp_tree_width)) return "tp_tree_width must be a power of two";
  if (k.grad_token_chunk < 1) return "grad_token_chunk must be >= 1";
  return {};
}

}  // namespace bp
