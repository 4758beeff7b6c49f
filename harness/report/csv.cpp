// CSV rendering: one row per case x tensor, RFC 4180.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "harness/report/report.h"

namespace bp::harness {

const std::vector<std::string> kCsvColumns = {
    "case_id", "case_verdict", "parameters", "tensor", "tensor_b", "status", "dtype_a", "dtype_b",
    "shape_a", "shape_b", "bit_identical", "is_logprob", "elements", "mismatches", "max_abs_diff",
    "max_ulp_diff", "mean_abs_diff", "train_rollout_logprob_abs_diff", "first_mismatch",
    "nan_a", "nan_b", "inf_a", "inf_b", "nan_policy",
    // schema_version 2
    "first_divergent_op", "ulp_histogram",
    // schema_version 3
    "seconds", "peak_device_bytes",
    // schema_version 5: a case's error message (verdict "error"), else empty
    "error",
    // the report's status (complete, interrupted), on every row
    "run_status",
    // schema_version 6: each side's distance from the float64 truth (kTruthColumns), else empty
    "truth_max_ulp_a", "truth_mean_ulp_a", "truth_max_ulp_b", "truth_mean_ulp_b",
    // where it was made (kGpuFields), on every row; empty when no GPU was used
    "gpu_name", "gpu_driver", "cuda_version", "nccl_version",
};

namespace {
constexpr char kEscape = '\\';
bool parameter_special(char ch) { return ch == kEscape || ch == ';' || ch == '='; }
std::string escaped_parameter(const std::string& s) {
  std::string e;
  for (char ch : s) {
    if (parameter_special(ch)) e += kEscape;
    e += ch;
  }
  return e;
}
}  // namespace

std::string csv_parameters(const std::map<std::string, std::string>& parameters) {
  std::string text;
  for (const auto& [k, v] : parameters) {
    if (!text.empty()) text += ';';
    text += escaped_parameter(k) + '=' + escaped_parameter(v);
  }
  return text;
}

std::map<std::string, std::string> parameters_from_csv(const std::string& text, bool escaped) {
  std::map<std::string, std::string> out;
  std::string key, value;
  bool in_value = false;  // past the item's first unescaped '='
  auto finish = [&] {
    out[key] = value;
    key.clear();
    value.clear();
    in_value = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    char ch = text[i];
    if (escaped && ch == kEscape && i + 1 < text.size() && parameter_special(text[i + 1])) {
      ch = text[++i];
    } else if (ch == ';') {
      finish();
      continue;
    } else if (ch == '=' && !in_value) {
      in_value = true;
      continue;
    }
    (in_value ? value : key) += ch;
  }
  if (!text.empty()) finish();
  return out;
}

size_t csv_column(const std::string& name) {
  const auto it = std::find(kCsvColumns.begin(), kCsvColumns.end(), name);
  if (it == kCsvColumns.end()) throw std::logic_error("no CSV column " + name);
  return static_cast<size_t>(it - kCsvColumns.begin());
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q(1, '"');
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  q += '"';
  return q;
}

namespace {

// Round-trippable (%.17g); non-finite as "inf" (pandas reads it as float inf).
std::string num(double v) {
  if (!std::isfinite(v)) return v > 0 ? "inf" : (v < 0 ? "-inf" : "nan");
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string list_text(const std::vector<uint64_t>& v) {
  std::string t = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) t += ',';
    t += std::to_string(v[i]);
  }
  t += ']';
  return t;
}
std::string shape_text(const std::optional<std::vector<uint64_t>>& s) { return s ? list_text(*s) : ""; }

}  // namespace

std::string render_csv(const Report& r) {
  std::string out;
  auto row = [&out](const std::vector<std::string>& fields) {
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i) out += ',';
      out += csv_field(fields[i]);
    }
    out += "\r\n";
  };
  row(kCsvColumns);
  // The report's columns, on every row.
  auto report_tail = [&r](std::vector<std::string>& f) {
    f.resize(kCsvColumns.size());
    f[csv_column("run_status")] = r.status();
    for (const GpuField& g : kGpuFields) f[csv_column(g.key)] = (r.environment.*g.field).value_or("");
  };
  // A report with no cases still says whether its run was interrupted, and where it ran.
  if (r.cases.empty()) {
    std::vector<std::string> f;
    report_tail(f);
    row(f);
  }
  for (const Case& c : r.cases) {
    const std::vector<std::string> head = {c.id, verdict_name(c.verdict), csv_parameters(c.parameters)};
    // The case's columns after the tensor's, repeated on every row of the case, and the report's.
    auto case_tail = [&c, &report_tail](std::vector<std::string>& f) {
      report_tail(f);
      f[csv_column("first_divergent_op")] = c.first_divergent_op.value_or("");
      f[csv_column("seconds")] = num(c.seconds);
      f[csv_column("peak_device_bytes")] = c.peak_device_bytes ? std::to_string(*c.peak_device_bytes) : "";
      f[csv_column("error")] = c.verdict == Verdict::kError ? c.error : "";
    };
    if (c.tensors.empty()) {
      std::vector<std::string> f = head;
      case_tail(f);
      row(f);
      continue;
    }
    for (const TensorRecord& t : c.tensors) {
      std::vector<std::string> f = head;
      f.insert(f.end(), {t.name, t.name_b, tensor_status_name(t.status), t.dtype_a, t.dtype_b,
                         shape_text(t.shape_a), shape_text(t.shape_b), t.matches() ? "true" : "false",
                         t.is_logprob ? "true" : "false"});
      if (const auto& m = t.metrics) {
        f.insert(f.end(), {std::to_string(m->elements), std::to_string(m->mismatches), num(m->max_abs_diff),
                           num(m->max_ulp_diff), num(m->mean_abs_diff),
                           t.is_logprob ? num(m->train_rollout_logprob_abs_diff()) : "",
                           m->first_mismatch < 0 ? "" : std::to_string(m->first_mismatch),
                           std::to_string(m->nan_a), std::to_string(m->nan_b), std::to_string(m->inf_a),
                           std::to_string(m->inf_b), m->nan_policy});
      }
      case_tail(f);
      for (const TruthColumns& col : kTruthColumns)
        if (const std::optional<TruthError>& e = t.*col.side) {
          f[csv_column(col.max_ulp)] = num(e->max_ulp);
          f[csv_column(col.mean_ulp)] = num(e->mean_ulp);
        }
      // An empty histogram (bit identical) is an empty field, as for absent metrics.
      if (t.metrics && !t.metrics->ulp_histogram.empty())
        f[csv_column("ulp_histogram")] = list_text(t.metrics->ulp_histogram);
      row(f);
    }
  }
  return out;
}

}  // namespace bp::harness
