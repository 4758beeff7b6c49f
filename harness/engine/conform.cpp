#include "harness/engine/conform.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>

#include <nlohmann/json.hpp>

#include "harness/engine/cases.h"
#include "harness/engine/single_case.h"
#include "harness/engine/work.h"
#include "harness/io/errors.h"
#include "harness/io/safetensors.h"
#include "reference/truth/qwen3.h"

namespace bp::harness {

namespace {

using io::BadInput;
namespace fs = std::filesystem;

// A tokens file written for the case engine from a capture's JSON, removed after.
class TokensFile {
 public:
  explicit TokensFile(const std::string& json)
      : path_((fs::temp_directory_path() / ("bitparity-conform-" + std::to_string(::getpid()) + ".json")).string()) {
    std::ofstream(path_, std::ios::binary) << json;
  }
  ~TokensFile() { std::error_code ec; fs::remove(path_, ec); }
  TokensFile(const TokensFile&) = delete;
  TokensFile& operator=(const TokensFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The dump's tokens into the plan: a tokens file's JSON (a capture), or "seed S
// lengths a,b,..." / "file PATH" (bitparity run's dumps).
std::unique_ptr<TokensFile> set_tokens(const io::SafetensorsFile& f, SweepPlan& plan) {
  const auto it = f.metadata().find("bitparity.tokens");
  if (it == f.metadata().end())
    throw BadInput(f.path(), "bitparity.tokens",
                   "missing: conform runs the tokens the engine ran (bitparity.capture and bitparity run record them)");
  const std::string& text = it->second;
  if (text.rfind("{", 0) == 0) {
    auto file = std::make_unique<TokensFile>(text);
    plan.tokens.file = file->path();
    return file;
  }
  static const std::regex seeded(R"(seed (\d{1,19}) lengths (\d{1,9}(,\d{1,9})*))");
  std::smatch m;
  if (std::regex_match(text, m, seeded)) {
    plan.tokens.seed = std::stoull(m[1].str());
    plan.tokens.lengths.clear();
    for (size_t at = 0, end; at <= m[2].str().size(); at = end + 1) {
      end = std::min(m[2].str().find(',', at), m[2].str().size());
      plan.tokens.lengths.push_back(std::stoi(m[2].str().substr(at, end - at)));
    }
    return nullptr;
  }
  if (text.rfind("file ", 0) == 0) {
    plan.tokens.file = text.substr(5);
    return nullptr;
  }
  throw BadInput(f.path(), "bitparity.tokens",
                 "expected a tokens file's JSON {\"sequences\": ...}, \"seed S lengths a,b\" or \"file PATH\"");
}

float temperature_of(const io::SafetensorsFile& f) {
  const auto it = f.metadata().find("bitparity.temperature");
  if (it == f.metadata().end()) return 1.0f;
  char* end = nullptr;
  const double t = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || !(t > 0) || !std::isfinite(t))
    throw BadInput(f.path(), "bitparity.temperature", "expected a positive finite number, found \"" + it->second + "\"");
  return static_cast<float>(t);
}

// The capture's tensors, and its ops as the substitutes by capture name.
std::map<std::string, NamedTensor> read_tensors(const io::SafetensorsFile& f,
                                                std::map<std::string, std::vector<bf16>>& ops) {
  std::map<std::string, NamedTensor> out;
  for (const io::TensorInfo& info : f.tensors()) {
    NamedTensor t;
    t.name = info.name;
    t.shape = info.shape;
    const bool op = info.name.rfind("ops.", 0) == 0;
    if (op && info.dtype != io::DType::BF16)
      throw BadInput(f.path(), info.name, std::string("is ") + io::dtype_name(info.dtype) +
                                              ": the contract's ops are BF16 (capture the engine in bf16)");
    if (info.dtype == io::DType::BF16) {
      t.type = CmpType::BF16;
      t.bf16_values = f.read_bf16(info);
      if (op) ops[info.name.substr(4)] = t.bf16_values;
    } else if (info.dtype == io::DType::F32) {
      t.f32_values = f.read_f32(info);
    } else {
      continue;  // not a tensor conform judges (no output of the model is of another dtype)
    }
    out.emplace(info.name, std::move(t));
  }
  return out;
}

// Two model specs naming one model: the fixture name, or one folder however written
// (relative, with a trailing '/': a folder spec holds a '/', models.h).
bool same_model(const std::string& a, const std::string& b) {
  if (a.find('/') == std::string::npos || b.find('/') == std::string::npos) return a == b;
  std::error_code ea, eb;
  const fs::path pa = fs::weakly_canonical(a, ea), pb = fs::weakly_canonical(b, eb);
  return !ea && !eb && (pa / "").lexically_normal() == (pb / "").lexically_normal();
}

// The model the dump says it ran must be --model: a capture's config (bitparity.config)
// must agree on the sizes, a run dump's fixture name (bitparity.model) must be it.
void check_same_model(const io::SafetensorsFile& f, const std::string& model, const ModelConfig& cfg) {
  const auto& meta = f.metadata();
  if (const auto it = meta.find("bitparity.model"); it != meta.end() && !same_model(it->second, model))
    throw BadInput(f.path(), "bitparity.model", "the dump ran model \"" + it->second + "\", not --model " + model);
  const auto it = meta.find("bitparity.config");
  if (it == meta.end()) return;
  const nlohmann::json c = nlohmann::json::parse(it->second, nullptr, false);
  if (!c.is_object()) throw BadInput(f.path(), "bitparity.config", "is not a JSON object");
  const std::pair<const char*, int64_t> sizes[] = {
      {"hidden_size", cfg.hidden_size},         {"num_hidden_layers", cfg.num_hidden_layers},
      {"num_attention_heads", cfg.num_attention_heads}, {"num_key_value_heads", cfg.num_key_value_heads},
      {"head_dim", cfg.head_dim},               {"vocab_size", cfg.vocab_size},
      {"intermediate_size", cfg.intermediate_size}};
  for (const auto& [key, value] : sizes)
    if (c.contains(key) && c[key].is_number_integer() && c[key].get<int64_t>() != value)
      throw BadInput(f.path(), std::string("bitparity.config.") + key,
                     "the engine's model has " + std::to_string(c[key].get<int64_t>()) + "; --model " + model +
                         " has " + std::to_string(value) + ": not the model the engine ran");
}

// The float64 truth of a judged tensor (ops.<op>, logprobs.<s>, entropy.<s>),
// flattened as the tensor is; nullopt for any other name.
std::optional<std::vector<double>> truth_of(const truth::EachOp& each, const std::string& name) {
  auto flat = [](const auto& m) { return std::vector<double>(m.data(), m.data() + m.size()); };
  if (name.rfind("ops.", 0) == 0) {
    const auto it = each.ops.find(name.substr(4));
    if (it != each.ops.end()) return flat(it->second);
    return std::nullopt;
  }
  for (const auto& [prefix, per_seq] : {std::pair{"logprobs.", &each.logprob}, std::pair{"entropy.", &each.entropy}}) {
    const std::string p = prefix;
    if (name.rfind(p, 0) != 0) continue;
    const std::string s = name.substr(p.size());
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9) return std::nullopt;
    const size_t i = std::stoul(s);
    if (i < per_seq->size()) return flat((*per_seq)[i]);
  }
  return std::nullopt;
}

// The truth rounded to nearest in `like`'s dtype: --contract float64's reference.
NamedTensor rounded_truth(const NamedTensor& like, const std::vector<double>& t) {
  NamedTensor r;
  r.name = like.name;
  r.shape = like.shape;
  r.type = like.type;
  for (const double v : t)
    if (like.type == CmpType::BF16) r.bf16_values.push_back(truth::nearest_bf16(v));
    else r.f32_values.push_back(static_cast<float>(v));  // a double narrows to float to nearest even
  return r;
}

TruthError error_from_truth(const NamedTensor& t, const std::vector<double>& truth) {
  return t.type == CmpType::BF16 ? truth_error(t.bf16_values, truth) : truth_error(t.f32_values, truth);
}

// What a capture is judged against: the contract's ops computed from the capture's
// inputs (under float64: each op's truth rounded), the float64 truth of each of the
// capture's tensors, and the model's op captures in execution order.
struct Judges {
  const Contract* contract = nullptr;  // null under float64
  std::vector<NamedTensor> reference;
  std::map<std::string, std::vector<double>> truth;
  std::vector<std::string> model_ops;  // "ops.<op>"
};

// The rows of a capture that are not the tokens' surface as the program's or the
// truth's size check: bad input naming the dump.
template <class F>
auto on_the_dumps_rows(const std::string& dump, F&& run) {
  try {
    return run();
  } catch (const std::invalid_argument& e) {
    const std::string why = e.what();
    for (const std::string prefix : {"substitute: ", "each_op: "})
      if (why.rfind(prefix, 0) == 0)
        throw BadInput(dump, "ops", why.substr(prefix.size()) + " (the dump's rows are not the tokens of bitparity.tokens?)");
    throw;
  }
}

Judges judges(const io::SafetensorsFile& f, const SweepPlan& plan, bool truth_only,
              const std::map<std::string, NamedTensor>& engine, const std::map<std::string, std::vector<bf16>>& ops,
              const WeightsListener& on_weights) {
  const std::string& model = plan.models[0];
  Judges j;
  ModelConfig cfg;
  std::vector<std::vector<int32_t>> seqs;
  std::optional<CaseEngine> cases;
  const CaseSpec* spec = nullptr;  // the contract's case; none under float64
  std::optional<Weights> own;      // float64 alone: no case engine loads them
  const Weights* weights = nullptr;  // the checkpoint's rounded to bf16, which both sides ran
  if (truth_only) {
    cfg = model_config(model, plan.base_dir, "command line", "--model");
    seqs = plan_tokens(plan, cfg.vocab_size, cfg.max_position_embeddings).seqs;
    check_same_model(f, model, cfg);
    check_work_limits(estimate_run(cfg, seqs, false), plan.force);
    WeightsOrigin origin;
    own = model_weights(model, plan.base_dir, cfg, plan.weight_seed,
                        io::LoadOptions{.allow_nonfinite = plan.allow_nonfinite_weights, .progress = {}}, origin);
    if (on_weights) on_weights(origin);
    weights = &*own;
  } else {
    cases.emplace(plan, on_weights);
    spec = &cases->cases().at(0);
    cfg = spec->model.config;
    seqs = spec->model.tokens;
    j.contract = &spec->contract;
    check_same_model(f, model, cfg);
    weights = &cases->weights(spec->model);
  }
  const truth::EachOp each = on_the_dumps_rows(f.path(), [&] {
    if (spec) j.reference = cases->run_substituted(*spec, ops);
    return truth::Model(cfg, *weights).each_op(seqs, ops, plan.temperature);
  });
  for (const auto& [name, t] : engine)
    if (auto truth = truth_of(each, name)) {
      if (truth_only) j.reference.push_back(rounded_truth(t, *truth));
      j.truth.emplace(name, std::move(*truth));
    }
  for (const auto& [op, _] : each.ops) j.model_ops.push_back("ops." + op);
  const int layers = static_cast<int>(cfg.num_hidden_layers);
  auto in_order = [&](const std::string& x, const std::string& y) {
    return execution_order_key(x, layers) < execution_order_key(y, layers);
  };
  std::sort(j.model_ops.begin(), j.model_ops.end(), in_order);
  std::stable_sort(j.reference.begin(), j.reference.end(),
                   [&](const NamedTensor& x, const NamedTensor& y) { return in_order(x.name, y.name); });
  return j;
}

}  // namespace

ConformResult build_conform(const std::string& dump, const std::string& model, const std::string& contract,
                            const WeightsListener& on_weights) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(dump);
  const bool truth_only = contract == kConformFloat64;
  SweepPlan plan = single_case_defaults();
  plan.models = {model};
  if (!truth_only) plan.contracts = {contract};  // single_case_defaults' otherwise
  plan.grads = false;
  plan.capture_ops = true;
  plan.temperature = temperature_of(f);
  plan.origins["models"] = plan.origins["contracts"] = {"command line", true};
  const std::unique_ptr<TokensFile> tokens = set_tokens(f, plan);
  std::map<std::string, std::vector<bf16>> ops;
  const std::map<std::string, NamedTensor> engine = read_tensors(f, ops);
  const Judges j = judges(f, plan, truth_only, engine, ops, on_weights);

  ConformResult r;
  r.report = make_report("conform");
  Case c;
  c.id = "conform";
  c.parameters = {{"dump", dump}, {"model", model}, {"contract", j.contract ? j.contract->name : kConformFloat64}};
  if (j.contract) {
    r.report.environment.contract_name = j.contract->name;
    r.report.environment.contract_knob_hash = c.parameters["contract_knob_hash"] = j.contract->knob_hash();
  }
  for (const NamedTensor& ref : j.reference) {
    const auto it = engine.find(ref.name);
    if (it == engine.end()) continue;
    TensorRecord rec = compare_tensors(it->second, &ref);
    if (const auto truth = j.truth.find(ref.name); truth != j.truth.end() && rec.status == TensorStatus::kCompared) {
      rec.truth_error_a = error_from_truth(it->second, truth->second);
      rec.truth_error_b = error_from_truth(ref, truth->second);
    }
    c.tensors.push_back(std::move(rec));
  }
  for (const std::string& op : j.model_ops)
    if (!engine.count(op)) r.not_captured.push_back(op);
  for (const auto& [name, _] : engine) {
    if (j.truth.count(name)) continue;  // judged: every output of the model has a truth
    if (name.rfind("grads.", 0) == 0) ++r.gradients;
    else r.unknown.push_back(name);
  }
  for (const TensorRecord& t : c.tensors)
    if (!t.matches() && t.name.rfind("ops.", 0) == 0) {
      c.first_divergent_op = t.name.substr(4);
      break;
    }
  c.settle();
  r.report.cases.push_back(std::move(c));
  return r;
}

}  // namespace bp::harness
