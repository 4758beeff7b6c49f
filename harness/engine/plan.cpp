#include "harness/engine/plan.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "harness/io/files.h"
#include "harness/io/json_strict.h"
#include "reference/common/rng.h"
#include "reference/common/sha256.h"

namespace bp::harness {

using io::BadInput;
using nlohmann::json;

const char* implementation_name(Implementation i) {
  switch (i) {
    case Implementation::kReference: return "reference";
    case Implementation::kEmulated: return "emulated";
    case Implementation::kCuda: return "cuda";
    case Implementation::kNccl: return "nccl";
    case Implementation::kFloat64: return "float64";
  }
  return "?";
}

std::optional<Implementation> parse_implementation(std::string_view s) {
  for (Implementation i : kAllImplementations)
    if (s == implementation_name(i)) return i;
  return std::nullopt;
}

std::string path_name(const program::Path& s) {
  switch (s.kind) {
    case program::Path::Kind::Extend: return "extend";
    case program::Path::Kind::Decode: return "decode";
    case program::Path::Kind::Ragged: return "ragged";
    case program::Path::Kind::Chunked: {
      std::string r = "chunked:";
      for (size_t i = 0; i < s.chunks.size(); ++i) r += (i ? "," : "") + std::to_string(s.chunks[i]);
      return r;
    }
  }
  return "?";
}

std::optional<program::Path> parse_path(std::string_view s, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<program::Path> {
    if (why) *why = w;
    return std::nullopt;
  };
  if (s == "extend") return program::Path::extend();
  if (s == "decode") return program::Path::decode();
  if (s == "ragged") return program::Path::ragged();
  constexpr std::string_view kChunked = "chunked:";
  if (s.substr(0, kChunked.size()) != kChunked)
    return fail("unknown path; the paths are extend, chunked:<n>[,<n>...], decode, ragged");
  std::vector<int> chunks;
  std::string_view rest = s.substr(kChunked.size());
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view num = rest.substr(0, comma);
    int n = 0;
    const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), n);
    if (num.empty() || ec != std::errc() || end != num.data() + num.size() || n < 1 || n > 1'000'000)
      return fail("chunk sizes must be integers in [1, 1000000], comma-separated, e.g. chunked:5,3");
    chunks.push_back(n);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return program::Path::chunked(std::move(chunks));
}

std::optional<std::vector<int64_t>> verify_layer_list(const std::string& spec, int64_t num_layers,
                                                      Implementation canonical, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<std::vector<int64_t>> {
    if (why) *why = w;
    return std::nullopt;
  };
  auto number = [](std::string_view s, int64_t& n) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    return !s.empty() && ec == std::errc() && end == s.data() + s.size() && n >= 0;
  };
  // N layers spread evenly: round(k·(L−1)/(N−1)) for k < N, the first and the last among them.
  auto spread = [&](int64_t n) {
    std::set<int64_t> layers;
    for (int64_t k = 0; k < n; ++k) layers.insert(n == 1 ? 0 : (2 * k * (num_layers - 1) + (n - 1)) / (2 * (n - 1)));
    return std::vector<int64_t>(layers.begin(), layers.end());
  };
  const bool format_only = num_layers == kAnyNumberOfLayers;
  if (spec.empty() || (format_only && spec == "all")) {
    if (canonical != Implementation::kCuda || format_only) return std::vector<int64_t>{};
    return spread(num_layers <= 4 ? num_layers : 3);
  }
  if (spec == "all") return spread(num_layers);
  constexpr const char* kForms = "\"all\", a number of layers N, or layer indices \"i,j,...\" (one layer: \"i,i\")";
  if (spec.find(',') == std::string::npos) {
    int64_t n = 0;
    if (!number(spec, n) || n < 1) return fail("expected " + std::string(kForms));
    return format_only ? std::vector<int64_t>{} : spread(std::min(n, num_layers));
  }
  std::set<int64_t> layers;
  std::string_view rest = spec;
  for (;;) {
    const size_t comma = rest.find(',');
    int64_t i = 0;
    if (!number(rest.substr(0, comma), i)) return fail("expected " + std::string(kForms));
    if (!format_only && i >= num_layers)
      return fail("layer " + std::to_string(i) + " does not exist: the model has " + std::to_string(num_layers) +
                  " layers (0 .. " + std::to_string(num_layers - 1) + ")");
    layers.insert(i);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return std::vector<int64_t>(layers.begin(), layers.end());
}

std::string canonical_name(const SweepPlan& plan) {
  const std::string impl = implementation_name(plan.canonical);
  // emulated and nccl are always given with their layout, tp1-ep1-cp1 included.
  const bool runs_layouts = plan.canonical == Implementation::kEmulated || plan.canonical == Implementation::kNccl;
  return plan.canonical_layout == layouts::Layout{} && !runs_layouts ? impl : impl + ":" + plan.canonical_layout.name();
}

std::vector<std::string> contract_names() {
  std::vector<std::string> r;
  for (const Contract& c : contracts()) r.push_back(c.name);
  return r;
}

std::string plan_field(const std::string& key, bool flags) {
  if (!flags) return key;
  // Options whose name is not the key's: singular options for the lists, and the
  // token options.
  static const std::map<std::string, std::string> renamed = {
      {"models", "--model"},       {"contracts", "--contract"}, {"implementations", "--implementation"},
      {"layouts", "--layout"},     {"paths", "--path"},         {"tokens", "--tokens"},
      {"tokens.file", "--tokens"}, {"tokens.seed", "--seed"},   {"tokens.lengths", "--lengths"}};
  if (const auto it = renamed.find(key); it != renamed.end()) return it->second;
  std::string f = "--" + key;
  for (char& c : f)
    if (c == '_') c = '-';
  return f;
}

void SweepPlan::bad(const std::string& key, const std::string& suffix, const std::string& message) const {
  const Origin o = origin(key.substr(0, key.find('.')));
  throw BadInput(o.source, plan_field(key, o.flags) + suffix, message);
}

namespace {

// Reads one plan object's fields, each with a message naming source and field.
class FieldReader {
 public:
  FieldReader(const std::string& source, bool flags) : source_(source), flags_(flags) {}

  [[noreturn]] void bad(const std::string& field, const std::string& msg) const {
    throw BadInput(source_, field, msg);
  }
  std::string name(const std::string& key) const { return plan_field(key, flags_); }

  static std::string describe(const json& v) {
    std::string d = v.dump();
    if (d.size() > 60) d = d.substr(0, 57) + "...";
    return std::string(io::json_type_word(v)) + " " + d;
  }

  int64_t integer(const std::string& field, const json& v, int64_t lo, int64_t hi) const {
    if (v.is_boolean() || !v.is_number_integer()) bad(field, "must be an integer, got " + describe(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi) : v.get<int64_t>() > hi)
      bad(field, v.dump() + " is too large (at most " + std::to_string(hi) + ")");
    const int64_t x = v.get<int64_t>();
    if (x < lo) bad(field, v.dump() + " is out of range (at least " + std::to_string(lo) + ")");
    return x;
  }
  uint64_t seed(const std::string& field, const json& v) const {
    if (v.is_boolean() || !v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      bad(field, "must be a non-negative integer, got " + describe(v));
    return v.get<uint64_t>();
  }
  const std::string& string(const std::string& field, const json& v) const {
    if (!v.is_string()) bad(field, "must be a string, got " + describe(v));
    return v.get_ref<const std::string&>();
  }
  // A model or tokens file named by a path: non-empty, and UTF-8, since dumps and
  // reports record it as JSON text (a plan file's strings are; a command line's may not be).
  const std::string& path(const std::string& field, const json& v) const {
    const std::string& s = string(field, v);
    if (s.empty()) bad(field, "must not be empty");
    try {
      (void)v.dump();
    } catch (const json::type_error&) {
      bad(field, "is not valid UTF-8 text; rename it (dumps and reports record it as JSON text)");
    }
    return s;
  }
  bool boolean(const std::string& field, const json& v) const {
    if (!v.is_boolean()) bad(field, "must be true or false, got " + describe(v));
    return v.get<bool>();
  }
  // A non-empty list, each element converted by `one(field[i], element)`.
  template <class T>
  std::vector<T> list(const std::string& field, const json& v,
                      const std::function<T(const std::string&, const json&)>& one) const {
    if (!v.is_array()) bad(field, "must be a list, got " + describe(v));
    if (v.empty()) bad(field, "must not be empty");
    std::vector<T> r;
    for (size_t i = 0; i < v.size(); ++i) r.push_back(one(field + "[" + std::to_string(i) + "]", v[i]));
    return r;
  }

 private:
  std::string source_;
  bool flags_;
};

template <class T>
void no_duplicates(const FieldReader& rd, const std::string& field, const std::vector<T>& v,
                   const std::function<std::string(const T&)>& text) {
  std::set<std::string> seen;
  for (size_t i = 0; i < v.size(); ++i)
    if (!seen.insert(text(v[i])).second)
      rd.bad(field + "[" + std::to_string(i) + "]", io::quoted_input(text(v[i])) + " is listed twice");
}

std::string joined(const std::vector<std::string>& v) {
  std::string r;
  for (const std::string& s : v) r += (r.empty() ? "" : ", ") + s;
  return r;
}

void apply_tokens(const FieldReader& rd, const json& v, TokenSpec& t) {
  const std::string field = rd.name("tokens");
  if (!v.is_object()) rd.bad(field, "must be an object {\"seed\", \"lengths\"} or {\"file\"}, got " + rd.describe(v));
  for (const auto& [k, x] : v.items())
    if (k != "seed" && k != "lengths" && k != "file")
      rd.bad(field + "." + k, "unknown field; tokens take \"seed\" and \"lengths\", or \"file\"");
  if (v.contains("file") && (v.contains("seed") || v.contains("lengths")))
    rd.bad(field, "give either a tokens file or a seed and lengths, not both");
  if (v.contains("file")) {
    t.file = rd.path(rd.name("tokens.file"), v["file"]);
    return;
  }
  t.file.clear();
  if (v.contains("seed")) t.seed = rd.seed(rd.name("tokens.seed"), v["seed"]);
  if (v.contains("lengths"))
    t.lengths = rd.list<int>(rd.name("tokens.lengths"), v["lengths"], [&](const std::string& f, const json& x) {
      return static_cast<int>(rd.integer(f, x, 2, 1'000'000));
    });
}

layouts::CpSplit cp_split_of(const FieldReader& rd, const std::string& f, const json& x) {
  const std::string& s = rd.string(f, x);
  if (s == "contiguous") return layouts::CpSplit::Contiguous;
  if (s == "zigzag") return layouts::CpSplit::Zigzag;
  rd.bad(f, "unknown cp split " + io::quoted_input(s) + "; the splits are contiguous, zigzag");
}

}  // namespace

void apply_plan_json(const json& obj, const std::string& source, bool flags, SweepPlan& plan) {
  const FieldReader rd(source, flags);
  if (!obj.is_object()) rd.bad("", std::string("a plan is a JSON object, got ") + io::json_type_word(obj));
  static const std::set<std::string> known = {"models", "contracts", "implementations", "layouts", "tp", "ep", "cp",
                                              "cp_split", "paths", "tokens", "weight_seed", "coef_seed",
                                              "temperature", "grads", "capture", "allow_nonfinite_weights",
                                              "canonical", "verify_layers"};
  // "backends" is the old name of "implementations": plans written before the
  // rename still read, but a plan may not give both.
  constexpr const char* kOldImplementations = "backends";
  for (const auto& [k, v] : obj.items())
    if (!known.count(k) && k != kOldImplementations)
      rd.bad(rd.name(k), "unknown field; a plan has " + joined({known.begin(), known.end()}));
  if (obj.contains(kOldImplementations) && obj.contains("implementations"))
    rd.bad(rd.name(kOldImplementations),
           "the old name of " + rd.name("implementations") + "; give one of them, not both");
  const char* implementations_key = obj.contains(kOldImplementations) ? kOldImplementations : "implementations";

  for (const auto& [k, v] : obj.items()) plan.origins[k == kOldImplementations ? "implementations" : k] = {source, flags};
  for (const char* axis : {"tp", "ep", "cp", "cp_split"})
    if (obj.contains("layouts") || obj.contains(axis)) plan.origins[axis] = plan.origins["layouts"] = {source, flags};
  auto field = [&](const char* k) -> const json* { return obj.contains(k) ? &obj[k] : nullptr; };
  if (const json* v = field("models")) {
    plan.models = rd.list<std::string>(rd.name("models"), *v,
                                       [&](const std::string& f, const json& x) { return rd.path(f, x); });
    no_duplicates<std::string>(rd, rd.name("models"), plan.models, [](const std::string& s) { return s; });
  }
  // `run --contract truth` is the old spelling of --implementation float64: the
  // float64 truth model, which has no contract.
  constexpr const char* kOldFloat64Contract = "truth";
  const json* contracts = field("contracts");
  if (contracts && plan.allow_float64 && contracts->is_array() &&
      std::find(contracts->begin(), contracts->end(), json(kOldFloat64Contract)) != contracts->end()) {
    const std::string why = std::string("'") + kOldFloat64Contract + "' is the old spelling of " +
                            rd.name("implementations") + " float64, the float64 truth model";
    if (contracts->size() != 1) rd.bad(rd.name("contracts"), why + ": it has no contract to list with others");
    if (field(implementations_key)) rd.bad(rd.name("contracts"), why + ": give one of them");
    plan.contracts.clear();
    plan.implementations = {Implementation::kFloat64};
    plan.origins["implementations"] = {source, flags};
  } else if (contracts) {
    plan.contracts = rd.list<std::string>(rd.name("contracts"), *contracts, [&](const std::string& f, const json& x) {
      const std::string& s = rd.string(f, x);
      if (!find_contract(s))
        rd.bad(f, "unknown contract " + io::quoted_input(s) + "; the contracts are " + joined(contract_names()));
      return s;
    });
    no_duplicates<std::string>(rd, rd.name("contracts"), plan.contracts, [](const std::string& s) { return s; });
  }
  if (const json* v = field(implementations_key)) {
    const std::string name = rd.name(implementations_key);
    plan.implementations = rd.list<Implementation>(name, *v, [&](const std::string& f, const json& x) {
      const std::string& s = rd.string(f, x);
      const auto i = parse_implementation(s);
      const std::string known = plan.allow_float64 ? "reference, emulated, cuda, nccl, float64" : "reference, emulated, cuda, nccl";
      if (!i) rd.bad(f, "unknown implementation " + io::quoted_input(s) + "; the implementations are " + known);
      if (*i == Implementation::kFloat64 && !plan.allow_float64)
        rd.bad(f, "float64, the float64 truth model, runs only in `bitparity run`; here the implementations are " +
                      known);
      return *i;
    });
    no_duplicates<Implementation>(rd, name, plan.implementations,
                                  [](const Implementation& i) { return implementation_name(i); });
  }

  // The layout selection: an explicit list or the grid, replaced as a whole.
  const bool any_axis = field("tp") || field("ep") || field("cp") || field("cp_split");
  if (field("layouts") && any_axis)
    rd.bad(rd.name("layouts"), "give either a list of layouts or the grid (" + rd.name("tp") + ", " + rd.name("ep") +
                                   ", " + rd.name("cp") + ", " + rd.name("cp_split") + "), not both");
  if (const json* v = field("layouts")) {
    plan.layouts = rd.list<layouts::Layout>(rd.name("layouts"), *v, [&](const std::string& f, const json& x) {
      const std::string& s = rd.string(f, x);
      std::string why;
      const auto l = layouts::parse_layout(s, &why);
      if (!l) rd.bad(f, "bad layout " + io::quoted_input(s) + (why.empty() ? "" : ": " + why) + " (e.g. tp2-ep1-cp2z)");
      return *l;
    });
    no_duplicates<layouts::Layout>(rd, rd.name("layouts"), plan.layouts,
                                   [](const layouts::Layout& l) { return l.name(); });
  } else if (any_axis) {
    plan.layouts.clear();
    plan.grid = LayoutGrid{{1}, {1}, {1}, {layouts::CpSplit::Contiguous}};
    auto sizes = [&](const char* k, std::vector<int>& out) {
      if (const json* v = field(k)) {
        out = rd.list<int>(rd.name(k), *v, [&](const std::string& f, const json& x) {
          return static_cast<int>(rd.integer(f, x, 1, 4096));
        });
        no_duplicates<int>(rd, rd.name(k), out, [](const int& n) { return std::to_string(n); });
      }
    };
    sizes("tp", plan.grid.tp);
    sizes("ep", plan.grid.ep);
    sizes("cp", plan.grid.cp);
    if (const json* v = field("cp_split")) {
      plan.grid.cp_split = rd.list<layouts::CpSplit>(
          rd.name("cp_split"), *v, [&](const std::string& f, const json& x) { return cp_split_of(rd, f, x); });
      no_duplicates<layouts::CpSplit>(rd, rd.name("cp_split"), plan.grid.cp_split, [](const layouts::CpSplit& c) {
        return std::string(c == layouts::CpSplit::Zigzag ? "zigzag" : "contiguous");
      });
    }
  }

  if (const json* v = field("paths")) {
    plan.paths = rd.list<program::Path>(rd.name("paths"), *v, [&](const std::string& f, const json& x) {
      const std::string& s = rd.string(f, x);
      std::string why;
      const auto p = parse_path(s, &why);
      if (!p) rd.bad(f, "bad path " + io::quoted_input(s) + ": " + why);
      return *p;
    });
    no_duplicates<program::Path>(rd, rd.name("paths"), plan.paths, [](const program::Path& p) { return path_name(p); });
  }
  if (const json* v = field("tokens")) apply_tokens(rd, *v, plan.tokens);
  if (const json* v = field("weight_seed")) plan.weight_seed = rd.seed(rd.name("weight_seed"), *v);
  if (const json* v = field("coef_seed")) plan.coef_seed = rd.seed(rd.name("coef_seed"), *v);
  if (const json* v = field("temperature")) {
    if (!v->is_number()) rd.bad(rd.name("temperature"), "must be a number, got " + rd.describe(*v));
    const double t = v->get<double>();
    // The reference divides fp32 logits by the fp32 temperature: it must be a
    // positive normal float.
    if (!(t >= 1e-30 && t <= 1e30)) rd.bad(rd.name("temperature"), v->dump() + " is out of range (1e-30 .. 1e30)");
    plan.temperature = static_cast<float>(t);
  }
  if (const json* v = field("grads")) plan.grads = rd.boolean(rd.name("grads"), *v);
  if (const json* v = field("allow_nonfinite_weights"))
    plan.allow_nonfinite_weights = rd.boolean(rd.name("allow_nonfinite_weights"), *v);
  if (const json* v = field("canonical")) {
    const std::string& s = rd.string(rd.name("canonical"), *v);
    const size_t colon = s.find(':');
    const std::string impl = s.substr(0, colon), layout = colon == std::string::npos ? "" : s.substr(colon + 1);
    const std::optional<Implementation> i = parse_implementation(impl);
    constexpr const char* kForms =
        "; it is reference, cuda, or a layout on an implementation that runs layouts: cuda:<layout>, "
        "emulated:<layout>, nccl:<layout> (e.g. nccl:tp2-ep4-cp1)";
    if (!i || *i == Implementation::kFloat64) rd.bad(rd.name("canonical"), "unknown canonical " + io::quoted_input(s) + kForms);
    plan.canonical = *i;
    plan.canonical_layout = layouts::Layout{};
    if (colon != std::string::npos) {
      std::string why;
      const auto l = layouts::parse_layout(layout, &why);
      if (!l) rd.bad(rd.name("canonical"), "layout " + io::quoted_input(layout) + " is " + why);
      if (l->reduction != layouts::Reduction::Tree)
        rd.bad(rd.name("canonical"), "a negative control's layout (" + l->name() + ") cannot be the canonical result");
      if (*i == Implementation::kReference && !(*l == layouts::Layout{}))
        rd.bad(rd.name("canonical"), "the reference runs unsharded: its layout is tp1-ep1-cp1" + std::string(kForms));
      plan.canonical_layout = *l;
    } else if (*i == Implementation::kEmulated || *i == Implementation::kNccl) {
      rd.bad(rd.name("canonical"), impl + " runs layouts: name the canonical one" + std::string(kForms));
    }
  }
  if (const json* v = field("verify_layers")) {
    const std::string& s = rd.string(rd.name("verify_layers"), *v);
    // Unset is the default; an empty value is a mistake, never "verify nothing".
    if (s.empty()) rd.bad(rd.name("verify_layers"), "must not be empty: give all, a number N or indices i,j,...");
    std::string why;
    if (!verify_layer_list(s, kAnyNumberOfLayers, plan.canonical, &why))
      rd.bad(rd.name("verify_layers"), why);
    plan.verify_layers = s;
  }
  if (const json* v = field("capture")) {
    const std::string& s = rd.string(rd.name("capture"), *v);
    if (s != "none" && s != "ops") rd.bad(rd.name("capture"), "unknown capture mode " + io::quoted_input(s) + "; the modes are none, ops");
    plan.capture_ops = s == "ops";
  }
}

namespace {
void apply_plan_text(std::string_view text, const std::string& path, SweepPlan& plan) {
  apply_plan_json(io::parse_json_strict(text, path), path, false, plan);
  plan.base_dir = std::filesystem::path(path).parent_path().string();
}
}  // namespace

SweepPlan parse_plan(std::string_view text, const std::string& path) {
  SweepPlan plan;
  apply_plan_text(text, path, plan);
  return plan;
}

void apply_plan_file(const std::string& path, SweepPlan& plan) {
  apply_plan_text(io::read_text_file(path, size_t{1} << 20), path, plan);
}

std::string read_tokens_text(const SweepPlan& plan) {
  return io::read_text_file(tokens_file(plan), size_t{64} << 20);
}

std::string tokens_file(const SweepPlan& plan) {
  namespace fs = std::filesystem;
  const std::string& file = plan.tokens.file;
  if (file.empty() || fs::path(file).is_absolute() || plan.base_dir.empty()) return file;
  return (fs::path(plan.base_dir) / file).string();
}

namespace {

// A tokens file's "coefficients": one list per sequence, one fp32 value per target
// (SPEC.md §6.4). A JSON number is read as binary64 and rounded to the nearest fp32.
std::vector<std::vector<float>> file_coefficients(const FieldReader& rd, const json& v,
                                                  const std::vector<std::vector<int32_t>>& seqs) {
  if (!v.is_array()) rd.bad("coefficients", "must be a list of lists (one per sequence), got " + rd.describe(v));
  if (v.size() != seqs.size())
    rd.bad("coefficients", "has " + std::to_string(v.size()) + " lists; \"sequences\" has " +
                               std::to_string(seqs.size()) + " sequences (one list of coefficients per sequence)");
  std::vector<std::vector<float>> c(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const std::string f = "coefficients[" + std::to_string(s) + "]";
    const json& row = v[s];
    if (!row.is_array()) rd.bad(f, "must be a list of numbers, got " + rd.describe(row));
    const size_t targets = seqs[s].size() - 1;
    if (row.size() != targets)
      rd.bad(f, "has " + std::to_string(row.size()) + " values; sequences[" + std::to_string(s) + "] has " +
                    std::to_string(seqs[s].size()) + " tokens, so " + std::to_string(targets) +
                    " targets (one coefficient per token after the first)");
    for (size_t t = 0; t < targets; ++t) {
      const std::string g = f + "[" + std::to_string(t) + "]";
      if (row[t].is_boolean() || !row[t].is_number()) rd.bad(g, "must be a number, got " + rd.describe(row[t]));
      const float x = static_cast<float>(row[t].get<double>());
      if (!std::isfinite(x)) rd.bad(g, row[t].dump() + " is not a finite float32 (|c| <= 3.4028235e38)");
      c[s].push_back(x);
    }
  }
  return c;
}

}  // namespace

TokenBatch plan_tokens(const SweepPlan& plan, int64_t vocab, int64_t max_positions) {
  std::vector<std::vector<int32_t>> seqs;
  std::string source, field_prefix;
  json file;
  if (plan.tokens.file.empty()) {
    for (size_t s = 0; s < plan.tokens.lengths.size(); ++s) {
      const uint64_t seq_seed = counter_hash(plan.tokens.seed, s);
      std::vector<int32_t> t;
      for (int j = 0; j < plan.tokens.lengths[s]; ++j)
        t.push_back(static_cast<int32_t>(counter_hash(seq_seed, static_cast<uint64_t>(j)) % static_cast<uint64_t>(vocab)));
      seqs.push_back(std::move(t));
    }
  } else {
    source = tokens_file(plan);
    const std::string text = plan.tokens.text.empty() ? read_tokens_text(plan) : plan.tokens.text;
    file = io::parse_json_strict(text, source);
    const FieldReader rd(source, false);
    if (!file.is_object()) rd.bad("", "a tokens file is a JSON object {\"sequences\": [[...], ...]}");
    for (const auto& [k, v] : file.items())
      if (k != "sequences" && k != "coefficients")
        rd.bad(k, "unknown field; a tokens file has \"sequences\" and optionally \"coefficients\"");
    if (!file.contains("sequences")) rd.bad("sequences", "required field is missing");
    seqs = rd.list<std::vector<int32_t>>("sequences", file["sequences"], [&](const std::string& f, const json& x) {
      return rd.list<int32_t>(f, x, [&](const std::string& g, const json& y) {
        return static_cast<int32_t>(rd.integer(g, y, 0, INT32_MAX));
      });
    });
    field_prefix = "sequences";
    // Recorded in dumps and reports, so that the loss can be reproduced from the file.
    if (file.contains("coefficients")) source += ", sha256 " + sha256_hex(text);
  }
  const FieldReader rd(tokens_file(plan), false);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const std::string f = field_prefix + "[" + std::to_string(s) + "]";
    const std::string too_long = std::to_string(seqs[s].size()) +
                                 " tokens exceed the model's max_position_embeddings " + std::to_string(max_positions);
    if (seqs[s].size() < 2) rd.bad(f, "a sequence needs at least 2 tokens (one logprob)");
    if (static_cast<int64_t>(seqs[s].size()) > max_positions) {
      if (plan.tokens.file.empty()) plan.bad("tokens.lengths", "[" + std::to_string(s) + "]", too_long);
      rd.bad(f, too_long);
    }
    for (size_t j = 0; j < seqs[s].size(); ++j)
      if (seqs[s][j] >= vocab)
        rd.bad(f + "[" + std::to_string(j) + "]",
               "token " + std::to_string(seqs[s][j]) + " is not below the model's vocab_size " + std::to_string(vocab));
  }
  if (!file.is_object() || !file.contains("coefficients"))
    return {std::move(seqs), ref::LossCoefficients::generated(plan.coef_seed)};
  if (plan.origins.count("coef_seed"))
    plan.bad("coef_seed", "",
             "the tokens file " + tokens_file(plan) +
                 " gives the loss coefficients; a coefficient seed would not be used (give one of them)");
  std::vector<std::vector<float>> c = file_coefficients(rd, file["coefficients"], seqs);
  return {std::move(seqs), ref::LossCoefficients::explicit_values(std::move(c), source)};
}

}  // namespace bp::harness
