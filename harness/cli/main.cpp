// bitparity: the command-line face of the oracle.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "harness/cli/common.h"
#include "harness/compare/diff.h"
#include "harness/exit_codes.h"
#include "harness/cli/report.h"
#include "harness/cli/selfcheck.h"

namespace bp {
namespace {

int cmd_selfcheck() {
  int failed = 0;
  for (const CheckResult& r : run_selfcheck()) {
    std::printf("%-4s %-32s %s\n", r.passed ? "ok" : "FAIL", r.name.c_str(), r.detail.c_str());
    failed += !r.passed;
  }
  std::printf("%s\n", failed ? "selfcheck: FAILED" : "selfcheck: all exact");
  return failed ? kExitMismatch : kExitExact;
}

}  // namespace
}  // namespace bp

int main(int argc, char** argv) {
  CLI::App app{"bitparity: a bit-exact oracle for LLM numerics.\n"
               "Exit codes: 0 all exact, 1 mismatch, 2 bad usage or input, 3 internal error, "
               "125 cannot test here (e.g. no GPU: CTest's SKIP_RETURN_CODE, `git bisect run`'s skip), "
               "130 sweep interrupted (SIGINT/SIGTERM; its reports hold the finished cases).\n"
               "With no subcommand: selfcheck. `bitparity sweep` with no arguments: the default sweep."};
  app.require_subcommand(0, 1);
  auto* selfcheck = app.add_subcommand("selfcheck", "check the numerics core (bf16, dot models, math, contracts)");
  const bp::harness::Subcommand model_commands[] = {
      bp::harness::add_run_command(app), bp::harness::add_sweep_command(app), bp::harness::add_bisect_command(app),
      bp::harness::add_list_command(app)};
  bp::harness::DiffOptions diff_opts;
  auto* diff = app.add_subcommand(
      "diff",
      "compare two safetensors dumps tensor by tensor, matched by name; exit 0 all identical, "
      "1 a difference or a tensor on one side only, 2 bad input");
  diff->add_option("A", diff_opts.a, "first dump (.safetensors)")->required();
  diff->add_option("B", diff_opts.b, "second dump (.safetensors)")->required();
  diff->add_option("--map", diff_opts.map, "OLD=NEW: tensor OLD of A is tensor NEW of B (repeatable)");
  diff->add_option("--json", diff_opts.json, "write a JSON report (reports/schema/report.schema.json)");
  diff->add_option("--csv", diff_opts.csv, "write a CSV report (one row per tensor)");
  diff->add_option("--junit", diff_opts.junit, "write a JUnit XML report");
  diff->add_flag("--quiet,-q", diff_opts.quiet, "print nothing but errors");
  bp::harness::ReportOptions report_opts;
  auto* report = app.add_subcommand(
      "report",
      "read a report back (JSON, or CSV by its .csv extension), print its summary, compare it against a baseline, "
      "render it as HTML. Exit code without --baseline: the report's verdict (0 exact or skipped only, 1 a mismatch); "
      "with --baseline: 1 iff a tensor or case newly fails (exact, skipped or new -> mismatch) or a case compared in "
      "the baseline is gone, else 0; 2 for an unreadable or malformed report (the message names file and field)");
  report->add_option("REPORT", report_opts.report, "report to read (.json or .csv)")->required();
  report->add_option("--baseline", report_opts.baseline,
                     "earlier report (.json or .csv): cases matched by id, tensors by name; prints what newly fails, "
                     "newly passes, changed metrics, was added or removed");
  report->add_option("--html", report_opts.html,
                     "write one self-contained HTML page (grids of layouts x paths, tensor tables, ULP histograms, "
                     "the baseline comparison); written atomically, never on a failed run");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? bp::kExitExact : bp::kExitBadInput;
  }
  try {
    for (const bp::harness::Subcommand& c : model_commands)
      if (*c.app) return c.run();
    if (*diff) return bp::harness::run_diff(diff_opts, stdout, stderr);
    if (*report) return bp::harness::run_report(report_opts, stdout, stderr);
    if (*selfcheck || app.get_subcommands().empty()) return bp::cmd_selfcheck();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitparity: internal error: %s\n", e.what());
    return bp::kExitInternal;
  }
  return bp::kExitInternal;
}
