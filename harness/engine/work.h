// What a plan will cost before it runs: the CPU reference's floating-point operations
// and the peak memory of its cases, from the model configs and the token sequences.
// A plan beyond the limits (docs/cli.md "Work limits") is refused unless --force, so that
// a typo (10^6 tokens, a 30B model) is a message, not days of silence or the OOM killer.
//
// The model (an estimate, within a small factor of the truth, never a measurement):
//   forward FLOPs per token and layer: 2·H·(q + 2·kv) + 2·q·H (projections), the MLP
//     (2·3·H·I dense; 2·3·H·(Im·top_k + E) MoE, the router counted as experts' rows),
//     attention 2·2·heads·head_dim·(t+1) at position t; per token 2·H·V for the logits;
//     the backward costs twice the forward.
//   peak bytes of a case: the weights (bf16) and their gradients (fp32), per token and
//     layer the activations the backward keeps (fp32), per token the logits' rows (fp32).
// Every case counts its implementation's run, and each (model, contract) its canonical
// reference (an extend forward and a backward) once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "reference/model/config.h"

namespace bp::harness {

struct WorkEstimate {
  double flops = 0;       // every CPU case and CPU canonical reference, in floating-point operations
  double peak_bytes = 0;  // the most memory one case needs
};

// The limits beyond which a plan is refused without --force: the FLOPs the CPU reference
// does in about kMaxHours hours on a 2-core machine, and the machine's physical memory.
inline constexpr double kReferenceFlopsPerSecond = 3e8;  // measured: 1500 tokens of qwen3-dense-tiny, one core
inline constexpr double kMaxHours = 2;
inline constexpr double kMaxFlops = kReferenceFlopsPerSecond * 3600 * kMaxHours;

// One run of `cfg` on `seqs`: its forward, and its backward when `backward`.
WorkEstimate estimate_run(const ModelConfig& cfg, const std::vector<std::vector<int32_t>>& seqs, bool backward);

// a then b: the FLOPs add up, the peak is the larger.
WorkEstimate combined(const WorkEstimate& a, const WorkEstimate& b);

// "about 1.2 TFLOP (about 20 min of CPU reference time), peak memory about 3.4 GiB".
std::string work_text(const WorkEstimate& w);

// The machine's physical memory in bytes (0 when unknown).
double physical_memory_bytes();

// "" when `w` is within the limits (or nothing can be said), else why, naming --force.
std::string work_limit_problem(const WorkEstimate& w, double physical_bytes);

// Unless `force`: io::BadInput("work estimate", "", the problem) when `w` is beyond the
// limits on this machine.
void check_work_limits(const WorkEstimate& w, bool force);

// io::BadInput for a run that ran out of memory, with the estimate `w`.
[[noreturn]] void throw_out_of_memory(const WorkEstimate& w);

}  // namespace bp::harness
