#include "harness/engine/cases.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <map>
#include <new>
#include <set>

#include "harness/engine/cuda_implementation.h"
#include "harness/engine/models.h"
#include "harness/engine/nccl_implementation.h"
#include "harness/exit_codes.h"
#include "harness/io/errors.h"
#include "host/layouts.h"
#include "program/layouts/emulated.h"
#include "reference/model/model_graph.h"

namespace bp::harness {

std::pair<std::pair<int, int>, std::string> execution_order_key(const std::string& tensor, int num_layers) {
  const int after = num_layers + 1;  // past every op
  auto starts = [&](std::string_view p) { return tensor.rfind(p, 0) == 0; };
  if (starts("ops.")) {
    const auto pos = graph::op_position(tensor.substr(4), num_layers);
    return pos ? std::make_pair(std::make_pair(pos->layer, pos->index), std::string())
               : std::make_pair(std::make_pair(after, 0), tensor);
  }
  // Per-sequence outputs sort by sequence number, not as text ("logprobs.10" after ".9").
  auto seq_key = [&](size_t prefix) {
    const std::string n = tensor.substr(prefix);
    return std::string(12 - std::min<size_t>(n.size(), 12), '0') + n;
  };
  if (starts("logprobs.")) return {{after, 1}, seq_key(9)};
  if (starts("entropy.")) return {{after, 2}, seq_key(8)};
  if (starts("grads.")) return {{after, 3}, tensor};
  return {{after, 4}, tensor};
}

std::vector<layouts::Layout> grid_layouts(const LayoutGrid& grid, const ModelConfig& cfg, const Knobs& kn,
                                          std::vector<std::string>* dropped) {
  std::vector<layouts::Layout> r;
  for (int tp : grid.tp)
    for (int ep : grid.ep)
      for (int cp : grid.cp)
        for (layouts::CpSplit split : grid.cp_split) {
          if (cp == 1 && split != grid.cp_split.front()) continue;  // one way to cut a whole sequence
          const layouts::Layout l{tp, ep, cp, cp == 1 ? layouts::CpSplit::Contiguous : split};
          if (const std::string why = layouts::shard_check(l, cfg, kn); why.empty())
            r.push_back(l);
          else if (dropped)
            dropped->push_back(l.name() + ": " + why);
        }
  return r;
}

std::vector<std::string> grid_exclusions(const LayoutGrid& grid, const ModelConfig& cfg, const Knobs& kn) {
  // The unsharded layout runs every model (shard_check refuses sizes only for
  // ranks > 1), so every cause belongs to an axis.
  std::vector<std::string> out;
  // One axis at a time: its refused sizes grouped by the constraint, which the
  // reason names after "<axis> <n> " (shard_check's wording).
  const std::pair<const char*, const std::vector<int>*> axes[] = {{"tp", &grid.tp}, {"ep", &grid.ep}, {"cp", &grid.cp}};
  for (int a = 0; a < 3; ++a) {
    std::vector<std::pair<std::string, std::string>> groups;  // constraint, sizes
    for (int n : *axes[a].second) {
      layouts::Layout l;
      (a == 0 ? l.tp : a == 1 ? l.ep : l.cp) = n;
      std::string why = layouts::shard_check(l, cfg, kn);
      if (why.empty()) continue;
      const std::string own = std::string(axes[a].first) + " " + std::to_string(n) + " ";
      if (why.rfind(own, 0) == 0) why = why.substr(own.size());
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == why; });
      if (it == groups.end()) it = groups.insert(groups.end(), {why, ""});
      it->second += (it->second.empty() ? "" : ", ") + std::to_string(n);
    }
    for (const auto& [why, sizes] : groups) out.push_back(std::string(axes[a].first) + " " + sizes + ": " + why);
  }
  // Layouts whose every size runs alone but not together (e.g. too many ranks); the
  // cp split changes no constraint.
  auto ok = [&](int tp, int ep, int cp) { return layouts::shard_check({tp, ep, cp}, cfg, kn).empty(); };
  size_t combined = 0;
  for (int tp : grid.tp)
    for (int ep : grid.ep)
      for (int cp : grid.cp) {
        if (!ok(tp, 1, 1) || !ok(1, ep, 1) || !ok(1, 1, cp) || ok(tp, ep, cp)) continue;
        const layouts::Layout l{tp, ep, cp};
        if (combined++ < 3) out.push_back(l.name() + ": " + layouts::shard_check(l, cfg, kn));
      }
  if (combined > 3) out.push_back("and " + std::to_string(combined - 3) + " more layouts refused in combination");
  return out;
}

namespace {

// f(), a std::bad_alloc turned into bad input that says what the plan needs.
template <class F>
auto within_memory(const WorkEstimate& w, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    throw_out_of_memory(w);
  }
}

// The grid axis to blame when no layout of the grid can run a model: the first whose
// every size the model refuses on its own (the other axes 1), else the first axis a
// source of the plan set.
std::string impossible_axis(const SweepPlan& plan, const ModelConfig& cfg, const Knobs& kn) {
  const LayoutGrid& g = plan.grid;
  auto refuses_all = [&](const std::vector<int>& sizes, int axis) {
    return std::all_of(sizes.begin(), sizes.end(), [&](int n) {
      layouts::Layout l;
      (axis == 0 ? l.tp : axis == 1 ? l.ep : l.cp) = n;
      return !layouts::shard_check(l, cfg, kn).empty();
    });
  };
  const std::pair<const char*, const std::vector<int>*> axes[] = {{"tp", &g.tp}, {"ep", &g.ep}, {"cp", &g.cp}};
  for (int a = 0; a < 3; ++a)
    if (refuses_all(*axes[a].second, a)) return axes[a].first;
  for (const char* key : {"tp", "ep", "cp", "cp_split"})
    if (plan.origins.count(key)) return key;
  return "tp";
}

}  // namespace

// --- the engine -------------------------------------------------------------------

struct CaseEngine::Loaded {
  const ModelEntry* model = nullptr;
  Weights weights;
  std::map<const Contract*, std::unique_ptr<host::Model>> by_contract;
  GpuRunner gpu;  // with its device copy of these weights, one contract at a time
  const host::Model& model_for(const Contract& contract) {
    auto& m = by_contract[&contract];
    if (!m) m = std::make_unique<host::Model>(model->config, weights, contract.knobs);
    return *m;
  }
  GpuModelSource gpu_source(const Contract& contract) const { return {*model, contract, weights}; }
};

struct CaseEngine::Canonical {
  const ModelEntry* model = nullptr;
  const Contract* contract = nullptr;
  std::vector<NamedTensor> tensors;  // what the cases compare with
  // The op captures layer-sliced verification reads, where the cases compare none.
  std::vector<NamedTensor> layer_captures;
  std::map<std::string, const NamedTensor*> by_name;  // both lists, made once they are final
  const NamedTensor* find(const std::string& name) const {
    const auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  }
};

TensorMetrics compare_left_on_gpu(const NamedTensor& ref, const NamedTensor& got) {
  if (ref.type != CmpType::F32 || !got.digest) throw std::logic_error("compare_left_on_gpu: F32 with a digest only");
  if (ref.digest == got.digest)
    return equal_metrics(CmpType::F32, ref.f32_values.size(), ref.shape, got.digest->nans, got.digest->infs);
  const std::vector<float> values = got.fetch();
  return harness::compare(std::span<const float>(ref.f32_values), std::span<const float>(values), ref.shape);
}

TensorRecord compare_tensors(const NamedTensor& ref, const NamedTensor* got) {
  TensorRecord rec;
  rec.name = ref.name;
  rec.dtype_a = cmp_type_name(ref.type);
  rec.shape_a = ref.shape;
  rec.is_logprob = ref.name.rfind("logprobs.", 0) == 0;
  if (!got) {
    rec.status = TensorStatus::kOnlyInA;
    return rec;
  }
  rec.dtype_b = cmp_type_name(got->type);
  rec.shape_b = got->shape;
  if (got->type != ref.type) {
    rec.status = TensorStatus::kDtypeMismatch;
  } else if (got->shape != ref.shape) {
    rec.status = TensorStatus::kShapeMismatch;
  } else if (got->fetch) {
    rec.metrics = compare_left_on_gpu(ref, *got);
  } else {
    rec.metrics = ref.type == CmpType::F32 ? harness::compare(std::span<const float>(ref.f32_values),
                                                              std::span<const float>(got->f32_values), ref.shape)
                                           : harness::compare(std::span<const bf16>(ref.bf16_values),
                                                              std::span<const bf16>(got->bf16_values), ref.shape);
  }
  if (rec.metrics) rec.metrics->is_logprob = rec.is_logprob;
  return rec;
}

namespace {

NamedTensor f32_tensor(std::string name, std::vector<float> v, std::vector<uint64_t> shape) {
  NamedTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.type = CmpType::F32;
  t.f32_values = std::move(v);
  return t;
}

// The named tensors of one run (see cases.h), in report order; a gradient the GPU
// kept (gpu_grads) by its digest and fetch.
std::vector<NamedTensor> to_tensors(const ModelConfig& cfg, program::ForwardResult&& fwd, program::BackwardResult* bwd,
                                    std::map<std::string, GpuTensor>&& gpu_grads = {}) {
  std::vector<NamedTensor> out;
  auto per_sequence = [&](const std::string& prefix, std::vector<std::vector<float>>& rows) {
    for (size_t s = 0; s < rows.size(); ++s) {
      const uint64_t n = rows[s].size();
      out.push_back(f32_tensor(prefix + std::to_string(s), std::move(rows[s]), {n}));
    }
  };
  auto captured = [&](const std::string& prefix, std::vector<program::Capture>& caps) {
    for (program::Capture& c : caps) {
      NamedTensor t;
      t.name = prefix + c.name;
      for (int64_t d : c.shape) t.shape.push_back(static_cast<uint64_t>(d));
      t.type = CmpType::BF16;
      t.bf16_values = std::move(c.bf16_data);
      out.push_back(std::move(t));
    }
  };
  per_sequence("logprobs.", fwd.logprob);
  per_sequence("entropy.", fwd.entropy);
  captured("ops.", fwd.captures);
  if (!bwd) return out;
  captured("", bwd->captures);  // resid_grad.<i>: not ops of the forward
  for (const WeightSpec& spec : weight_specs(cfg)) {
    std::vector<uint64_t> shape(spec.shape.begin(), spec.shape.end());
    if (auto kept = gpu_grads.find(spec.name); kept != gpu_grads.end()) {
      NamedTensor t = f32_tensor("grads." + spec.name, {}, std::move(shape));
      t.digest = kept->second.digest;
      t.fetch = std::move(kept->second.fetch);
      out.push_back(std::move(t));
      continue;
    }
    auto it = bwd->grads.find(spec.name);
    if (it == bwd->grads.end()) continue;  // lm_head when tied; a replay's layers not replayed
    out.push_back(f32_tensor("grads." + spec.name, std::move(it->second), std::move(shape)));
  }
  return out;
}


// Each expected tensor against the output of its name (none: only in the canonical
// result), then what the run produced that the canonical result has not (an
// implementation's bug); the first divergent op; the verdict.
void compare_outputs(const std::vector<const NamedTensor*>& expected, const std::vector<NamedTensor>& got, Case& out) {
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : got) by_name.emplace(t.name, &t);
  for (const NamedTensor* r : expected) {
    const auto it = by_name.find(r->name);
    out.tensors.push_back(compare_tensors(*r, it == by_name.end() ? nullptr : it->second));
    if (it != by_name.end()) by_name.erase(it);
  }
  for (const NamedTensor& t : got)
    if (by_name.count(t.name)) {
      TensorRecord rec;
      rec.name = t.name;
      rec.status = TensorStatus::kOnlyInB;
      rec.dtype_b = cmp_type_name(t.type);
      rec.shape_b = t.shape;
      out.tensors.push_back(std::move(rec));
    }
  for (const TensorRecord& t : out.tensors)
    if (!t.matches() && t.name.rfind("ops.", 0) == 0) {
      out.first_divergent_op = t.name.substr(4);
      break;
    }
  out.settle();
}

// A negative control (+ring, +nccl-bf16sum) is there to differ from the contract.
// Whether its reduction order shows in the bits depends on the input (two TP
// partials add alike in either order; few tokens leave few sums whose order can
// show), so one that came out bit-identical proves nothing: its case is no pass but
// skipped, its tensors kept, saying why.
void skip_control_that_did_not_differ(const layouts::Layout& layout, Case& out) {
  if (layout.reduction == layouts::Reduction::Tree || out.verdict != Verdict::kExact) return;
  const std::string name = layout.name();
  out.verdict = Verdict::kSkipped;
  out.skip_reason = "the negative control " + name.substr(name.find('+')) +
                    " came out bit-identical to the contract on this input, so it shows nothing here: lengthen the "
                    "sequences or raise tp (docs/layouts.md \"Negative controls\")";
}

}  // namespace

CaseEngine::CaseEngine(SweepPlan plan, WeightsListener on_weights)
    : plan_(std::move(plan)), on_weights_(std::move(on_weights)) {
  for (const std::string& name : plan_.contracts) {
    const Contract* c = find_contract(name);
    if (!c) throw std::logic_error("unknown contract " + name);  // the plan parser checked it
    contracts_.push_back(c);
  }
  models_.reserve(plan_.models.size());
  for (size_t m = 0; m < plan_.models.size(); ++m) {
    const SweepPlan::Origin o = plan_.origin("models");
    const std::string field = plan_field("models", o.flags) + "[" + std::to_string(m) + "]";
    const ModelConfig cfg = harness::model_config(plan_.models[m], plan_.base_dir, o.source, field);
    TokenBatch batch = plan_tokens(plan_, cfg.vocab_size, cfg.max_position_embeddings);
    std::string why;
    // The replay reads the canonical run's layer inputs and, from its backward, each
    // layer's input gradient: only the unsharded reference and GPU models capture
    // them (emulated or nccl ranks capture no resid_grad, even on tp1-ep1-cp1).
    const bool replayable_canonical =
        plan_.canonical_layout == layouts::Layout{} &&
        (plan_.canonical == Implementation::kReference || plan_.canonical == Implementation::kCuda);
    if (!replayable_canonical && !plan_.verify_layers.empty())
      plan_.bad("verify_layers", "",
                "layer-sliced verification replays the unsharded model's layers from the canonical run's captures: it "
                "needs an unsharded canonical (reference or cuda), not " + canonical_name(plan_));
    const auto verify = replayable_canonical
                            ? verify_layer_list(plan_.verify_layers, cfg.num_hidden_layers, plan_.canonical, &why)
                            : std::optional<std::vector<int64_t>>(std::vector<int64_t>{});
    if (!verify) plan_.bad("verify_layers", "", "model " + plan_.models[m] + ": " + why);
    const ModelEntry& model = models_.emplace_back(
        ModelEntry{plan_.models[m], cfg, std::move(batch.seqs), std::move(batch.coefs), *verify});
    // A layout the model cannot run names the field that chose it, or the model
    // when no source did (the defaults, which the user never wrote).
    auto refuse = [&](const std::string& key, const std::string& suffix, const std::string& message) {
      if (plan_.origins.count(key)) plan_.bad(key, suffix, message);
      plan_.bad("models", "[" + std::to_string(m) + "]", message);
    };

    for (const Contract* contract : contracts_) {
      const Knobs& kn = contract->knobs;
      // (The unsharded canonical's limits are the model's own, told where it is refused.)
      if (const std::string w = layouts::shard_check(plan_.canonical_layout, cfg, kn);
          !w.empty() && !(plan_.canonical_layout == layouts::Layout{}))
        plan_.bad("canonical", "",
                  "model " + model.name + " cannot run the canonical layout " + plan_.canonical_layout.name() + ": " + w);
      // The sharded implementations' layouts for this model and contract.
      std::vector<layouts::Layout> sharded;
      std::vector<std::string> dropped;  // the grid's layouts the model cannot run, with the reason
      if (!plan_.layouts.empty()) {
        for (size_t i = 0; i < plan_.layouts.size(); ++i) {
          if (plan_.layouts[i].reduction == layouts::Reduction::NcclBf16Sum &&
              !std::count(plan_.implementations.begin(), plan_.implementations.end(), Implementation::kNccl))
            plan_.bad("layouts", "[" + std::to_string(i) + "]",
                      "layout " + plan_.layouts[i].name() +
                          " reduces with NCCL's own all-reduce: it runs with implementation nccl only");
          const std::string why = layouts::shard_check(plan_.layouts[i], cfg, kn);
          if (!why.empty())
            refuse("layouts", "[" + std::to_string(i) + "]",
                   "model " + model.name + " cannot run layout " + plan_.layouts[i].name() + ": " + why);
        }
        sharded = plan_.layouts;
      } else {
        sharded = grid_layouts(plan_.grid, cfg, kn, &dropped);
        if (contract == contracts_.front())
          for (const std::string& d : dropped) dropped_.push_back(model.name + ": " + d);
      }
      const bool needs_layouts =
          std::any_of(plan_.implementations.begin(), plan_.implementations.end(),
                      [](Implementation i) { return i != Implementation::kReference; });
      if (sharded.empty() && needs_layouts) {
        std::string why;
        for (const std::string& e : grid_exclusions(plan_.grid, cfg, kn)) why += (why.empty() ? "" : "; ") + e;
        refuse(impossible_axis(plan_, cfg, kn), "",
               "no layout of the grid can run model " + model.name + " under " + contract->name + ": " + why);
      }
      for (Implementation i : plan_.implementations) {
        const std::vector<layouts::Layout> ls =
            i == Implementation::kReference ? std::vector<layouts::Layout>{layouts::Layout{}} : sharded;
        for (const layouts::Layout& l : ls) {
          // NCCL's own all-reduce needs NCCL: the control is real ranks' only.
          if (l.reduction == layouts::Reduction::NcclBf16Sum && i != Implementation::kNccl) continue;
          for (const program::Path& p : plan_.paths) cases_.push_back({model, *contract, i, l, p});
        }
      }
      if (!model.verify_layers.empty())
        cases_.push_back({model, *contract, Implementation::kReference, layouts::Layout{}, program::Path::extend(), true});
    }
  }
  work_ = estimate_work();
  check_work_limits(work_, plan_.force);
}

CaseEngine::~CaseEngine() = default;

WorkEstimate CaseEngine::estimate_work() const {
  WorkEstimate w;
  const ModelEntry* model = nullptr;
  const Contract* contract = nullptr;
  for (const CaseSpec& c : cases_) {
    if (&c.model != model || &c.contract != contract) {  // its canonical reference: extend, with the backward
      model = &c.model;
      contract = &c.contract;
      if (plan_.canonical == Implementation::kReference || plan_.canonical == Implementation::kEmulated)
        w = combined(w, estimate_run(c.model.config, c.model.tokens, plan_.grads));
    }
    const bool backward = plan_.grads && c.path.kind == program::Path::Kind::Extend;
    WorkEstimate run = estimate_run(c.model.config, c.model.tokens, backward);
    // A verification runs its layers and the head: roughly that share of a forward.
    if (c.verify)
      run.flops *= static_cast<double>(c.model.verify_layers.size() + 1) /
                   static_cast<double>(c.model.config.num_hidden_layers + 1);
    // The limit is on CPU time: a GPU case's arithmetic is not (its host memory is).
    if (c.implementation == Implementation::kCuda || c.implementation == Implementation::kNccl) run.flops = 0;
    w = combined(w, run);
  }
  return w;
}

CaseSpec CaseEngine::canonical_spec(const ModelEntry& model, const Contract& contract) const {
  return {model, contract, plan_.canonical, plan_.canonical_layout, program::Path::extend()};
}

std::string CaseEngine::case_id(const CaseSpec& c) const {
  if (c.verify) return c.model.name + "/" + c.contract.name + "/verify-layers";
  return c.model.name + "/" + c.contract.name + "/" + implementation_name(c.implementation) + "/" + c.layout.name() + "/" +
         path_name(c.path);
}

CaseEngine::Loaded& CaseEngine::loaded(const ModelEntry& model) {
  if (!loaded_ || loaded_->model != &model) {
    loaded_.reset();  // free the previous model's weights first
    auto l = std::make_unique<Loaded>();
    l->model = &model;
    WeightsOrigin origin;
    l->weights = model_weights(model.name, plan_.base_dir, model.config, plan_.weight_seed,
                               io::LoadOptions{plan_.allow_nonfinite_weights, load_progress_}, origin);
    if (on_weights_) on_weights_(origin);
    loaded_ = std::move(l);
  }
  return *loaded_;
}

const Weights& CaseEngine::weights(const ModelEntry& model) { return loaded(model).weights; }

program::ForwardOptions CaseEngine::case_options() const {
  program::ForwardOptions opt;
  opt.temperature = plan_.temperature;
  opt.entropy = true;
  opt.capture = plan_.capture_ops;
  return opt;
}

std::vector<NamedTensor> CaseEngine::run(const CaseSpec& c) { return run_outputs(c, false); }

std::vector<NamedTensor> CaseEngine::run_outputs(const CaseSpec& c, bool grads_stay_on_gpu) {
  refuse_if_untestable(c);
  return within_memory(work_, [&] { return run_case(c, case_options(), {}, grads_stay_on_gpu); });
}

std::vector<NamedTensor> CaseEngine::run_substituted(const CaseSpec& c,
                                                     const std::map<std::string, std::vector<bf16>>& engine_ops) {
  program::ForwardOptions opt = case_options();
  opt.capture = true;
  opt.substitute = &engine_ops;
  const host::Model& m = loaded(c.model).model_for(c.contract);
  return within_memory(work_, [&] {
    return to_tensors(c.model.config, m.forward(c.model.tokens, program::Path::extend(), opt), nullptr);
  });
}

void CaseEngine::refuse_if_untestable(const CaseSpec& c) const {
  if (c.implementation == Implementation::kCuda)
    if (const auto why = cuda_unavailable_reason()) throw CannotTest(*why);
  if (c.implementation != Implementation::kCuda && c.implementation != Implementation::kNccl) return;
  if (c.implementation == Implementation::kNccl) {
    if (!ranks_) throw CannotTest(nccl_unavailable_reason().value_or("this process is not one of the ranks"));
    if (c.layout.world() > ranks_->world())
      throw CannotTest("layout " + c.layout.name() + " needs " + std::to_string(c.layout.world()) +
                       " GPUs; this run has " + std::to_string(ranks_->world()) + " ranks (one per GPU)");
  }
  if (const auto why = cuda_model_problem(c.model.config)) throw CannotTest(*why);
}

std::vector<NamedTensor> CaseEngine::run_case(const CaseSpec& c, const program::ForwardOptions& opt,
                                              const program::BackwardOptions& bo, bool grads_stay_on_gpu) {
  const ModelConfig& cfg = c.model.config;
  const auto& seqs = c.model.tokens;
  Loaded& l = loaded(c.model);
  const Knobs& kn = c.contract.knobs;
  const bool grads = plan_.grads && c.path.kind == program::Path::Kind::Extend;
  program::ForwardResult fwd;
  std::optional<program::BackwardResult> bwd;
  std::map<std::string, GpuTensor> gpu_grads;
  switch (c.implementation) {
    case Implementation::kCuda: {
      GpuCaseResult r = l.gpu.run(
          {l.gpu_source(c.contract), c.layout, seqs, c.path, opt, grads, c.model.coefs, bo, grads_stay_on_gpu});
      last_peak_device_bytes_ = r.peak_device_bytes;
      fwd = std::move(r.forward);
      bwd = std::move(r.backward);
      gpu_grads = std::move(r.gpu_grads);
      break;
    }
    case Implementation::kNccl: {
      if (ranks_->leader()) ranks_->send_case(case_id(c));
      GpuCaseResult r = ranks_->run({l.gpu_source(c.contract), c.layout, seqs, c.path, opt, grads, c.model.coefs});
      if (!ranks_->leader()) return {};
      last_peak_device_bytes_ = r.peak_device_bytes;
      last_ranks_ = r.ranks;
      last_communication_ = std::move(r.communication);
      fwd = std::move(r.forward);
      bwd = std::move(r.backward);
      break;
    }
    case Implementation::kReference: {
      const host::Model& m = l.model_for(c.contract);
      fwd = m.forward(seqs, c.path, opt);
      if (grads) bwd = m.backward(seqs, c.model.coefs, plan_.temperature, bo);
      break;
    }
    case Implementation::kEmulated:
      try {
        fwd = host::sharded_forward(cfg, l.weights, kn, c.layout, seqs, c.path, opt);
        if (grads) bwd = host::sharded_backward(cfg, l.weights, kn, c.layout, seqs, c.model.coefs, plan_.temperature);
      } catch (const layouts::RanksNotStarted& e) {
        throw CaseFailed(e.what());  // this case's error; the sweep goes on
      }
      break;
    case Implementation::kFloat64:  // no contract, so no case of the engine (the plan parser keeps it to `run`)
      throw std::logic_error("the float64 truth model runs through run_single_case, not the case engine");
  }
  return to_tensors(cfg, std::move(fwd), bwd ? &*bwd : nullptr, std::move(gpu_grads));
}

int CaseEngine::follow_rank_zero() {
  for (;;) {
    const std::string id = ranks_->next_case();
    if (id.empty()) return 0;
    // A case of the plan, or a (model, contract)'s canonical run on real ranks.
    std::optional<CaseSpec> spec;
    if (const auto it = std::find_if(cases_.begin(), cases_.end(), [&](const CaseSpec& c) { return case_id(c) == id; });
        it != cases_.end())
      spec.emplace(*it);
    for (const ModelEntry& m : models_)
      for (const Contract* c : contracts_)
        if (!spec && case_id(canonical_spec(m, *c)) == id) spec.emplace(canonical_spec(m, *c));
    if (!spec)
      throw io::BadInput("ranks", "", "rank 0 runs case " + id + ", which rank " + std::to_string(ranks_->rank()) +
                                          "'s plan does not have: every rank must run the same plan");
    try {
      run(*spec);
    } catch (const CaseFailed& e) {
      std::fprintf(stderr, "bitparity sweep: rank %d: case %s failed: %s\n", ranks_->rank(), id.c_str(), e.what());
      return kExitInternal;
    }
  }
}

const CaseEngine::Canonical& CaseEngine::canonical(const ModelEntry& model, const Contract& contract) {
  if (canonical_ && canonical_->model == &model && canonical_->contract == &contract) return *canonical_;
  canonical_.reset();
  auto c = std::make_unique<Canonical>();
  c->model = &model;
  c->contract = &contract;
  // The extend path (with its backward) of the plan's canonical: the unsharded CPU
  // reference or GPU model, or a layout.
  const CaseSpec spec = canonical_spec(model, contract);
  refuse_if_untestable(spec);  // before the model is built
  Loaded& l = loaded(model);
  if (spec.implementation == Implementation::kCuda) l.gpu.prepare(l.gpu_source(contract), spec.layout);
  if (spec.implementation == Implementation::kNccl) l.gpu.release();
  // Layer-sliced verification reads each verified stage's input and outputs: the
  // captures of those layers and of the layers before them (whose resid_mlp is the
  // next one's input; the last layer's for the head), and every layer's input
  // gradient from the backward (a verified layer's output gradient is the next one's).
  program::ForwardOptions opt = case_options();
  program::BackwardOptions bo;
  std::set<int64_t> layers;
  for (int64_t li : model.verify_layers) layers.insert({li, li - 1});  // (layer −1 captures nothing)
  if (!model.verify_layers.empty()) {
    layers.insert(model.config.num_hidden_layers - 1);
    bo.capture_resid_grads = true;
    if (!opt.capture) {
      opt.capture = true;
      opt.capture_layers = &layers;
    }
  }
  c->tensors = within_memory(work_, [&] { return run_case(spec, opt, bo); });
  // What the cases do not compare stays apart: ops without --capture ops, and the
  // input gradients always.
  const bool keep_ops = plan_.capture_ops;
  auto compared = std::stable_partition(c->tensors.begin(), c->tensors.end(), [&](const NamedTensor& t) {
    return t.name.rfind("resid_grad.", 0) != 0 && (keep_ops || t.name.rfind("ops.", 0) != 0);
  });
  std::move(compared, c->tensors.end(), std::back_inserter(c->layer_captures));
  c->tensors.erase(compared, c->tensors.end());
  for (const auto* list : {&c->tensors, &c->layer_captures})
    for (const NamedTensor& t : *list) c->by_name.emplace(t.name, &t);
  canonical_ = std::move(c);
  return *canonical_;
}

std::vector<NamedTensor> CaseEngine::replay_layers(const CaseSpec& spec, const Canonical& canonical) {
  const ModelConfig& cfg = spec.model.config;
  const int64_t L = cfg.num_hidden_layers;
  auto captured = [&](const std::string& name) -> const std::vector<bf16>& {
    const NamedTensor* t = canonical.find(name);
    if (!t) throw std::logic_error("the canonical run did not capture " + name);
    return t->bf16_values;
  };
  std::map<int64_t, std::vector<bf16>> inputs, output_grads;
  for (int64_t li : spec.model.verify_layers) {
    inputs[li] = captured("ops." + graph::layer_input_name(li));
    if (plan_.grads) output_grads[li] = captured(graph::resid_grad_name(li + 1));
  }
  inputs[L] = captured("ops." + graph::layer_input_name(L));  // the head
  const std::set<int64_t> layers(spec.model.verify_layers.begin(), spec.model.verify_layers.end());
  program::ForwardOptions opt = case_options();
  opt.capture = true;
  opt.capture_layers = &layers;
  opt.replay = &inputs;
  const host::Model& model = loaded(spec.model).model_for(spec.contract);
  program::ForwardResult fwd = model.forward(spec.model.tokens, program::Path::extend(), opt);
  if (!plan_.grads) return to_tensors(cfg, std::move(fwd), nullptr);
  program::BackwardOptions bo;
  bo.capture_resid_grads = true;
  bo.replay_inputs = &inputs;
  bo.replay_output_grads = &output_grads;
  program::BackwardResult bwd = model.backward(spec.model.tokens, spec.model.coefs, plan_.temperature, bo);
  return to_tensors(cfg, std::move(fwd), &bwd);
}

Case CaseEngine::verify_case(const CaseSpec& spec) {
  Case out = case_header(spec);
  std::string layers;
  for (int64_t li : spec.model.verify_layers) layers += (layers.empty() ? "" : ",") + std::to_string(li);
  out.parameters["path"] = "verify-layers";  // a replay of the extend path's layers: its own column
  out.parameters["verified_layers"] = layers + " and the head, " + (plan_.grads ? "forward and backward" : "forward");
  out.parameters["verified"] = canonical_name(plan_) + " canonical result";
  const Canonical* canonical = nullptr;
  // Untimed: the canonical run (on the GPU under canonical cuda; CannotTest skips
  // the verification where there is none). Timed: the CPU's replay.
  const auto outputs = case_outputs(
      out,
      [&] {
        refuse_if_canonical_untestable(spec);
        canonical = &this->canonical(spec.model, spec.contract);
      },
      [&] { return within_memory(work_, [&] { return replay_layers(spec, *canonical); }); });
  if (!outputs) return out;
  std::vector<const NamedTensor*> expected;
  for (const NamedTensor& t : *outputs)
    if (const NamedTensor* c = canonical->find(t.name)) expected.push_back(c);
  compare_outputs(expected, *outputs, out);
  return out;
}

Case CaseEngine::case_header(const CaseSpec& spec) const {
  Case out;
  out.id = case_id(spec);
  out.parameters = {{"model", spec.model.name},
                    {"contract", spec.contract.name},
                    {"contract_knob_hash", spec.contract.knob_hash()},
                    // The report's key stays "backend" (its schema, the committed
                    // reports and their readers); the value is the implementation.
                    {"backend", implementation_name(spec.implementation)},
                    {"layout", spec.layout.name()},
                    {"path", path_name(spec.path)}};
  // Said only where it is not the reference (the reports before it had no such key).
  if (canonical_name(plan_) != "reference") out.parameters["canonical"] = canonical_name(plan_);
  // The loss whose gradients the case compares, so that it can be reproduced.
  if (plan_.grads && spec.path.kind == program::Path::Kind::Extend)
    out.parameters["coefficients"] = spec.model.coefs.describe();
  return out;
}

Case CaseEngine::interrupted(const CaseSpec& spec) const {
  Case out = case_header(spec);
  out.verdict = Verdict::kSkipped;
  out.skip_reason = "interrupted: stopped by a second SIGINT/SIGTERM before it finished";
  return out;
}

std::optional<std::vector<NamedTensor>> case_outputs(Case& out, const std::function<void()>& prepare,
                                                     const std::function<std::vector<NamedTensor>()>& run) {
  std::optional<std::chrono::steady_clock::time_point> start;
  auto seconds_since_start = [&start] {
    return start ? std::chrono::duration<double>(std::chrono::steady_clock::now() - *start).count() : 0.0;
  };
  try {
    prepare();
    start = std::chrono::steady_clock::now();
    std::vector<NamedTensor> got = run();
    out.seconds = seconds_since_start();
    return got;
  } catch (const CannotTest& e) {
    out.verdict = Verdict::kSkipped;
    out.skip_reason = e.what();
  } catch (const CaseFailed& e) {
    out.verdict = Verdict::kError;
    out.error = e.what();
    out.seconds = seconds_since_start();
  }
  return std::nullopt;
}

// A case compared with a canonical that cannot run here (cuda or nccl without the
// GPUs) skips, saying so, before its own model work: the sweep then writes its
// reports with every such case skipped instead of ending at the first.
void CaseEngine::refuse_if_canonical_untestable(const CaseSpec& spec) const {
  try {
    refuse_if_untestable(canonical_spec(spec.model, spec.contract));
  } catch (const CannotTest& e) {
    throw CannotTest("its canonical, " + canonical_name(plan_) + ", cannot run here: " + e.what());
  }
}

Case CaseEngine::compare(const CaseSpec& spec) {
  return within_memory(work_, [&] { return compare_case(spec); });
}

Case CaseEngine::compare_case(const CaseSpec& spec) {
  if (spec.verify) return verify_case(spec);
  Case out = case_header(spec);
  // The time is the case's own model work: its weights are loaded (once per model),
  // copied to the device (cuda, unsharded: once per model and contract) and the
  // reference is computed (once per model and contract) outside it. A case that
  // cannot run here skips before its model is built.
  last_peak_device_bytes_.reset();
  last_ranks_.reset();
  last_communication_.clear();
  const auto outputs = case_outputs(
      out,
      [&] {
        refuse_if_untestable(spec);
        refuse_if_canonical_untestable(spec);
        Loaded& l = loaded(spec.model);
        if (spec.implementation == Implementation::kCuda) l.gpu.prepare(l.gpu_source(spec.contract), spec.layout);
        if (spec.implementation == Implementation::kNccl) l.gpu.release();
      },
      [&] { return run_outputs(spec, true); });
  out.peak_device_bytes = last_peak_device_bytes_;
  out.ranks = last_ranks_;
  out.communication = std::move(last_communication_);
  if (!outputs) return out;  // skipped or failed: nothing to compare
  const Canonical& ref = canonical(spec.model, spec.contract);
  // Gradients left on the GPU are compared by digest: the canonical's, taken at the
  // first such case and kept for the rest.
  if (std::any_of(outputs->begin(), outputs->end(), [](const NamedTensor& t) { return bool(t.fetch); }))
    for (NamedTensor& t : canonical_->tensors)
      if (t.name.rfind("grads.", 0) == 0 && !t.digest) t.digest = tensor_digest(std::span<const float>(t.f32_values));
  const bool grads = plan_.grads && spec.path.kind == program::Path::Kind::Extend;
  std::vector<const NamedTensor*> expected;
  for (const NamedTensor& r : ref.tensors)
    if (grads || r.name.rfind("grads.", 0) != 0) expected.push_back(&r);
  const auto start = std::chrono::steady_clock::now();
  compare_outputs(expected, *outputs, out);
  out.compare_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  skip_control_that_did_not_differ(spec.layout, out);
  return out;
}

}  // namespace bp::harness
