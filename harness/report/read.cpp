// Reading JSON and CSV reports back into bp::harness::Report (see read.h).
#include "harness/report/read.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>

#include "harness/io/csv_records.h"
#include "harness/io/errors.h"
#include "harness/io/files.h"
#include "harness/io/json_strict.h"

namespace bp::harness {

namespace {

using io::BadInput;
using json = nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();

// --- checks shared by both formats (each returns "" or what is wrong) ---------

template <class Enum, size_t N>
std::optional<Enum> enum_from_name(const std::string& s, const std::array<Enum, N>& all, const char* (*name)(Enum)) {
  for (Enum e : all)
    if (s == name(e)) return e;
  return std::nullopt;
}
std::optional<Verdict> verdict_from_name(const std::string& s) {
  return enum_from_name(
      s, std::array{Verdict::kExact, Verdict::kMismatch, Verdict::kSkipped, Verdict::kNonFinite, Verdict::kError},
      verdict_name);
}
constexpr const char* kVerdictWhat = "verdict (exact, mismatch, skipped, nonfinite, error)";
std::optional<TensorStatus> status_from_name(const std::string& s) {
  return enum_from_name(s,
                        std::array{TensorStatus::kCompared, TensorStatus::kOnlyInA, TensorStatus::kOnlyInB,
                                   TensorStatus::kDtypeMismatch, TensorStatus::kShapeMismatch},
                        tensor_status_name);
}

// A report's "status": "complete" (false) or "interrupted" (true).
std::optional<bool> interrupted_from_status(const std::string& s) {
  if (s == "complete" || s == "interrupted") return s == "interrupted";
  return std::nullopt;
}

std::string histogram_problem(const TensorMetrics& m) {
  if (m.ulp_histogram.empty())
    return m.mismatches == 0 ? "" : "is empty but mismatches is " + std::to_string(m.mismatches);
  if (m.ulp_histogram.size() != kUlpBins)
    return "has " + std::to_string(m.ulp_histogram.size()) + " bins, expected " + std::to_string(kUlpBins);
  const uint64_t sum = std::accumulate(m.ulp_histogram.begin(), m.ulp_histogram.end(), uint64_t{0});
  if (sum != m.mismatches)
    return "counts " + std::to_string(sum) + " elements but mismatches is " + std::to_string(m.mismatches);
  return "";
}

// A stated case verdict must be what its tensors give (skipped and error stand on their own).
std::string verdict_problem(const Case& c) {
  Case settled = c;
  settled.settle();
  if (settled.verdict == c.verdict) return "";
  return std::string("is \"") + verdict_name(c.verdict) + "\" but its tensors give \"" + verdict_name(settled.verdict) +
         "\"";
}

// Metrics fields a tensor record shares with its metrics.
void bind_metrics(TensorRecord& t) {
  if (!t.metrics) return;
  t.metrics->dtype = t.dtype_a;
  t.metrics->shape = t.shape_a.value_or(std::vector<uint64_t>{});
  t.metrics->is_logprob = t.is_logprob;
  t.metrics->bit_identical = t.metrics->mismatches == 0;
}

// --- JSON --------------------------------------------------------------------

// A JSON value and its path in the report, so every complaint names the field.
class Node {
 public:
  Node(const json& v, std::string path, const std::string& file) : v_(v), path_(std::move(path)), file_(file) {}

  [[noreturn]] void bad(const std::string& why) const { throw BadInput(file_, path_.empty() ? "(top level)" : path_, why); }

  // An object holding every key of `required`, optionally those of `optional`, and no other.
  void expect_object(std::initializer_list<const char*> required, std::initializer_list<const char*> optional = {}) const {
    if (!v_.is_object()) bad(std::string("expected an object, found ") + io::json_type_word(v_));
    for (const char* k : required)
      if (!v_.contains(k)) Node(v_, child(k), file_).bad("required field is missing");
    for (const auto& [k, _] : v_.items()) {
      auto is_k = [&k = k](const char* x) { return k == x; };
      if (std::none_of(required.begin(), required.end(), is_k) && std::none_of(optional.begin(), optional.end(), is_k))
        Node(v_, child(k), file_).bad("unknown field");
    }
  }
  bool has(const char* key) const { return v_.contains(key); }
  bool is_null() const { return v_.is_null(); }
  // An object's members in key order (any keys).
  std::vector<std::pair<std::string, Node>> members() const {
    if (!v_.is_object()) bad(std::string("expected an object, found ") + io::json_type_word(v_));
    std::vector<std::pair<std::string, Node>> out;
    for (const auto& [k, v] : v_.items()) out.emplace_back(k, Node(v, child(k), file_));
    return out;
  }
  Node operator[](const char* key) const { return Node(v_.at(key), child(key), file_); }
  std::vector<Node> elements() const {
    if (!v_.is_array()) bad(std::string("expected an array, found ") + io::json_type_word(v_));
    std::vector<Node> out;
    for (size_t i = 0; i < v_.size(); ++i) out.emplace_back(v_[i], path_ + "[" + std::to_string(i) + "]", file_);
    return out;
  }

  std::string str() const {
    if (!v_.is_string()) bad(std::string("expected a string, found ") + io::json_type_word(v_));
    return v_.get<std::string>();
  }
  std::optional<std::string> str_or_null() const { return v_.is_null() ? std::nullopt : std::optional(str()); }
  bool boolean() const {
    if (!v_.is_boolean()) bad(std::string("expected true or false, found ") + io::json_type_word(v_));
    return v_.get<bool>();
  }
  uint64_t count() const {
    if (!v_.is_number_unsigned()) bad("expected an integer >= 0, found " + describe());
    return v_.get<uint64_t>();
  }
  // A difference: a number >= 0, or "inf".
  double diff() const {
    if (v_.is_string() && v_.get<std::string>() == "inf") return kInf;
    if (!v_.is_number() || v_.get<double>() < 0) bad(std::string("expected a number >= 0 or \"inf\", found ") + describe());
    return v_.get<double>();
  }
  // A measurement: a finite number >= 0.
  double non_negative() const {
    if (!v_.is_number() || !(v_.get<double>() >= 0) || std::isinf(v_.get<double>()))
      bad("expected a number >= 0, found " + describe());
    return v_.get<double>();
  }
  double ulp() const {
    if (v_.is_string() && v_.get<std::string>() == "inf") return kInf;
    if (!v_.is_number_unsigned()) bad(std::string("expected an integer >= 0 or \"inf\", found ") + describe());
    return static_cast<double>(v_.get<uint64_t>());
  }
  std::vector<uint64_t> counts() const {
    std::vector<uint64_t> out;
    for (const Node& e : elements()) out.push_back(e.count());
    return out;
  }
  std::optional<uint64_t> count_or_null() const { return v_.is_null() ? std::nullopt : std::optional(count()); }
  std::optional<bool> boolean_or_null() const { return v_.is_null() ? std::nullopt : std::optional(boolean()); }
  int64_t index_or_minus_one() const {  // a flat index >= 0, or null for "none" (-1)
    if (v_.is_null()) return -1;
    if (!v_.is_number_unsigned() || v_.get<uint64_t>() > uint64_t{INT64_MAX})
      bad(std::string("expected an integer >= 0 or null, found ") + describe());
    return static_cast<int64_t>(v_.get<uint64_t>());
  }
  std::optional<std::vector<uint64_t>> counts_or_null() const {
    return v_.is_null() ? std::nullopt : std::optional(counts());
  }
  template <class T>
  T one_of(std::optional<T> (*from_name)(const std::string&), const char* what) const {
    const std::string s = str();
    if (auto e = from_name(s)) return *e;
    bad("\"" + s + "\" is not a " + what);
  }

  const std::string& path() const { return path_; }

 private:
  std::string child(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  std::string describe() const {
    if (v_.is_string()) return "\"" + v_.get<std::string>() + "\"";
    return v_.is_number() ? v_.dump() : io::json_type_word(v_);
  }
  const json& v_;
  std::string path_;
  const std::string& file_;
};

WeightsOrigin read_weights_origin(const Node& n) {
  n.expect_object({"model", "seed", "files", "conversion"});
  WeightsOrigin w;
  w.model = n["model"].str();
  w.seed = n["seed"].count_or_null();
  for (const Node& f : n["files"].elements()) {
    f.expect_object({"path", "sha256"});
    w.files.push_back({f["path"].str(), f["sha256"].str()});
  }
  w.conversion = n["conversion"].str_or_null().value_or("");
  return w;
}

Environment read_environment(const Node& n) {
  n.expect_object({"git_commit", "git_dirty", "bitparity_version", "compiler_id", "compiler_version", "compiler_flags",
                   "build_type", "contract_name", "contract_knob_hash", "cpu_model", "gpu_name", "gpu_driver",
                   "cuda_version", "nccl_version"},
                  {"weights"});
  Environment e;
  e.git_commit = n["git_commit"].str();
  e.git_dirty = n["git_dirty"].boolean_or_null();
  e.bitparity_version = n["bitparity_version"].str();
  e.compiler_id = n["compiler_id"].str();
  e.compiler_version = n["compiler_version"].str();
  e.compiler_flags = n["compiler_flags"].str();
  e.build_type = n["build_type"].str();
  e.contract_name = n["contract_name"].str_or_null();
  e.contract_knob_hash = n["contract_knob_hash"].str_or_null();
  e.cpu_model = n["cpu_model"].str();
  e.gpu_name = n["gpu_name"].str_or_null();
  e.gpu_driver = n["gpu_driver"].str_or_null();
  e.cuda_version = n["cuda_version"].str_or_null();
  e.nccl_version = n["nccl_version"].str_or_null();
  if (n.has("weights"))
    for (const Node& w : n["weights"].elements()) e.weights.push_back(read_weights_origin(w));
  return e;
}

std::optional<std::string> nan_policy_from_name(const std::string& s) {
  return s == kNanPolicy ? std::optional(s) : std::nullopt;
}

// train_rollout_logprob_abs_diff is derived (mean_abs_diff of a logprob tensor);
// the final re-render check holds it to that.
TensorMetrics read_metrics(const Node& n) {
  n.expect_object({"elements", "mismatches", "max_abs_diff", "max_ulp_diff", "mean_abs_diff", "first_mismatch", "nan_a",
                   "nan_b", "inf_a", "inf_b", "nan_policy", "ulp_histogram"},
                  {"train_rollout_logprob_abs_diff"});
  TensorMetrics m;
  m.elements = n["elements"].count();
  m.mismatches = n["mismatches"].count();
  m.max_abs_diff = n["max_abs_diff"].diff();
  m.max_ulp_diff = n["max_ulp_diff"].ulp();
  m.mean_abs_diff = n["mean_abs_diff"].diff();
  if (n.has("train_rollout_logprob_abs_diff")) n["train_rollout_logprob_abs_diff"].diff();
  m.first_mismatch = n["first_mismatch"].index_or_minus_one();
  m.nan_a = n["nan_a"].count();
  m.nan_b = n["nan_b"].count();
  m.inf_a = n["inf_a"].count();
  m.inf_b = n["inf_b"].count();
  m.nan_policy = n["nan_policy"].one_of(nan_policy_from_name, "known NaN policy (expected \"nan_equal\")");
  m.ulp_histogram = n["ulp_histogram"].counts();
  if (const std::string why = histogram_problem(m); !why.empty()) n["ulp_histogram"].bad(why);
  return m;
}

std::optional<TruthError> read_truth_side(const Node& n) {
  if (n.is_null()) return std::nullopt;
  n.expect_object({"max_ulp", "mean_ulp"});
  return TruthError{n["max_ulp"].diff(), n["mean_ulp"].diff()};
}

// Written only where a side is set (json.cpp).
void read_truth_error(const Node& n, TensorRecord& t) {
  n.expect_object({"a", "b"});
  t.truth_error_a = read_truth_side(n["a"]);
  t.truth_error_b = read_truth_side(n["b"]);
  if (!t.truth_error_a && !t.truth_error_b)
    n.bad("has neither side (a tensor without truth errors has no \"truth_error\")");
}

TensorRecord read_tensor(const Node& n) {
  n.expect_object({"name", "name_b", "status", "dtype_a", "dtype_b", "shape_a", "shape_b", "bit_identical", "is_logprob",
                   "metrics"},
                  {"truth_error"});
  TensorRecord t;
  t.name = n["name"].str();
  t.name_b = n["name_b"].str_or_null().value_or("");
  t.status = n["status"].one_of(status_from_name, "tensor status");
  t.dtype_a = n["dtype_a"].str_or_null().value_or("");
  t.dtype_b = n["dtype_b"].str_or_null().value_or("");
  t.shape_a = n["shape_a"].counts_or_null();
  t.shape_b = n["shape_b"].counts_or_null();
  n["bit_identical"].boolean();  // derived: checked by the re-render
  t.is_logprob = n["is_logprob"].boolean();
  const Node metrics = n["metrics"];
  const bool compared = t.status == TensorStatus::kCompared;
  if (metrics.is_null() == compared)
    metrics.bad(compared ? "a compared tensor needs metrics" : "must be null unless status is \"compared\"");
  if (compared) t.metrics = read_metrics(metrics);
  bind_metrics(t);
  if (n.has("truth_error")) read_truth_error(n["truth_error"], t);
  return t;
}

int read_ranks(const Node& n) {
  const uint64_t v = n.count();
  if (v < 1 || v > static_cast<uint64_t>(std::numeric_limits<int>::max()))
    n.bad("expected an integer >= 1, found " + std::to_string(v));
  return static_cast<int>(v);
}

// Present only when the case called collectives (json.cpp), each kind once.
std::vector<CollectiveTraffic> read_communication(const Node& n) {
  std::vector<CollectiveTraffic> out;
  std::set<std::string> seen;
  for (const Node& e : n.elements()) {
    e.expect_object({"collective", "calls", "bytes"});
    CollectiveTraffic t{e["collective"].str(), e["calls"].count(), e["bytes"].count()};
    if (!seen.insert(t.collective).second) e["collective"].bad("collective \"" + t.collective + "\" appears twice");
    out.push_back(std::move(t));
  }
  if (out.empty()) n.bad("is empty: a case that called no collectives has no \"communication\"");
  return out;
}

Case read_case(const Node& n) {
  n.expect_object({"id", "parameters", "verdict", "skip_reason", "error", "first_divergent_op", "seconds",
                   "peak_device_bytes", "tensors"},
                  {"ranks", "communication"});
  Case c;
  c.id = n["id"].str();
  for (const auto& [k, node] : n["parameters"].members()) c.parameters[k] = node.str();
  c.verdict = n["verdict"].one_of(verdict_from_name, kVerdictWhat);
  const auto skip = n["skip_reason"].str_or_null();
  if (skip.has_value() != (c.verdict == Verdict::kSkipped))
    n["skip_reason"].bad("must be a string for a skipped case and null otherwise");
  c.skip_reason = skip.value_or("");
  const auto error = n["error"].str_or_null();
  if (error.has_value() != (c.verdict == Verdict::kError))
    n["error"].bad("must be a string for a case with verdict \"error\" and null otherwise");
  c.error = error.value_or("");
  c.first_divergent_op = n["first_divergent_op"].str_or_null();
  c.seconds = n["seconds"].non_negative();
  c.peak_device_bytes = n["peak_device_bytes"].count_or_null();
  if (n.has("ranks")) c.ranks = read_ranks(n["ranks"]);
  if (n.has("communication")) c.communication = read_communication(n["communication"]);
  for (const Node& t : n["tensors"].elements()) c.tensors.push_back(read_tensor(t));
  if (const std::string why = verdict_problem(c); !why.empty()) n["verdict"].bad(why);
  return c;
}

// "/cases/1/tensors/0/bit_identical" -> "cases[1].tensors[0].bit_identical", walking
// `doc` to tell array indices from object keys.
std::string dotted_path(const json& doc, const std::string& pointer) {
  std::string out;
  const json* at = &doc;
  size_t i = 1;
  while (i <= pointer.size() && !pointer.empty()) {
    const size_t end = std::min(pointer.find('/', i), pointer.size());
    std::string token;  // RFC 6901 unescape: "~1" is '/', "~0" is '~'
    for (size_t k = i; k < end; ++k) {
      if (pointer[k] == '~' && k + 1 < end) token += pointer[++k] == '1' ? '/' : '~';
      else token += pointer[k];
    }
    if (at && at->is_array()) {
      out += "[" + token + "]";
      const size_t k = std::stoul(token);
      at = k < at->size() ? &(*at)[k] : nullptr;
    } else {
      out += (out.empty() ? "" : ".") + token;
      at = at && at->is_object() && at->contains(token) ? &(*at)[token] : nullptr;
    }
    i = end + 1;
  }
  return out;
}

// The index of the first case whose id an earlier case has, if any.
std::optional<size_t> repeated_case_id(const Report& r) {
  std::set<std::string> seen;
  for (size_t i = 0; i < r.cases.size(); ++i)
    if (!seen.insert(r.cases[i].id).second) return i;
  return std::nullopt;
}
std::string repeated_id_message(const Case& c) {
  return "case id \"" + c.id + "\" appears twice (a baseline matches cases by id)";
}

// What each schema_version after the oldest readable one added (report.h): a case
// verdict with its summary count, case fields (optional ones absent, the others null,
// in a report of an earlier version) and optional tensor fields.
constexpr uint64_t kOldestReadableSchema = 3;
struct SchemaAddition {
  uint64_t version;
  const char* verdict;  // its summary count is 0 in an earlier report; nullptr for none
  std::vector<const char*> null_case_fields, optional_case_fields, optional_tensor_fields;
};
const SchemaAddition kSchemaAdditions[] = {
    {4, "nonfinite", {}, {}, {}},
    {5, "error", {"error"}, {"ranks", "communication"}, {}},
    {6, nullptr, {}, {}, {"truth_error"}},
};

// Refuses any of `fields` in `object` (at the path prefix `at`) with `absent`.
void refuse_fields(const json& object, const std::vector<const char*>& fields, const std::string& at,
                   const std::string& absent, const std::string& path) {
  if (!object.is_object()) return;
  for (const char* f : fields)
    if (object.contains(f)) Node(object[f], at + f, path).bad(absent);
}

// One case of a report that predates `a`: none of what `a` added, its null fields set.
void case_before(json& c, const SchemaAddition& a, const std::string& at, const std::string& absent,
                 const std::string& path) {
  if (!c.is_object()) return;
  if (a.verdict && c.contains("verdict") && c["verdict"] == a.verdict)
    Node(c["verdict"], at + "verdict", path).bad("the verdict \"" + std::string(a.verdict) + "\" " + absent);
  refuse_fields(c, a.null_case_fields, at, absent, path);
  refuse_fields(c, a.optional_case_fields, at, absent, path);
  for (const char* f : a.null_case_fields) c[f] = nullptr;
  if (!c.contains("tensors") || !c["tensors"].is_array()) return;
  const json& tensors = c["tensors"];
  for (size_t k = 0; k < tensors.size(); ++k)
    refuse_fields(tensors[k], a.optional_tensor_fields, at + "tensors[" + std::to_string(k) + "].", absent, path);
}

// A report of an earlier schema_version (3 and later) as the current version's
// document it stands for: what was added since takes its default, once the report is
// seen to hold none of it. Only where the document has the shape the strict reader
// expects; it names anything else afterwards.
void as_current_schema(json& doc, const std::string& path) {
  const Node version(doc["schema_version"], "schema_version", path);
  const uint64_t v = version.count();
  if (v < kOldestReadableSchema || v > static_cast<uint64_t>(kReportSchemaVersion))
    version.bad("this bitparity reads schema_version " + std::to_string(kOldestReadableSchema) + " to " +
                std::to_string(kReportSchemaVersion) + "; this report's is " + std::to_string(v) +
                (v > static_cast<uint64_t>(kReportSchemaVersion) ? " (written by a later bitparity)"
                                                                  : "; re-run the command that wrote it"));
  json& summary = doc["summary"];
  json& cases = doc["cases"];
  for (const SchemaAddition& a : kSchemaAdditions) {
    if (v >= a.version) continue;
    const std::string absent = "is not in a report of schema_version " + std::to_string(v) +
                               " (schema_version " + std::to_string(a.version) + " added it)";
    if (a.verdict && summary.is_object()) {
      if (summary.contains(a.verdict)) Node(summary[a.verdict], std::string("summary.") + a.verdict, path).bad(absent);
      summary[a.verdict] = 0;
    }
    if (!cases.is_array()) continue;
    for (size_t i = 0; i < cases.size(); ++i) case_before(cases[i], a, "cases[" + std::to_string(i) + "].", absent, path);
  }
  doc["schema_version"] = kReportSchemaVersion;
}

}  // namespace

Report parse_report_json(std::string_view text, const std::string& path) {
  json doc = io::parse_json_strict(text, path);
  const Node root(doc, "", path);
  root.expect_object({"schema_version", "tool", "command", "created_utc", "status", "verdict", "nan_policy",
                      "environment", "summary", "cases"});
  as_current_schema(doc, path);
  Report r;
  root["tool"].str();
  r.command = root["command"].str();
  r.created_utc = root["created_utc"].str();
  const auto interrupted = interrupted_from_status(root["status"].str());
  if (!interrupted) root["status"].bad("expected \"complete\" or \"interrupted\"");
  r.interrupted = *interrupted;
  root["nan_policy"].expect_object({"id", "text"});
  r.environment = read_environment(root["environment"]);
  root["summary"].expect_object(
      {"cases", "exact", "mismatch", "skipped", "nonfinite", "error", "tensors", "tensors_mismatch"});
  for (const Node& c : root["cases"].elements()) r.cases.push_back(read_case(c));
  if (const auto i = repeated_case_id(r)) root["cases"].elements()[*i]["id"].bad(repeated_id_message(r.cases[*i]));
  // What the writer derives (tool, verdicts, summary, bit_identical, the NaN policy
  // text, train_rollout_logprob_abs_diff) must be what it would write now.
  const json expected = json(to_json(r));
  const json patch = json::diff(doc, expected);
  if (!patch.empty()) {
    const std::string ptr = patch[0]["path"].get<std::string>();
    const std::string field = dotted_path(doc, ptr);
    const std::string op = patch[0]["op"].get<std::string>();
    std::string why = "disagrees with the rest of the report";
    if (op == "add") why = "is missing (the report's records require it)";
    else if (op == "remove") why = "should not be there (the report's records rule it out)";
    else why += " (expected " + patch[0]["value"].dump() + ")";
    throw BadInput(path, field.empty() ? "(top level)" : field, why);
  }
  return r;
}

// Of any size: what bitparity writes it reads back (a sweep's report can pass the
// 64 MiB that bounds the inputs a user writes by hand).
Report read_report_json(const std::string& path) {
  return parse_report_json(io::read_text_file(path, std::numeric_limits<size_t>::max()), path);
}

// --- CSV ---------------------------------------------------------------------

namespace {

// A row's fields in kCsvColumns' order, whatever the file's order.
using CsvRow = std::vector<std::string>;

// One CSV row with its line number, so every complaint names line and column.
class Row {
 public:
  Row(const CsvRow& f, unsigned line, const std::string& file) : f_(f), line_(line), file_(file) {}

  [[noreturn]] void bad(size_t col, const std::string& why) const {
    throw BadInput(file_, "line " + std::to_string(line_) + ", column " + kCsvColumns[col], why);
  }
  const std::string& at(size_t col) const { return f_[col]; }
  std::string text(const char* name) const { return f_[col(name)]; }
  bool empty(const char* name) const { return f_[col(name)].empty(); }
  bool boolean(const char* name) const {
    const size_t c = col(name);
    if (f_[c] != "true" && f_[c] != "false") bad(c, "expected true or false, found \"" + f_[c] + "\"");
    return f_[c] == "true";
  }
  uint64_t count(const char* name) const { return parse_count(col(name), f_[col(name)]); }
  double diff(const char* name) const {
    const size_t c = col(name);
    if (f_[c] == "inf") return kInf;
    const auto v = finite_non_negative(f_[c]);
    if (!v) bad(c, "expected a number >= 0 or \"inf\", found \"" + f_[c] + "\"");
    return *v;
  }
  // A measurement: a finite number >= 0.
  double non_negative(const char* name) const {
    const size_t c = col(name);
    const auto v = finite_non_negative(f_[c]);
    if (!v) bad(c, "expected a number >= 0, found \"" + f_[c] + "\"");
    return *v;
  }
  double ulp(const char* name) const {
    const double v = diff(name);
    if (std::isfinite(v) && v != std::floor(v)) bad(col(name), "expected an integer or \"inf\", found \"" + text(name) + "\"");
    return v;
  }
  // "[a,b,...]"; "" gives nullopt.
  std::optional<std::vector<uint64_t>> list(const char* name) const {
    const size_t c = col(name);
    const std::string& s = f_[c];
    if (s.empty()) return std::nullopt;
    if (s.size() < 2 || s.front() != '[' || s.back() != ']') bad(c, "expected a list \"[a,b,...]\", found \"" + s + "\"");
    std::vector<uint64_t> out;
    const std::string inner = s.substr(1, s.size() - 2);
    for (size_t at = 0; !inner.empty() && at <= inner.size();) {
      const size_t end = std::min(inner.find(',', at), inner.size());
      out.push_back(parse_count(c, inner.substr(at, end - at)));
      at = end + 1;
    }
    return out;
  }
  template <class T>
  T one_of(const char* name, std::optional<T> (*from_name)(const std::string&), const char* what) const {
    if (auto e = from_name(text(name))) return *e;
    bad(col(name), "\"" + text(name) + "\" is not a " + what);
  }

  static size_t col(const char* name) { return csv_column(name); }

 private:
  static std::optional<double> finite_non_negative(const std::string& s) {
    double v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || !(v >= 0) || std::isinf(v)) return std::nullopt;
    return v;
  }
  uint64_t parse_count(size_t c, const std::string& s) const {
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size())
      bad(c, "expected an integer >= 0, found \"" + s + "\"");
    return v;
  }
  const CsvRow& f_;
  unsigned line_;
  const std::string& file_;
};

// The metric columns of kCsvColumns (between is_logprob and nan_policy, inclusive).
constexpr const char* kMetricColumns[] = {"elements", "mismatches", "max_abs_diff", "max_ulp_diff", "mean_abs_diff",
                                          "train_rollout_logprob_abs_diff", "first_mismatch", "nan_a", "nan_b",
                                          "inf_a", "inf_b", "nan_policy", "ulp_histogram"};

TensorMetrics metrics_from_row(const Row& row, bool is_logprob) {
  TensorMetrics m;
  m.elements = row.count("elements");
  m.mismatches = row.count("mismatches");
  m.max_abs_diff = row.diff("max_abs_diff");
  m.max_ulp_diff = row.ulp("max_ulp_diff");
  m.mean_abs_diff = row.diff("mean_abs_diff");
  if (is_logprob != !row.empty("train_rollout_logprob_abs_diff"))
    row.bad(Row::col("train_rollout_logprob_abs_diff"), "must be given for a logprob tensor and only then");
  if (is_logprob && row.diff("train_rollout_logprob_abs_diff") != m.mean_abs_diff)
    row.bad(Row::col("train_rollout_logprob_abs_diff"), "must equal mean_abs_diff");
  m.first_mismatch = row.empty("first_mismatch") ? -1 : static_cast<int64_t>(row.count("first_mismatch"));
  m.nan_a = row.count("nan_a");
  m.nan_b = row.count("nan_b");
  m.inf_a = row.count("inf_a");
  m.inf_b = row.count("inf_b");
  if (row.text("nan_policy") != kNanPolicy) row.bad(Row::col("nan_policy"), "expected \"nan_equal\"");
  m.ulp_histogram = row.list("ulp_histogram").value_or(std::vector<uint64_t>{});
  if (const std::string why = histogram_problem(m); !why.empty()) row.bad(Row::col("ulp_histogram"), why);
  return m;
}

// Both of a side's columns, or neither (kTruthColumns).
std::optional<TruthError> truth_from_row(const Row& row, const TruthColumns& c) {
  const bool has_max = !row.empty(c.max_ulp), has_mean = !row.empty(c.mean_ulp);
  if (has_max != has_mean)
    row.bad(Row::col(has_max ? c.mean_ulp : c.max_ulp), std::string("is empty but ") +
                                                          (has_max ? c.max_ulp : c.mean_ulp) +
                                                          " is not (a side's truth error is both numbers or neither)");
  if (!has_max) return std::nullopt;
  return TruthError{row.diff(c.max_ulp), row.diff(c.mean_ulp)};
}

TensorRecord tensor_from_row(const Row& row) {
  TensorRecord t;
  t.name = row.text("tensor");
  t.name_b = row.text("tensor_b");
  t.status = row.one_of("status", status_from_name, "tensor status");
  t.dtype_a = row.text("dtype_a");
  t.dtype_b = row.text("dtype_b");
  t.shape_a = row.list("shape_a");
  t.shape_b = row.list("shape_b");
  t.is_logprob = row.boolean("is_logprob");
  if (t.status == TensorStatus::kCompared) {
    t.metrics = metrics_from_row(row, t.is_logprob);
  } else {
    for (const char* c : kMetricColumns)
      if (!row.empty(c)) row.bad(Row::col(c), "must be empty unless status is \"compared\"");
  }
  bind_metrics(t);
  for (const TruthColumns& c : kTruthColumns) t.*c.side = truth_from_row(row, c);
  if (row.boolean("bit_identical") != t.matches())
    row.bad(Row::col("bit_identical"), t.matches() ? "is false but the metrics say identical" : "is true but the tensor does not match");
  return t;
}

// The columns of a case (beside case_id), repeated on each of its rows.
constexpr const char* kCaseColumns[] = {"case_verdict", "parameters", "first_divergent_op", "seconds",
                                        "peak_device_bytes", "error"};
bool is_case_column(size_t c) {
  return std::any_of(std::begin(kCaseColumns), std::end(kCaseColumns), [c](const char* n) { return Row::col(n) == c; });
}

// The case columns of a row; rows of one case must agree on them.
Case case_from_row(const Row& row, bool escaped_parameters) {
  Case c;
  c.id = row.text("case_id");
  c.verdict = row.one_of("case_verdict", verdict_from_name, kVerdictWhat);
  c.parameters = parameters_from_csv(row.text("parameters"), escaped_parameters);
  if (!row.empty("first_divergent_op")) c.first_divergent_op = row.text("first_divergent_op");
  c.seconds = row.non_negative("seconds");
  if (!row.empty("peak_device_bytes")) c.peak_device_bytes = row.count("peak_device_bytes");
  // The verdict, not the field, says whether the case failed: a message may be empty.
  if (c.verdict == Verdict::kError) c.error = row.text("error");
  else if (!row.empty("error")) row.bad(Row::col("error"), "must be empty unless case_verdict is \"error\"");
  return c;
}

// The GPU columns (kGpuFields): the last, and optional, as a CSV written before them has none.
bool is_gpu_column(const std::string& name) {
  return std::any_of(std::begin(kGpuFields), std::end(kGpuFields), [&](const GpuField& g) { return name == g.key; });
}
bool is_truth_column(const std::string& name) {
  return std::any_of(std::begin(kTruthColumns), std::end(kTruthColumns),
                     [&](const TruthColumns& t) { return name == t.max_ulp || name == t.mean_ulp; });
}
// The columns a CSV of schema_version 3 lacks: run_status, error, the truth errors'
// and the GPU's. A CSV written before them reads them as their defaults (an empty
// error, no truth errors, no GPU, and a complete run: such a CSV never said otherwise).
bool is_later_column(const std::string& name) {
  return name == "run_status" || name == "error" || is_truth_column(name) || is_gpu_column(name);
}
std::string later_column_default(const std::string& name) { return name == "run_status" ? "complete" : ""; }
// The report's columns, the same on every row: run_status and the GPU's.
bool is_report_column(size_t c) { return c == Row::col("run_status") || is_gpu_column(kCsvColumns[c]); }

// The row of a report without cases (csv.cpp): empty but for the report's columns.
bool is_report_row(const Row& row) { return row.empty("case_id") && row.empty("case_verdict"); }
void check_report_row(const Row& row) {
  for (size_t c = 0; c < kCsvColumns.size(); ++c)
    if (!is_report_column(c) && !row.at(c).empty())
      row.bad(c, "must be empty in the row of a report without cases (case_id and case_verdict are empty)");
}

// Where each of kCsvColumns is among the header's fields (npos: absent, a column an
// earlier bitparity did not write). Every column, in any order, no other, none twice.
std::vector<size_t> header_columns(const io::CsvRecord& header, const std::string& path) {
  std::vector<size_t> at(kCsvColumns.size(), std::string::npos);
  auto bad = [&](const std::string& why) { throw BadInput(path, "line " + std::to_string(header.line), why); };
  for (size_t i = 0; i < header.fields.size(); ++i) {
    const std::string& name = header.fields[i];
    const auto known = std::find(kCsvColumns.begin(), kCsvColumns.end(), name);
    if (known == kCsvColumns.end()) bad("unknown column \"" + name + "\" in the header");
    size_t& slot = at[static_cast<size_t>(known - kCsvColumns.begin())];
    if (slot != std::string::npos) bad("column \"" + name + "\" appears twice in the header");
    slot = i;
  }
  for (size_t c = 0; c < kCsvColumns.size(); ++c)
    if (at[c] == std::string::npos && !is_later_column(kCsvColumns[c]))
      bad("column \"" + kCsvColumns[c] + "\" is missing from the header (a bitparity CSV report of schema_version 3 "
          "or later has it)");
  return at;
}

// A record's fields in kCsvColumns' order, an absent column's default in its place.
CsvRow in_column_order(const io::CsvRecord& record, size_t header_fields, const std::vector<size_t>& columns,
                       const std::string& path) {
  if (record.fields.size() != header_fields)
    throw BadInput(path, "line " + std::to_string(record.line),
                   "has " + std::to_string(record.fields.size()) + " fields; the header has " +
                       std::to_string(header_fields));
  CsvRow f(kCsvColumns.size());
  for (size_t c = 0; c < kCsvColumns.size(); ++c)
    f[c] = columns[c] == std::string::npos ? later_column_default(kCsvColumns[c]) : record.fields[columns[c]];
  return f;
}

// Consecutive rows with one case_id form a case; a case without tensors is one row
// with empty tensor columns. Every row carries the report's columns.
void read_csv_rows(const std::vector<io::CsvRecord>& records, const std::vector<size_t>& columns,
                   bool escaped_parameters, Report& r, const std::string& path) {
  CsvRow case_head;
  unsigned case_line = 0, rows = 0;
  bool tensorless = false, report_row = false;
  std::set<std::string> ids;
  auto close_case = [&] {
    if (r.cases.empty()) return;
    if (const std::string why = verdict_problem(r.cases.back()); !why.empty())
      throw BadInput(path, "line " + std::to_string(case_line) + ", column case_verdict", why);
  };
  for (size_t i = 1; i < records.size(); ++i) {
    const CsvRow f = in_column_order(records[i], records[0].fields.size(), columns, path);
    const Row row(f, records[i].line, path);
    const bool interrupted = row.one_of("run_status", interrupted_from_status, "run status (complete, interrupted)");
    if (rows++ == 0) {
      r.interrupted = interrupted;
      for (const GpuField& g : kGpuFields)
        if (!row.empty(g.key)) r.environment.*g.field = row.text(g.key);
    } else {
      if (interrupted != r.interrupted) row.bad(Row::col("run_status"), "differs from the first row's");
      for (const GpuField& g : kGpuFields)
        if (row.text(g.key) != (r.environment.*g.field).value_or(""))
          row.bad(Row::col(g.key), "differs from the first row's");
    }
    if (report_row || (is_report_row(row) && rows > 1))
      row.bad(Row::col("case_id"), "a report without cases has one row, and a report with cases no such row");
    if (is_report_row(row)) {
      check_report_row(row);
      report_row = true;
      continue;
    }
    const bool continues = !r.cases.empty() && r.cases.back().id == row.text("case_id");
    if (continues) {
      for (const char* col : kCaseColumns)
        if (row.text(col) != case_head[Row::col(col)]) row.bad(Row::col(col), "differs from the first row of its case");
    } else {
      close_case();
      const Case c = case_from_row(row, escaped_parameters);
      if (!ids.insert(c.id).second) row.bad(Row::col("case_id"), repeated_id_message(c));
      r.cases.push_back(c);
      case_head = f;
      case_line = records[i].line;
    }
    const bool no_tensor = row.empty("status");
    if (continues && (tensorless || no_tensor))
      row.bad(Row::col("status"), "a case without tensors has exactly one row");
    tensorless = no_tensor;
    if (!no_tensor) {
      r.cases.back().tensors.push_back(tensor_from_row(row));
    } else {
      for (size_t c = Row::col("tensor"); c < kCsvColumns.size(); ++c)
        if (!is_case_column(c) && !is_report_column(c) && !row.at(c).empty())
          row.bad(c, "must be empty in the row of a case without tensors (status is empty)");
    }
  }
  close_case();
}

}  // namespace

Report read_report_csv(const std::string& path) {
  const std::vector<io::CsvRecord> records =
      io::csv_records(io::read_text_file(path, std::numeric_limits<size_t>::max()), path);
  if (records.empty()) throw BadInput(path, "CSV", "no header: the file is empty");
  const std::vector<size_t> columns = header_columns(records[0], path);
  // The parameters column is escaped since the GPU columns came (csv.cpp); a CSV
  // without them splits it as it was written, at every ';' and each item's first '='.
  const bool escaped_parameters = columns[csv_column(kGpuFields[0].key)] != std::string::npos;
  Report r;
  read_csv_rows(records, columns, escaped_parameters, r, path);
  return r;
}

Report read_report(const std::string& path) {
  std::string ext = path.size() >= 4 ? path.substr(path.size() - 4) : "";
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".csv" ? read_report_csv(path) : read_report_json(path);
}

}  // namespace bp::harness
