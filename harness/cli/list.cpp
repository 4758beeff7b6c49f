// `bitparity list`: the models, contracts, implementations, layouts and paths a plan can name.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "harness/cli/common.h"
#include "harness/engine/cases.h"
#include "harness/engine/cuda_implementation.h"
#include "harness/engine/nccl_implementation.h"
#include "harness/engine/models.h"
#include "harness/exit_codes.h"

namespace bp::harness {

namespace {

struct ListOptions {
  std::vector<std::string> models;  // checkpoint directories to describe too
};

std::string shape_text(const ModelConfig& c) {
  std::string s = c.model_type + ", hidden " + std::to_string(c.hidden_size) + ", " +
                  std::to_string(c.num_hidden_layers) + " layers, " + std::to_string(c.num_attention_heads) + "/" +
                  std::to_string(c.num_key_value_heads) + " heads of " + std::to_string(c.head_dim) + ", vocab " +
                  std::to_string(c.vocab_size);
  if (c.is_moe_model())
    s += ", " + std::to_string(c.num_experts) + " experts top-" + std::to_string(c.num_experts_per_tok);
  return s;
}

// The default grid's layouts that the model can run under every contract.
std::string layouts_text(const ModelConfig& cfg) {
  std::vector<layouts::Layout> common = grid_layouts(LayoutGrid{}, cfg, contracts().front().knobs);
  for (const Contract& c : contracts()) {
    const std::vector<layouts::Layout> mine = grid_layouts(LayoutGrid{}, cfg, c.knobs);
    std::erase_if(common, [&](const layouts::Layout& l) { return std::find(mine.begin(), mine.end(), l) == mine.end(); });
  }
  std::string s;
  for (const layouts::Layout& l : common) s += (s.empty() ? "" : " ") + l.name();
  return s.empty() ? "(none)" : s;
}

// Why the default grid's other layouts are missing (grid_exclusions), each cause
// once, naming the contracts it applies to when not all of them.
std::vector<std::string> missing_text(const ModelConfig& cfg) {
  std::vector<std::pair<std::string, std::vector<std::string>>> causes;  // cause, contracts
  for (const Contract& c : contracts())
    for (const std::string& e : grid_exclusions(LayoutGrid{}, cfg, c.knobs)) {
      auto it = std::find_if(causes.begin(), causes.end(), [&](const auto& x) { return x.first == e; });
      if (it == causes.end()) it = causes.insert(causes.end(), {e, {}});
      it->second.push_back(c.name);
    }
  std::vector<std::string> out;
  for (const auto& [cause, names] : causes) {
    std::string s = "missing " + cause;
    if (names.size() < contracts().size()) {
      s += " (under";
      for (const std::string& n : names) s += " " + n;
      s += ")";
    }
    out.push_back(s);
  }
  return out;
}

int list(const ListOptions& o) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (const EmbeddedFixture& f : embedded_fixtures())
    models.emplace_back(std::string(f.name), model_config(std::string(f.name), "", "", ""));
  for (size_t i = 0; i < o.models.size(); ++i) {
    const std::string spec = names_fixture(o.models[i]) ? "./" + o.models[i] : o.models[i];
    models.emplace_back(spec, model_config(spec, "", "command line", "--model[" + std::to_string(i) + "]"));
  }
  size_t w = 0;
  for (const auto& [name, cfg] : models) w = std::max(w, name.size());
  const int iw = static_cast<int>(w);
  std::printf("models (fixtures: embedded config.json, generated weights; directories: Hugging Face checkpoints):\n");
  for (const auto& [name, cfg] : models) {
    const char* kind = names_fixture(name) ? "fixture" : generated_weights(name, "") ? "config only" : "checkpoint";
    std::printf("  %-*s  %-11s %s\n", iw, name.c_str(), kind, shape_text(cfg).c_str());
  }
  std::printf("contracts:\n");
  for (const Contract& c : contracts())
    std::printf("  %-16s hash %s  %s\n", c.name.c_str(), c.knob_hash().c_str(), c.canonical_knobs().c_str());
  std::printf("implementations:\n"
              "  reference  the unsharded CPU reference model (host::Model), every path\n"
              "  emulated   the sharded layouts on emulated CPU ranks (program/layouts)\n"
              "  cuda       %s\n"
              "  nccl       %s\n"
              "  float64    the float64 truth model (reference/truth): no contract, unsharded, extend, no captures; "
              "run only (--contract truth is its old spelling)\n",
              cuda_implementation_summary(), nccl_implementation_summary());
  const LayoutGrid g;
  auto sizes = [](const std::vector<int>& v) {
    std::string s;
    for (int n : v) s += (s.empty() ? "" : ", ") + std::to_string(n);
    return s;
  };
  std::printf("layouts (tp<N>-ep<N>-cp<N>[z][+ring|+nccl-bf16sum]; z = zigzag cp split, +ring = the ring-reduction "
              "negative control, +nccl-bf16sum = NCCL's bf16 all-reduce of the row-parallel partials, nccl only); those of "
              "the default grid (tp %s; ep %s; cp %s) each model runs under every contract, and why the others are "
              "missing:\n",
              sizes(g.tp).c_str(), sizes(g.ep).c_str(), sizes(g.cp).c_str());
  for (const auto& [name, cfg] : models) {
    std::printf("  %-*s  %s\n", iw, name.c_str(), layouts_text(cfg).c_str());
    for (const std::string& m : missing_text(cfg)) std::printf("  %-*s  %s\n", iw, "", m.c_str());
  }
  std::printf("paths:\n  extend  chunked:<n>[,<n>...]  decode  ragged\n");
  return kExitExact;
}

}  // namespace

Subcommand add_list_command(CLI::App& app) {
  auto o = std::make_shared<ListOptions>();
  CLI::App* sub = app.add_subcommand("list", "list models (fixtures and --model directories), contracts, "
                                             "implementations, the layouts each model can run, and paths");
  sub->add_option("--model", o->models, "a Hugging Face checkpoint directory to describe too (repeatable)");
  return guarded_subcommand(sub, [o] { return list(*o); });
}

}  // namespace bp::harness
