// One case of a plan run to its outputs: what `bitparity run` writes to a dump
// and what `bitparity bisect` compares, one side each.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "harness/engine/cases.h"
#include "harness/engine/plan.h"

namespace bp::harness {

// One case's outputs, for `run` (its dump) and `bisect` (one side).
struct SingleRun {
  std::string id;  // the case id
  std::map<std::string, std::string> metadata;  // what the dump's __metadata__ records, the weights' origin too
  std::vector<NamedTensor> tensors;
  int num_layers = 0;
};
// run's defaults: qwen3-dense-tiny, the first default contract (bf16-sm90tc-v3),
// reference, tp1-ep1-cp1, extend; implementation float64 allowed.
SweepPlan single_case_defaults();
// Runs the one case `plan` names (io::BadInput when it names more, a layout the
// reference implementation cannot run, or what the float64 truth model lacks: a
// contract, a path other than extend, captures, a sharded layout; CannotTest for
// cuda). A float64 case's id is "<model>/float64", its dump records no contract.
// `on_weights` hears where the model's weights came from, as they are loaded.
SingleRun run_single_case(const SweepPlan& plan, const WeightsListener& on_weights = {});

}  // namespace bp::harness
