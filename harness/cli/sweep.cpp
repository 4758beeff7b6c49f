// `bitparity sweep`: every case of a plan against the canonical reference, a
// results table, reports, and the exit code CI and `git bisect run` read.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <mutex>

#include "harness/cli/common.h"
#include "harness/engine/cases.h"
#include "harness/engine/nccl_implementation.h"
#include "harness/exit_codes.h"
#include "harness/report/report.h"
#include "program/run_control.h"
#include "reference/common/sha256.h"

namespace bp::harness {

namespace {

// Set by SIGINT/SIGTERM: the sweep stops after the case in flight. A second signal
// cancels that case too (run_control: the programs stop at their next op).
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int) {
  if (g_stop) program::run_control::cancel_requested.store(true, std::memory_order_relaxed);
  g_stop = 1;
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

struct SweepOptions {
  PlanFlags plan;
  std::string json, csv, junit, html;
  bool quiet = false, verbose = false, strict = false;
};

std::string clock_text(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// "cases done/total, elapsed, ETA, case, layer" on one rewritten line of a terminal:
// rewritten when a case starts, and as its layers go by (at most every kLayerInterval,
// so only a long case shows them). While enabled, the programs' layer observer.
class Progress {
 public:
  Progress(size_t total, bool enabled) : total_(total), enabled_(enabled && ::isatty(STDERR_FILENO)) {
    if (enabled_) {
      active_ = this;
      program::run_control::layer_observer.store(&on_layer);
    }
  }
  ~Progress() {
    if (!enabled_) return;
    program::run_control::layer_observer.store(nullptr);
    active_ = nullptr;
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const { return enabled_; }
  void update(size_t done, const std::string& now) {
    if (!enabled_) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    done_ = done;
    case_ = now;
    print("");
  }
  void finish() const {
    if (enabled_) std::fprintf(stderr, "\r\033[K");
  }
  // A long step of the case in flight (a layer, a checkpoint's loading), after its
  // name; at most every kLayerInterval, so only a long case shows them.
  void status(const std::string& text) {
    if (!enabled_) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    if (elapsed() - printed_at_ < kLayerInterval) return;
    print("  " + text);
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  static constexpr double kLayerInterval = 0.2;  // seconds

  static void on_layer(const char* pass, int64_t layer, int64_t layers) {
    if (Progress* p = active_)
      p->status(std::string(pass) + " layer " + std::to_string(layer + 1) + "/" + std::to_string(layers));
  }
  void print(const std::string& layer) {
    const double el = elapsed();
    printed_at_ = el;
    const std::string eta =
        done_ ? clock_text(el / static_cast<double>(done_) * static_cast<double>(total_ - done_)) : "?";
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s elapsed, ETA %s  %s%s", done_, total_, clock_text(el).c_str(),
                 eta.c_str(), case_.c_str(), layer.c_str());
    std::fflush(stderr);
  }

  static inline std::atomic<Progress*> active_{nullptr};
  size_t total_, done_ = 0;
  bool enabled_;
  std::string case_;
  double printed_at_ = 0;
  std::mutex mutex_;  // the layer observer runs on the emulated ranks' threads
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// One cell of the table: "exact", "skip", "NONFINITE", "ERROR", or "<n> diff <u> ulp"
// (n tensors differ, u the largest ULP distance among them).
std::string cell_text(const Case& c) {
  if (c.verdict == Verdict::kSkipped) return "skip";
  if (c.verdict == Verdict::kExact) return "exact";
  if (c.verdict == Verdict::kNonFinite) return "NONFINITE";
  if (c.verdict == Verdict::kError) return "ERROR";
  size_t n = 0;
  double ulp = 0;
  bool missing = false;
  for (const TensorRecord& t : c.tensors) {
    if (t.matches()) continue;
    ++n;
    if (t.metrics) ulp = std::max(ulp, t.metrics->max_ulp_diff);
    missing |= !t.metrics;
  }
  return std::to_string(n) + " diff " + (missing ? "(missing)" : metric_text(ulp, "%.0f") + " ulp");
}

// For a terminal: names pass through terminal_text.
std::string case_line(const Case& c) {
  const char* word = c.verdict == Verdict::kMismatch ? "MISMATCH "
                     : c.verdict == Verdict::kError  ? "ERROR"
                                                     : verdict_name(c.verdict);
  std::string s = std::string(word) + " " + terminal_text(c.id);
  if (c.verdict == Verdict::kSkipped) return s + ": " + terminal_text(c.skip_reason);
  if (c.verdict == Verdict::kError) return s + ": " + terminal_text(c.error);
  if (c.verdict == Verdict::kNonFinite) return s + ": " + terminal_text(nonfinite_text(*c.first_nonfinite()));
  if (const TensorRecord* t = c.first_mismatch()) {
    s += ": first tensor " + terminal_text(t->name);
    if (t->metrics)
      s += " (" + std::to_string(t->metrics->mismatches) + " of " + std::to_string(t->metrics->elements) +
           " elements, max " + metric_text(t->metrics->max_ulp_diff, "%.0f") + " ulp)";
    else
      s += std::string(" (") + tensor_status_name(t->status) + ")";
  }
  if (c.first_divergent_op) s += ", first divergent op " + terminal_text(*c.first_divergent_op);
  return s;
}

// A negative control that ran and came out bit-identical (the case engine skips it,
// keeping its tensors; every other skipped case skips before it runs).
bool control_showed_nothing(const Case& c) { return c.verdict == Verdict::kSkipped && !c.tensors.empty(); }

// What a case's run cost, for --verbose: "(1.23 s)", "(1.23 s, compared in 0.05 s, peak
// 2.5 GiB device memory)", "(1.23 s on 2 ranks, peak 2.5 GiB device memory, 3.1 MiB moved
// in 42 collectives)".
std::string cost_text(const Case& c) {
  std::string s = "(" + duration_text(c.seconds);
  if (c.ranks) s += " on " + std::to_string(*c.ranks) + (*c.ranks == 1 ? " rank" : " ranks");
  if (c.compare_seconds) s += ", compared in " + duration_text(*c.compare_seconds);
  if (c.peak_device_bytes) s += ", peak " + bytes_text(*c.peak_device_bytes) + " device memory";
  if (!c.communication.empty()) s += ", " + communication_text(c.communication);
  return s + ")";
}

// Rows model/contract/implementation/layout, one column per path (the plan's, then
// any other a case has: verify-layers); columns padded to width. The rows come from
// the report's parameters, where the implementation is still keyed "backend".
void print_table(const Report& r, std::vector<std::string> paths, std::FILE* out) {
  for (const Case& c : r.cases)
    if (std::find(paths.begin(), paths.end(), c.parameters.at("path")) == paths.end())
      paths.push_back(c.parameters.at("path"));
  const std::vector<std::string> keys = {"model", "contract", "backend", "layout"};
  std::vector<std::vector<std::string>> rows;  // the keys' values, then one cell per path
  std::map<std::vector<std::string>, size_t> row_of;
  for (const Case& c : r.cases) {
    std::vector<std::string> key;
    for (const std::string& k : keys) key.push_back(terminal_text(c.parameters.at(k)));
    auto [it, fresh] = row_of.emplace(key, rows.size());
    if (fresh) {
      key.resize(keys.size() + paths.size(), "-");
      rows.push_back(key);
    }
    const size_t col = static_cast<size_t>(std::find(paths.begin(), paths.end(), c.parameters.at("path")) - paths.begin());
    rows[it->second][keys.size() + col] = cell_text(c);
  }
  std::vector<std::string> header = {"model", "contract", "implementation", "layout"};
  header.insert(header.end(), paths.begin(), paths.end());
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) {
    width[i] = header[i].size();
    for (const auto& row : rows) width[i] = std::max(width[i], row[i].size());
  }
  auto print = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t i = 0; i < cells.size(); ++i) line += cells[i] + std::string(width[i] - cells[i].size() + 2, ' ');
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  };
  print(header);
  for (const auto& row : rows) print(row);
}

// The most ranks a case of the plan may need: its largest layout (the canonical's included).
int largest_world(const SweepPlan& plan) {
  int world = plan.canonical == Implementation::kNccl ? plan.canonical_layout.world() : 1;
  for (const layouts::Layout& l : plan.layouts) world = std::max(world, l.world());
  if (plan.layouts.empty())
    world = std::max(world, *std::max_element(plan.grid.tp.begin(), plan.grid.tp.end()) *
                                *std::max_element(plan.grid.ep.begin(), plan.grid.ep.end()) *
                                *std::max_element(plan.grid.cp.begin(), plan.grid.cp.end()));
  return world;
}

// What every rank of real ranks must share with rank 0, by digest: the binary
// (so the kernels and the contract code are the same), the plan's cases and
// inputs, the contracts' knobs.
std::vector<std::pair<std::string, std::string>> rank_setup(const CaseEngine& engine) {
  std::ifstream exe("/proc/self/exe", std::ios::binary);
  const std::string binary{std::istreambuf_iterator<char>(exe), {}};
  Sha256 plan, contracts;
  const SweepPlan& p = engine.plan();
  // The coefficients' description names an explicit file's sha256: the ranks must read the same values.
  for (const CaseSpec& c : engine.cases()) plan.update(engine.case_id(c) + " " + c.model.coefs.describe() + "\n");
  for (const std::string& m : p.models) plan.update("model " + m + "\n");
  plan.update("seeds " + std::to_string(p.weight_seed) + " " + std::to_string(p.coef_seed) + " " +
              std::to_string(p.tokens.seed) + " temperature " + std::to_string(p.temperature) + " grads " +
              std::to_string(p.grads) + " capture " + std::to_string(p.capture_ops) + " canonical " +
              canonical_name(p) + " tokens " + p.tokens.file);
  for (int n : p.tokens.lengths) plan.update(" " + std::to_string(n));
  for (const Contract* c : engine.contracts()) contracts.update(c->name + " " + c->canonical_knobs() + "\n");
  return {{"binary", sha256_hex(binary)}, {"plan", plan.hex()}, {"contracts", contracts.hex()}};
}

// Rank 0 tells the followers that the sweep is over, however it ends.
class FollowersReleased {
 public:
  explicit FollowersReleased(RankSession* ranks) : ranks_(ranks && ranks->leader() ? ranks : nullptr) {}
  ~FollowersReleased() {
    try {
      if (ranks_) ranks_->send_done();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bitparity sweep: could not release the other ranks: %s\n", e.what());
    }
  }
  FollowersReleased(const FollowersReleased&) = delete;
  FollowersReleased& operator=(const FollowersReleased&) = delete;

 private:
  RankSession* ranks_;
};

int sweep(const SweepOptions& o) {
  const SweepPlan plan = o.plan.plan();
  std::unique_ptr<RankSession> ranks;
  if (std::count(plan.implementations.begin(), plan.implementations.end(), Implementation::kNccl) ||
      plan.canonical == Implementation::kNccl) {
    try {
      ranks = RankSession::join();
    } catch (const IdleRank& e) {
      if (!o.quiet) std::fprintf(stderr, "sweep: %s\n", e.what());
      return kExitExact;
    }
    // Not started as a rank: start the ranks on this node's GPUs (rank 0 does the rest).
    if (!ranks && !nccl_unavailable_reason())
      return launch_ranks(std::min(visible_gpus(), largest_world(plan)), program_args());
  }
  const bool follower = ranks && !ranks->leader();
  const ReportPaths paths{o.json, o.csv, o.junit, o.html};
  if (!follower)
    if (const int rc = check_report_paths("sweep", paths, o.plan.input_files(plan), stderr)) return rc;
  std::FILE* const out = text_stream({o.json, o.csv, o.junit, o.html});
  WeightsLog weights("sweep", o.quiet || follower);
  CaseEngine engine(plan, weights.listener());
  std::vector<GpuIdentity> gpus;  // the GPUs the cases run on (every rank's), for the report
  if (ranks) {
    engine.use_rank_session(ranks.get());
    ranks->check_same(rank_setup(engine));
    gpus = ranks->gpu_identities();
    if (follower) {
      const int rc = engine.follow_rank_zero();
      if (ranks->broken()) RankSession::leave_now(rc);
      return rc;
    }
  } else if (uses_gpu(plan)) {
    if (const auto g = gpu_identity()) gpus = {*g};
  }
  const FollowersReleased release(ranks.get());
  if (o.verbose)
    for (const std::string& d : engine.dropped_layouts()) std::fprintf(out, "layout not run: %s\n", d.c_str());

  Report r = make_report("sweep");
  set_gpu_environment(r.environment, gpus);
  if (ranks) {
    r.environment.nccl_version = ranks->nccl_version();
    if (!o.quiet)
      std::fprintf(stderr, "sweep: %d ranks (started by %s), one per GPU, NCCL %s\n", ranks->world(),
                   ranks->launcher().c_str(), ranks->nccl_version().c_str());
  }
  if (engine.contracts().size() == 1) {
    r.environment.contract_name = engine.contracts().front()->name;
    r.environment.contract_knob_hash = engine.contracts().front()->knob_hash();
  }
  g_stop = 0;
  program::run_control::cancel_requested = false;
  install_stop_handlers();
  const auto& cases = engine.cases();
  Progress progress(cases.size(), !o.quiet);
  engine.on_load_progress([&progress](const io::LoadProgress& p) {
    char text[96];
    std::snprintf(text, sizeof text, "%s weights %.1f/%.1f GB", p.stage, static_cast<double>(p.done_bytes) * 1e-9,
                  static_cast<double>(p.total_bytes) * 1e-9);
    progress.status(text);
  });
  if (progress.enabled())
    std::fprintf(stderr, "sweep: %zu cases: %s\n", cases.size(), work_text(engine.work()).c_str());
  bool cancelled = false;
  for (size_t i = 0; i < cases.size() && !g_stop; ++i) {
    progress.update(i, engine.case_id(cases[i]));
    try {
      r.cases.push_back(engine.compare(cases[i]));
    } catch (const program::run_control::Cancelled&) {
      r.cases.push_back(engine.interrupted(cases[i]));
      cancelled = true;
      break;
    }
    // A reader that went away (`| head -1`) ends the printing, not the sweep (SIGPIPE is ignored: main.cpp).
    if (o.verbose && !std::ferror(out)) {
      progress.finish();
      std::fprintf(out, "%s %s\n", case_line(r.cases.back()).c_str(), cost_text(r.cases.back()).c_str());
      std::fflush(out);
    }
  }
  progress.finish();
  r.interrupted = cancelled || r.cases.size() < cases.size();
  r.environment.weights = weights.origins();

  size_t tensors = 0;
  for (const Case& c : r.cases) tensors += c.tensors.size();
  const Verdict overall = r.overall();
  if (!o.quiet) {
    std::vector<std::string> path_names;
    for (const program::Path& p : plan.paths) path_names.push_back(path_name(p));
    print_table(r, path_names, out);
    if (!o.verbose) {
      size_t shown = 0;
      for (const Case& c : r.cases)
        if ((c.verdict == Verdict::kMismatch || c.verdict == Verdict::kError) && shown++ < 10)
          std::fprintf(out, "%s\n", case_line(c).c_str());
      if (shown > 10) std::fprintf(out, "... and %zu more failing cases\n", shown - 10);
    }
  }
  if (const auto silent = std::count_if(r.cases.begin(), r.cases.end(), control_showed_nothing))
    std::fprintf(stderr, "bitparity sweep: warning: %zu negative-control case%s came out bit-identical to the contract "
                 "and show%s nothing on this input: skipped (--verbose and the reports name them)\n", static_cast<size_t>(silent), silent == 1 ? "" : "s",
                 silent == 1 ? "s" : "");
  const char* verdict = r.interrupted ? "INTERRUPTED"
                        : overall == Verdict::kError ? "ERROR"
                        : overall == Verdict::kMismatch ? "MISMATCH"
                        : overall == Verdict::kNonFinite ? "NON-FINITE (matching NaN/Inf results prove nothing)"
                        : overall == Verdict::kSkipped  ? "NOTHING TESTED (cannot test here)"
                                                        : "ALL EXACT";
  std::fprintf(o.quiet ? stderr : out, "sweep: %zu of %zu cases: %s; %zu tensors; %.1f s: %s\n", r.cases.size(),
               cases.size(), r.counts_text().c_str(), tensors, progress.elapsed(), verdict);
  const int rc = [&]() -> int {
    if (const int w = write_reports("sweep", r, paths, stderr)) return w;
    if (const auto f = failure_exit_code(r)) return *f;  // interrupted, an error, a mismatch
    if (overall == Verdict::kNonFinite) return nonfinite_exit("sweep", r, o.strict, stderr);
    if (overall == Verdict::kSkipped) return kExitCannotTest;
    return kExitExact;
  }();
  if (ranks && ranks->broken()) RankSession::leave_now(rc);
  return rc;
}

}  // namespace

Subcommand add_sweep_command(CLI::App& app) {
  auto o = std::make_shared<SweepOptions>();
  CLI::App* sub = app.add_subcommand(
      "sweep",
      "compare models x contracts x implementations x layouts x paths against the canonical reference (logprobs, entropy, "
      "every parameter gradient on the extend path, every op's output with --capture ops). With no arguments: the "
      "default sweep on the embedded tiny fixtures. Exit 0 all exact (or non-finite matches, with a warning), 1 a "
      "mismatch (or, with --strict, a non-finite match), 2 bad usage or input, 3 internal error or a case that failed "
      "with an error (its verdict 'error'; the other cases still run and the reports are written), 125 nothing could "
      "be tested here, 130 interrupted (SIGINT/SIGTERM stops after the case in flight, a second one stops that case "
      "at once; the report holds the finished cases, marked interrupted)");
  o->plan.add_to(sub, true);
  sub->add_option("--json", o->json, "write a JSON report (reports/schema/report.schema.json); '-': stdout");
  sub->add_option("--csv", o->csv, "write a CSV report (one row per case x tensor); '-': stdout");
  sub->add_option("--junit", o->junit, "write a JUnit XML report (one testcase per case); '-': stdout");
  sub->add_option("--html", o->html, "write an HTML report; '-': stdout");
  sub->add_flag("--quiet,-q", o->quiet, "print only the verdict line, on stderr (and errors)");
  sub->add_flag("--strict", o->strict, kStrictHelp);
  sub->add_flag("--verbose,-v", o->verbose,
                "print every case as it finishes, with its run time, peak device memory and, on several ranks, the "
                "bytes its collectives moved, and the layouts a model cannot run");
  return guarded_subcommand(sub, [o] { return sweep(*o); });
}

}  // namespace bp::harness
