// bitparity: the command-line face of the oracle.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>

#include "diff.h"
#include "exit_codes.h"
#include "reference/contract/contract.h"
#include "selfcheck.h"

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

int cmd_list() {
  std::printf("contracts:\n");
  for (const Contract& c : contracts())
    std::printf("  %-16s hash %s  %s\n", c.name.c_str(), c.knob_hash().c_str(), c.canonical_knobs().c_str());
  return kExitExact;
}

}  // namespace
}  // namespace bp

int main(int argc, char** argv) {
  CLI::App app{"bitparity: a bit-exact oracle for LLM numerics.\n"
               "Exit codes: 0 all exact, 1 mismatch, 2 bad usage or input, 3 internal error, "
               "125 cannot test here."};
  app.require_subcommand(0, 1);
  auto* selfcheck = app.add_subcommand("selfcheck", "check the numerics core (bf16, dot models, math, contracts)");
  auto* list = app.add_subcommand("list", "list contracts");
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? bp::kExitExact : bp::kExitBadInput;
  }
  try {
    if (*list) return bp::cmd_list();
    if (*diff) return bp::harness::run_diff(diff_opts, stdout, stderr);
    if (*selfcheck || app.get_subcommands().empty()) return bp::cmd_selfcheck();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitparity: internal error: %s\n", e.what());
    return bp::kExitInternal;
  }
  return bp::kExitInternal;
}
