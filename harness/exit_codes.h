// Process exit codes (docs/reports.md "Exit codes"); 125 is what CTest's SKIP_RETURN_CODE
// and `git bisect run` treat as "cannot test here".
#pragma once

namespace bp {
enum ExitCode : int {
  kExitExact = 0,
  kExitMismatch = 1,
  kExitBadInput = 2,
  kExitInternal = 3,
  kExitCannotTest = 125,
  kExitInterrupted = 130,  // SIGINT/SIGTERM stopped a sweep (128 + SIGINT, as shells report it)
};
}  // namespace bp
