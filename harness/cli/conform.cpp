// `bitparity conform DUMP --model M [--contract C]`: each op of an engine's capture
// judged alone against the contract (engine/conform.h), its table, reports and exit code.
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "harness/cli/common.h"
#include "harness/engine/conform.h"
#include "harness/exit_codes.h"
#include "reference/contract/contract.h"

namespace bp::harness {

namespace {

struct ConformOptions {
  std::string dump, model, contract, json, csv, junit, html;
  bool quiet = false;
};

// An op less accurate than the contract on the same inputs: its mean distance from
// the truth above the contract's.
bool less_accurate(const TensorRecord& t) { return t.truth_ratio().value_or(1) > 1; }

// One line per tensor off the contract: the bits, then both sides' distance from
// the float64 truth (--contract float64: every tensor, its distance alone).
void print_tensors(const Case& c, bool truth_only, std::FILE* out) {
  for (const TensorRecord& t : c.tensors) {
    if (t.matches() && !truth_only) continue;
    std::fprintf(out, "%-34s ", terminal_text(t.name).c_str());
    if (!t.metrics) {
      std::fprintf(out, "%s\n", tensor_status_name(t.status));
      continue;
    }
    if (truth_only) {
      std::fprintf(out, "from float64: %s; %" PRIu64 " of %" PRIu64 " elements not the truth rounded\n",
                   truth_error_text(t.truth_error_a).c_str(), t.metrics->mismatches,
                   t.metrics->elements);
      continue;
    }
    std::fprintf(out, "%" PRIu64 " of %" PRIu64 " elements differ, max %.0f ulp", t.metrics->mismatches,
                 t.metrics->elements, t.metrics->max_ulp_diff);
    if (t.truth_error_a && t.truth_error_b)
      std::fprintf(out, "; from float64: engine %s, contract %s%s", truth_error_text(t.truth_error_a).c_str(),
                   truth_error_text(t.truth_error_b).c_str(), less_accurate(t) ? " (less accurate)" : "");
    std::fprintf(out, "\n");
  }
}

void print(const ConformResult& r, bool truth_only, std::FILE* out) {
  const Case& c = r.report.cases.front();
  print_tensors(c, truth_only, out);
  const size_t exact = std::count_if(c.tensors.begin(), c.tensors.end(), [](const TensorRecord& t) { return t.matches(); });
  if (!r.not_captured.empty())
    std::fprintf(out, "not captured: %zu op tensor(s) (computed by the reference from the ops before them), first %s\n",
                 r.not_captured.size(), terminal_text(r.not_captured.front()).c_str());
  if (!r.unknown.empty())
    std::fprintf(out, "not judged: %zu tensor(s) that are no output of the model, first %s\n", r.unknown.size(),
                 terminal_text(r.unknown.front()).c_str());
  if (r.gradients) std::fprintf(out, "not judged: %zu gradient(s) (diff them against bitparity run)\n", r.gradients);
  const std::string first = c.first_divergent_op ? ", first " + terminal_text(*c.first_divergent_op) : "";
  if (truth_only) {
    std::fprintf(out, "conform: %zu tensors judged alone against the float64 truth: %zu correctly rounded, %zu not%s\n",
                 c.tensors.size(), exact, c.tensors.size() - exact, first.c_str());
    return;
  }
  std::fprintf(out, "conform: %zu tensors judged alone against %s: %zu exact, %zu off the contract%s; %zu of them less "
               "accurate than the contract (mean distance from the float64 truth)\n",
               c.tensors.size(), c.parameters.at("contract").c_str(), exact, c.tensors.size() - exact, first.c_str(),
               truth_summary(c).farther);
}

int conform(const ConformOptions& o) {
  const ReportPaths paths{o.json, o.csv, o.junit, o.html};
  if (const int rc = check_report_paths("conform", paths, {o.dump}, stderr)) return rc;
  WeightsLog weights("conform", o.quiet);
  ConformResult r = build_conform(o.dump, o.model, o.contract, weights.listener());
  r.report.environment.weights = weights.origins();
  if (!o.quiet) print(r, o.contract == kConformFloat64, text_stream({o.json, o.csv, o.junit, o.html}));
  if (const int rc = write_reports("conform", r.report, paths, stderr)) return rc;
  const Verdict v = r.report.cases.front().verdict;
  if (v == Verdict::kNonFinite) return nonfinite_exit("conform", r.report, false, stderr);
  return v == Verdict::kExact ? kExitExact : kExitMismatch;
}

}  // namespace

Subcommand add_conform_command(CLI::App& app) {
  auto o = std::make_shared<ConformOptions>();
  o->contract = default_contract_names().front();
  CLI::App* sub = app.add_subcommand(
      "conform",
      "judge each op of an engine's capture alone against a contract: the CPU reference computes every captured op "
      "from the engine's own captured inputs (its tokens from the dump's bitparity.tokens) and compares the bits, so "
      "an op that left the contract shows alone at its position; beside each op off the contract, the engine's and "
      "the contract's distance from the op's float64 truth on the same inputs. --contract float64: the distances "
      "alone, each op against its truth rounded. Exit 0 every op exact, 1 an op off the contract, 2 "
      "bad usage or input (no tokens in the dump, an op that is not BF16, rows that are not the tokens'), 3 internal "
      "error");
  sub->add_option("DUMP", o->dump, "the engine's capture (.safetensors: ops.<op> BF16 [tokens, features])")->required();
  sub->add_option("--model", o->model, "the checkpoint the engine ran (a folder with a '/', or a fixture name)")
      ->required();
  sub->add_option("--contract", o->contract,
                  "the contract to judge against, or float64 (default: " + o->contract + ")");
  sub->add_option("--json", o->json, "write a JSON report (tensors in execution order); '-': stdout");
  sub->add_option("--csv", o->csv, "write a CSV report; '-': stdout");
  sub->add_option("--junit", o->junit, "write a JUnit XML report; '-': stdout");
  sub->add_option("--html", o->html, "write an HTML page (a layers x ops heat map: exact or the largest ULP distance "
                                     "of each op, the first off the contract outlined); '-': stdout");
  sub->add_flag("--quiet,-q", o->quiet, "print nothing but errors");
  return guarded_subcommand(sub, [o] { return conform(*o); });
}

}  // namespace bp::harness
