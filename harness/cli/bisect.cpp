// `bitparity bisect`: two runs (two case specs) or two `run --capture ops` dumps;
// the first (layer, op, tensor) in execution order whose bits differ, its diff
// statistics, and whether that op's captured inputs were equal — so the user sees
// whether the op itself or something before it changed.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "harness/cli/common.h"
#include "harness/engine/cases.h"
#include "harness/engine/cuda_implementation.h"
#include "harness/engine/single_case.h"
#include "harness/exit_codes.h"
#include "harness/io/json_strict.h"
#include "harness/io/safetensors.h"
#include "reference/model/model_graph.h"

namespace bp::harness {

namespace {

using nlohmann::json;

struct BisectOptions {
  PlanFlags plan;  // what both specs start from
  std::string a, b;                 // --a / --b specs
  std::vector<std::string> dumps;   // or two dump files
  std::string json, html;
  bool quiet = false;
};

// One side: its tensors by name, and a label for messages.
struct Side {
  std::string label;
  std::map<std::string, NamedTensor> tensors;
  int num_layers = 0;
  // A run whose path is not extend (or under --no-grads) computes no gradients by
  // design; a dump's missing gradients are a difference like any missing tensor.
  bool computes_grads = true;
  // Ops an engine capture says its name map cannot take (metadata
  // bitparity.not_captured, a JSON list of op names without the layer: Hugging
  // Face's MoE block computes router_weights and expert_out in no module of their
  // own); the other side's such tensors are left out, said, not a difference.
  std::set<std::string> not_captured;
};

// "key=value,key=value": a piece without '=' continues the previous value, so
// lists read naturally (path=chunked:5,3,lengths=9,17). Keys: model, contract,
// implementation (or backend, its old name), layout, path, tp, ep, cp, cp_split,
// seed, lengths, tokens, weight_seed, coef_seed, temperature.
json spec_json(const std::string& spec, const std::string& source) {
  std::vector<std::pair<std::string, std::string>> kv;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string piece = spec.substr(start, comma - start);
    const size_t eq = piece.find('=');
    if (eq != std::string::npos && eq > 0) {
      kv.emplace_back(piece.substr(0, eq), piece.substr(eq + 1));
    } else if (!kv.empty() && eq == std::string::npos && !piece.empty()) {
      kv.back().second += "," + piece;
    } else {
      throw io::BadInput(source, piece,
                         "expected key=value (e.g. path=decode,layout=tp2-ep1-cp1,implementation=emulated)");
    }
    start = comma + 1;
  }
  auto ints = [&](const std::string& key, const std::string& v) {
    json list = json::array();
    size_t s = 0;
    while (s <= v.size()) {
      const size_t c = std::min(v.find(',', s), v.size());
      const std::string n = v.substr(s, c - s);
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || n.size() > 18)
        throw io::BadInput(source, key, io::quoted_input(v) + " is not a list of non-negative integers");
      list.push_back(std::stoull(n));
      s = c + 1;
    }
    return list;
  };
  json j = json::object();
  for (const auto& [k, v] : kv) {
    static const std::map<std::string, std::string> lists = {
        {"model", "models"},   {"contract", "contracts"}, {"implementation", "implementations"},
        {"backend", "implementations"}, {"layout", "layouts"},   {"path", "paths"},
        {"cp_split", "cp_split"}};
    if (j.contains(k) || (lists.count(k) && j.contains(lists.at(k))))
      throw io::BadInput(source, k, "given twice");
    if (const auto it = lists.find(k); it != lists.end()) {
      j[it->second] = json::array({v});
    } else if (k == "tp" || k == "ep" || k == "cp") {
      j[k] = ints(k, v);
    } else if (k == "seed") {
      j["tokens"]["seed"] = ints(k, v).at(0);
      if (v.find(',') != std::string::npos) throw io::BadInput(source, k, "one seed");
    } else if (k == "lengths") {
      j["tokens"]["lengths"] = ints(k, v);
    } else if (k == "tokens") {
      j["tokens"]["file"] = v;
    } else if (k == "weight_seed" || k == "coef_seed") {
      if (v.find(',') != std::string::npos) throw io::BadInput(source, k, "one seed");
      j[k] = ints(k, v).at(0);
    } else if (k == "temperature") {
      char* end = nullptr;
      const double t = std::strtod(v.c_str(), &end);
      if (v.empty() || *end) throw io::BadInput(source, k, io::quoted_input(v) + " is not a number");
      j[k] = t;
    } else {
      throw io::BadInput(source, k,
                         "unknown key; a spec takes model, contract, implementation, layout, path, tp, ep, cp, "
                         "cp_split, seed, lengths, tokens, weight_seed, coef_seed, temperature");
    }
  }
  return j;
}

SweepPlan spec_plan(const BisectOptions& o, const std::string& spec, const char* source) {
  SweepPlan plan = o.plan.plan(single_case_defaults());
  plan.capture_ops = true;
  apply_plan_json(spec_json(spec, source), source, false, plan);
  return plan;
}

Side side_of_spec(const SweepPlan& plan, WeightsLog& weights) {
  SingleRun r = run_single_case(plan, weights.listener());
  const bool grads = plan.grads && plan.paths.at(0).kind == program::Path::Kind::Extend;
  Side s;
  s.label = r.id;
  s.num_layers = r.num_layers;
  s.computes_grads = grads;
  for (NamedTensor& t : r.tensors) s.tensors.emplace(t.name, std::move(t));
  return s;
}

Side side_of_dump(const std::string& path) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(path);
  Side s;
  s.label = path;
  for (const io::TensorInfo& info : f.tensors()) {
    NamedTensor t;
    t.name = info.name;
    t.shape = info.shape;
    if (info.dtype == io::DType::BF16) {
      t.type = CmpType::BF16;
      t.bf16_values = f.read_bf16(info);
    } else if (info.dtype == io::DType::F32) {
      t.f32_values = f.read_f32(info);
    } else {
      throw io::BadInput(path, info.name, std::string("dtype ") + io::dtype_name(info.dtype) +
                                              " cannot be compared (bitparity compares BF16 and F32)");
    }
    // Layers are numbered from 0: the count is one past the largest index seen.
    if (info.name.rfind("ops.layers.", 0) == 0)
      s.num_layers = std::max(s.num_layers, std::atoi(info.name.c_str() + 11) + 1);
    s.tensors.emplace(t.name, std::move(t));
  }
  if (const auto it = f.metadata().find("bitparity.not_captured"); it != f.metadata().end()) {
    const nlohmann::json ops = io::parse_json_strict(it->second, path + ": bitparity.not_captured");
    if (!ops.is_array()) throw io::BadInput(path, "bitparity.not_captured", "expected a JSON list of op names");
    for (const auto& op : ops) {
      if (!op.is_string()) throw io::BadInput(path, "bitparity.not_captured", "expected a JSON list of op names");
      s.not_captured.insert(op.get<std::string>());
    }
  }
  return s;
}

// (layer, op) of "ops.layers.3.router_weights"; nullopt for other tensors.
std::optional<std::pair<int, std::string_view>> layer_op(std::string_view tensor) {
  return tensor.starts_with("ops.") ? graph::split_layer_capture(tensor.substr(4)) : std::nullopt;
}

bool equal(const NamedTensor& a, const NamedTensor& b) {
  const TensorRecord r = compare_tensors(a, &b);
  return r.metrics && r.metrics->bit_identical;
}

std::string element_text(const NamedTensor& t, int64_t i) {
  char buf[64];
  if (t.type == CmpType::BF16) {
    const bf16 v = t.bf16_values[static_cast<size_t>(i)];
    std::snprintf(buf, sizeof buf, "0x%04x (%.9g)", v.bits, static_cast<double>(widen(v)));
  } else {
    uint32_t u;
    std::memcpy(&u, &t.f32_values[static_cast<size_t>(i)], 4);
    std::snprintf(buf, sizeof buf, "0x%08x (%.9g)", u, static_cast<double>(t.f32_values[static_cast<size_t>(i)]));
  }
  return buf;
}

// "layer 3, op q_norm" for ops.layers.3.q_norm; "op embed"; "" for non-op tensors.
std::string where_text(const std::string& tensor) {
  if (tensor.rfind("ops.", 0) != 0) return "";
  if (const auto lo = layer_op(tensor)) return "layer " + std::to_string(lo->first) + ", op " + std::string(lo->second);
  return "op " + tensor.substr(4);
}

// The tensors of two sides, paired by name, in execution order. A tensor on one
// side only is a difference (an engine that drops an op's output, a truncated
// dump), except a gradient the other side's run computes none of by design.
struct Pairing {
  std::vector<std::string> names;         // compared or on one side only, in execution order
  size_t common = 0, only_a = 0, only_b = 0;
  std::vector<std::string> not_computed;  // gradients the other side's run does not compute
  std::vector<std::string> not_captured;  // ops the other side's capture cannot take
};

// Whether `tensor` is computed from the logits: the logprobs and entropy.
bool reads_logits(const std::string& tensor) {
  return tensor.rfind("logprobs.", 0) == 0 || tensor.rfind("entropy.", 0) == 0;
}

// Whether `tensor` is one `s`'s capture says it cannot take: a layer's op by its
// name without the layer, a model's op by its name, and where the logits are not
// captured (an engine's logits of its sampled rows only), the logprobs and entropy
// a capture computes from them.
bool cannot_take(const Side& s, const std::string& tensor) {
  if (const auto lo = layer_op(tensor)) return s.not_captured.count(std::string(lo->second)) > 0;
  if (tensor.rfind("ops.", 0) == 0) return s.not_captured.count(tensor.substr(4)) > 0;
  return reads_logits(tensor) && s.not_captured.count("logits") > 0;
}

Pairing pair_tensors(const Side& a, const Side& b, int layers) {
  Pairing p;
  auto add = [&](const std::string& name, const Side& lacking, size_t& only) {
    if (name.rfind("grads.", 0) == 0 && !lacking.computes_grads) return p.not_computed.push_back(name);
    if (cannot_take(lacking, name)) return p.not_captured.push_back(name);
    ++only;
    p.names.push_back(name);
  };
  for (const auto& [name, t] : a.tensors) {
    if (!b.tensors.count(name)) {
      add(name, b, p.only_a);
    } else {
      ++p.common;
      p.names.push_back(name);
    }
  }
  for (const auto& [name, t] : b.tensors)
    if (!a.tensors.count(name)) add(name, a, p.only_b);
  std::stable_sort(p.names.begin(), p.names.end(), [&](const std::string& x, const std::string& y) {
    return execution_order_key(x, layers) < execution_order_key(y, layers);
  });
  return p;
}

TensorRecord record_of(const std::string& name, const Side& a, const Side& b) {
  const auto ia = a.tensors.find(name), ib = b.tensors.find(name);
  const NamedTensor* in_b = ib == b.tensors.end() ? nullptr : &ib->second;
  if (ia != a.tensors.end()) return compare_tensors(ia->second, in_b);
  TensorRecord rec;  // only in B
  rec.name = name;
  rec.is_logprob = name.rfind("logprobs.", 0) == 0;
  rec.dtype_b = cmp_type_name(in_b->type);
  rec.shape_b = in_b->shape;
  rec.status = TensorStatus::kOnlyInB;
  return rec;
}

// Whether each captured input of the differing op was equal on both sides: equal
// inputs put the difference in the op itself.
void print_inputs(const std::string& tensor, const Side& a, const Side& b, int layers, std::FILE* out) {
  const bool is_op = tensor.rfind("ops.", 0) == 0;
  const std::string op = is_op ? tensor.substr(4) : "";
  std::vector<std::string> inputs;
  if (is_op) inputs = graph::op_inputs(op, layers);
  if (reads_logits(tensor)) inputs = {"logits"};
  bool all_equal = true, any_input = false;
  for (const std::string& in : inputs) {
    const std::string tn = "ops." + in;
    if (!a.tensors.count(tn) || !b.tensors.count(tn)) continue;
    any_input = true;
    const bool eq = equal(a.tensors.at(tn), b.tensors.at(tn));
    all_equal &= eq;
    std::fprintf(out, "  input %-28s %s\n", tn.c_str(), eq ? "equal" : "DIFFERS");
  }
  if (op == "embed")
    std::fprintf(out, "  -> embed reads only the tokens and the embedding weights: they differ\n");
  else if (any_input && all_equal)
    std::fprintf(out, "  -> its captured inputs are equal: the op itself (or its weights) computes different bits\n");
  else if (!any_input && !inputs.empty())
    std::fprintf(out, "  -> its inputs were not captured (run with --capture ops to see them)\n");
}

void print_first_difference(const TensorRecord& rec, const Side& a, const Side& b, int layers, std::FILE* out) {
  const std::string name = terminal_text(rec.name), where = terminal_text(where_text(rec.name));
  std::fprintf(out, "first difference: %s%s\n", name.c_str(), where.empty() ? "" : (" (" + where + ")").c_str());
  const bool only_a = rec.status == TensorStatus::kOnlyInA;
  if (only_a || rec.status == TensorStatus::kOnlyInB) {
    std::fprintf(out, "  only in %s: %s lacks it (an output the engine dropped, or a truncated dump)\n",
                 only_a ? "A" : "B", only_a ? "B" : "A");
    std::fprintf(out, "bisect: first difference at %s: only in %s\n", name.c_str(), only_a ? "A" : "B");
    return;
  }
  if (rec.metrics) {
    const TensorMetrics& m = *rec.metrics;
    const NamedTensor &ta = a.tensors.at(rec.name), &tb = b.tensors.at(rec.name);
    std::fprintf(out,
                 "  %s %s: %" PRIu64 " of %" PRIu64 " elements differ, max %.0f ulp, max |diff| %.3g, mean |diff| %.3g\n",
                 rec.dtype_a.c_str(), io::shape_str(ta.shape).c_str(), m.mismatches, m.elements, m.max_ulp_diff,
                 m.max_abs_diff, m.mean_abs_diff);
    std::fprintf(out, "  first at element %" PRId64 ": A %s, B %s\n", m.first_mismatch,
                 element_text(ta, m.first_mismatch).c_str(), element_text(tb, m.first_mismatch).c_str());
  } else {
    std::fprintf(out, "  %s\n", tensor_status_name(rec.status));
  }
  print_inputs(rec.name, a, b, layers, out);
  std::fprintf(out, "bisect: first difference at %s\n", name.c_str());
}

// "58 tensors in both, compared in execution order; 1 only in A, 1 only in B", and
// what was left out or cannot be bisected at all.
void print_pairing(const Pairing& p, const Side& a, const Side& b, std::FILE* out) {
  std::fprintf(out, "A: %s\nB: %s\n", terminal_text(a.label).c_str(), terminal_text(b.label).c_str());
  std::fprintf(out, "%zu tensors in both, compared in execution order", p.common);
  if (p.only_a || p.only_b) std::fprintf(out, "; %zu only in A, %zu only in B: differences", p.only_a, p.only_b);
  std::fprintf(out, "\n");
  if (!p.not_computed.empty())
    std::fprintf(out, "not compared: %zu gradient tensor(s) of one side only: the other run computes no gradients "
                 "(they are computed on the extend path)\n", p.not_computed.size());
  if (!p.not_captured.empty())
    std::fprintf(out, "not compared: %zu op tensor(s) of one side only: the other side's capture says its name map "
                 "cannot take them (bitparity.not_captured)\n", p.not_captured.size());
  if (p.common == 0 && !p.names.empty())
    std::fprintf(out, "bisect: A and B have no tensor in common (A %zu, B %zu): not the same computation, or one "
                 "side's output is missing\n", a.tensors.size(), b.tensors.size());
}

int bisect(const BisectOptions& o) {
  const bool by_dumps = !o.dumps.empty();
  if (by_dumps == (!o.a.empty() || !o.b.empty()))
    throw io::BadInput("command line", "", "give two dumps (bisect A.safetensors B.safetensors) or --a SPEC --b SPEC");
  if (by_dumps && o.dumps.size() != 2) throw io::BadInput("command line", "", "bisect takes two dumps");
  if (!by_dumps && (o.a.empty() || o.b.empty())) throw io::BadInput("command line", "--a/--b", "give both --a and --b");
  std::vector<std::string> read_files = o.dumps;
  std::optional<SweepPlan> plan_a, plan_b;
  if (!by_dumps) {
    plan_a = spec_plan(o, o.a, "--a");
    plan_b = spec_plan(o, o.b, "--b");
    for (const SweepPlan* p : {&*plan_a, &*plan_b})
      for (std::string& f : o.plan.input_files(*p)) read_files.push_back(std::move(f));
  }
  const ReportPaths paths{o.json, "", "", o.html};
  if (const int rc = check_report_paths("bisect", paths, read_files, stderr)) return rc;
  std::FILE* const out = text_stream({o.json, o.html});
  WeightsLog weights("bisect", o.quiet);
  const Side a = by_dumps ? side_of_dump(o.dumps[0]) : side_of_spec(*plan_a, weights);
  const Side b = by_dumps ? side_of_dump(o.dumps[1]) : side_of_spec(*plan_b, weights);
  if (a.tensors.empty() && b.tensors.empty())
    throw io::BadInput("command line", "", "A and B hold no tensor: nothing to bisect");
  const int layers = std::max(a.num_layers, b.num_layers);
  const Pairing pairing = pair_tensors(a, b, layers);

  Report r = make_report("bisect");
  r.environment.weights = weights.origins();
  if (!by_dumps && (uses_gpu(*plan_a) || uses_gpu(*plan_b))) {
    if (const auto g = gpu_identity()) set_gpu_environment(r.environment, {*g});
  }
  Case c;
  c.id = "bisect";
  c.parameters = {{"a", a.label}, {"b", b.label}};
  for (const std::string& name : pairing.names) c.tensors.push_back(record_of(name, a, b));
  const TensorRecord* first = c.first_mismatch();
  if (first && first->name.rfind("ops.", 0) == 0) c.first_divergent_op = first->name.substr(4);
  c.settle();

  if (!o.quiet) {
    print_pairing(pairing, a, b, out);
    if (first)
      print_first_difference(*first, a, b, layers, out);
    else
      std::fprintf(out, "bisect: no difference: every tensor is bit-identical\n");
  }
  const bool differs = first != nullptr;
  r.cases.push_back(std::move(c));
  if (const int rc = write_reports("bisect", r, paths, stderr)) return rc;
  return differs ? kExitMismatch : kExitExact;
}

}  // namespace

Subcommand add_bisect_command(CLI::App& app) {
  auto o = std::make_shared<BisectOptions>();
  CLI::App* sub = app.add_subcommand(
      "bisect",
      "the first (layer, op, tensor) in execution order whose bits differ between two runs "
      "(--a SPEC --b SPEC, each like path=decode,layout=tp2-ep1-cp1,implementation=emulated over the plan flags, "
      "run with --capture ops) or two `run --capture ops` dumps; prints its diff statistics and whether its inputs were equal. "
      "Exit 0 no difference, 1 a difference, 2 bad usage or input, 3 internal error");
  o->plan.add_to(sub);
  sub->add_option("dumps", o->dumps, "two dumps A.safetensors B.safetensors");
  sub->add_option("--a", o->a, "spec of run A: key=value,... (model, contract, implementation (or backend), layout, "
                               "path, tp, ep, cp, cp_split, seed, lengths, tokens, weight_seed, coef_seed, "
                               "temperature)");
  sub->add_option("--b", o->b, "spec of run B");
  sub->add_option("--json", o->json, "write a JSON report (tensors in execution order); '-': stdout");
  sub->add_option("--html", o->html, "write an HTML page (a layers x ops heat map of the captured ops); '-': stdout");
  sub->add_flag("--quiet,-q", o->quiet, "print nothing but errors");
  return guarded_subcommand(sub, [o] { return bisect(*o); });
}

}  // namespace bp::harness
