// What the subcommands of bitparity share. Each subcommand lives in its own file
// (cli/<name>.cpp) and registers itself the same way: add_<name>_command adds the
// subcommand and its options to the app and returns it with the function main()
// calls when it was chosen. Besides: the plan options of run, sweep and bisect, and
// the map from errors to exit codes.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/engine/plan.h"
#include "harness/report/report.h"

namespace bp::harness {

struct Subcommand {
  CLI::App* app;
  std::function<int()> run;  // the exit code (exit_codes.h)
};

Subcommand add_selfcheck_command(CLI::App& app);
Subcommand add_run_command(CLI::App& app);
Subcommand add_sweep_command(CLI::App& app);
Subcommand add_bisect_command(CLI::App& app);
Subcommand add_list_command(CLI::App& app);
Subcommand add_diff_command(CLI::App& app);
Subcommand add_report_command(CLI::App& app);

// The plan options shared by run, sweep and bisect (--model, --contract,
// --implementation, --layout, --tp/--ep/--cp/--cp-split, --path,
// --seed/--lengths/--tokens, --weight-seed, --coef-seed, --temperature, --no-grads,
// --capture, --plan).
class PlanFlags {
 public:
  void add_to(CLI::App* app);
  // The plan: `base`, then the --plan file, then the flags given. io::BadInput.
  SweepPlan plan(SweepPlan base = {}) const;

 private:
  nlohmann::json given() const;  // the flags given, as plan JSON keys
  std::string plan_file_;
  std::vector<std::string> models_, contracts_, implementations_, layouts_, cp_split_, paths_;
  std::vector<int> tp_, ep_, cp_, lengths_;
  uint64_t seed_ = 0, weight_seed_ = 0, coef_seed_ = 0;
  double temperature_ = 1;
  std::string tokens_file_, capture_;
  bool no_grads_ = false, force_ = false;
  std::vector<std::pair<CLI::Option*, std::function<void(nlohmann::json&)>>> options_;
};

// Reports: ReportPaths, check_report_paths and write_reports (report/report.h).
// Commands check the paths before running, so a bad path costs no work either.

// Inside a catch block: prints the exception in flight for subcommand `cmd`
// ("bitparity sweep: bad input: ...") and returns its exit code.
int exit_for_error(const char* cmd, std::FILE* err);

// The subcommand `sub` running `body`, any exception it throws turned into its
// exit code by exit_for_error under `sub`'s name.
Subcommand guarded_subcommand(CLI::App* sub, std::function<int()> body);

// Inside a catch block of a command that reads files (diff, report): prints a
// bp::io::BadInput or bp::io::IoError in flight ("bitparity diff: bad input: ...")
// and returns kExitBadInput; rethrows anything else.
int exit_for_read_error(const char* cmd, std::FILE* err);

}  // namespace bp::harness
