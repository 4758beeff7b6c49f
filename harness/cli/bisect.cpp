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

#include "harness/cli/common.h"
#include "harness/engine/cases.h"
#include "harness/engine/cuda_implementation.h"
#include "harness/engine/single_case.h"
#include "harness/exit_codes.h"
#include "harness/io/safetensors.h"
#include "reference/model/model_graph.h"

namespace bp::harness {

namespace {

using nlohmann::json;

struct BisectOptions {
  PlanFlags plan;  // what both specs start from
  std::string a, b;                 // --a / --b specs
  std::vector<std::string> dumps;   // or two dump files
  std::string json;
  bool quiet = false;
};

// One side: its tensors by name, and a label for messages.
struct Side {
  std::string label;
  std::map<std::string, NamedTensor> tensors;
  int num_layers = 0;
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
  Side s{r.id, {}, r.num_layers};
  for (NamedTensor& t : r.tensors) s.tensors.emplace(t.name, std::move(t));
  return s;
}

Side side_of_dump(const std::string& path) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(path);
  Side s{path, {}, 0};
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
  return s;
}

bool same_type_and_shape(const NamedTensor& a, const NamedTensor& b) { return a.type == b.type && a.shape == b.shape; }

TensorMetrics metrics_of(const NamedTensor& a, const NamedTensor& b) {
  return a.type == CmpType::F32 ? compare(std::span<const float>(a.f32_values), std::span<const float>(b.f32_values), a.shape)
                                : compare(std::span<const bf16>(a.bf16_values), std::span<const bf16>(b.bf16_values), a.shape);
}

bool equal(const NamedTensor& a, const NamedTensor& b) {
  return same_type_and_shape(a, b) && metrics_of(a, b).bit_identical;
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
  const std::string op = tensor.substr(4);
  if (op.rfind("layers.", 0) == 0) {
    const size_t dot = op.find('.', 7);
    return "layer " + op.substr(7, dot - 7) + ", op " + op.substr(dot + 1);
  }
  return "op " + op;
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
  const ReportPaths paths{o.json, "", "", ""};
  if (const int rc = check_report_paths("bisect", paths, read_files, stderr)) return rc;
  std::FILE* const out = text_stream({o.json});
  WeightsLog weights("bisect", o.quiet);
  const Side a = by_dumps ? side_of_dump(o.dumps[0]) : side_of_spec(*plan_a, weights);
  const Side b = by_dumps ? side_of_dump(o.dumps[1]) : side_of_spec(*plan_b, weights);
  const int layers = std::max(a.num_layers, b.num_layers);

  // The tensors of both sides in execution order.
  std::vector<std::string> common, only_a, only_b;
  for (const auto& [name, t] : a.tensors) (b.tensors.count(name) ? common : only_a).push_back(name);
  for (const auto& [name, t] : b.tensors)
    if (!a.tensors.count(name)) only_b.push_back(name);
  std::stable_sort(common.begin(), common.end(), [&](const std::string& x, const std::string& y) {
    return execution_order_key(x, layers) < execution_order_key(y, layers);
  });

  Report r = make_report("bisect");
  r.environment.weights = weights.origins();
  if (!by_dumps && (uses_gpu(*plan_a) || uses_gpu(*plan_b))) {
    if (const auto g = gpu_identity()) set_gpu_environment(r.environment, {*g});
  }
  Case c;
  c.id = "bisect";
  c.parameters = {{"a", a.label}, {"b", b.label}};
  const NamedTensor* first_a = nullptr;
  const NamedTensor* first_b = nullptr;
  for (const std::string& name : common) {
    const NamedTensor &ta = a.tensors.at(name), &tb = b.tensors.at(name);
    TensorRecord rec;
    rec.name = name;
    rec.dtype_a = cmp_type_name(ta.type);
    rec.dtype_b = cmp_type_name(tb.type);
    rec.shape_a = ta.shape;
    rec.shape_b = tb.shape;
    rec.is_logprob = name.rfind("logprobs.", 0) == 0;
    if (ta.type != tb.type) {
      rec.status = TensorStatus::kDtypeMismatch;
    } else if (ta.shape != tb.shape) {
      rec.status = TensorStatus::kShapeMismatch;
    } else {
      rec.metrics = metrics_of(ta, tb);
      rec.metrics->is_logprob = rec.is_logprob;
    }
    if (!rec.matches() && !first_a) first_a = &ta, first_b = &tb;
    c.tensors.push_back(std::move(rec));
  }
  if (first_a && first_a->name.rfind("ops.", 0) == 0) c.first_divergent_op = first_a->name.substr(4);
  c.settle();

  if (!o.quiet) {
    std::fprintf(out, "A: %s\nB: %s\n", terminal_text(a.label).c_str(), terminal_text(b.label).c_str());
    std::fprintf(out, "%zu tensors in both, compared in execution order", common.size());
    if (!only_a.empty() || !only_b.empty())
      std::fprintf(out, " (%zu only in A, %zu only in B: not compared)", only_a.size(), only_b.size());
    std::fprintf(out, "\n");
    if (!first_a) {
      std::fprintf(out, "bisect: no difference: every common tensor is bit-identical\n");
    } else {
      const TensorRecord& rec = *c.first_mismatch();
      const std::string where = terminal_text(where_text(first_a->name));
      std::fprintf(out, "first difference: %s%s\n", terminal_text(first_a->name).c_str(),
                   where.empty() ? "" : (" (" + where + ")").c_str());
      if (rec.metrics) {
        const TensorMetrics& m = *rec.metrics;
        std::fprintf(out,
                     "  %s %s: %" PRIu64 " of %" PRIu64
                     " elements differ, max %.0f ulp, max |diff| %.3g, mean |diff| %.3g\n",
                     rec.dtype_a.c_str(), io::shape_str(first_a->shape).c_str(), m.mismatches, m.elements,
                     m.max_ulp_diff, m.max_abs_diff, m.mean_abs_diff);
        std::fprintf(out, "  first at element %" PRId64 ": A %s, B %s\n", m.first_mismatch,
                     element_text(*first_a, m.first_mismatch).c_str(),
                     element_text(*first_b, m.first_mismatch).c_str());
      } else {
        std::fprintf(out, "  %s\n", tensor_status_name(rec.status));
      }
      // The op's inputs: equal inputs put the difference in the op itself.
      const bool is_op = first_a->name.rfind("ops.", 0) == 0;
      const std::string op = is_op ? first_a->name.substr(4) : "";
      std::vector<std::string> inputs;
      if (is_op) inputs = graph::op_inputs(op, layers);
      if (first_a->name.rfind("logprobs.", 0) == 0 || first_a->name.rfind("entropy.", 0) == 0) inputs = {"logits"};
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
        std::fprintf(out,
                     "  -> its captured inputs are equal: the op itself (or its weights) computes different bits\n");
      else if (!any_input && !inputs.empty())
        std::fprintf(out, "  -> its inputs were not captured (run with --capture ops to see them)\n");
      std::fprintf(out, "bisect: first difference at %s\n", terminal_text(first_a->name).c_str());
    }
  }
  r.cases.push_back(std::move(c));
  if (const int rc = write_reports("bisect", r, paths, stderr)) return rc;
  return first_a ? kExitMismatch : kExitExact;
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
  sub->add_flag("--quiet,-q", o->quiet, "print nothing but errors");
  return guarded_subcommand(sub, [o] { return bisect(*o); });
}

}  // namespace bp::harness
