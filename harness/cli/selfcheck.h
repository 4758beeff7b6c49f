// `bitparity selfcheck`: the numerics core checked against what it promises,
// in seconds, from the installed binary alone.
#pragma once
#include <string>
#include <vector>

namespace bp {

struct CheckResult {
  std::string name;
  bool passed;
  std::string detail;  // one line: what was checked and what was found
};

std::vector<CheckResult> run_selfcheck();

}  // namespace bp
