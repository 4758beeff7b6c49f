#include "harness/engine/conform.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "harness/engine/cases.h"
#include "harness/engine/single_case.h"
#include "harness/io/errors.h"
#include "harness/io/safetensors.h"

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

}  // namespace

ConformResult build_conform(const std::string& dump, const std::string& model, const std::string& contract,
                            const WeightsListener& on_weights) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(dump);
  SweepPlan plan = single_case_defaults();
  plan.models = {model};
  plan.contracts = {contract};
  plan.grads = false;
  plan.capture_ops = true;
  plan.temperature = temperature_of(f);
  plan.origins["models"] = plan.origins["contracts"] = {"command line", true};
  const std::unique_ptr<TokensFile> tokens = set_tokens(f, plan);
  std::map<std::string, std::vector<bf16>> ops;
  const std::map<std::string, NamedTensor> engine = read_tensors(f, ops);
  CaseEngine cases(plan, on_weights);
  const CaseSpec& spec = cases.cases().at(0);
  check_same_model(f, model, spec.model.config);
  std::vector<NamedTensor> reference;
  try {
    reference = cases.run_substituted(spec, ops);
  } catch (const std::invalid_argument& e) {
    const std::string why = e.what();
    if (why.rfind("substitute: ", 0) != 0) throw;
    throw BadInput(dump, "ops", why.substr(12) + " (the dump's rows are not the tokens of bitparity.tokens?)");
  }

  ConformResult r;
  r.report = make_report("conform");
  r.report.environment.contract_name = spec.contract.name;
  r.report.environment.contract_knob_hash = spec.contract.knob_hash();
  Case c;
  c.id = "conform";
  c.parameters = {{"dump", dump},
                  {"model", spec.model.name},
                  {"contract", spec.contract.name},
                  {"contract_knob_hash", spec.contract.knob_hash()}};
  std::set<std::string> judged;
  const int layers = static_cast<int>(spec.model.config.num_hidden_layers);
  std::vector<const NamedTensor*> order;
  for (const NamedTensor& t : reference) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [&](const NamedTensor* x, const NamedTensor* y) {
    return execution_order_key(x->name, layers) < execution_order_key(y->name, layers);
  });
  for (const NamedTensor* ref : order) {
    const auto it = engine.find(ref->name);
    if (it == engine.end()) {
      if (ref->name.rfind("ops.", 0) == 0) r.not_captured.push_back(ref->name);
      continue;
    }
    judged.insert(ref->name);
    c.tensors.push_back(compare_tensors(it->second, ref));
  }
  for (const auto& [name, _] : engine) {
    if (judged.count(name)) continue;
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
