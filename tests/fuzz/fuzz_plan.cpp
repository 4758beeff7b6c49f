// libFuzzer target: the sweep plan parser (harness/engine/plan.h).
//
// Every input is parsed as a plan file (parse_plan) and, when it is JSON, applied
// as if it came from command-line flags (apply_plan_json with flags). Contract:
// only bp::io::BadInput may escape; any other exception, a crash or a sanitizer
// report is a finding. The two forms differ only in how fields are named, so they
// accept the same inputs; an accepted plan holds what the sweep relies on.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

#include "fuzz_contract.h"
#include "harness/io/json_strict.h"
#include "harness/engine/plan.h"

namespace {

using bp::harness::SweepPlan;

void check_invariants(const SweepPlan& p) {
  using bp::fuzz::require;
  require(!p.models.empty() && !p.contracts.empty() && !p.implementations.empty() && !p.paths.empty(),
          "accepted a plan with an empty list");
  for (const auto& path : p.paths)
    for (const int c : path.chunks) require(c >= 1, "accepted a chunk size below 1");
  if (p.layouts.empty())
    require(!p.grid.tp.empty() && !p.grid.ep.empty() && !p.grid.cp.empty() && !p.grid.cp_split.empty(),
            "accepted an empty layout grid axis");
  if (p.tokens.file.empty())
    for (const int n : p.tokens.lengths) require(n >= 2, "accepted a token sequence shorter than 2");
  require(std::isfinite(p.temperature) && p.temperature > 0, "accepted a temperature that is not positive and finite");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<SweepPlan> from_file;
  bp::fuzz::allow_bad_input([&] { from_file = bp::harness::parse_plan(text, "fuzz/plan.json"); });
  if (from_file) check_invariants(*from_file);

  std::optional<nlohmann::json> json;
  bp::fuzz::allow_bad_input([&] { json = bp::io::parse_json_strict(text, "fuzz/plan.json"); });
  if (!json) return 0;
  bool from_flags = false;
  bp::fuzz::allow_bad_input([&] {
    SweepPlan plan;
    bp::harness::apply_plan_json(*json, "command line", /*flags=*/true, plan);
    check_invariants(plan);
    from_flags = true;
  });
  bp::fuzz::require(from_flags == from_file.has_value(), "a plan file and the same fields as flags disagree");
  return 0;
}
