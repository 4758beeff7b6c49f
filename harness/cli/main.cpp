// bitparity: the command-line face of the oracle. main builds the app, lets every
// subcommand register itself (cli/<name>.cpp, cli/common.h), and runs the one chosen.
#include <CLI/CLI.hpp>
#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <exception>

#include "harness/cli/common.h"
#include "harness/exit_codes.h"

namespace {

// A crash is a bug of ours: say so with the stack (file offsets that addr2line
// resolves against the unstripped binary), then die of the same signal.
extern "C" void on_crash(int sig) {
  static const char head[] = "bitparity: internal error: crashed; stack:\n";
  (void)!::write(STDERR_FILENO, head, sizeof head - 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_crash);
  using namespace bp::harness;
  CLI::App app{"bitparity: a bit-exact oracle for LLM numerics.\n"
               "Exit codes: 0 all exact, 1 mismatch, 2 bad usage or input, 3 internal error, "
               "125 cannot test here (e.g. no GPU: CTest's SKIP_RETURN_CODE, `git bisect run`'s skip), "
               "130 sweep interrupted (SIGINT/SIGTERM; its reports hold the finished cases), or `report` of such a "
               "report.\n"
               "With no subcommand: selfcheck. `bitparity sweep` with no arguments: the default sweep."};
  app.require_subcommand(0, 1);
  // A reader that goes away (`bitparity sweep -v | head -1`) must not kill us before
  // the reports are written: a write to the closed pipe fails with EPIPE instead.
  std::signal(SIGPIPE, SIG_IGN);
  // Past the file size limit (ulimit -f) a write fails with EFBIG instead of killing
  // the process: the report is then lost as on a full disk, its temporary removed,
  // and the other reports are written.
  std::signal(SIGXFSZ, SIG_IGN);
  remember_program_args(argc, argv);
  // In the order `bitparity --help` lists them.
  const Subcommand selfcheck = add_selfcheck_command(app);
  const Subcommand commands[] = {selfcheck,
                                 add_run_command(app),
                                 add_sweep_command(app),
                                 add_bisect_command(app),
                                 add_list_command(app),
                                 add_diff_command(app),
                                 add_merge_command(app),
                                 add_conform_command(app),
                                 add_report_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? bp::kExitExact : bp::kExitBadInput;
  }
  try {
    for (const Subcommand& c : commands)
      if (*c.app) return c.run();
    return selfcheck.run();  // no subcommand
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitparity: internal error: %s\n", e.what());
    return bp::kExitInternal;
  }
}
