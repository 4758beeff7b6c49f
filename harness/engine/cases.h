// The case engine: runs one (model, contract, implementation, layout, path) case and
// compares it with the canonical reference of its (model, contract) — the
// unsharded host::Model's extend forward (logprobs, entropy, captures) and its
// backward (every parameter's gradient), computed once and cached.
//
// A run's outputs are named tensors, the names a `bitparity run` dump uses:
//   logprobs.<s>  F32 [len_s − 1]  logprob of token t+1 at position t, sequence s
//   entropy.<s>   F32 [len_s − 1]  entropy of the next-token distribution
//   ops.<op>      BF16 [tokens, features]  with capture: every op's output in
//                 canonical rows (sequence by sequence), e.g. ops.layers.0.attn_out
//   grads.<name>  F32, the parameter's shape: on the extend path (the training
//                 path) with grads, dL/dW for L = Σ c_t·logprob_t, HF names
// A case compares every tensor of its run with the reference's tensor of the same
// name: logprobs and entropy always, ops with capture, grads on the extend path.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/compare/compare.h"
#include "harness/engine/models.h"
#include "harness/engine/plan.h"
#include "harness/engine/work.h"
#include "harness/report/report.h"
#include "host/model.h"
#include "reference/common/tensor_digest.h"

namespace bp::harness {

class RankSession;  // engine/nccl_implementation.h

// The case's implementation cannot run on this machine (exit code 125 when nothing ran).
class CannotTest : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The case's run failed, and the sweep can go on to the next case: what() says, on
// one line (a CSV report is read line by line), what failed and names the rank
// ("rank 1 was killed by signal 9 during the case", "rank 1 threw: ..."). The case's
// verdict is then "error" (the sweep's exit code 3, after its reports). An
// implementation throws it only where the failure is confined to the case (its
// processes are gone or have aborted their communicator); anything else it throws
// ends the sweep.
class CaseFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct NamedTensor {
  std::string name;
  std::vector<uint64_t> shape;
  CmpType type = CmpType::F32;
  std::vector<float> f32_values;  // when F32
  std::vector<bf16> bf16_values;  // when BF16
  // The values' digest (reference/common/tensor_digest.h), where one was taken: a
  // canonical's gradients when cuda cases compare with them, or a tensor left on the
  // GPU that computed it. Such an F32 tensor has no values here but `fetch`, which
  // brings them when the digests differ (docs/cli.md, gradients compared where they live).
  std::optional<TensorDigest> digest;
  std::function<std::vector<float>()> fetch;
};

// One model of the plan, resolved: its name as the plan gives it, its config, and
// the plan's token sequences for it with the loss coefficients of its backward.
struct ModelEntry {
  std::string name;
  ModelConfig config;
  std::vector<std::vector<int32_t>> tokens;
  ref::LossCoefficients coefs;
  std::vector<int64_t> verify_layers;  // the plan's verify_layers for this model, resolved (plan.h)
};

// One case: its model (the engine's entry) and contract (one of bp::contracts()),
// resolved once when the plan is expanded.
struct CaseSpec {
  const ModelEntry& model;
  const Contract& contract;
  Implementation implementation = Implementation::kReference;
  layouts::Layout layout;
  program::Path path;
  // The layer-sliced verification of the (model, contract)'s canonical result
  // (plan.h, verify_layers): the reference re-runs model.verify_layers and the head
  // from the canonical run's captured inputs. Its id ends in "verify-layers".
  bool verify = false;
};

// One case's run as a report case sees it: `prepare()` (untimed: uploads), then
// `run()`, timed into out.seconds, gives the outputs. When either throws CannotTest,
// `out` is skipped with the reason; CaseFailed, `out` gets the verdict error, the
// message and the seconds `run` ran until then; both give nullopt. Anything else
// propagates. (CaseEngine::compare's, on its own so that a test can throw what an
// implementation would.)
std::optional<std::vector<NamedTensor>> case_outputs(Case& out, const std::function<void()>& prepare,
                                                     const std::function<std::vector<NamedTensor>()>& run);

// The record of one tensor of A (`ref`) against B's of its name (`got`; null: only in
// A): its status (dtype or shape mismatch) or its metrics. A run against the
// canonical result, and bisect's two sides, compare their tensors by it.
TensorRecord compare_tensors(const NamedTensor& ref, const NamedTensor* got);
// An F32 tensor left on the GPU (got: digest and fetch) against the canonical's
// (values, and its digest where taken): equal digests give compare()'s metrics of
// equal tensors without moving a value; otherwise got's values are fetched and
// compared. Digests of unequal tensors agree only where two 64-bit sums collide.
TensorMetrics compare_left_on_gpu(const NamedTensor& ref, const NamedTensor& got);

// Sort key of a dump tensor name in execution order: ops.* in the model graph's op
// order (graph::op_position; names it does not know sort after them), then
// logprobs.*, entropy.*, grads.* (each by sequence / name).
std::pair<std::pair<int, int>, std::string> execution_order_key(const std::string& tensor, int num_layers);

// The grid's layouts that a model can run under the knobs, in grid order (cp_split
// only for cp > 1); the others, with the reason, appended to `dropped` if given.
// Why the others are missing, cause by cause: per axis the sizes the model
// refuses alone (the other axes 1), grouped by constraint ("tp 2, 4: does not
// divide num_key_value_heads 1 ...", "ep 2, 4: needs a MoE model ..."); then the
// layouts refused only in combination ("tp4-ep4-cp8: <why>"). Empty when the model
// runs every layout of the grid.
std::vector<std::string> grid_exclusions(const LayoutGrid& grid, const ModelConfig& cfg, const Knobs& kn);
std::vector<layouts::Layout> grid_layouts(const LayoutGrid& grid, const ModelConfig& cfg, const Knobs& kn,
                                          std::vector<std::string>* dropped = nullptr);

class CaseEngine {
 public:
  // Resolves the plan: loads each model's config (weights lazily), tokens, and
  // checks explicit layouts against every model and contract, and the plan's work
  // against the limits (engine/work.h; unless plan.force). Throws io::BadInput
  // naming the source that set the field (the plan file or "command line").
  // `on_weights` hears where each model's weights came from as they are loaded.
  explicit CaseEngine(SweepPlan plan, WeightsListener on_weights = {});
  ~CaseEngine();
  CaseEngine(const CaseEngine&) = delete;  // its cases point into it
  CaseEngine& operator=(const CaseEngine&) = delete;

  const SweepPlan& plan() const { return plan_; }
  // The cases in sweep order: model, contract, implementation, layout, path.
  const std::vector<CaseSpec>& cases() const { return cases_; }
  // The plan's contracts, in plan order.
  const std::vector<const Contract*>& contracts() const { return contracts_; }
  // Grid layouts dropped because a model cannot run them: "<model>: <layout>: why".
  const std::vector<std::string>& dropped_layouts() const { return dropped_; }
  std::string case_id(const CaseSpec& c) const;  // "model/contract/implementation/layout/path"
  // The work of every case and canonical reference (engine/work.h).
  const WorkEstimate& work() const { return work_; }

  // One case's outputs (throws CannotTest when its implementation cannot run here,
  // program::run_control::Cancelled when cancelled, io::BadInput with the work estimate when
  // out of memory).
  std::vector<NamedTensor> run(const CaseSpec& c);
  // Runs the case and compares it with the reference: a report case with
  // parameters (model, contract, contract_knob_hash, backend: the implementation,
  // layout, path), the seconds of its run() and the device memory it peaked at,
  // and, with capture, first_divergent_op. A CannotTest case comes back skipped, a
  // CaseFailed one with the verdict error, its message and the seconds until it
  // failed. Throws what run() throws otherwise.
  Case compare(const CaseSpec& c);
  // Conformance (engine/conform.h): the case's model and contract on the CPU
  // reference, extend path, every op captured as computed from `engine_ops` (another
  // engine's captured outputs by capture name, canonical rows) instead of from this
  // model's own earlier ops (program::ForwardOptions::substitute).
  std::vector<NamedTensor> run_substituted(const CaseSpec& c,
                                           const std::map<std::string, std::vector<bf16>>& engine_ops);
  // The model's bf16 weights as the cases run them (loaded once, kept while the
  // plan stays on this model).
  const Weights& weights(const ModelEntry& model);
  // The report case of one stopped by program::run_control::Cancelled: skipped, "interrupted".
  Case interrupted(const CaseSpec& c) const;

  // Hears a checkpoint's loading as it goes (a progress line; io::LoadOptions::progress).
  void on_load_progress(std::function<void(const io::LoadProgress&)> f) { load_progress_ = std::move(f); }

  // This process is a rank of real ranks (engine/nccl_implementation.h): its nccl
  // cases run on them. Without one, nccl cases skip (cannot test here).
  void use_rank_session(RankSession* ranks) { ranks_ = ranks; }
  // A follower rank's whole sweep: runs its part of each case rank 0 names, until
  // rank 0 is done. Returns the exit code (0, or 3 once a rank failed).
  int follow_rank_zero();

 private:
  struct Loaded;
  struct Canonical;
  Loaded& loaded(const ModelEntry& model);
  const Canonical& canonical(const ModelEntry& model, const Contract& contract);
  CaseSpec canonical_spec(const ModelEntry& model, const Contract& contract) const;  // extend, the plan's canonical
  program::ForwardOptions case_options() const;  // the plan's temperature and capture, with entropy
  // Throws CannotTest where c's implementation cannot run here (no GPU, not enough ranks).
  void refuse_if_untestable(const CaseSpec& c) const;
  void refuse_if_canonical_untestable(const CaseSpec& c) const;  // CannotTest naming the canonical
  std::vector<NamedTensor> run_case(const CaseSpec& c, const program::ForwardOptions& opt,
                                    const program::BackwardOptions& bo = {}, bool grads_stay_on_gpu = false);
  // run(c), where a cuda case's gradients may stay on the GPU (GpuCaseInput::grads_stay_on_gpu).
  std::vector<NamedTensor> run_outputs(const CaseSpec& c, bool grads_stay_on_gpu);
  Case compare_case(const CaseSpec& c);
  Case verify_case(const CaseSpec& c);
  std::vector<NamedTensor> replay_layers(const CaseSpec& c, const Canonical& canonical);
  Case case_header(const CaseSpec& c) const;  // id and parameters
  WorkEstimate estimate_work() const;

  SweepPlan plan_;
  std::vector<ModelEntry> models_;  // the plan's, in plan order (never reallocated: cases point into it)
  std::vector<const Contract*> contracts_;
  std::unique_ptr<Loaded> loaded_;        // the last model's weights, host and device (sweeps go model by model)
  std::unique_ptr<Canonical> canonical_;  // the last (model, contract) asked for
  std::vector<CaseSpec> cases_;
  std::vector<std::string> dropped_;
  WeightsListener on_weights_;
  std::function<void(const io::LoadProgress&)> load_progress_;
  WorkEstimate work_;
  // The device memory the last run() peaked at, set by a run on a device; compare()
  // clears it before each run and reports it as the case's peak_device_bytes.
  std::optional<uint64_t> last_peak_device_bytes_;
  // Likewise the ranks and NCCL traffic of the last run on real ranks.
  std::optional<int> last_ranks_;
  std::vector<CollectiveTraffic> last_communication_;
  RankSession* ranks_ = nullptr;
};

}  // namespace bp::harness
