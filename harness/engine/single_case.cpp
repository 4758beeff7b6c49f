// One case of a plan run to its outputs: what `bitparity run` dumps and each side of
// `bitparity bisect`. The case engine runs a contract's cases; the float64 truth
// model (reference/truth/qwen3.h), which has no contract, runs here.
#include "harness/engine/single_case.h"

#include "harness/engine/models.h"
#include "harness/engine/work.h"
#include "harness/io/files.h"
#include "reference/truth/qwen3.h"

namespace bp::harness {

namespace {

// The float64 truth model's run of the one case `plan` names (on `layout`), rounded
// to F32 (to nearest) so that `bitparity diff` measures a contract's distance from it.
// Records the loss coefficients in `meta`.
std::vector<NamedTensor> run_float64(const SweepPlan& plan, const layouts::Layout& layout, WeightsOrigin& origin,
                                     const WeightsListener& on_weights, std::map<std::string, std::string>& meta) {
  const SweepPlan::Origin o = plan.origin("models");
  const ModelConfig cfg = model_config(plan.models[0], plan.base_dir, o.source, plan_field("models", o.flags) + "[0]");
  if (!plan.contracts.empty() && plan.origins.count("contracts"))
    plan.bad("contracts", "", "the float64 truth has no contract");
  if (plan.paths[0].kind != program::Path::Kind::Extend)
    plan.bad("paths", "[0]", "the float64 truth has no paths: each sequence is computed whole (use extend)");
  if (plan.capture_ops) plan.bad("capture", "", "the float64 truth has no op captures");
  if (layout != layouts::Layout{}) plan.bad("layouts", "", "the float64 truth is unsharded (tp1-ep1-cp1)");
  const TokenBatch batch = plan_tokens(plan, cfg.vocab_size, cfg.max_position_embeddings);
  const auto& seqs = batch.seqs;
  meta["bitparity.coefficients"] = batch.coefs.describe();
  check_work_limits(estimate_run(cfg, seqs, plan.grads), plan.force);
  const truth::Model m = truth_model(plan.models[0], plan.base_dir, cfg, plan.weight_seed,
                                     io::LoadOptions{.allow_nonfinite = plan.allow_nonfinite_weights, .progress = {}}, origin);
  if (on_weights) on_weights(origin);
  truth::ForwardOptions opt;
  opt.temperature = plan.temperature;
  opt.entropy = true;
  const truth::ForwardResult fwd = m.forward(seqs, opt);
  std::vector<NamedTensor> out;
  auto add = [&](std::string name, const std::vector<double>& v, std::vector<uint64_t> shape) {
    NamedTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    for (double x : v) t.f32_values.push_back(static_cast<float>(x));
    out.push_back(std::move(t));
  };
  for (size_t s = 0; s < fwd.logprob.size(); ++s) add("logprobs." + std::to_string(s), fwd.logprob[s], {fwd.logprob[s].size()});
  for (size_t s = 0; s < fwd.entropy.size(); ++s) add("entropy." + std::to_string(s), fwd.entropy[s], {fwd.entropy[s].size()});
  if (plan.grads) {
    const truth::BackwardResult bwd = m.backward(seqs, batch.coefs, plan.temperature);
    for (const WeightSpec& spec : weight_specs(cfg))
      if (const auto it = bwd.grads.find(spec.name); it != bwd.grads.end())
        add("grads." + spec.name, it->second, std::vector<uint64_t>(spec.shape.begin(), spec.shape.end()));
  }
  return out;
}

// A plan of one case: every list has one element (the float64 truth model's
// contracts none). Returns the case's layout.
layouts::Layout require_one_case(const SweepPlan& p) {
  auto one = [&](const char* key, size_t n) {
    if (n != 1) p.bad(key, "", "names " + std::to_string(n) + " values; run takes one case (use sweep for more)");
  };
  const bool float64 = p.implementations[0] == Implementation::kFloat64;
  one("models", p.models.size());
  if (!float64) one("contracts", p.contracts.size());
  one("implementations", p.implementations.size());
  one("paths", p.paths.size());
  if (p.layouts.empty()) {
    const size_t n = p.grid.tp.size() * p.grid.ep.size() * p.grid.cp.size() * p.grid.cp_split.size();
    one("tp", n);
  } else {
    one("layouts", p.layouts.size());
  }
  const layouts::Layout l = p.layouts.empty() ? layouts::Layout{p.grid.tp[0], p.grid.ep[0], p.grid.cp[0], p.grid.cp_split[0]}
                                              : p.layouts[0];
  if (p.implementations[0] == Implementation::kNccl)
    p.bad("implementations", "", "nccl, real ranks over NCCL, runs in `bitparity sweep` (which starts the ranks); "
                                 "run the layout with --implementation cuda (virtual ranks) here");
  if (p.implementations[0] == Implementation::kReference && l != layouts::Layout{})
    p.bad("layouts", "", "the reference implementation is unsharded; run layout " + l.name() +
                             " with --implementation emulated");
  return l;
}

// The dump's record of its tokens: "seed S lengths a,b,...", or a tokens file's JSON
// itself (a file named by its path may be gone or changed by the time a dump is read:
// conform runs the tokens the dump records), its path beside it. The plan holds the
// text run_single_case read once, which the run plans from too.
void record_tokens(const SweepPlan& plan, std::map<std::string, std::string>& m) {
  const TokenSpec& t = plan.tokens;
  if (!t.file.empty()) {
    m["bitparity.tokens"] = t.text;
    m["bitparity.tokens_file"] = tokens_file(plan);
    return;
  }
  std::string s = "seed " + std::to_string(t.seed) + " lengths ";
  for (size_t i = 0; i < t.lengths.size(); ++i) s += (i ? "," : "") + std::to_string(t.lengths[i]);
  m["bitparity.tokens"] = s;
}

// The dump's record of where the weights came from: the seed only when one made them.
void record_weights(const WeightsOrigin& o, std::map<std::string, std::string>& m) {
  m["bitparity.weights"] = weights_text(o, true);
  if (o.seed) m["bitparity.weight_seed"] = std::to_string(*o.seed);
}

}  // namespace

SweepPlan single_case_defaults() {
  SweepPlan p;
  p.models = {"qwen3-dense-tiny"};
  p.contracts = {default_contract_names().front()};
  p.implementations = {Implementation::kReference};
  p.layouts = {layouts::Layout{}};
  p.paths = {program::Path::extend()};
  p.allow_float64 = true;
  return p;
}

SingleRun run_single_case(const SweepPlan& given, const WeightsListener& on_weights) {
  SweepPlan plan = given;
  if (!plan.tokens.file.empty() && plan.tokens.text.empty()) plan.tokens.text = read_tokens_text(plan);
  const layouts::Layout layout = require_one_case(plan);
  SingleRun r;
  std::map<std::string, std::string>& m = r.metadata;
  m = {{"bitparity.model", plan.models[0]},
       {"bitparity.implementation", implementation_name(plan.implementations[0])},
       {"bitparity.path", path_name(plan.paths[0])},
       {"bitparity.temperature", std::to_string(plan.temperature)},
       {"bitparity.capture", plan.capture_ops ? "ops" : "none"}};
  record_tokens(plan, m);
  WeightsOrigin origin;
  if (plan.implementations[0] == Implementation::kFloat64) {
    r.tensors = run_float64(plan, layout, origin, on_weights, m);
    record_weights(origin, m);
    m["bitparity.layout"] = layout.name();
    m["bitparity.note"] = "float64 truth rounded to F32 (nearest)";
    r.id = plan.models[0] + "/" + implementation_name(Implementation::kFloat64);
    r.num_layers = static_cast<int>(model_config(plan.models[0], plan.base_dir, "", "").num_hidden_layers);
    return r;
  }
  CaseEngine engine(plan, [&](const WeightsOrigin& o) {
    origin = o;
    if (on_weights) on_weights(o);
  });
  const CaseSpec& c = engine.cases().at(0);
  m["bitparity.layout"] = c.layout.name();
  m["bitparity.contract"] = c.contract.name;
  m["bitparity.contract_knob_hash"] = c.contract.knob_hash();
  m["bitparity.coefficients"] = c.model.coefs.describe();
  r.id = engine.case_id(c);
  r.num_layers = static_cast<int>(c.model.config.num_hidden_layers);
  r.tensors = engine.run(c);
  record_weights(origin, m);
  return r;
}

}  // namespace bp::harness
