// `bitparity report R.json|R.csv [--baseline OLD.json|OLD.csv] [--html out.html]`:
// reads a report back, prints its summary (and its comparison against a baseline),
// and renders it as one HTML page.
#include <cstdio>
#include <optional>
#include <string>

#include "harness/cli/common.h"
#include "harness/exit_codes.h"
#include "harness/io/errors.h"
#include "harness/io/files.h"
#include "harness/report/baseline.h"
#include "harness/report/html.h"
#include "harness/report/read.h"

namespace bp::harness {

namespace {

struct ReportOptions {
  std::string report;    // JSON, or CSV by the ".csv" extension
  std::string baseline;  // "" = none
  std::string html;      // "" = none
  bool strict = false;
};

// "  TRUTH <case>: ..." for a case whose tensors have both sides' truth errors: in how
// many the engine is the farther, and the worst (truth_summary); "" otherwise.
std::string truth_line(const Case& c) {
  const auto [measured, farther, worst] = truth_summary(c);
  if (measured == 0) return "";
  const std::string head = "  TRUTH " + terminal_text(c.id) + ": the engine is ";
  const std::string of = std::to_string(measured) + (measured == 1 ? " tensor" : " tensors");
  if (!worst) return head + "no farther from the float64 truth than the contract in any of " + of + "\n";
  return head + "farther from the float64 truth than the contract in " + std::to_string(farther) + " of " + of +
         ", most in " + terminal_text(worst->name) + " (mean " + metric_text(worst->truth_error_a->mean_ulp, "%.3g") +
         " / " + metric_text(worst->truth_error_b->mean_ulp, "%.3g") + " ulp)\n";
}

// For a terminal: names pass through terminal_text.
void print_summary(const Report& r, const std::string& path, std::FILE* out) {
  std::fprintf(out, "report %s: %zu cases: %s%s\n", terminal_text(path).c_str(), r.cases.size(),
               r.counts_text().c_str(), r.interrupted ? " (interrupted run)" : "");
  for (const Case& c : r.cases) {
    if (c.verdict == Verdict::kError)
      std::fprintf(out, "  ERROR %s: %s\n", terminal_text(c.id).c_str(), terminal_text(c.error).c_str());
    if (c.verdict == Verdict::kMismatch) {
      const TensorRecord* t = c.first_mismatch();
      std::fprintf(out, "  MISMATCH %s: first tensor %s (%s)%s%s\n", terminal_text(c.id).c_str(),
                   t ? terminal_text(t->name).c_str() : "?", t ? tensor_status_name(t->status) : "?",
                   c.first_divergent_op ? ", first divergent op " : "",
                   terminal_text(c.first_divergent_op.value_or("")).c_str());
    }
    std::fputs(truth_line(c).c_str(), out);
  }
  std::fprintf(out, "verdict: %s\n", verdict_name(r.overall()));
  if (r.interrupted)
    std::fprintf(out, "report: the run was interrupted: its cases are those that finished before it stopped\n");
}

// Exit code: 130 for the report of an interrupted run (as the run itself exited: its
// missing cases were never compared); else without a baseline the report's verdict
// (0 exact or skipped only, 1 a mismatch, 3 a case that failed with an error, as the
// run exited; nonfinite: 0 with a warning, 1 under --strict); with one, 1 iff
// something newly fails or a case compared in the baseline is gone, else 0; 2 for an
// unreadable or malformed report (the message names the file and the field) or a bad
// --html path (unwritable, or one of the reports read). Every input is read before
// the page is written (atomically), so a failed run leaves an earlier page untouched.
int report(const ReportOptions& o) {
  if (const int rc = check_report_paths("report", ReportPaths{"", "", "", o.html}, {o.report, o.baseline}, stderr))
    return rc;
  Report r;
  std::optional<BaselineDiff> diff;
  try {
    r = read_report(o.report);
    if (!o.baseline.empty()) diff = compare_to_baseline(read_report(o.baseline), o.baseline, r, o.report);
  } catch (...) {
    return exit_for_read_error("report", stderr);
  }
  std::FILE* const out = text_stream({o.html});
  print_summary(r, o.report, out);
  if (diff) std::fputs(format_baseline_diff(*diff).c_str(), out);
  if (!o.html.empty()) {
    try {
      io::write_output(o.html, render_html(r, o.report, diff ? &*diff : nullptr));
    } catch (const io::IoError& e) {
      std::fprintf(stderr, "bitparity report: cannot write --html: %s\n", e.what());
      return kExitBadInput;
    }
  }
  if (r.interrupted) return kExitInterrupted;
  if (diff) return diff->regressed() ? kExitMismatch : kExitExact;
  if (const auto rc = failure_exit_code(r)) return *rc;  // an error, a mismatch
  if (r.overall() == Verdict::kNonFinite) return nonfinite_exit("report", r, o.strict, stderr);
  return kExitExact;
}

}  // namespace

Subcommand add_report_command(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* sub = app.add_subcommand(
      "report",
      "read a report back (JSON, or CSV by its .csv extension), print its summary, compare it against a baseline, "
      "render it as HTML. Exit code without --baseline: the report's verdict (0 exact or skipped only, 1 a mismatch, "
      "3 a case that failed with an error; nonfinite: 0 with a warning, 1 with --strict); "
      "with --baseline: 1 iff a tensor or case newly fails (exact, skipped or new -> mismatch or nonfinite; anything "
      "-> error) or a case compared in the baseline is gone, else 0; 2 for an unreadable or malformed report (the "
      "message names file and field); 130 for the report of an interrupted run");
  sub->add_option("REPORT", o->report, "report to read (.json or .csv)")->required();
  sub->add_option("--baseline", o->baseline,
                  "earlier report (.json or .csv): cases matched by id, tensors by name; prints what newly fails, "
                  "newly passes, changed metrics, was added or removed");
  sub->add_option("--html", o->html,
                  "write one self-contained HTML page (grids of layouts x paths, tensor tables, ULP histograms, "
                  "the baseline comparison); written atomically, never on a failed run; '-': stdout");
  sub->add_flag("--strict", o->strict, kStrictHelp);
  return {sub, [o] { return report(*o); }};
}

}  // namespace bp::harness
