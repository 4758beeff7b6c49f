// What a sweep runs: models × contracts × implementations × layouts × paths on one
// batch of token sequences. A plan comes from a JSON file (`--plan FILE`), from
// flags, or both (flags override the file field by field), on top of the default
// plan: the README's default sweep on the embedded tiny fixtures.
//
// Plan file (every key optional; unknown keys are refused):
//   {
//     "models":      ["qwen3-dense-tiny", "path/to/hf_dir"],  fixture names or HF checkpoint dirs
//     "contracts":   ["bf16-sm90tc-v3", "bf16-fmaseq-v1"],     default: the v3 pair
//     "implementations": ["reference", "emulated", "cuda"],   (or "backends", its old name)
//     "layouts":     ["tp2-ep1-cp2z", "tp1-ep1-cp1+ring"],    explicit list, or the grid:
//     "tp": [1, 2, 4], "ep": [1, 2, 4], "cp": [1, 2], "cp_split": ["contiguous", "zigzag"],
//     "paths":       ["extend", "chunked:5,3", "decode", "ragged"],
//     "tokens":      {"seed": 1, "lengths": [9, 17, 24]}  or  {"file": "tokens.json"},
//     "weight_seed": 20261122, "coef_seed": 7, "temperature": 1.0,
//     "grads": true, "capture": "none" | "ops", "allow_nonfinite_weights": false,
//     "canonical":   "reference" | "cuda" | "<implementation>:<layout>"   what every case is compared with (below)
//     "verify_layers": "all" | "N" | "i,j,…"  layers the CPU reference re-runs (below)
//   }
// A tokens file is {"sequences": [[t0, t1, ...], ...]} (each at least 2 tokens),
// optionally with "coefficients": [[c0, c1, ...], ...], the loss's coefficients,
// len − 1 per sequence (SPEC.md §6.4), which replace the ones coef_seed generates;
// a plan carries explicit coefficients through its tokens file.
// Relative model directories and tokens files are taken relative to the plan file.
//
// Layouts: an explicit list must be shardable by every model of the plan. The grid
// is the product of its axes, filtered per model to the layouts it can run (ep > 1
// only for MoE models, shard_check empty); cp_split matters only for cp > 1. A
// source that names any grid axis gets 1 (contiguous) for the axes it leaves out.
// The reference implementation is unsharded: it runs each path once, on tp1-ep1-cp1.
// The canonical result of a (model, contract) is the unsharded extend forward and
// backward of the reference model (CPU), or with "canonical": "cuda" of the GPU
// model — bit-identical to the reference wherever both run (the gpu suites prove it
// on the tiny fixtures), and the only one that fits a real-size model's time — or
// with "<implementation>:<layout>" (cuda, emulated, nccl) of that layout, for a model
// too large for one GPU: "nccl:tp2-ep4-cp1" compares the other layouts with it.
// Layer-sliced verification (verify_layers) checks that GPU canonical with the CPU
// reference where the whole CPU model would take days: after each (model,
// contract)'s cases, one more case re-runs the chosen layers and the head (final
// norm, logits, logprobs, entropy) on the CPU from the canonical run's own captured
// input of each, and compares every op's output bit for bit; with grads also their
// backward, from the canonical backward's gradient of each layer's output, comparing
// each layer's input gradient and parameter gradients. "all" every layer, "N"
// N layers spread evenly (the first and the last among them), "i,j,…" those
// (one layer: "i,i"). Under canonical cuda the default is all layers for models of
// at most 4, else 3; under canonical reference only when asked (a self-check).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/io/errors.h"
#include "program/layouts/layout.h"
#include "program/path.h"
#include "program/results.h"
#include "reference/contract/contract.h"
#include "reference/model/config.h"
#include "reference/model/loss.h"
#include "reference/model/weights.h"

namespace bp::harness {

// What computes a case: the reference model (host::Model, unsharded), the layouts
// on emulated CPU ranks, the GPU (engine/cuda_implementation.h), real ranks over
// NCCL, one process per GPU (engine/nccl_implementation.h); and, for `run`
// only (allow_float64), the float64 truth model (reference/truth/qwen3.h): no
// contract, unsharded, extend, no captures. Not the program's compute Backend
// (program/backend.h), which the first three supply.
enum class Implementation { kReference, kEmulated, kCuda, kNccl, kFloat64 };
const char* implementation_name(Implementation i);  // "reference", "emulated", "cuda", "nccl", "float64"
std::optional<Implementation> parse_implementation(std::string_view s);
inline constexpr Implementation kAllImplementations[] = {Implementation::kReference, Implementation::kEmulated,
                                                         Implementation::kCuda, Implementation::kNccl,
                                                         Implementation::kFloat64};

// The layers a verify_layers spec names for a model of `num_layers` layers, sorted;
// nullopt with `why` for a malformed spec or a layer the model does not have.
// "" resolves to the default for `canonical` (an empty list: no verification).
// kAnyNumberOfLayers checks the spec's form only (and returns an empty list).
inline constexpr int64_t kAnyNumberOfLayers = -1;
std::optional<std::vector<int64_t>> verify_layer_list(const std::string& spec, int64_t num_layers,
                                                      Implementation canonical, std::string* why);

// Paths: "extend", "decode", "ragged", "chunked:<n>[,<n>...]" (n >= 1).
std::string path_name(const program::Path& s);
std::optional<program::Path> parse_path(std::string_view s, std::string* why = nullptr);

// The contracts a plan may name: bp::contracts(). (`run` also reads "truth", the
// old spelling of implementation float64: it sets implementations ["float64"] and
// no contract.) A plan that names none runs bp::default_contract_names() (v2).
std::vector<std::string> contract_names();

struct TokenSpec {
  uint64_t seed = 1;
  std::vector<int> lengths = {6, 11, 17};
  std::string file;  // when set: the sequences of this tokens file (seed/lengths unused)
  std::string text;  // the file's contents where a caller read it once (run: what it records is what it plans)
};

struct LayoutGrid {
  std::vector<int> tp = {1, 2, 4}, ep = {1, 2, 4}, cp = {1, 2};
  std::vector<layouts::CpSplit> cp_split = {layouts::CpSplit::Contiguous, layouts::CpSplit::Zigzag};
};

struct SweepPlan {
  std::vector<std::string> models = {"qwen3-dense-tiny", "qwen3-moe-tiny"};
  std::vector<std::string> contracts = default_contract_names();  // empty for the float64 truth model, which has none
  std::vector<Implementation> implementations = {Implementation::kReference, Implementation::kEmulated};
  std::vector<layouts::Layout> layouts;  // explicit list; empty: the grid
  LayoutGrid grid;
  std::vector<program::Path> paths = {program::Path::extend(), program::Path::chunked({5, 3}),
                                      program::Path::decode(), program::Path::ragged()};
  TokenSpec tokens;
  uint64_t weight_seed = 20261122;
  uint64_t coef_seed = 7;
  float temperature = 1.0f;
  bool grads = true;        // compare every parameter gradient on the extend path
  bool capture_ops = false;  // compare every op's output
  Implementation canonical = Implementation::kReference;  // what the cases are compared with, on
  layouts::Layout canonical_layout;                        // this layout (unsharded by default)
  std::string verify_layers;  // "" = the default above; else "all", "N" or "i,j,…" (checked when read)
  bool allow_nonfinite_weights = false;  // load a checkpoint's NaN/Inf weights instead of refusing them
  bool allow_float64 = false;  // implementations may name float64 (`run` only)
  bool force = false;          // run beyond the work limits (engine/work.h; --force, not a plan key)
  std::string base_dir;     // where relative model dirs / tokens files are resolved ("" = cwd)

  // Which source set each field (JSON key -> source), for messages about values
  // that only a model can refuse (a layout it cannot shard, a sequence too long).
  // A field no source set is the default of its option ("defaults: --lengths[2]"):
  // a user who wrote no plan is never told about one.
  struct Origin {
    std::string source = "defaults";
    bool flags = true;
  };
  std::map<std::string, Origin> origins;
  Origin origin(const std::string& key) const {
    const auto it = origins.find(key);
    return it == origins.end() ? Origin{} : it->second;
  }
  // io::BadInput naming the source that set `key` and the field key + suffix.
  [[noreturn]] void bad(const std::string& key, const std::string& suffix, const std::string& message) const;
};

// "reference", "cuda", "nccl:tp2-ep4-cp1": the plan's canonical as it is written.
std::string canonical_name(const SweepPlan& plan);

// Applies the fields of one plan object to `plan` (later sources override earlier
// ones). `source` names the origin in messages; with `flags` a field is named as
// its command-line option ("--cp-split") instead of its JSON key ("cp_split").
// Throws io::BadInput(source, field, reason) for unknown keys, wrong types, unknown
// contracts, implementations, paths or capture modes, malformed layout names, and values
// out of range. Does not touch the file system.
void apply_plan_json(const nlohmann::json& obj, const std::string& source, bool flags, SweepPlan& plan);

// The default plan with the JSON text `json` applied (named `path` in messages;
// base_dir = path's directory). Throws only io::BadInput. The plan fuzz target's
// entry point.
SweepPlan parse_plan(std::string_view json, const std::string& path);

// Reads a plan file and applies it to `plan` (base_dir = the file's directory):
// io::BadInput, or io::IoError when unreadable.
void apply_plan_file(const std::string& path, SweepPlan& plan);

// A plan's batch for one model: its token sequences and the loss coefficients of
// its backward.
struct TokenBatch {
  std::vector<std::vector<int32_t>> seqs;
  ref::LossCoefficients coefs;
};

// The token sequences of a plan for a model with `vocab` tokens: from the file,
// or token j of sequence s = counter_hash(counter_hash(seed, s), j) mod vocab; the
// coefficients the file's "coefficients" (explicit, described by the file's path
// and sha256), else generated from coef_seed. Throws io::BadInput (a malformed
// tokens file, a token >= vocab, a sequence shorter than 2 or longer than
// max_positions, coefficients not one finite number per target, or coef_seed set
// beside a file's coefficients).
TokenBatch plan_tokens(const SweepPlan& plan, int64_t vocab, int64_t max_positions);

// The plan's tokens file resolved against base_dir, or "" when its tokens are generated.
std::string tokens_file(const SweepPlan& plan);
// That file's contents (io::BadInput where it cannot be read, or is over 64 MiB).
std::string read_tokens_text(const SweepPlan& plan);

// Field names as the user wrote them: the JSON key, or the option for flags.
std::string plan_field(const std::string& key, bool flags);

}  // namespace bp::harness
