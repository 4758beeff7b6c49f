// What the subcommands share: the plan options and the error-to-exit-code maps.
#include "harness/cli/common.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <new>

#include "harness/engine/cases.h"
#include "harness/engine/models.h"
#include "harness/exit_codes.h"
#include "harness/io/errors.h"
#include "harness/io/files.h"

namespace bp::harness {

using nlohmann::json;

namespace {

// CLI11 reads "-1" into a uint64_t as 2^64 - 1 (strtoull's rule); a seed on the command
// line is what a plan file's must be, an integer in [0, 2^64 - 1].
const CLI::Validator kSeed(
    [](std::string& s) -> std::string {
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc() || end != s.data() + s.size())
        return "must be an integer in [0, 18446744073709551615], got " + io::quoted_input(s);
      return "";
    },
    "UINT64");

// CLI11 reads "nan", "inf" and "1e400" into a double as NaN or infinity, which the plan
// could then only quote as JSON's null: say what was given. (The range is the plan's.)
const CLI::Validator kFiniteNumber(
    [](std::string& s) -> std::string {
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (s.empty() || *end || !std::isfinite(v)) return io::quoted_input(s) + " is not a finite number";
      return "";
    },
    "NUMBER");

}  // namespace

void PlanFlags::add_to(CLI::App* app, bool canonical) {
  app->add_option("--plan", plan_file_, "JSON plan file (docs/cli.md \"Plan files\"); the flags below override its fields");
  remember(app->add_option("--model", models_,
                           "fixture name or Hugging Face checkpoint directory (with a '/': config.json, and model.safetensors "
                           "or its index and shards; a directory with other weight files is refused); repeatable"),
           [this](json& j) { j["models"] = models_; });
  remember(app->add_option("--contract", contracts_, "contract name(s), comma-separated")->delimiter(','),
           [this](json& j) { j["contracts"] = contracts_; });
  remember(app->add_option("--implementation,--backend", implementations_,
                           "what computes the cases: reference, emulated, cuda, nccl (comma-separated); run also float64, the "
                           "float64 truth model; --backend is its old name")
               ->delimiter(','),
           [this](json& j) { j["implementations"] = implementations_; });
  remember(app->add_option("--layout", layouts_, "layout name(s) like tp2-ep1-cp2z, tp2-ep1-cp1+ring (comma-separated)")
               ->delimiter(','),
           [this](json& j) { j["layouts"] = layouts_; });
  remember(app->add_option("--tp", tp_, "grid: tensor-parallel sizes, e.g. 1,2,4")->delimiter(','),
           [this](json& j) { j["tp"] = tp_; });
  remember(app->add_option("--ep", ep_, "grid: expert-parallel sizes")->delimiter(','), [this](json& j) { j["ep"] = ep_; });
  remember(app->add_option("--cp", cp_, "grid: context-parallel sizes")->delimiter(','), [this](json& j) { j["cp"] = cp_; });
  remember(app->add_option("--cp-split", cp_split_, "grid: contiguous, zigzag")->delimiter(','),
           [this](json& j) { j["cp_split"] = cp_split_; });
  remember(app->add_option("--path", paths_, "extend, chunked:<n>[,<n>...], decode, ragged; repeatable"),
           [this](json& j) { j["paths"] = paths_; });
  remember(app->add_option("--seed", seed_, "token seed (random sequences of --lengths)")->check(kSeed),
           [this](json& j) { j["tokens"]["seed"] = seed_; });
  remember(app->add_option("--lengths", lengths_, "sequence lengths, e.g. 9,17,24")->delimiter(','),
           [this](json& j) { j["tokens"]["lengths"] = lengths_; });
  remember(app->add_option("--tokens", tokens_file_, "tokens file {\"sequences\": [[...], ...]}"),
           [this](json& j) { j["tokens"]["file"] = tokens_file_; });
  remember(app->add_option("--weight-seed", weight_seed_,
                           "seed of generated weights (fixtures, and model directories with no weight file)")
               ->check(kSeed),
           [this](json& j) { j["weight_seed"] = weight_seed_; });
  remember(app->add_option("--coef-seed", coef_seed_, "seed of the loss coefficients c_t")->check(kSeed),
           [this](json& j) { j["coef_seed"] = coef_seed_; });
  remember(app->add_option("--temperature", temperature_, "logprob temperature, in [1e-30, 1e30]")->check(kFiniteNumber),
           [this](json& j) { j["temperature"] = temperature_; });
  remember(app->add_flag("--no-grads", no_grads_, "skip the backward (parameter gradients)"),
           [this](json& j) { j["grads"] = !no_grads_; });
  remember(app->add_option("--capture", capture_, "none, or ops: also every op's output"),
           [this](json& j) { j["capture"] = capture_; });
  if (canonical) add_canonical_to(app);
  remember(app->add_flag("--allow-nonfinite-weights", allow_nonfinite_weights_,
                         "load a checkpoint's NaN or Inf weights (or F32 values beyond bf16's range) instead of refusing "
                         "them: for deliberate tests of NaN handling"),
           [this](json& j) { j["allow_nonfinite_weights"] = allow_nonfinite_weights_; });
  app->add_flag("--force", force_,
                "run a plan beyond the work limits (docs/cli.md \"Work limits\": about 2 hours of CPU reference time, "
                "the machine's physical memory)");
}

void PlanFlags::add_canonical_to(CLI::App* app) {
  remember(app->add_option("--canonical", canonical_,
                           "what every case is compared with: reference (the unsharded CPU reference model, the "
                           "default), cuda (the unsharded GPU model, equal to it bit for bit where both run; for models "
                           "too large for the CPU), or <implementation>:<layout> (cuda, emulated or nccl; e.g. "
                           "nccl:tp2-ep4-cp1, for models too large for one GPU)"),
           [this](json& j) { j["canonical"] = canonical_; });
  remember(app->add_option("--verify-layers", verify_layers_,
                           "layer-sliced verification of the canonical result: the CPU reference re-runs these layers and "
                           "the head from the canonical run's captured inputs and compares every op: all, a number N "
                           "(spread evenly, first and last included) or indices i,j,... (default under --canonical cuda: "
                           "all for models of up to 4 layers, else 3)"),
           [this](json& j) { j["verify_layers"] = verify_layers_; });
}

// Each option remembers how to put itself into the plan JSON when given.
CLI::Option* PlanFlags::remember(CLI::Option* o, std::function<void(json&)> put) {
  options_.emplace_back(o, std::move(put));
  return o;
}

json PlanFlags::given() const {
  json j = json::object();
  for (const auto& [opt, put] : options_)
    if (opt->count()) put(j);
  return j;
}

SweepPlan PlanFlags::plan(SweepPlan base) const {
  if (!plan_file_.empty()) apply_plan_file(plan_file_, base);
  apply_plan_json(given(), "command line", true, base);
  base.force = force_;
  return base;
}

int nonfinite_exit(const char* cmd, const Report& r, bool strict, std::FILE* err) {
  size_t shown = 0;
  for (const Case& c : r.cases)
    if (c.verdict == Verdict::kNonFinite && shown++ < 10)
      std::fprintf(err, "bitparity %s: %s: %s: %s\n", cmd, strict ? "error" : "warning", c.id.c_str(),
                   nonfinite_text(*c.first_nonfinite()).c_str());
  if (shown > 10) std::fprintf(err, "bitparity %s: ... and %zu more non-finite cases\n", cmd, shown - 10);
  return strict ? kExitMismatch : kExitExact;
}

std::vector<std::string> PlanFlags::input_files(const SweepPlan& plan) const {
  std::vector<std::string> files;
  if (!plan_file_.empty()) files.push_back(plan_file_);
  if (const std::string tokens = tokens_file(plan); !tokens.empty()) files.push_back(tokens);
  for (const std::string& m : plan.models)
    for (std::string& f : model_files(m, plan.base_dir)) files.push_back(std::move(f));
  return files;
}

std::FILE* text_stream(const std::vector<std::string>& outputs) {
  for (const std::string& o : outputs)
    if (!o.empty() && io::same_file(o, "-")) return stderr;
  return stdout;
}

WeightsListener WeightsLog::listener() {
  return [this](const WeightsOrigin& o) {
    const std::string text = weights_text(o, true);
    for (const WeightsOrigin& seen : origins_)
      if (seen.model == o.model && weights_text(seen, true) == text) return;  // said already
    origins_.push_back(o);
    if (!quiet_) std::fprintf(stderr, "bitparity %s: %s: %s\n", cmd_, o.model.c_str(), weights_text(o, false).c_str());
  };
}

namespace {
std::vector<std::string>& args_store() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void remember_program_args(int argc, char** argv) { args_store().assign(argv + 1, argv + argc); }
const std::vector<std::string>& program_args() { return args_store(); }

int exit_for_error(const char* cmd, std::FILE* err) {
  try {
    throw;
  } catch (const io::BadInput& e) {
    std::fprintf(err, "bitparity %s: bad input: %s\n", cmd, e.what());
    return kExitBadInput;
  } catch (const io::IoError& e) {
    std::fprintf(err, "bitparity %s: cannot read or write: %s\n", cmd, e.what());
    return kExitBadInput;
  } catch (const CannotTest& e) {
    std::fprintf(err, "bitparity %s: cannot test here: %s\n", cmd, e.what());
    return kExitCannotTest;
  } catch (const std::bad_alloc&) {  // the plan's size is the user's to choose
    std::fprintf(err, "bitparity %s: bad input: out of memory: the plan needs more memory than this process can get "
                 "(docs/cli.md \"Work limits\")\n", cmd);
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(err, "bitparity %s: internal error: %s\n", cmd, e.what());
    return kExitInternal;
  }
}

int exit_for_read_error(const char* cmd, std::FILE* err) {
  try {
    throw;
  } catch (const io::BadInput& e) {
    std::fprintf(err, "bitparity %s: bad input: %s\n", cmd, e.what());
  } catch (const io::IoError& e) {
    std::fprintf(err, "bitparity %s: cannot read: %s\n", cmd, e.what());
  }
  return kExitBadInput;
}

Subcommand guarded_subcommand(CLI::App* sub, std::function<int()> body) {
  return {sub, [name = sub->get_name(), body = std::move(body)] {
            try {
              return body();
            } catch (...) {
              return exit_for_error(name.c_str(), stderr);
            }
          }};
}

}  // namespace bp::harness
