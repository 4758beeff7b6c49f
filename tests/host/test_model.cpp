// The reference model (SPEC.md §6) on the tiny fixtures under all four contracts:
// every path gives the same logprob bits (extend, chunked, decode, ragged), a
// sequence alone equals itself inside a batch (also where the log-probability ops
// read the logits in place, one call per sequence), captures agree across paths,
// negative controls (another kv block, the other dot model) change the bits, the
// backward gives finite non-zero gradients for every parameter with the same bits
// with 1 and with 2 threads (these on the CI half of the cases, model_cases.h; the
// other half in the slow twin), and golden digests pin logprobs, entropies and
// gradients of every case in CI.
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <ostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/io/hf_config.h"
#include "host/model.h"
#include "program/qwen3_program.h"
#include "reference/model/model_graph.h"
#include "reference/common/rng.h"
#include "support/golden.h"
#include "support/model_cases.h"

namespace {

using bp::host::Model;
using bp::program::Path;
using Seqs = std::vector<std::vector<int32_t>>;
using Rows = std::vector<std::vector<float>>;

constexpr uint64_t kWeightSeed = 20261122;
constexpr uint64_t kCoefSeed = 7;
const bp::ref::LossCoefficients kCoefs = bp::ref::LossCoefficients::generated(kCoefSeed);

using Case = bp::test::FixtureCase;
std::string case_name(const Case& c) { return c.fixture + "/" + c.contract; }

bp::ModelConfig load(const std::string& fixture) { return bp::test::load_fixture(fixture); }

// Three sequences: 23, 70 (crosses the 64-key block) and 41 tokens.
Seqs make_seqs(int64_t vocab) { return bp::test::make_seqs(vocab, {23, 70, 41}); }

using bp::test::flat;
using bp::test::same_bits;

class ModelTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    cfg_ = load(GetParam().fixture);
    w_ = bp::generate_weights(cfg_, kWeightSeed);
    contract_ = bp::find_contract(GetParam().contract);
    ASSERT_NE(contract_, nullptr);
    seqs_ = make_seqs(cfg_.vocab_size);
  }
  bp::ModelConfig cfg_;
  bp::Weights w_;
  const bp::Contract* contract_ = nullptr;
  Seqs seqs_;
};

TEST_P(ModelTest, EveryPathSameBits) {
  const Model m(cfg_, w_, contract_->knobs);
  bp::program::ForwardOptions opt;
  opt.entropy = true;
  const auto ext = m.forward(seqs_, Path::extend(), opt);
  const auto ref = flat(ext.logprob), ref_ent = flat(ext.entropy);
  for (float x : ref) ASSERT_TRUE(std::isfinite(x) && x <= 0.0f);
  const std::vector<std::pair<std::string, Path>> paths = {
      {"ragged", Path::ragged()},
      {"decode", Path::decode()},
      {"chunked 5", Path::chunked({5})},
      {"chunked 1,7,3", Path::chunked({1, 7, 3})},
      {"chunked 64,2", Path::chunked({64, 2})},
      {"chunked 17,40", Path::chunked({17, 40})},
  };
  for (const auto& [name, path] : paths) {
    const auto r = m.forward(seqs_, path, opt);
    EXPECT_TRUE(same_bits(flat(r.logprob), ref)) << name;
    EXPECT_TRUE(same_bits(flat(r.entropy), ref_ent)) << name;
  }
  // A sequence alone equals itself inside a ragged batch (and inside a batch in
  // another order, at another packed offset).
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const auto alone = m.forward({seqs_[s]}, Path::ragged(), opt);
    EXPECT_TRUE(same_bits(alone.logprob[0], ext.logprob[s])) << "sequence " << s;
  }
  const Seqs rev(seqs_.rbegin(), seqs_.rend());
  const auto r = m.forward(rev, Path::ragged(), opt);
  for (size_t s = 0; s < seqs_.size(); ++s)
    EXPECT_TRUE(same_bits(r.logprob[seqs_.size() - 1 - s], ext.logprob[s])) << "reversed batch, sequence " << s;
}

TEST_P(ModelTest, CapturesAgreeAcrossPaths) {
  const Model m(cfg_, w_, contract_->knobs);
  bp::program::ForwardOptions opt;
  opt.capture = true;
  const Seqs two = {seqs_[0], seqs_[1]};
  const auto a = m.forward(two, Path::ragged(), opt);
  const auto b = m.forward(two, Path::chunked({9, 30}), opt);
  ASSERT_EQ(a.captures.size(), b.captures.size());
  // embed + 17 per layer + final_norm + logits
  EXPECT_EQ(a.captures.size(), static_cast<size_t>(3 + 17 * cfg_.num_hidden_layers));
  EXPECT_EQ(a.captures.front().name, "embed");
  EXPECT_EQ(a.captures[4].name, "layers.0.v_proj");
  EXPECT_EQ(a.captures.back().name, "logits");
  for (size_t i = 0; i < a.captures.size(); ++i) {
    EXPECT_EQ(a.captures[i].name, b.captures[i].name);
    EXPECT_EQ(a.captures[i].shape, b.captures[i].shape);
    EXPECT_TRUE(a.captures[i].bf16_data == b.captures[i].bf16_data) << a.captures[i].name;
  }
  EXPECT_EQ(a.captures.back().shape, (std::vector<int64_t>{93, cfg_.vocab_size}));
}

// Layer-sliced verification's premise: a layer's output bits depend only on its
// input bits and the weights. Each layer and the head, replayed alone from the whole
// run's captured input, gives that run's captures, logprobs and entropies; an input
// one bit off changes them (the negative control).
TEST_P(ModelTest, LayerReplayEqualsWholeRun) {
  const Model m(cfg_, w_, contract_->knobs);
  bp::program::ForwardOptions opt;
  opt.capture = true;
  opt.entropy = true;
  const auto whole = m.forward(seqs_, Path::extend(), opt);
  auto captured = [&](const std::string& name) -> const std::vector<bp::bf16>& {
    for (const auto& c : whole.captures)
      if (c.name == name) return c.bf16_data;
    throw std::runtime_error("no capture " + name);
  };
  const int64_t L = cfg_.num_hidden_layers;
  for (int64_t stage = 0; stage <= L; ++stage) {
    std::map<int64_t, std::vector<bp::bf16>> inputs;
    inputs[stage] = captured(bp::graph::layer_input_name(stage));
    const std::set<int64_t> layers{stage};
    bp::program::ForwardOptions ro = opt;
    ro.capture_layers = &layers;
    ro.replay = &inputs;
    const auto replayed = m.forward(seqs_, Path::extend(), ro);
    const std::string prefix = stage == L ? "" : "layers." + std::to_string(stage) + ".";
    size_t compared = 0;
    for (const auto& c : replayed.captures) {
      if (c.name == "embed" || (stage < L && c.name.rfind(prefix, 0) != 0)) continue;
      EXPECT_TRUE(c.bf16_data == captured(c.name)) << "stage " << stage << ": " << c.name;
      ++compared;
    }
    EXPECT_GE(compared, stage == L ? 2u : 13u) << "stage " << stage;  // final_norm + logits; a layer's ops
    if (stage == L) {
      EXPECT_TRUE(same_bits(flat(replayed.logprob), flat(whole.logprob)));
      EXPECT_TRUE(same_bits(flat(replayed.entropy), flat(whole.entropy)));
    }
    // One bit of one input element off: the stage's first op differs.
    inputs[stage][5].bits ^= 0x0100;
    const auto off = m.forward(seqs_, Path::extend(), ro);
    const std::string first = stage == L ? "final_norm" : prefix + "input_norm";
    for (const auto& c : off.captures)
      if (c.name == first) {
        EXPECT_FALSE(c.bf16_data == captured(c.name)) << "negative control, stage " << stage;
      }
  }
  bp::program::ForwardOptions wrong_path = opt;
  std::map<int64_t, std::vector<bp::bf16>> none;
  wrong_path.replay = &none;
  EXPECT_THROW(m.forward(seqs_, Path::decode(), wrong_path), std::invalid_argument);
}

// The same for the backward: a layer replayed from its captured input and its output's
// gradient gives the whole backward's input gradient and parameter gradients of that
// layer; the head gives its own; an output gradient one bit off changes them.
TEST_P(ModelTest, LayerReplayBackwardEqualsWholeRun) {
  const Model m(cfg_, w_, contract_->knobs);
  bp::program::ForwardOptions fo;
  fo.capture = true;
  const auto fwd = m.forward(seqs_, Path::extend(), fo);
  bp::program::BackwardOptions capture;
  capture.capture_resid_grads = true;
  const auto whole = m.backward(seqs_, kCoefs, 1.0f, capture);
  const int64_t L = cfg_.num_hidden_layers;
  ASSERT_EQ(whole.captures.size(), static_cast<size_t>(L + 1));
  auto find = [](const auto& caps, const std::string& name) -> const std::vector<bp::bf16>& {
    for (const auto& c : caps)
      if (c.name == name) return c.bf16_data;
    throw std::runtime_error("no capture " + name);
  };
  const std::string layer_prefix = "model.layers.";
  for (int64_t li = 0; li < L; ++li) {
    std::map<int64_t, std::vector<bp::bf16>> inputs, dy;
    inputs[li] = find(fwd.captures, bp::graph::layer_input_name(li));
    inputs[L] = find(fwd.captures, bp::graph::layer_input_name(L));
    dy[li] = find(whole.captures, bp::graph::resid_grad_name(li + 1));
    bp::program::BackwardOptions bo = capture;
    bo.replay_inputs = &inputs;
    bo.replay_output_grads = &dy;
    const auto r = m.backward(seqs_, kCoefs, 1.0f, bo);
    EXPECT_TRUE(find(r.captures, bp::graph::resid_grad_name(li)) == find(whole.captures, bp::graph::resid_grad_name(li)))
        << "layer " << li;
    const std::string mine = layer_prefix + std::to_string(li) + ".";
    size_t layer_grads = 0;
    for (const auto& [name, g] : r.grads) {
      EXPECT_TRUE(same_bits(g, whole.grads.at(name))) << "layer " << li << ": " << name;
      if (name.rfind(layer_prefix, 0) == 0) {
        EXPECT_EQ(name.rfind(mine, 0), 0u) << name;  // only the replayed layer's
        ++layer_grads;
      }
    }
    EXPECT_GE(layer_grads, 9u) << "layer " << li;
    EXPECT_EQ(r.grads.count("model.embed_tokens.weight"), li == 0 ? 1u : 0u) << "layer " << li;
    dy[li][3].bits ^= 0x0100;  // negative control
    const auto off = m.backward(seqs_, kCoefs, 1.0f, bo);
    EXPECT_FALSE(same_bits(off.grads.at(mine + "input_layernorm.weight"),
                           whole.grads.at(mine + "input_layernorm.weight")))
        << "negative control, layer " << li;
  }
}

// Sequences long enough that the log-probability ops read the logits in place, a
// call per sequence (program/qwen3_program.h, in_place_runs; the CI batch's 23, 70
// and 41 tokens are gathered): each equals itself scored alone, in its logprobs and
// entropies and in the gradient that reaches the final norm (lm_head's input
// gradient and the norm's backward go row by row, so a token's row depends only on
// its own logits' gradient).
TEST_P(ModelTest, LongSequencesScoredInPlaceEqualAlone) {
  using bp::ref::LossCoefficients;
  auto target_rows = [](const Seqs& seqs) {  // every packed row but each sequence's last
    std::vector<int> rows;
    int t = 0;
    for (const auto& s : seqs)
      for (size_t i = 0; i < s.size(); ++i, ++t)
        if (i + 1 < s.size()) rows.push_back(t);
    return rows;
  };
  const Seqs seqs = bp::test::make_seqs(cfg_.vocab_size, {90, 130});
  ASSERT_EQ(bp::program::in_place_runs(target_rows(seqs)).size(), 2u);
  ASSERT_TRUE(bp::program::in_place_runs(target_rows(seqs_)).empty());

  const Model m(cfg_, w_, contract_->knobs);
  bp::program::ForwardOptions opt;
  opt.entropy = true;
  bp::program::BackwardOptions bo;
  bo.capture_resid_grads = true;
  const Rows c = kCoefs.for_batch(seqs);
  const auto fwd = m.forward(seqs, Path::extend(), opt);
  const auto bwd = m.backward(seqs, LossCoefficients::explicit_values(c), 1.0f, bo);
  const std::string top = bp::graph::resid_grad_name(cfg_.num_hidden_layers);
  auto top_grad = [&](const bp::program::BackwardResult& r) -> const std::vector<bp::bf16>& {
    for (const auto& cap : r.captures)
      if (cap.name == top) return cap.bf16_data;
    throw std::runtime_error("no capture " + top);
  };
  const size_t H = static_cast<size_t>(cfg_.hidden_size);
  size_t row0 = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto alone = m.forward({seqs[s]}, Path::extend(), opt);
    EXPECT_TRUE(same_bits(alone.logprob[0], fwd.logprob[s])) << "sequence " << s;
    EXPECT_TRUE(same_bits(alone.entropy[0], fwd.entropy[s])) << "sequence " << s;
    const auto alone_bwd = m.backward({seqs[s]}, LossCoefficients::explicit_values({c[s]}), 1.0f, bo);
    const std::vector<bp::bf16>& in_batch = top_grad(bwd);
    const std::vector<bp::bf16> mine(in_batch.begin() + static_cast<std::ptrdiff_t>(row0 * H),
                                     in_batch.begin() + static_cast<std::ptrdiff_t>((row0 + seqs[s].size()) * H));
    EXPECT_TRUE(mine == top_grad(alone_bwd)) << "final norm's input gradient, sequence " << s;
    row0 += seqs[s].size();
  }
}

TEST_P(ModelTest, NegativeControls) {
  const Model m(cfg_, w_, contract_->knobs);
  const auto ref = flat(m.forward(seqs_, Path::ragged()).logprob);
  bp::Knobs kb = contract_->knobs;
  kb.attn_kv_block = 32;  // the 70-token sequence's keys fall in other blocks
  EXPECT_FALSE(same_bits(flat(Model(cfg_, w_, kb).forward(seqs_, Path::ragged()).logprob), ref));
  bp::Knobs kd = contract_->knobs;
  kd.dot = kd.dot == bp::DotModel::Sm90Tc ? bp::DotModel::FmaSeq : bp::DotModel::Sm90Tc;
  EXPECT_FALSE(same_bits(flat(Model(cfg_, w_, kd).forward(seqs_, Path::ragged()).logprob), ref));
}

TEST_P(ModelTest, BackwardFiniteDeterministic) {
  const Model m(cfg_, w_, contract_->knobs);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto g1 = m.backward(seqs_, kCoefs);
  omp_set_num_threads(2);
  const auto g2 = m.backward(seqs_, kCoefs);
  omp_set_num_threads(threads);
  ASSERT_GE(omp_get_num_procs(), 1);

  // The backward's forward is the extend path.
  EXPECT_TRUE(same_bits(flat(g1.logprob), flat(m.forward(seqs_, Path::extend()).logprob)));
  EXPECT_EQ(flat(g1.coef).size(), flat(g1.logprob).size());
  EXPECT_EQ(g1.coef[0][0], bp::ref::loss_coef(kCoefSeed, 0));

  const auto specs = bp::weight_specs(cfg_);
  EXPECT_EQ(g1.grads.size(), specs.size());
  for (const auto& s : specs) {
    ASSERT_TRUE(g1.grads.count(s.name)) << s.name;
    const auto& g = g1.grads.at(s.name);
    ASSERT_EQ(static_cast<int64_t>(g.size()), s.numel()) << s.name;
    bool nonzero = false, finite = true;
    for (float x : g) {
      nonzero |= x != 0.0f;
      finite &= std::isfinite(x);
    }
    EXPECT_TRUE(nonzero) << s.name;
    EXPECT_TRUE(finite) << s.name;
    EXPECT_TRUE(same_bits(g, g2.grads.at(s.name))) << s.name << " (1 vs 2 threads)";
  }
}

// Explicit coefficients (SPEC.md §6.4) are used as given: the generated values
// given explicitly give the same bits; one value changed changes the gradients
// (negative control); a shape that is not the batch's is refused.
TEST_P(ModelTest, ExplicitCoefficients) {
  using bp::ref::LossCoefficients;
  const Model m(cfg_, w_, contract_->knobs);
  const auto gen = m.backward(seqs_, kCoefs);
  Rows c = kCoefs.for_batch(seqs_);
  const auto same = m.backward(seqs_, LossCoefficients::explicit_values(c));
  EXPECT_TRUE(same_bits(flat(same.coef), flat(gen.coef)));
  for (const auto& [name, g] : gen.grads) EXPECT_TRUE(same_bits(same.grads.at(name), g)) << name;

  c[1][5] += 0.5f;
  const auto other = m.backward(seqs_, LossCoefficients::explicit_values(c));
  EXPECT_EQ(other.coef[1][5], c[1][5]);
  EXPECT_TRUE(same_bits(flat(other.logprob), flat(gen.logprob)));  // the forward does not read c
  EXPECT_FALSE(same_bits(other.grads.at("model.norm.weight"), gen.grads.at("model.norm.weight")));

  Rows short_row = c;
  short_row[2].pop_back();
  EXPECT_THROW(m.backward(seqs_, LossCoefficients::explicit_values(short_row)), std::invalid_argument);
  EXPECT_THROW(m.backward(seqs_, LossCoefficients::explicit_values({c[0], c[1]})), std::invalid_argument);
  c[0][0] = std::nanf("");
  EXPECT_THROW(LossCoefficients::explicit_values(c), std::invalid_argument);
}

TEST_P(ModelTest, RefusesMissingWeight) {
  bp::Weights w;
  for (const auto& [name, t] : w_.all())
    if (name != "model.layers.1.self_attn.k_norm.weight") w.insert(name, t);
  EXPECT_THROW(Model(cfg_, w, contract_->knobs), std::invalid_argument);
  const Model m(cfg_, w_, contract_->knobs);
  EXPECT_THROW(m.forward({{1, 2, 3}, {}}, Path::extend()), std::invalid_argument);
  EXPECT_THROW(m.forward(seqs_, Path::chunked({})), std::invalid_argument);
}

// A sanity check of the gradient's meaning (not of its bits): moving a parameter
// tensor by a small step along sign(dL/dw) raises L, against it lowers L, with the
// first-order change Σ|g|·step predicting the difference within a factor of two.
TEST_P(ModelTest, GradientPointsUphill) {
  const auto g = Model(cfg_, w_, contract_->knobs).backward(seqs_, kCoefs);
  auto loss = [&](const bp::Weights& w) {
    const auto lp = Model(cfg_, w, contract_->knobs).forward(seqs_, Path::ragged()).logprob;
    double L = 0;
    for (size_t s = 0; s < lp.size(); ++s)
      for (size_t t = 0; t < lp[s].size(); ++t) L += static_cast<double>(g.coef[s][t]) * lp[s][t];
    return L;
  };
  const double L0 = loss(w_);
  for (const auto& [name, step] : std::vector<std::pair<std::string, float>>{
           {"model.norm.weight", 0.01f}, {"model.embed_tokens.weight", 0.01f}, {"model.layers.1.input_layernorm.weight", 0.01f},
           {"model.layers.0.self_attn.q_proj.weight", 0.002f},
           {"model.layers.0.self_attn.v_proj.weight", 0.002f},
           {"model.layers.2.mlp.gate_proj.weight", 0.002f}}) {
    if (!w_.contains(name)) continue;
    const auto& gr = g.grads.at(name);
    double pred = 0;
    bp::Weights up = w_, down = w_;
    auto& wu = up.at(name).data;
    auto& wd = down.at(name).data;
    for (size_t i = 0; i < gr.size(); ++i) {
      if (gr[i] == 0.0f) continue;
      const float sgn = gr[i] > 0 ? step : -step;
      const float x = bp::widen(wu[i]);
      wu[i] = bp::round_bf16(x + sgn);
      wd[i] = bp::round_bf16(x - sgn);
      pred += std::fabs(static_cast<double>(gr[i])) *
              (static_cast<double>(bp::widen(wu[i])) - static_cast<double>(bp::widen(wd[i]))) / 2.0 * (gr[i] > 0 ? 1 : -1);
    }
    const double Lu = loss(up), Ld = loss(down);
    EXPECT_GT(Lu, L0) << name;
    EXPECT_LT(Ld, L0) << name;
    const double diff = (Lu - Ld) / 2.0;
    EXPECT_GT(diff, 0.5 * pred) << name << " pred " << pred;
    EXPECT_LT(diff, 2.0 * pred) << name << " pred " << pred;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelTest, bp::test::ci_fixture_cases(), bp::test::fixture_case_name);
INSTANTIATE_TEST_SUITE_P(SlowFixtures, ModelTest, bp::test::slow_fixture_cases(), bp::test::fixture_case_name);

// Golden digests of every case (v1's unchanged since v1; v2's pinned at its
// release): the extend path's logprobs and entropies, and a few gradients.
class ModelGolden : public ModelTest {};

TEST_P(ModelGolden, DigestsPinned) {
  const Model m(cfg_, w_, contract_->knobs);
  bp::program::ForwardOptions opt;
  opt.entropy = true;
  const auto ext = m.forward(seqs_, Path::extend(), opt);
  bp::test::expect_golden("model.txt", case_name(GetParam()) + "/logprob", bp::test::digest(flat(ext.logprob)));
  bp::test::expect_golden("model.txt", case_name(GetParam()) + "/entropy", bp::test::digest(flat(ext.entropy)));
  const auto g = m.backward(seqs_, kCoefs);
  const std::string base = case_name(GetParam()) + "/grad/";
  std::vector<std::string> pinned = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                     "model.layers.0.input_layernorm.weight", "model.norm.weight"};
  const int64_t last = cfg_.num_hidden_layers - 1;
  if (cfg_.is_moe_layer(last)) {
    pinned.push_back("model.layers." + std::to_string(last) + ".mlp.gate.weight");
    pinned.push_back("model.layers." + std::to_string(last) + ".mlp.experts.3.down_proj.weight");
  } else {
    pinned.push_back("model.layers." + std::to_string(last) + ".mlp.down_proj.weight");
  }
  if (!cfg_.tie_word_embeddings) pinned.push_back("lm_head.weight");
  for (const auto& n : pinned) bp::test::expect_golden("model.txt", base + n, bp::test::digest(g.grads.at(n)));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelGolden, bp::test::every_fixture_case(), bp::test::fixture_case_name);

}  // namespace

// Issue 4's "done when": a Qwen3-30B-A3B-shaped single layer (hidden 2048, 32/4
// heads, 128 experts top-8, vocab 151936, untied) forward and backward on the CPU.
// Slow set only; prints its times.
TEST(Model30B, SlowOneLayerForwardBackward) {
  bp::ModelConfig cfg = load("qwen3-30b-a3b");
  cfg.num_hidden_layers = 1;
  ASSERT_TRUE(cfg.is_moe_layer(0));
  const auto t0 = std::chrono::steady_clock::now();
  const bp::Weights w = bp::generate_weights(cfg, kWeightSeed);
  const auto t1 = std::chrono::steady_clock::now();
  const Model m(cfg, w, bp::find_contract("bf16-sm90tc-v1")->knobs);
  Seqs seqs = {make_seqs(cfg.vocab_size)[0]};
  seqs[0].resize(16);
  const auto ext = m.forward(seqs, Path::extend());
  const auto t2 = std::chrono::steady_clock::now();
  const auto dec = m.forward(seqs, Path::decode());
  EXPECT_TRUE(same_bits(flat(dec.logprob), flat(ext.logprob)));
  const auto t3 = std::chrono::steady_clock::now();
  const auto g = m.backward(seqs, kCoefs);
  const auto t4 = std::chrono::steady_clock::now();
  EXPECT_TRUE(same_bits(flat(g.logprob), flat(ext.logprob)));
  for (const auto& [name, gr] : g.grads) {
    bool finite = true;
    for (float x : gr) finite &= std::isfinite(x);
    EXPECT_TRUE(finite) << name;
  }
  auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf("30B-A3B one layer, 16 tokens, %d threads: weights %.1f s, forward %.1f s, decode %.1f s, backward %.1f s\n",
              omp_get_max_threads(), s(t0, t1), s(t1, t2), s(t2, t3), s(t3, t4));
}
