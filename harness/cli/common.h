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

#include "harness/engine/models.h"
#include "harness/engine/plan.h"
#include "harness/report/report.h"

namespace bp::harness {

struct Subcommand {
  CLI::App* app;
  std::function<int()> run;  // the exit code (exit_codes.h)
};

// The command line after the program's name, as main received it (the launcher of
// real ranks starts them with the same arguments).
void remember_program_args(int argc, char** argv);
const std::vector<std::string>& program_args();

Subcommand add_selfcheck_command(CLI::App& app);
Subcommand add_run_command(CLI::App& app);
Subcommand add_sweep_command(CLI::App& app);
Subcommand add_bisect_command(CLI::App& app);
Subcommand add_list_command(CLI::App& app);
Subcommand add_diff_command(CLI::App& app);
Subcommand add_merge_command(CLI::App& app);
Subcommand add_conform_command(CLI::App& app);
Subcommand add_report_command(CLI::App& app);

// The plan options shared by run, sweep and bisect (--model, --contract,
// --implementation, --layout, --tp/--ep/--cp/--cp-split, --path,
// --seed/--lengths/--tokens, --weight-seed, --coef-seed, --temperature, --no-grads,
// --capture, --plan).
class PlanFlags {
 public:
  // With `canonical`, also --canonical and --verify-layers: what a sweep compares its
  // cases with. run and bisect compare with no canonical result, so they leave them
  // out and CLI11 refuses them (exit 2, naming the option) instead of ignoring them.
  void add_to(CLI::App* app, bool canonical = false);
  // The plan: `base`, then the --plan file, then the flags given. io::BadInput.
  SweepPlan plan(SweepPlan base = {}) const;
  // The files `plan` (from plan()) reads: the --plan file, the tokens file, every
  // file of its model directories. No output may be one of them.
  std::vector<std::string> input_files(const SweepPlan& plan) const;

 private:
  void add_canonical_to(CLI::App* app);  // --canonical, --verify-layers
  CLI::Option* remember(CLI::Option* o, std::function<void(nlohmann::json&)> put);
  nlohmann::json given() const;  // the flags given, as plan JSON keys
  std::string plan_file_;
  std::vector<std::string> models_, contracts_, implementations_, layouts_, cp_split_, paths_;
  std::vector<int> tp_, ep_, cp_, lengths_;
  uint64_t seed_ = 0, weight_seed_ = 0, coef_seed_ = 0;
  double temperature_ = 1;
  std::string tokens_file_, capture_, canonical_, verify_layers_;
  bool no_grads_ = false, allow_nonfinite_weights_ = false, force_ = false;
  std::vector<std::pair<CLI::Option*, std::function<void(nlohmann::json&)>>> options_;
};

// Where each model's weights came from: said on stderr once per model per command
// ("bitparity sweep: qwen3-dense-tiny: generated weights (seed 20261122)"; nothing
// when quiet) and kept for the report's environment.
class WeightsLog {
 public:
  WeightsLog(const char* cmd, bool quiet) : cmd_(cmd), quiet_(quiet) {}
  WeightsLog(const WeightsLog&) = delete;  // its listener points to it
  WeightsListener listener();
  const std::vector<WeightsOrigin>& origins() const { return origins_; }

 private:
  const char* cmd_;
  bool quiet_;
  std::vector<WeightsOrigin> origins_;
};

// Reports: ReportPaths, check_report_paths and write_reports (report/report.h).
// Commands check the paths before running, so a bad path costs no work either.

// For a report whose verdict is nonfinite (report.h: every tensor matches, but one
// is all NaN/Inf, or a logprob is NaN/Inf): one warning line per such case (the
// first 10) on `err`, then the exit code: kExitMismatch under --strict, else
// kExitExact. Commands call it only when nothing worse decided the exit code.
int nonfinite_exit(const char* cmd, const Report& r, bool strict, std::FILE* err);
inline constexpr const char* kStrictHelp =
    "exit 1 when a result is non-finite: a tensor all NaN/Inf on both sides, or a NaN/Inf logprob (without it: a "
    "warning, exit 0)";
// Where a command prints its text: stdout, or stderr when one of `outputs` is
// standard output ("-", /dev/stdout), which then holds that output alone.
std::FILE* text_stream(const std::vector<std::string>& outputs);

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
