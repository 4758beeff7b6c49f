// `bitparity conform`: each op of an engine's capture judged alone against the
// contract (cli/conform.cpp). The CPU reference runs the capture's tokens through the
// model, every op computed from the engine's own captured inputs instead of from its
// own earlier outputs (program::ForwardOptions::substitute), and each op's bits are
// compared with the engine's: an op that left the contract shows alone, at its
// position, whatever followed from it in the engine (an engine's difference
// cascades; its ops judged alone do not). Routing follows the engine's router
// logits: the experts the reference runs are the ones those logits choose.
//
// The capture: a dump of `ops.<op>` tensors (BF16 [tokens, features], canonical
// rows), and optionally `logprobs.<s>`, `entropy.<s>` (F32; judged from the engine's
// logits), with its tokens in the metadata `bitparity.tokens`: a tokens file's JSON
// (the Python capture writes it) or `seed S lengths a,b,...` (`bitparity run`'s
// dumps). Ops of the model the capture lacks are computed by the reference itself
// and listed as not captured; tensors that are no output of the model are listed;
// gradients are counted, not judged (`diff` them against `bitparity run`'s).
#pragma once
#include <string>
#include <vector>

#include "harness/engine/models.h"
#include "harness/report/report.h"

namespace bp::harness {

struct ConformResult {
  Report report;                         // one case, "conform": the judged tensors in execution order
  std::vector<std::string> not_captured;  // the model's ops the capture lacks
  std::vector<std::string> unknown;       // the capture's tensors that are no output of the model
  size_t gradients = 0;                   // the capture's gradients: not judged (no backward runs)
};

// `--contract float64`: no contract; each op's reference is its float64 truth
// rounded to nearest in the op's dtype, on the same inputs.
inline constexpr const char* kConformFloat64 = "float64";

// Throws bp::io::BadInput naming the dump and the tensor or metadata key at fault
// (no tokens, an op that is not BF16, rows that are not the tokens'), and what the
// case engine throws for the model and contract.
ConformResult build_conform(const std::string& dump, const std::string& model, const std::string& contract,
                            const WeightsListener& on_weights);

}  // namespace bp::harness
