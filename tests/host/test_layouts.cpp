// The layouts proof (SPEC.md §7, issue 4): under every layout of
// {TP 1,2,4} × {EP 1,2,4} × {CP 1, 2 contiguous, 2 zigzag} the tiny fixtures allow,
// every path gives logprobs (and entropies) bit-identical to the unsharded
// full-sequence reference, and the backward gives every parameter gradient
// bit-identical to the unsharded backward — for all four contracts (v1's two-pass
// and v2's one-pass vocabulary-parallel log-softmax). The `cpu` set runs a subset
// that still covers each mechanism (TP, EP, CP both splits, token splits over
// several gradient chunks, a sequence longer than one attention chunk) on half the
// (fixture, contract) cases (model_cases.h); the `slow` twin runs the other half
// and the whole matrix for all. Negative control: the ring reduction (a local chain
// per rank, then NCCL's ring order) makes TP = 2 differ.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "host/layouts.h"
#include "program/layouts/sharding.h"
#include "support/model_cases.h"

namespace {

using bp::layouts::CpSplit;
using bp::layouts::Layout;
using bp::layouts::Reduction;
using bp::ref::Path;
using bp::test::flat;
using bp::test::same_bits;
using bp::test::Seqs;

using Case = bp::test::FixtureCase;
constexpr uint64_t kCoefSeed = bp::test::kFixtureCoefSeed;
const bp::ref::LossCoefficients kCoefs = bp::ref::LossCoefficients::generated(kCoefSeed);

// Every layout of the matrix the model allows.
std::vector<Layout> matrix(const bp::ModelConfig& cfg, const bp::Knobs& kn) {
  std::vector<Layout> out;
  for (int tp : {1, 2, 4})
    for (int ep : {1, 2, 4})
      for (auto [cp, split] : {std::pair{1, CpSplit::Contiguous}, {2, CpSplit::Contiguous}, {2, CpSplit::Zigzag}}) {
        const Layout l{tp, ep, cp, split, Reduction::Tree};
        if (bp::layouts::shard_check(l, cfg, kn).empty()) out.push_back(l);
      }
  return out;
}

// CI subsets: each mechanism once, and layouts that combine them all.
std::vector<Layout> subset(const bp::ModelConfig& cfg, const bp::Knobs& kn, std::vector<const char*> names) {
  std::vector<Layout> out;
  for (const char* name : names) {
    Layout l = *bp::layouts::parse_layout(name);
    if (!cfg.is_moe_model()) l.ep = 1;
    if (std::find(out.begin(), out.end(), l) == out.end() && bp::layouts::shard_check(l, cfg, kn).empty())
      out.push_back(l);
  }
  return out;
}

const std::vector<std::pair<std::string, Path>>& paths() {
  static const std::vector<std::pair<std::string, Path>> p = {{"extend", Path::extend()},
                                                                  {"ragged", Path::ragged()},
                                                                  {"chunked:5,3", Path::chunked({5, 3})},
                                                                  {"decode", Path::decode()}};
  return p;
}

class LayoutsTest : public bp::test::FixtureTest {
 protected:
  void SetUp() override {
    FixtureTest::SetUp();
    grad_seqs_ = bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutGradLengths);
    path_seqs_ = bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutPathLengths);
  }

  void expect_forward_exact(const std::vector<Layout>& layouts, const std::vector<std::string>& path_names) {
    const bp::ref::Model ref(cfg_, w_, kn_);
    bp::ref::ForwardOptions opt;
    opt.entropy = true;
    const auto want = ref.forward(path_seqs_, Path::extend(), opt);
    for (const Layout& l : layouts)
      for (const auto& [name, path] : paths()) {
        if (std::find(path_names.begin(), path_names.end(), name) == path_names.end()) continue;
        const auto got = bp::layouts::forward(cfg_, w_, kn_, l, path_seqs_, path, opt);
        EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob))) << l.name() << " " << name;
        EXPECT_TRUE(same_bits(flat(got.entropy), flat(want.entropy))) << l.name() << " " << name;
      }
  }

  void expect_backward_exact(const std::vector<Layout>& layouts, const bp::ref::LossCoefficients& coefs = kCoefs) {
    const auto want = bp::ref::Model(cfg_, w_, kn_).backward(grad_seqs_, coefs);
    for (const Layout& l : layouts) {
      const auto got = bp::layouts::backward(cfg_, w_, kn_, l, grad_seqs_, coefs);
      EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob))) << l.name();
      EXPECT_TRUE(same_bits(flat(got.coef), flat(want.coef))) << l.name();
      ASSERT_EQ(got.grads.size(), want.grads.size()) << l.name();
      for (const auto& [name, g] : want.grads) {
        ASSERT_TRUE(got.grads.count(name)) << l.name() << " lacks " << name;
        EXPECT_TRUE(same_bits(got.grads.at(name), g)) << l.name() << " " << name;
      }
    }
  }

  Seqs grad_seqs_, path_seqs_;
};

TEST_P(LayoutsTest, ForwardSubsetEveryPathExact) {
  expect_forward_exact(subset(cfg_, kn_, {"tp2-ep1-cp1", "tp1-ep1-cp2z", "tp4-ep2-cp1", "tp2-ep4-cp2"}),
                       {"extend", "ragged", "chunked:5,3", "decode"});
}

TEST_P(LayoutsTest, BackwardSubsetExact) {
  expect_backward_exact(subset(cfg_, kn_, {"tp2-ep2-cp2z", "tp4-ep4-cp1", "tp1-ep1-cp2"}));
}

// Explicit coefficients (a trainer's advantages: not the generated ones) reach every
// rank: the layouts' gradients equal the unsharded model's under them too.
TEST_P(LayoutsTest, BackwardExplicitCoefficientsExact) {
  std::vector<std::vector<float>> c;
  for (const auto& s : grad_seqs_) {
    c.emplace_back();
    for (size_t t = 0; t + 1 < s.size(); ++t) c.back().push_back(static_cast<float>(t % 5) * 0.75f - 1.25f);
  }
  expect_backward_exact(subset(cfg_, kn_, {"tp2-ep2-cp2z", "tp4-ep1-cp1"}),
                        bp::ref::LossCoefficients::explicit_values(c));
}

TEST_P(LayoutsTest, SlowWholeMatrixExact) {
  const auto start = std::chrono::steady_clock::now();
  const auto all = matrix(cfg_, kn_);
  expect_forward_exact(all, {"extend", "ragged", "chunked:5,3", "decode"});
  expect_backward_exact(all);
  std::printf("[ layouts ] %zu layouts x %zu paths + backward: %.1f s\n", all.size(), paths().size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// Every op's captured output is the unsharded model's, row for row.
TEST_P(LayoutsTest, CapturesExact) {
  bp::ref::ForwardOptions opt;
  opt.capture = true;
  const auto want = bp::ref::Model(cfg_, w_, kn_).forward(path_seqs_, Path::extend(), opt);
  Layout l = *bp::layouts::parse_layout(cfg_.is_moe_model() ? "tp2-ep2-cp2z" : "tp2-ep1-cp2z");
  const auto got = bp::layouts::forward(cfg_, w_, kn_, l, path_seqs_, Path::chunked({4}), opt);
  ASSERT_EQ(got.captures.size(), want.captures.size());
  for (size_t i = 0; i < want.captures.size(); ++i) {
    EXPECT_EQ(got.captures[i].name, want.captures[i].name);
    EXPECT_EQ(got.captures[i].shape, want.captures[i].shape) << want.captures[i].name;
    EXPECT_TRUE(got.captures[i].bf16_data == want.captures[i].bf16_data) << want.captures[i].name;
  }
}

// The comparison bites: a framework's TP (a local GEMM chain per rank, then NCCL's
// ring all-reduce) changes the bits with the TP size; the contract's tree does
// not. The first op to differ is a row-parallel output (o_proj or down_proj: a bf16
// rounding of a differently summed fp32 value flips now and then). Under v1 the
// ring also sums the vocabulary chunk sums, and logprobs differ too where that sum
// is not dominated by one logit (the MoE fixture's untied head); v2's log-softmax
// has no all-reduce for the ring to replace (SPEC.md §7), and on these fixtures the
// flipped roundings do not reach the logits.
TEST_P(LayoutsTest, RingReductionIsNotLayoutInvariant) {
  bp::ref::ForwardOptions opt;
  opt.capture = true;
  auto run = [&](const char* layout) {
    return bp::layouts::forward(cfg_, w_, kn_, *bp::layouts::parse_layout(layout), path_seqs_, Path::extend(),
                                opt);
  };
  auto first_difference = [](const bp::ref::ForwardResult& a, const bp::ref::ForwardResult& b) -> std::string {
    for (size_t i = 0; i < a.captures.size(); ++i)
      if (a.captures[i].bf16_data != b.captures[i].bf16_data) return a.captures[i].name;
    return same_bits(flat(a.logprob), flat(b.logprob)) ? "" : "logprob";
  };
  const auto ref = bp::ref::Model(cfg_, w_, kn_).forward(path_seqs_, Path::extend(), opt);
  const auto ring1 = run("tp1-ep1-cp1+ring"), ring2 = run("tp2-ep1-cp1+ring"), tree2 = run("tp2-ep1-cp1");
  auto row_parallel_output = [](const std::string& op) {
    return op.ends_with(".attn_out") || op.ends_with(".mlp_out");
  };
  EXPECT_PRED1(row_parallel_output, first_difference(ring2, ref));
  EXPECT_PRED1(row_parallel_output, first_difference(ring2, ring1));
  EXPECT_EQ(first_difference(tree2, ref), "");
  if (cfg_.is_moe_model() && kn_.log_softmax == bp::LogSoftmax::kTwoPass) {
    EXPECT_FALSE(same_bits(flat(ring2.logprob), flat(ring1.logprob)));
    EXPECT_FALSE(same_bits(flat(ring2.logprob), flat(ref.logprob)));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LayoutsTest, bp::test::ci_fixture_cases(), bp::test::fixture_case_name);
INSTANTIATE_TEST_SUITE_P(SlowFixtures, LayoutsTest, bp::test::slow_fixture_cases(), bp::test::fixture_case_name);

// ---- Layout names, sharding rules, refusals ---------------------------------------

TEST(Layout, NamesRoundTrip) {
  for (const char* s : {"tp1-ep1-cp1", "tp2-ep4-cp2z", "tp4-ep1-cp2+ring", "tp1-ep2-cp2z+ring"}) {
    const auto l = bp::layouts::parse_layout(s);
    ASSERT_TRUE(l) << s;
    EXPECT_EQ(l->name(), s);
  }
  for (const char* s : {"", "tp0-ep1-cp1", "tp2", "tp2-ep1-cp1x", "TP2-EP1-CP1", "tp2-ep1-cp1 "}) {
    std::string why;
    EXPECT_FALSE(bp::layouts::parse_layout(s, &why)) << s;
    EXPECT_NE(why.find("tp<N>-ep<N>-cp<N>"), std::string::npos) << why;
  }
}

TEST(Layout, CpOwnersSplitEvenlyContiguousAndZigzag) {
  const Layout cont{1, 1, 2, CpSplit::Contiguous}, zig{1, 1, 2, CpSplit::Zigzag};
  // 10 positions: contiguous [0,5) [5,10); zigzag parts [0,2) [2,5) [5,7) [7,10) on 0 1 1 0.
  const int want_cont[] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, want_zig[] = {0, 0, 1, 1, 1, 1, 1, 0, 0, 0};
  for (int p = 0; p < 10; ++p) {
    EXPECT_EQ(bp::layouts::cp_owner(cont, p, 10), want_cont[p]) << p;
    EXPECT_EQ(bp::layouts::cp_owner(zig, p, 10), want_zig[p]) << p;
  }
  for (int S = 1; S < 40; ++S)  // every position has exactly one owner in range, parts in order
    for (int p = 0; p < S; ++p) EXPECT_LT(bp::layouts::cp_owner(zig, p, S), 2);
}

TEST(Layout, RefusesWhatTheModelCannotShard) {
  const bp::Knobs kn = bp::find_contract("bf16-sm90tc-v1")->knobs;
  bp::ModelConfig dense = bp::test::load_fixture("qwen3-dense-tiny"), moe = bp::test::load_fixture("qwen3-moe-tiny");
  auto why = [&](const char* layout, const bp::ModelConfig& c) {
    return bp::layouts::shard_check(*bp::layouts::parse_layout(layout), c, kn);
  };
  EXPECT_EQ(why("tp4-ep4-cp2z", moe), "");
  EXPECT_NE(why("tp3-ep1-cp1", dense).find("tp 3 does not divide"), std::string::npos);
  EXPECT_NE(why("tp1-ep2-cp1", dense).find("needs a MoE model"), std::string::npos);
  EXPECT_NE(why("tp1-ep3-cp1", moe).find("ep 3 does not divide num_experts 8"), std::string::npos);
  EXPECT_NE(why("tp8-ep1-cp1", moe).find("num_key_value_heads 4"), std::string::npos);
  const auto w = bp::generate_weights(dense, bp::test::kFixtureWeightSeed);
  EXPECT_THROW(bp::layouts::forward(dense, w, kn, *bp::layouts::parse_layout("tp1-ep2-cp1"), {{1, 2}},
                                    Path::extend()),
               std::invalid_argument);
}

// A rank that fails (a token outside the vocabulary on one rank only) fails the
// run with its own message, and the other ranks are released, not deadlocked.
TEST(Layout, RankFailureIsReportedNotDeadlocked) {
  const bp::Knobs kn = bp::find_contract("bf16-fmaseq-v1")->knobs;
  const bp::ModelConfig cfg = bp::test::load_fixture("qwen3-moe-tiny");
  const auto w = bp::generate_weights(cfg, bp::test::kFixtureWeightSeed);
  Seqs seqs = bp::test::make_seqs(cfg.vocab_size, {6, 6});
  seqs[1][4] = static_cast<int32_t>(cfg.vocab_size);  // on rank e = 1, c = 1 only
  try {
    bp::layouts::forward(cfg, w, kn, *bp::layouts::parse_layout("tp2-ep2-cp2"), seqs, Path::extend());
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("512"), std::string::npos) << e.what();
  }
}

}  // namespace
