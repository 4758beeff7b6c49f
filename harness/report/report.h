// The report every bitparity command writes: an environment block, a status, one
// entry per case with its compared tensors, and an overall verdict. Three renderings,
// each written by bp::io::write_output of io/files.h: a file atomically (temporary in
// the same directory + fsync + rename, through a symbolic link to its target), so an
// error never leaves a partial report and never destroys an earlier one; "-",
// a device or a FIFO straight:
//   JSON   schema reports/schema/report.schema.json, "schema_version": 6 (2 changed
//          ulp_histogram to the mismatch-only bins of compare/compare.h, added
//          first_divergent_op; 3 added each case's seconds and peak_device_bytes;
//          4 added the "nonfinite" verdict and its summary count; 5 added the
//          "error" verdict with each case's "error" message and its summary count,
//          and each case's optional "ranks" and "communication"; 6 added each
//          tensor's optional "truth_error", {"a": ..., "b": ...}, each side null or
//          its {"max_ulp", "mean_ulp"}, written where a side is set)
//   CSV    one row per case x tensor (a case with no tensors: one row with empty
//          tensor columns; a report with no cases: one row with only run_status,
//          the report's status, which every row carries), header row, stable
//          column order (kCsvColumns), RFC 4180
//          quoting, CRLF line ends; non-finite numbers are written "inf"; lists
//          (shapes, ulp_histogram) as "[a,b,...]". Schema 5 added the column
//          "error" (a case's error message); ranks and communication are JSON only.
//          The environment's GPU fields (kGpuFields), every row, empty when null,
//          are the last columns (added after schema 5, without a new JSON field).
//          Schema 6 added the truth errors' columns (kTruthColumns) before them,
//          empty where a side is unset.
//   JUnit  one <testcase> per case, its time attribute the case's seconds; a
//          mismatching case has one <failure> naming its first mismatching tensor; a
//          case that failed with an error has one <error> with its message; a
//          skipped case has <skipped/>.
// In JSON non-finite metrics (NaN against a number) are the string "inf".
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/compare/compare.h"
#include "harness/io/files.h"

namespace bp::harness {

inline constexpr int kReportSchemaVersion = 6;

// Where one model's weights came from: generated from a seed, or read from
// checkpoint files (docs/failure-modes.md).
struct WeightsOrigin {
  std::string model;                  // as the plan names it
  std::optional<uint64_t> seed;       // generated from this seed (no files)
  std::vector<io::FileDigest> files;  // read from these (the index first, then the shards)
  std::string conversion;             // how stored values became the model's ("" used as stored)
};
// One line: "generated weights (seed S)", or "weights from N files" (with
// `digests`: ": <path> sha256 <hex>, ..."), then "; <conversion>" when there was one.
std::string weights_text(const WeightsOrigin& o, bool digests);

struct Environment {
  std::string git_commit = "unknown";
  std::optional<bool> git_dirty;      // null when unknown
  std::string compiler_id, compiler_version, compiler_flags, build_type;
  std::string bitparity_version;
  std::optional<std::string> contract_name, contract_knob_hash;  // null when no contract applies
  std::string cpu_model = "unknown";
  // Where the run's GPU cases ran (set_gpu_environment), null when none could: a
  // parity report that does not say on which GPU it was made is no evidence.
  std::optional<std::string> gpu_name, gpu_driver, cuda_version, nccl_version;
  std::vector<WeightsOrigin> weights;  // the models' weights; JSON key "weights" only when a model ran
};

// The environment's GPU fields by key: the JSON keys, and the CSV columns and JUnit
// properties of the same names.
struct GpuField {
  const char* key;
  std::optional<std::string> Environment::*field;
};
inline constexpr GpuField kGpuFields[] = {{"gpu_name", &Environment::gpu_name},
                                          {"gpu_driver", &Environment::gpu_driver},
                                          {"cuda_version", &Environment::cuda_version},
                                          {"nccl_version", &Environment::nccl_version}};

// One GPU as its own process sees it (gpu_identity() of
// harness/engine/cuda_implementation.h): each field is the answer, or "unknown
// (<the query that failed>: <why>)".
struct GpuIdentity {
  std::string name;     // "NVIDIA H200"
  std::string driver;   // "570.133.20 (CUDA 12.8)": the kernel driver, and the CUDA version it supports
  std::string runtime;  // "13.0": the CUDA runtime the process runs on
};

// Sets e's gpu_name, gpu_driver and cuda_version from the GPUs a run used, in rank
// order (one for a single process). A field every rank agrees on is given once, the
// name then with " xN" for N > 1 ranks ("NVIDIA H200 x8"); otherwise each rank's:
// "rank 0: 570.133.20 (CUDA 12.8); rank 1: 575.51.03 (CUDA 12.9)" (the ranks may be
// on different hosts). No GPUs: the fields are left alone.
void set_gpu_environment(Environment& e, const std::vector<GpuIdentity>& gpus);

// The build's compiler (from CMake-configured definitions), the CPU model
// (/proc/cpuinfo), and the git commit and dirty flag of the source tree the binary
// was configured from (via `git`, when both exist; else "unknown" / null).
Environment detect_environment();

// How one named tensor came out. Only kCompared carries metrics.
enum class TensorStatus { kCompared, kOnlyInA, kOnlyInB, kDtypeMismatch, kShapeMismatch };
const char* tensor_status_name(TensorStatus s);  // "compared", "only_in_a", ...

struct TensorRecord {
  std::string name;    // the tensor's name in A (or in B when only in B)
  std::string name_b;  // its name in B when renamed (--map), else ""
  TensorStatus status = TensorStatus::kCompared;
  std::string dtype_a, dtype_b;  // "" when absent on that side
  std::optional<std::vector<uint64_t>> shape_a, shape_b;
  std::optional<TensorMetrics> metrics;
  // Each side's distance from the float64 truth of the op on the same inputs
  // (`conform`: A the engine, B the contract); absent where nobody measured it.
  std::optional<TruthError> truth_error_a, truth_error_b;
  bool is_logprob = false;
  bool matches() const { return status == TensorStatus::kCompared && metrics && metrics->bit_identical; }
  // How many times farther A is from the truth than B, by their mean ulp; nullopt
  // unless both sides are set. Equal means give 1 (0 and 0: both exact), a mean of 0
  // against a larger one 0 or +inf.
  std::optional<double> truth_ratio() const;
  // Whether either side's distance from the float64 truth was measured (conform).
  bool has_truth_error() const { return truth_error_a || truth_error_b; }
  // Matches, but proves nothing: every element is NaN or Inf, or (a logprob tensor)
  // any element is. Two NaN-filled results are bit-identical, and one NaN weight
  // makes every logprob and gradient NaN; such a match must never read as "exact".
  bool nonfinite() const;
};

// Each side's truth error by its CSV columns (max and mean ulp; both empty when unset).
struct TruthColumns {
  const char* max_ulp;
  const char* mean_ulp;
  std::optional<TruthError> TensorRecord::*side;
};
inline constexpr TruthColumns kTruthColumns[] = {
    {"truth_max_ulp_a", "truth_mean_ulp_a", &TensorRecord::truth_error_a},
    {"truth_max_ulp_b", "truth_mean_ulp_b", &TensorRecord::truth_error_b}};

// A case is kNonFinite when its tensors all match but one of them is nonfinite().
// kError: the case's run failed (a rank killed or throwing); nothing was compared.
enum class Verdict { kExact, kMismatch, kSkipped, kNonFinite, kError };
const char* verdict_name(Verdict v);  // "exact", "mismatch", "skipped", "nonfinite", "error"

// The bytes one kind of collective moved during a case's run.
struct CollectiveTraffic {
  std::string collective;  // "all_gather", "all_to_all", "all_reduce", ...
  uint64_t calls = 0;
  uint64_t bytes = 0;  // sent by all ranks together
  bool operator==(const CollectiveTraffic&) const = default;
};
// "3.1 MiB moved in 42 collectives" (the sums over `traffic`); "" when it is empty.
std::string communication_text(const std::vector<CollectiveTraffic>& traffic);

struct Case {
  std::string id;
  std::map<std::string, std::string> parameters;
  Verdict verdict = Verdict::kExact;
  std::string skip_reason;  // when kSkipped
  std::string error;        // when kError: what failed, naming the rank, e.g. "rank 1 was killed by signal 9"
  std::vector<TensorRecord> tensors;
  // The first (layer, op) whose output differs, e.g. "layers.3.attn_out", when the
  // command located it (sweep/bisect); nullopt when not looked for or not found.
  std::optional<std::string> first_divergent_op;
  // Wall time of the case's own run (CaseEngine::run: the implementation's model work, not
  // loading the weights, from disk or onto the device, nor the comparison with the
  // reference); 0 where a command times no run (diff, bisect).
  double seconds = 0;
  // Wall time of the comparison with the canonical result (sweep: the tensors'
  // metrics, digests and fetches included; --verbose prints it); nullopt where none ran.
  std::optional<double> compare_seconds;
  // The device memory the run peaked at, the model's weights included in every case
  // (also when they stay resident between cases: harness/engine/cuda_implementation.h);
  // on several ranks the largest of theirs; nullopt for an implementation with no
  // device (CPU).
  std::optional<uint64_t> peak_device_bytes;
  // The number of processes (GPUs) the case ran on; nullopt for implementations that
  // run in this one process (reference, emulated ranks, cuda's virtual ranks).
  std::optional<int> ranks;
  // The collectives the run called, per kind; empty for implementations without real
  // collectives (the emulated and virtual ranks exchange through memory).
  std::vector<CollectiveTraffic> communication;
  // (Time, peak, ranks and communication are measurements, not results: a baseline
  // never counts them as a change, and a case's verdict ignores them.)

  // kMismatch if any tensor does not match, else kNonFinite if any is nonfinite(),
  // else kExact (leaves kSkipped and kError alone).
  void settle();
  const TensorRecord* first_mismatch() const;  // in record order; nullptr when none
  const TensorRecord* first_nonfinite() const;  // likewise
};

struct Report {
  std::string command;  // "diff", "sweep", ...
  std::string created_utc;  // ISO 8601, set by make_report
  bool interrupted = false;
  const char* status() const { return interrupted ? "interrupted" : "complete"; }  // the reports' "status"
  Environment environment;
  std::vector<Case> cases;
  // The first of kError, kMismatch, kNonFinite, kExact that any case has; else
  // kSkipped (also for no cases at all). A case that failed is the worst outcome.
  Verdict overall() const;
  size_t count(Verdict v) const;  // the cases with verdict v
  // "3 exact, 1 mismatch, 0 nonfinite, 1 error, 2 skipped", for summary lines.
  std::string counts_text() const;
};

// The exit code (harness/exit_codes.h) that a run's report decides on its own:
// kExitInterrupted for an interrupted run, else kExitInternal when a case failed with
// an error, else kExitMismatch on a mismatch; nullopt otherwise (exact, non-finite
// or skipped cases only: each command has its rule for those).
std::optional<int> failure_exit_code(const Report& r);

Report make_report(std::string command);  // environment detected, timestamp now

nlohmann::ordered_json to_json(const Report& r);  // keys in schema order
std::string render_json(const Report& r);   // to_json(r).dump(2) + "\n"
std::string render_csv(const Report& r);
std::string render_junit(const Report& r);
extern const std::vector<std::string> kCsvColumns;
size_t csv_column(const std::string& name);  // its index in kCsvColumns; throws std::logic_error if none
std::string csv_field(const std::string& s);  // RFC 4180 quoting when needed
// A case's parameters in the CSV column "parameters": "key=value;key=value", each
// backslash, ';' and '=' of a key or value preceded by a backslash, so that any model
// path reads back as written (a folder "x;contract=bf16-fmaseq-v1" is no second
// contract). The reader keeps a backslash before any other character as it is.
// `escaped` false reads a CSV written before the escaping (one without the GPU
// columns): split at every ';' and each item's first '=', backslashes as they are.
std::string csv_parameters(const std::map<std::string, std::string>& parameters);
std::map<std::string, std::string> parameters_from_csv(const std::string& text, bool escaped);

// Writes with io::write_output (io/files.h: "-" is standard output, files atomically;
// throw bp::io::IoError, a file `path` is then untouched).
void write_json(const Report& r, const std::string& path);
void write_csv(const Report& r, const std::string& path);
void write_junit(const Report& r, const std::string& path);

// Where a command writes its reports ("" = not at all).
struct ReportPaths {
  std::string json, csv, junit, html;
};
// 0 when every path can take a report, names a file of its own and is none of
// `inputs` (the files the command reads) -- io::check_outputs -- else prints why and
// returns kExitBadInput: commands check before their work, so a bad path costs
// neither the work nor an earlier report.
int check_report_paths(const char* cmd, const ReportPaths& paths, const std::vector<std::string>& inputs,
                       std::FILE* err);
// Writes each requested report; 0, or kExitBadInput when one could not be written
// (each failure is printed, naming its report; the others are still written).
int write_reports(const char* cmd, const Report& r, const ReportPaths& paths, std::FILE* err);

// "logprobs.0 is NaN/Inf in 12 of 12 elements: the match proves nothing", for the
// warnings of commands and reports about a kNonFinite case.
std::string nonfinite_text(const TensorRecord& t);

// `v` printed with `printf_format` (one double conversion), or "inf" when it is not
// finite: metrics are distances, so a non-finite one is +inf.
std::string metric_text(double v, const char* printf_format);

// "max 0.51 / mean 0.12 ulp": one side's distance from the float64 truth, as the
// conform command and the HTML report both write it; "not measured" when absent.
std::string truth_error_text(const std::optional<TruthError>& e);

// Of a case's tensors with both sides' truth errors (conform: the engine's and the
// contract's distance from the float64 truth): how many, in how many the engine is the
// farther (TensorRecord::truth_ratio > 1), and the one where it is farthest.
struct TruthSummary {
  size_t measured = 0, farther = 0;
  const TensorRecord* worst = nullptr;
};
TruthSummary truth_summary(const Case& c);

// For people (HTML, the sweep's lines), 3 significant digits: "850 us", "12.3 ms",
// "4.56 s", then "2 min 05 s"; "0 s" for 0.
std::string duration_text(double seconds);
// "512 B", "1.5 KiB", "23.4 MiB", "1.25 GiB" (binary units, 3 significant digits).
std::string bytes_text(uint64_t bytes);
// `s` for a terminal: control characters (an ESC that would drive the terminal, a
// line break that would forge a line) as \xNN. Names read from files (tensors,
// cases, paths) pass through it on their way to stdout or stderr; the reports keep
// them as they are, in their own escaping.
std::string terminal_text(std::string_view s);

}  // namespace bp::harness
