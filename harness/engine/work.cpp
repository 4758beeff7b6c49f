#include "harness/engine/work.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "harness/io/errors.h"
#include "reference/model/weights.h"

namespace bp::harness {

namespace {

std::string scaled(double x, const char* const units[], int count, double step) {
  int u = 0;
  while (x >= step && u + 1 < count) {
    x /= step;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g %s", x, units[u]);
  return buf;
}

std::string flops_text(double f) {
  static const char* const units[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  return scaled(f, units, 7, 1000);
}

std::string memory_text(double b) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  return scaled(b, units, 6, 1024);
}

std::string rough_duration_text(double seconds) {
  char buf[48];
  if (seconds < 90) std::snprintf(buf, sizeof buf, "%.0f s", seconds);
  else if (seconds < 90 * 60) std::snprintf(buf, sizeof buf, "%.0f min", seconds / 60);
  else if (seconds < 3 * 86400) std::snprintf(buf, sizeof buf, "%.1f h", seconds / 3600);
  else std::snprintf(buf, sizeof buf, "%.3g days", seconds / 86400);
  return buf;
}

}  // namespace

WorkEstimate estimate_run(const ModelConfig& cfg, const std::vector<std::vector<int32_t>>& seqs, bool backward) {
  const double H = static_cast<double>(cfg.hidden_size), q = static_cast<double>(cfg.q_dim()),
               kv = static_cast<double>(cfg.kv_dim()), V = static_cast<double>(cfg.vocab_size);
  double tokens = 0, attention_pairs = 0;  // attention_pairs: Σ over sequences of n(n+1)/2
  for (const auto& s : seqs) {
    const double n = static_cast<double>(s.size());
    tokens += n;
    attention_pairs += n * (n + 1) / 2;
  }
  // Per layer by kind, in constant time whatever the layer count: the MLP's width for
  // one token is the dense intermediate size, or the experts it is routed to (plus
  // the router's logits).
  const double layers = static_cast<double>(cfg.num_hidden_layers);
  const double moe_layers = static_cast<double>(cfg.moe_layer_count()), dense_layers = layers - moe_layers;
  const double mlp_widths =
      dense_layers * static_cast<double>(cfg.intermediate_size) +
      moe_layers * static_cast<double>(cfg.moe_intermediate_size * cfg.num_experts_per_tok + cfg.num_experts);
  const double flops_per_token = 2 * H * V + layers * (2 * H * (q + 2 * kv) + 2 * q * H) + 2 * 3 * H * mlp_widths;
  const double activations_per_token = layers * (4 * H + 4 * q + 5 * kv) + 3 * mlp_widths;
  const double attention = 2 * 2 * q * attention_pairs * layers;
  const double forward = flops_per_token * tokens + attention;
  const double params = parameter_count(cfg);
  WorkEstimate w;
  w.flops = backward ? 3 * forward : forward;
  w.peak_bytes = 2 * params + (backward ? 4 * params : 0) + 4 * tokens * (activations_per_token + 2 * V);
  return w;
}

WorkEstimate combined(const WorkEstimate& a, const WorkEstimate& b) {
  return {a.flops + b.flops, std::max(a.peak_bytes, b.peak_bytes)};
}

std::string work_text(const WorkEstimate& w) {
  return "about " + flops_text(w.flops) + " (about " + rough_duration_text(w.flops / kReferenceFlopsPerSecond) +
         " of CPU reference time), peak memory about " + memory_text(w.peak_bytes);
}

double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

std::string work_limit_problem(const WorkEstimate& w, double physical_bytes) {
  const std::string force = "; --force runs it anyway (docs/cli.md \"Work limits\")";
  if (physical_bytes > 0 && w.peak_bytes > physical_bytes)
    return "the plan needs " + work_text(w) + ", more than this machine's " + memory_text(physical_bytes) +
           " of physical memory" + force;
  if (w.flops > kMaxFlops)
    return "the plan needs " + work_text(w) + ", more than the limit of " + flops_text(kMaxFlops) + " (about " +
           rough_duration_text(kMaxFlops / kReferenceFlopsPerSecond) + ")" + force;
  return "";
}

void check_work_limits(const WorkEstimate& w, bool force) {
  if (force) return;
  if (const std::string why = work_limit_problem(w, physical_memory_bytes()); !why.empty())
    throw io::BadInput("work estimate", "", why);
}

void throw_out_of_memory(const WorkEstimate& w) {
  throw io::BadInput("work estimate", "", "out of memory: the plan needs " + work_text(w) + "; this machine has " +
                                              memory_text(physical_memory_bytes()) + " of physical memory");
}

}  // namespace bp::harness
