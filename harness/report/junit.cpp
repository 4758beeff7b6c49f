// JUnit XML rendering: one <testcase> per case.
#include <cstdio>

#include "harness/report/html.h"
#include "harness/report/report.h"

namespace bp::harness {

namespace {

std::string xml(const std::string& s) { return markup_escape(s, Markup::kXml); }

std::string describe(const TensorRecord& t) {
  std::string s = "tensor '" + t.name + "'";
  if (!t.name_b.empty()) s += " (B: '" + t.name_b + "')";
  switch (t.status) {
    case TensorStatus::kOnlyInA: return s + ": only in A";
    case TensorStatus::kOnlyInB: return s + ": only in B";
    case TensorStatus::kDtypeMismatch: return s + ": dtype " + t.dtype_a + " vs " + t.dtype_b;
    case TensorStatus::kShapeMismatch: return s + ": shapes differ";
    case TensorStatus::kCompared: break;
  }
  const TensorMetrics& m = *t.metrics;
  return s + ": " + std::to_string(m.mismatches) + "/" + std::to_string(m.elements) + " elements differ, first at " +
         std::to_string(m.first_mismatch) + ", max ulp " + metric_text(m.max_ulp_diff, "%.17g") + ", max |diff| " +
         metric_text(m.max_abs_diff, "%.17g") + ", mean |diff| " + metric_text(m.mean_abs_diff, "%.17g");
}

// JUnit's time attribute: seconds as a decimal (CI tools read it as a float).
std::string time_attribute(double seconds) {
  char buf[400];  // room for the largest finite double in %f
  std::snprintf(buf, sizeof buf, " time=\"%.6f\"", seconds);
  return buf;
}

}  // namespace

std::string render_junit(const Report& r) {
  size_t failures = 0, errors = 0, skipped = 0;
  double seconds = 0;
  for (const Case& c : r.cases) {
    failures += c.verdict == Verdict::kMismatch;
    errors += c.verdict == Verdict::kError;
    skipped += c.verdict == Verdict::kSkipped;
    seconds += c.seconds;
  }
  const std::string suite = "bitparity." + r.command;
  const std::string counts = " tests=\"" + std::to_string(r.cases.size()) + "\" failures=\"" +
                             std::to_string(failures) + "\" errors=\"" + std::to_string(errors) + "\" skipped=\"" +
                             std::to_string(skipped) + "\"";
  const Environment& e = r.environment;
  std::string o = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<testsuites name=\"bitparity\"" + counts + ">\n";
  o += "  <testsuite name=\"" + xml(suite) + "\"" + counts + time_attribute(seconds) + " timestamp=\"" +
       xml(r.created_utc) + "\">\n";
  o += "    <properties>\n";
  auto prop = [&o](const std::string& k, const std::string& v) {
    o += "      <property name=\"" + xml(k) + "\" value=\"" + xml(v) + "\"/>\n";
  };
  prop("status", r.status());
  prop("verdict", verdict_name(r.overall()));
  prop("schema_version", std::to_string(kReportSchemaVersion));
  prop("git_commit", e.git_commit);
  prop("git_dirty", e.git_dirty ? (*e.git_dirty ? "true" : "false") : "unknown");
  prop("compiler", e.compiler_id + " " + e.compiler_version);
  prop("compiler_flags", e.compiler_flags);
  if (e.contract_name) prop("contract", *e.contract_name + " " + e.contract_knob_hash.value_or(""));
  prop("cpu_model", e.cpu_model);
  // Where it was made, when it used a GPU (as the contract, when one applies).
  for (const GpuField& g : kGpuFields)
    if (const auto& v = e.*g.field) prop(g.key, *v);
  prop("nan_policy", kNanPolicy);
  o += "    </properties>\n";
  for (const Case& c : r.cases) {
    o += "    <testcase classname=\"" + xml(suite) + "\" name=\"" + xml(c.id) + "\"" + time_attribute(c.seconds);
    const TensorRecord* bad = c.verdict == Verdict::kMismatch ? c.first_mismatch() : nullptr;
    if (c.verdict == Verdict::kSkipped) {
      o += ">\n      <skipped message=\"" + xml(c.skip_reason) + "\"/>\n    </testcase>\n";
    } else if (c.verdict == Verdict::kError) {
      o += ">\n      <error type=\"error\" message=\"" + xml(c.error) + "\">" + xml(c.error) +
           "</error>\n    </testcase>\n";
    } else if (bad) {
      size_t n_bad = 0;
      for (const TensorRecord& t : c.tensors) n_bad += !t.matches();
      const std::string msg = describe(*bad);
      o += ">\n      <failure type=\"mismatch\" message=\"" + xml(msg) + "\">" +
           xml(std::to_string(n_bad) + " of " + std::to_string(c.tensors.size()) +
               " tensors differ; first: " + msg) +
           "</failure>\n    </testcase>\n";
    } else if (c.verdict == Verdict::kNonFinite) {
      // Not a failure (the command exits 0 without --strict), but never a silent pass.
      o += ">\n      <system-err>" + xml("WARNING: nonfinite: " + nonfinite_text(*c.first_nonfinite())) +
           "</system-err>\n    </testcase>\n";
    } else {
      o += "/>\n";
    }
  }
  o += "  </testsuite>\n</testsuites>\n";
  return o;
}

}  // namespace bp::harness
