// Shared by the model-level suites: the tiny fixtures, seeded token batches and
// bitwise comparison of per-sequence results.
#pragma once
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "harness/io/hf_config.h"
#include "host/model.h"
#include "program/layouts/layout.h"
#include "reference/common/rng.h"
#include "reference/contract/contract.h"
#include "support/golden.h"

namespace bp::test {

using Seqs = std::vector<std::vector<int32_t>>;
using Rows = std::vector<std::vector<float>>;

inline ModelConfig load_fixture(const std::string& fixture) {
  return io::load_hf_config(source_path("fixtures/models/" + fixture));
}

// Sequences of the given lengths, token j of sequence i = counter_hash(1000 + i, j) mod vocab.
inline Seqs make_seqs(int64_t vocab, const std::vector<int>& lens) {
  Seqs s;
  for (size_t i = 0; i < lens.size(); ++i) {
    std::vector<int32_t> t;
    for (int j = 0; j < lens[i]; ++j)
      t.push_back(static_cast<int32_t>(counter_hash(1000 + i, static_cast<uint64_t>(j)) % static_cast<uint64_t>(vocab)));
    s.push_back(t);
  }
  return s;
}

inline std::vector<float> flat(const Rows& r) {
  std::vector<float> v;
  for (const auto& x : r) v.insert(v.end(), x.begin(), x.end());
  return v;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A backward's every output bit for bit: the logprobs, the loss coefficients it used
// and each named gradient (failures name `label` and the gradient).
template <class Got, class Want>
void expect_same_backward(const Got& got, const Want& want, const std::string& label) {
  EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob))) << label;
  EXPECT_TRUE(same_bits(flat(got.coef), flat(want.coef))) << label;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << label;
  for (const auto& [name, g] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << label << " lacks " << name;
    EXPECT_TRUE(same_bits(got.grads.at(name), g)) << label << " " << name;
  }
}

// The model-level suites' parameter: a tiny fixture under a contract.
struct FixtureCase {
  std::string fixture, contract;
};
inline void PrintTo(const FixtureCase& c, std::ostream* os) { *os << c.fixture << "/" << c.contract; }

// Both tiny fixtures under every contract (v1 and v2, both dot models).
inline std::vector<FixtureCase> all_fixture_cases() {
  std::vector<FixtureCase> cases;
  for (const char* fixture : {"qwen3-dense-tiny", "qwen3-moe-tiny"})
    for (const Contract& c : contracts()) cases.push_back({fixture, c.name});
  return cases;
}
inline auto every_fixture_case() { return ::testing::ValuesIn(all_fixture_cases()); }

// The model suites' CI half: each fixture under both versions and both dot models,
// each contract on one fixture (dense: sm90tc-v1, fmaseq-v2; MoE: sm90tc-v2,
// fmaseq-v1). The other half runs in the `_slow` twin (an instantiation named
// Slow*, tests/CMakeLists.txt), so the CI time stays that of two contracts.
inline bool in_ci_half(const FixtureCase& c) {
  const bool v2 = c.contract.ends_with("-v2"), sm90 = c.contract.find("sm90tc") != std::string::npos;
  return (c.fixture == "qwen3-dense-tiny") == (sm90 != v2);
}
inline auto fixture_cases_in_half(bool ci) {
  std::vector<FixtureCase> cases = all_fixture_cases();
  std::erase_if(cases, [&](const FixtureCase& c) { return in_ci_half(c) != ci; });
  return ::testing::ValuesIn(cases);
}
inline auto ci_fixture_cases() { return fixture_cases_in_half(true); }
inline auto slow_fixture_cases() { return fixture_cases_in_half(false); }
inline std::string fixture_case_name(const ::testing::TestParamInfo<FixtureCase>& info) {
  std::string n = info.param.fixture + "_" + info.param.contract;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

// The weights and loss coefficients the layout and GPU model suites share.
inline constexpr uint64_t kFixtureWeightSeed = 20261122;
inline constexpr uint64_t kFixtureCoefSeed = 11;

// A suite over every fixture case: the fixture's config, its generated weights
// (kFixtureWeightSeed) and the contract's knobs.
class FixtureTest : public ::testing::TestWithParam<FixtureCase> {
 protected:
  void SetUp() override {
    cfg_ = load_fixture(GetParam().fixture);
    w_ = generate_weights(cfg_, kFixtureWeightSeed);
    kn_ = find_contract(GetParam().contract)->knobs;
  }
  ModelConfig cfg_;
  Weights w_;
  Knobs kn_;
};

// The layout suites' batches (CPU emulated ranks and GPU virtual ranks alike). For
// the backward four sequences (one per e at EP 4): the 150-token one spans two
// gradient chunks, so attention's dk/dv chunks sit on different CP ranks, and the
// batch (223 tokens) spans two weight-gradient chunks. For the paths, a short batch.
inline const std::vector<int> kLayoutGradLengths = {23, 150, 41, 9};
inline const std::vector<int> kLayoutPathLengths = {13, 30, 7, 21};

// Every capture of a has b's name, shape and bits, in the same order.
inline bool same_captures(const program::ForwardResult& a, const program::ForwardResult& b) {
  if (a.captures.size() != b.captures.size()) return false;
  for (size_t i = 0; i < a.captures.size(); ++i)
    if (a.captures[i].name != b.captures[i].name || a.captures[i].shape != b.captures[i].shape ||
        a.captures[i].bf16_data != b.captures[i].bf16_data)
      return false;
  return true;
}

// Models whose kv heads tp 2..8 replicate, derived from the tiny fixtures:
// mqa — 8 query heads on one kv head (tp 2, 4, 8 make 2, 4, 8 replicas);
// gqa2 — 8 query heads on 2 kv heads (tp 4 = 2·Hkv, tp 8 = 4·Hkv);
// a3b — Qwen3-30B-A3B's heads (32 query, 4 kv: tp 8 = 2·Hkv) and an all-MoE
// stack at the MoE fixture's small sizes (8 experts top 2), head_dim 32: the
// smallest the CUDA attention takes, so the GPU twin runs the same model.
inline ModelConfig replica_model(const std::string& name) {
  ModelConfig c = load_fixture(name == "a3b" ? "qwen3-moe-tiny" : "qwen3-dense-tiny");
  if (name == "mqa") c.num_key_value_heads = 1;
  if (name == "gqa2") c.num_key_value_heads = 2;
  if (name == "a3b") {
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.head_dim = 32;
    c.num_hidden_layers = 2;
    c.mlp_only_layers.clear();
  }
  return c;
}

struct ReplicaCase {
  std::string model, contract;
  std::vector<std::string> layouts;
};
inline void PrintTo(const ReplicaCase& c, std::ostream* os) { *os << c.model << "/" << c.contract; }
inline std::string replica_case_name(const ::testing::TestParamInfo<ReplicaCase>& info) {
  std::string n = info.param.model + "_" + info.param.contract;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

// Every model under every contract; CI runs each model's small layouts, the slow
// twin larger ones (CP with replicas at tp 8, a3b on 32 ranks). The layout suites of
// the CPU (emulated ranks) and the GPU (virtual ranks) share them.
inline std::vector<ReplicaCase> replica_cases(bool ci) {
  struct Layouts {
    std::string model;
    std::vector<std::string> ci, slow;
  };
  const std::vector<Layouts> all = {
      {"mqa", {"tp2-ep1-cp1", "tp4-ep1-cp2z", "tp8-ep1-cp1"}, {"tp2-ep1-cp2", "tp8-ep1-cp2z"}},
      {"gqa2", {"tp4-ep1-cp1", "tp8-ep1-cp2"}, {"tp4-ep1-cp2z", "tp8-ep1-cp2z"}},
      {"a3b", {"tp8-ep1-cp1", "tp8-ep2-cp1"}, {"tp8-ep4-cp1", "tp8-ep2-cp2z"}}};
  std::vector<ReplicaCase> out;
  for (const Layouts& m : all)
    for (const Contract& c : contracts()) out.push_back({m.model, c.name, ci ? m.ci : m.slow});
  return out;
}

// Models whose sizes are not multiples of tp_tree_width C = 8 (SPEC.md §2.4.1: fixed
// chunks of ⌈size/C⌉, the last short or empty), derived from the tiny fixtures:
// odd-dense — vocab 300, intermediate 100, 8 query heads on 1 kv head, tied
// embeddings; odd-heads — vocab 257, 5 query heads on 1 kv head of head_dim 20
// (q dim 100, kv dim 20; the CUDA attention takes head_dim 32, 64, 128 only);
// odd-moe — vocab 211, intermediate 49 (its dense layer 0: chunks of 7, the last
// empty), moe_intermediate 36, untied. odd-dense and odd-moe shard at tp > 1 too, the
// tail ranks' slices of I and V shorter (SPEC.md §7: tp 2 of vocab 300 is 152 + 148;
// tp 2 of I = 49 gives rank 1 chunks of 7, 7, 7 and an empty one); odd-heads runs at
// tp 1 only (q dim 100).
inline ModelConfig odd_size_model(const std::string& name) {
  ModelConfig c = load_fixture(name == "odd-moe" ? "qwen3-moe-tiny" : "qwen3-dense-tiny");
  c.intermediate_size = name == "odd-moe" ? 49 : 100;
  if (name == "odd-dense") {
    c.vocab_size = 300;
    c.num_key_value_heads = 1;
  } else if (name == "odd-heads") {
    c.vocab_size = 257;
    c.num_attention_heads = 5;
    c.num_key_value_heads = 1;
    c.head_dim = 20;
  } else {
    c.vocab_size = 211;
    c.moe_intermediate_size = 36;
  }
  return c;
}

// A derived model by name: the odd-size ones (odd-*) or the replicated-kv ones.
inline ModelConfig derived_model(const std::string& name) {
  return name.rfind("odd-", 0) == 0 ? odd_size_model(name) : replica_model(name);
}

// Every odd-size model under every contract, with the layouts it runs; the GPU
// suites (gpu) leave out odd-heads, whose head_dim the CUDA attention does not take.
inline std::vector<ReplicaCase> odd_size_cases(bool gpu) {
  std::vector<ReplicaCase> out;
  for (const Contract& c : contracts()) {
    out.push_back({"odd-dense", c.name, {"tp1-ep1-cp1", "tp1-ep1-cp2z", "tp2-ep1-cp1", "tp4-ep1-cp2z", "tp8-ep1-cp1"}});
    if (!gpu) out.push_back({"odd-heads", c.name, {"tp1-ep1-cp1", "tp1-ep1-cp2z"}});
    out.push_back({"odd-moe", c.name, {"tp1-ep1-cp1", "tp1-ep4-cp2z", "tp2-ep1-cp1", "tp4-ep2-cp1", "tp2-ep2-cp2z"}});
  }
  return out;
}

// The layout suites' fixture (CPU emulated ranks, GPU virtual ranks): a derived
// model's config and generated weights, the contract's knobs, and the case's
// layouts, each one the model can shard.
class DerivedModelTest : public ::testing::TestWithParam<ReplicaCase> {
 protected:
  void SetUp() override {
    cfg_ = derived_model(GetParam().model);
    w_ = generate_weights(cfg_, kFixtureWeightSeed);
    kn_ = find_contract(GetParam().contract)->knobs;
    for (const std::string& name : GetParam().layouts) {
      layouts_.push_back(*layouts::parse_layout(name));
      ASSERT_EQ(layouts::shard_check(layouts_.back(), cfg_, kn_), "") << name;
    }
  }
  ModelConfig cfg_;
  Weights w_;
  Knobs kn_;
  std::vector<layouts::Layout> layouts_;
};

}  // namespace bp::test
