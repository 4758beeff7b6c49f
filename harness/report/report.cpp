// Report model, environment detection, and the reports written (io::write_output, io/files.h).
#include "harness/report/report.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>

#include "harness/exit_codes.h"
#include "harness/io/errors.h"
#include "harness/io/files.h"
#include "harness/report/html.h"

#ifndef BP_COMPILER_ID
#define BP_COMPILER_ID "unknown"
#endif
#ifndef BP_COMPILER_VERSION
#define BP_COMPILER_VERSION "unknown"
#endif
#ifndef BP_COMPILER_FLAGS
#define BP_COMPILER_FLAGS ""
#endif
#ifndef BP_BUILD_TYPE
#define BP_BUILD_TYPE ""
#endif
#ifndef BP_VERSION
#define BP_VERSION "unknown"
#endif
#ifndef BP_CONFIGURED_SOURCE_DIR
#define BP_CONFIGURED_SOURCE_DIR ""
#endif

namespace bp::harness {

namespace {

// Runs a shell command; its stdout (trimmed) when it exits 0, else nullopt.
std::optional<std::string> capture(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return std::nullopt;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string q(1, '\'');
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  q += '\'';
  return q;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string v = line.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.erase(v.begin());
      return v;
    }
  }
  return "unknown";
}

}  // namespace

Environment detect_environment() {
  Environment e;
  e.compiler_id = BP_COMPILER_ID;
  e.compiler_version = BP_COMPILER_VERSION;
  e.compiler_flags = BP_COMPILER_FLAGS;
  while (!e.compiler_flags.empty() && e.compiler_flags.front() == ' ') e.compiler_flags.erase(0, 1);
  while (!e.compiler_flags.empty() && e.compiler_flags.back() == ' ') e.compiler_flags.pop_back();
  e.build_type = BP_BUILD_TYPE;
  e.bitparity_version = BP_VERSION;
  e.cpu_model = cpu_model();
  const std::string src = BP_CONFIGURED_SOURCE_DIR;
  if (!src.empty()) {
    // The build's own tree, never the caller's repository: git reads GIT_DIR,
    // GIT_WORK_TREE, GIT_INDEX_FILE, ... before -C, and a git hook (a pre-push hook
    // running the oracle) sets them. `git rev-parse --local-env-vars` names them all.
    const std::string git = "unset $(git rev-parse --local-env-vars) 2>/dev/null; git -C " + shell_quote(src);
    if (auto head = capture(git + " rev-parse HEAD 2>/dev/null"); head && head->size() == 40) {
      e.git_commit = *head;
      if (auto st = capture(git + " status --porcelain --untracked-files=no 2>/dev/null")) e.git_dirty = !st->empty();
    }
  }
  return e;
}

void set_gpu_environment(Environment& e, const std::vector<GpuIdentity>& gpus) {
  if (gpus.empty()) return;
  // The value all ranks share, once (with `suffix`); else each rank's.
  auto field = [&gpus](std::string GpuIdentity::*f, const std::string& suffix) {
    const std::string& first = gpus[0].*f;
    if (std::all_of(gpus.begin(), gpus.end(), [&](const GpuIdentity& g) { return g.*f == first; }))
      return first + suffix;
    std::string each;
    for (size_t r = 0; r < gpus.size(); ++r) each += (r ? "; rank " : "rank ") + std::to_string(r) + ": " + gpus[r].*f;
    return each;
  };
  e.gpu_name = field(&GpuIdentity::name, gpus.size() > 1 ? " x" + std::to_string(gpus.size()) : "");
  e.gpu_driver = field(&GpuIdentity::driver, "");
  e.cuda_version = field(&GpuIdentity::runtime, "");
}

const char* tensor_status_name(TensorStatus s) {
  switch (s) {
    case TensorStatus::kCompared: return "compared";
    case TensorStatus::kOnlyInA: return "only_in_a";
    case TensorStatus::kOnlyInB: return "only_in_b";
    case TensorStatus::kDtypeMismatch: return "dtype_mismatch";
    case TensorStatus::kShapeMismatch: return "shape_mismatch";
  }
  return "?";
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kExact: return "exact";
    case Verdict::kMismatch: return "mismatch";
    case Verdict::kSkipped: return "skipped";
    case Verdict::kNonFinite: return "nonfinite";
    case Verdict::kError: return "error";
  }
  return "?";
}

bool TensorRecord::nonfinite() const {
  if (!matches() || metrics->elements == 0) return false;
  const uint64_t nonfinite_elements = metrics->nan_a + metrics->inf_a;
  return nonfinite_elements == metrics->elements || (is_logprob && nonfinite_elements > 0);
}

std::optional<double> TensorRecord::truth_ratio() const {
  if (!truth_error_a || !truth_error_b) return std::nullopt;
  const double a = truth_error_a->mean_ulp, b = truth_error_b->mean_ulp;
  return a == b ? 1.0 : a / b;  // equal infinities too
}

TruthSummary truth_summary(const Case& c) {
  TruthSummary s;
  for (const TensorRecord& t : c.tensors) {
    const std::optional<double> ratio = t.truth_ratio();
    if (!ratio) continue;
    ++s.measured;
    if (*ratio <= 1) continue;
    ++s.farther;
    if (!s.worst || *ratio > *s.worst->truth_ratio()) s.worst = &t;
  }
  return s;
}

void Case::settle() {
  if (verdict == Verdict::kSkipped || verdict == Verdict::kError) return;
  const bool any_nonfinite = std::any_of(tensors.begin(), tensors.end(), [](const TensorRecord& t) { return t.nonfinite(); });
  verdict = first_mismatch() ? Verdict::kMismatch : any_nonfinite ? Verdict::kNonFinite : Verdict::kExact;
}

const TensorRecord* Case::first_mismatch() const {
  for (const TensorRecord& t : tensors)
    if (!t.matches()) return &t;
  return nullptr;
}

const TensorRecord* Case::first_nonfinite() const {
  for (const TensorRecord& t : tensors)
    if (t.nonfinite()) return &t;
  return nullptr;
}

std::string nonfinite_text(const TensorRecord& t) {
  const TensorMetrics& m = *t.metrics;
  return t.name + " is NaN/Inf in " + std::to_string(m.nan_a + m.inf_a) + " of " + std::to_string(m.elements) +
         " elements on both sides: the match proves nothing";
}

Verdict Report::overall() const {
  for (const Verdict v : {Verdict::kError, Verdict::kMismatch, Verdict::kNonFinite, Verdict::kExact})
    if (count(v) != 0) return v;
  return Verdict::kSkipped;
}

size_t Report::count(Verdict v) const {
  return static_cast<size_t>(std::count_if(cases.begin(), cases.end(), [v](const Case& c) { return c.verdict == v; }));
}

std::string Report::counts_text() const {
  std::string s;
  for (const Verdict v : {Verdict::kExact, Verdict::kMismatch, Verdict::kNonFinite, Verdict::kError, Verdict::kSkipped})
    s += (s.empty() ? "" : ", ") + std::to_string(count(v)) + " " + verdict_name(v);
  return s;
}

std::optional<int> failure_exit_code(const Report& r) {
  if (r.interrupted) return kExitInterrupted;
  if (r.count(Verdict::kError) != 0) return kExitInternal;
  if (r.count(Verdict::kMismatch) != 0) return kExitMismatch;
  return std::nullopt;
}

std::string communication_text(const std::vector<CollectiveTraffic>& traffic) {
  if (traffic.empty()) return "";
  uint64_t calls = 0, bytes = 0;
  for (const CollectiveTraffic& t : traffic) calls += t.calls, bytes += t.bytes;
  return bytes_text(bytes) + " moved in " + std::to_string(calls) + (calls == 1 ? " collective" : " collectives");
}

std::string weights_text(const WeightsOrigin& o, bool digests) {
  std::string s;
  if (o.seed) {
    s = "generated weights (seed " + std::to_string(*o.seed) + ")";
  } else {
    s = "weights from " + std::to_string(o.files.size()) + (o.files.size() == 1 ? " file" : " files");
    for (size_t i = 0; digests && i < o.files.size(); ++i)
      s += (i ? ", " : ": ") + o.files[i].path + " sha256 " + o.files[i].sha256;
  }
  return o.conversion.empty() ? s : s + "; " + o.conversion;
}

Report make_report(std::string command) {
  Report r;
  r.command = std::move(command);
  r.environment = detect_environment();
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  r.created_utc = buf;
  return r;
}

void write_json(const Report& r, const std::string& path) { io::write_output(path, render_json(r)); }
void write_csv(const Report& r, const std::string& path) { io::write_output(path, render_csv(r)); }
void write_junit(const Report& r, const std::string& path) { io::write_output(path, render_junit(r)); }

namespace {
using Writer = void (*)(const Report&, const std::string&);
struct ReportWriter {
  const char* option;
  const std::string* path;
  Writer write;
};
std::vector<ReportWriter> writers(const ReportPaths& p) {
  const Writer html = [](const Report& r, const std::string& path) {
    io::write_output(path, render_html(r, "bitparity " + r.command, nullptr));
  };
  return {{"--json", &p.json, &write_json}, {"--csv", &p.csv, &write_csv}, {"--junit", &p.junit, &write_junit},
          {"--html", &p.html, html}};
}
}  // namespace

int check_report_paths(const char* cmd, const ReportPaths& paths, const std::vector<std::string>& inputs,
                       std::FILE* err) {
  std::vector<io::NamedOutput> outputs;
  for (const ReportWriter& w : writers(paths))
    if (!w.path->empty()) outputs.push_back({w.option, *w.path});
  try {
    io::check_outputs(outputs, inputs);
  } catch (const io::BadInput& e) {
    std::fprintf(err, "bitparity %s: cannot write report: %s\n", cmd, e.what());
    return kExitBadInput;
  }
  return 0;
}

int write_reports(const char* cmd, const Report& r, const ReportPaths& paths, std::FILE* err) {
  int rc = 0;
  for (const ReportWriter& w : writers(paths)) {
    if (w.path->empty()) continue;
    try {
      w.write(r, *w.path);
    } catch (const io::IoError& e) {
      // The other reports are still written: one lost folder costs only its own.
      std::fprintf(err, "bitparity %s: cannot write the %s report: %s\n", cmd, w.option, e.what());
      rc = kExitBadInput;
    }
  }
  return rc;
}

std::string metric_text(double v, const char* printf_format) {
  if (!std::isfinite(v)) return "inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, printf_format, v);
  return buf;
}

std::string truth_error_text(const std::optional<TruthError>& e) {
  if (!e) return "not measured";
  return "max " + metric_text(e->max_ulp, "%.3g") + " / mean " + metric_text(e->mean_ulp, "%.3g") + " ulp";
}

namespace {
// `v` (< 999.5, so "%.3g" stays out of exponent notation) and its unit.
std::string three_digits(double v, const char* unit) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g %s", v, unit);
  return buf;
}
}  // namespace

std::string duration_text(double seconds) {
  if (!(seconds > 0)) return "0 s";
  if (seconds * 1e6 < 999.5) return three_digits(seconds * 1e6, "us");
  if (seconds * 1e3 < 999.5) return three_digits(seconds * 1e3, "ms");
  if (seconds < 59.95) return three_digits(seconds, "s");
  const long s = std::lround(seconds);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%ld min %02ld s", s / 60, s % 60);
  return buf;
}

std::string bytes_text(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024;
  size_t u = 0;
  while (v >= 999.5 && u + 1 < std::size(kUnits)) v /= 1024, ++u;
  return three_digits(v, kUnits[u]);
}

std::string terminal_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out += ch;
      continue;
    }
    char escaped[5];
    std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
    out += escaped;
  }
  return out;
}

}  // namespace bp::harness
