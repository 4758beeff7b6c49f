// JSON rendering (reports/schema/report.schema.json, schema_version 6: 6 added each
// tensor's optional "truth_error"; earlier versions: report.h).
#include <cmath>

#include "harness/report/report.h"

namespace bp::harness {

namespace {

using json = nlohmann::ordered_json;

json number(double v) { return std::isfinite(v) ? json(v) : json("inf"); }
json ulp_number(double v) { return std::isfinite(v) ? json(static_cast<uint64_t>(v)) : json("inf"); }
template <class T>
json or_null(const std::optional<T>& v) { return v ? json(*v) : json(nullptr); }
json str_or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

json metrics_json(const TensorMetrics& m, bool is_logprob) {
  json j = {
      {"elements", m.elements},
      {"mismatches", m.mismatches},
      {"max_abs_diff", number(m.max_abs_diff)},
      {"max_ulp_diff", ulp_number(m.max_ulp_diff)},
      {"mean_abs_diff", number(m.mean_abs_diff)},
      {"first_mismatch", m.first_mismatch < 0 ? json(nullptr) : json(m.first_mismatch)},
      {"nan_a", m.nan_a}, {"nan_b", m.nan_b}, {"inf_a", m.inf_a}, {"inf_b", m.inf_b},
      {"nan_policy", m.nan_policy},
      {"ulp_histogram", m.ulp_histogram},
  };
  if (is_logprob) j["train_rollout_logprob_abs_diff"] = number(m.train_rollout_logprob_abs_diff());
  return j;
}

json truth_side_json(const std::optional<TruthError>& e) {
  return e ? json{{"max_ulp", number(e->max_ulp)}, {"mean_ulp", number(e->mean_ulp)}} : json(nullptr);
}

json tensor_json(const TensorRecord& t) {
  json j = {
      {"name", t.name},
      {"name_b", str_or_null(t.name_b)},
      {"status", tensor_status_name(t.status)},
      {"dtype_a", str_or_null(t.dtype_a)},
      {"dtype_b", str_or_null(t.dtype_b)},
      {"shape_a", or_null(t.shape_a)},
      {"shape_b", or_null(t.shape_b)},
      {"bit_identical", t.matches()},
      {"is_logprob", t.is_logprob},
      {"metrics", t.metrics ? metrics_json(*t.metrics, t.is_logprob) : json(nullptr)},
  };
  // Only where a side was measured (conform), so that other reports read as before.
  if (t.has_truth_error())
    j["truth_error"] = {{"a", truth_side_json(t.truth_error_a)}, {"b", truth_side_json(t.truth_error_b)}};
  return j;
}

json weights_json(const WeightsOrigin& w) {
  json files = json::array();
  for (const io::FileDigest& f : w.files) files.push_back({{"path", f.path}, {"sha256", f.sha256}});
  return {{"model", w.model},
          {"seed", or_null(w.seed)},
          {"files", std::move(files)},
          {"conversion", str_or_null(w.conversion)}};
}

json environment_json(const Environment& e) {
  json j = {
      {"git_commit", e.git_commit},
      {"git_dirty", or_null(e.git_dirty)},
      {"bitparity_version", e.bitparity_version},
      {"compiler_id", e.compiler_id},
      {"compiler_version", e.compiler_version},
      {"compiler_flags", e.compiler_flags},
      {"build_type", e.build_type},
      {"contract_name", or_null(e.contract_name)},
      {"contract_knob_hash", or_null(e.contract_knob_hash)},
      {"cpu_model", e.cpu_model},
      {"gpu_name", or_null(e.gpu_name)},
      {"gpu_driver", or_null(e.gpu_driver)},
      {"cuda_version", or_null(e.cuda_version)},
      {"nccl_version", or_null(e.nccl_version)},
  };
  // Optional, so that reports of commands that load no model read back unchanged.
  if (!e.weights.empty()) {
    json& w = j["weights"] = json::array();
    for (const WeightsOrigin& o : e.weights) w.push_back(weights_json(o));
  }
  return j;
}

json communication_json(const std::vector<CollectiveTraffic>& traffic) {
  json a = json::array();
  for (const CollectiveTraffic& t : traffic)
    a.push_back({{"collective", t.collective}, {"calls", t.calls}, {"bytes", t.bytes}});
  return a;
}

json case_json(const Case& c, json tensors) {
  json j = {
      {"id", c.id},
      {"parameters", c.parameters},
      {"verdict", verdict_name(c.verdict)},
      {"skip_reason", c.verdict == Verdict::kSkipped ? json(c.skip_reason) : json(nullptr)},
      {"error", c.verdict == Verdict::kError ? json(c.error) : json(nullptr)},
      {"first_divergent_op", or_null(c.first_divergent_op)},
      {"seconds", c.seconds},
      {"peak_device_bytes", or_null(c.peak_device_bytes)},
  };
  // Absent where the implementation runs in one process (no ranks, no collectives).
  if (c.ranks) j["ranks"] = *c.ranks;
  if (!c.communication.empty()) j["communication"] = communication_json(c.communication);
  j["tensors"] = std::move(tensors);
  return j;
}

}  // namespace

json to_json(const Report& r) {
  json cases = json::array();
  uint64_t n_tensors = 0, n_tensors_bad = 0;
  for (const Case& c : r.cases) {
    json tensors = json::array();
    for (const TensorRecord& t : c.tensors) {
      tensors.push_back(tensor_json(t));
      ++n_tensors;
      n_tensors_bad += !t.matches();
    }
    cases.push_back(case_json(c, std::move(tensors)));
  }
  return {
      {"schema_version", kReportSchemaVersion},
      {"tool", "bitparity"},
      {"command", r.command},
      {"created_utc", r.created_utc},
      {"status", r.status()},
      {"verdict", verdict_name(r.overall())},
      {"nan_policy", {{"id", kNanPolicy}, {"text", kNanPolicyText}}},
      {"environment", environment_json(r.environment)},
      {"summary",
       {{"cases", r.cases.size()}, {"exact", r.count(Verdict::kExact)}, {"mismatch", r.count(Verdict::kMismatch)},
        {"skipped", r.count(Verdict::kSkipped)}, {"nonfinite", r.count(Verdict::kNonFinite)},
        {"error", r.count(Verdict::kError)}, {"tensors", n_tensors}, {"tensors_mismatch", n_tensors_bad}}},
      {"cases", std::move(cases)},
  };
}

std::string render_json(const Report& r) {
  // Invalid UTF-8 in a user-supplied name is replaced, never a throw.
  return to_json(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace bp::harness
