#include "harness/cli/report.h"

#include <optional>

#include "harness/exit_codes.h"
#include "harness/io/errors.h"
#include "harness/io/files.h"
#include "harness/report/baseline.h"
#include "harness/report/html.h"
#include "harness/report/read.h"

namespace bp::harness {

namespace {

void print_summary(const Report& r, const std::string& path, std::FILE* out) {
  size_t exact = 0, mismatch = 0, skipped = 0;
  for (const Case& c : r.cases) {
    exact += c.verdict == Verdict::kExact;
    mismatch += c.verdict == Verdict::kMismatch;
    skipped += c.verdict == Verdict::kSkipped;
  }
  std::fprintf(out, "report %s: %zu cases: %zu exact, %zu mismatch, %zu skipped%s\n", path.c_str(), r.cases.size(),
               exact, mismatch, skipped, r.interrupted ? " (interrupted run)" : "");
  for (const Case& c : r.cases) {
    if (c.verdict != Verdict::kMismatch) continue;
    const TensorRecord* t = c.first_mismatch();
    std::fprintf(out, "  MISMATCH %s: first tensor %s (%s)%s%s\n", c.id.c_str(), t ? t->name.c_str() : "?",
                 t ? tensor_status_name(t->status) : "?", c.first_divergent_op ? ", first divergent op " : "",
                 c.first_divergent_op.value_or("").c_str());
  }
  std::fprintf(out, "verdict: %s\n", verdict_name(r.overall()));
}

}  // namespace

int run_report(const ReportOptions& o, std::FILE* out, std::FILE* err) {
  if (!o.html.empty())
    if (const std::string why = io::write_path_problem(o.html); !why.empty()) {
      std::fprintf(err, "bitparity report: cannot write --html %s: %s\n", o.html.c_str(), why.c_str());
      return kExitBadInput;
    }
  Report r;
  std::optional<BaselineDiff> diff;
  try {
    r = read_report(o.report);
    if (!o.baseline.empty()) diff = compare_to_baseline(read_report(o.baseline), o.baseline, r, o.report);
  } catch (...) {
    return exit_for_read_error("report", err);
  }
  print_summary(r, o.report, out);
  if (diff) std::fputs(format_baseline_diff(*diff).c_str(), out);
  if (!o.html.empty()) {
    try {
      io::write_file_atomic(o.html, render_html(r, o.report, diff ? &*diff : nullptr));
    } catch (const io::IoError& e) {
      std::fprintf(err, "bitparity report: cannot write --html: %s\n", e.what());
      return kExitBadInput;
    }
  }
  if (diff) return diff->regressed() ? kExitMismatch : kExitExact;
  return r.overall() == Verdict::kMismatch ? kExitMismatch : kExitExact;
}

}  // namespace bp::harness
