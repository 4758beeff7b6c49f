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
// Replicated kv heads (tp a multiple of num_key_value_heads, up to tp 8): MQA, GQA and
// a Qwen3-30B-A3B-shaped MoE under all four contracts, every path and the backward,
// exact likewise (larger layouts in the slow twin); their negative control cuts a
// GQA group's dk/dv chain between replicas.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <type_traits>

#include "host/layouts.h"
#include "reference/common/rng.h"
#include "reference/ops/attention.h"
#include "program/layouts/sharding.h"
#include "support/model_cases.h"

namespace {

using bp::bf16;
using bp::layouts::CpSplit;
using bp::layouts::Layout;
using bp::layouts::Reduction;
using bp::program::Path;
using bp::test::expect_same_backward;
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
const std::vector<std::string> kEveryPath = {"extend", "ragged", "chunked:5,3", "decode"};

// Each layout on each named path: logprobs and entropies equal the unsharded extend's.
void expect_forward_exact(const bp::ModelConfig& cfg, const bp::Weights& w, const bp::Knobs& kn, const Seqs& seqs,
                          const std::vector<Layout>& layouts, const std::vector<std::string>& path_names) {
  const bp::host::Model ref(cfg, w, kn);
  bp::program::ForwardOptions opt;
  opt.entropy = true;
  const auto want = ref.forward(seqs, Path::extend(), opt);
  for (const Layout& l : layouts)
    for (const auto& [name, path] : paths()) {
      if (std::find(path_names.begin(), path_names.end(), name) == path_names.end()) continue;
      const auto got = bp::host::sharded_forward(cfg, w, kn, l, seqs, path, opt);
      EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob))) << l.name() << " " << name;
      EXPECT_TRUE(same_bits(flat(got.entropy), flat(want.entropy))) << l.name() << " " << name;
    }
}

// Each layout's backward: logprobs, coefficients and every gradient equal the unsharded backward's.
void expect_backward_exact(const bp::ModelConfig& cfg, const bp::Weights& w, const bp::Knobs& kn, const Seqs& seqs,
                           const std::vector<Layout>& layouts, const bp::ref::LossCoefficients& coefs = kCoefs) {
  const auto want = bp::host::Model(cfg, w, kn).backward(seqs, coefs);
  for (const Layout& l : layouts) {
    expect_same_backward(bp::host::sharded_backward(cfg, w, kn, l, seqs, coefs), want, l.name());
  }
}

// Every op's captured output under the layout and path is the unsharded extend's, row for row.
void expect_captures_exact(const bp::ModelConfig& cfg, const bp::Weights& w, const bp::Knobs& kn, const Seqs& seqs,
                           const Layout& l, const Path& path) {
  bp::program::ForwardOptions opt;
  opt.capture = true;
  const auto want = bp::host::Model(cfg, w, kn).forward(seqs, Path::extend(), opt);
  const auto got = bp::host::sharded_forward(cfg, w, kn, l, seqs, path, opt);
  ASSERT_EQ(got.captures.size(), want.captures.size()) << l.name();
  for (size_t i = 0; i < want.captures.size(); ++i) {
    EXPECT_EQ(got.captures[i].name, want.captures[i].name) << l.name();
    EXPECT_EQ(got.captures[i].shape, want.captures[i].shape) << l.name() << " " << want.captures[i].name;
    EXPECT_TRUE(got.captures[i].bf16_data == want.captures[i].bf16_data) << l.name() << " " << want.captures[i].name;
  }
}

class LayoutsTest : public bp::test::FixtureTest {
 protected:
  void SetUp() override {
    FixtureTest::SetUp();
    grad_seqs_ = bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutGradLengths);
    path_seqs_ = bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutPathLengths);
  }

  void expect_forward_exact(const std::vector<Layout>& layouts, const std::vector<std::string>& path_names) {
    ::expect_forward_exact(cfg_, w_, kn_, path_seqs_, layouts, path_names);
  }
  void expect_backward_exact(const std::vector<Layout>& layouts, const bp::ref::LossCoefficients& coefs = kCoefs) {
    ::expect_backward_exact(cfg_, w_, kn_, grad_seqs_, layouts, coefs);
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
  const Layout l = *bp::layouts::parse_layout(cfg_.is_moe_model() ? "tp2-ep2-cp2z" : "tp2-ep1-cp2z");
  expect_captures_exact(cfg_, w_, kn_, path_seqs_, l, Path::chunked({4}));
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
  bp::program::ForwardOptions opt;
  opt.capture = true;
  auto run = [&](const char* layout) {
    return bp::host::sharded_forward(cfg_, w_, kn_, *bp::layouts::parse_layout(layout), path_seqs_, Path::extend(),
                                opt);
  };
  auto first_difference = [](const bp::program::ForwardResult& a, const bp::program::ForwardResult& b) -> std::string {
    for (size_t i = 0; i < a.captures.size(); ++i)
      if (a.captures[i].bf16_data != b.captures[i].bf16_data) return a.captures[i].name;
    return same_bits(flat(a.logprob), flat(b.logprob)) ? "" : "logprob";
  };
  const auto ref = bp::host::Model(cfg_, w_, kn_).forward(path_seqs_, Path::extend(), opt);
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

// ---- Replicated kv heads (SPEC.md §7): tp a multiple of num_key_value_heads ---------

using bp::test::replica_model;

class ReplicatedKvTest : public bp::test::DerivedModelTest {
 protected:
  void SetUp() override {
    DerivedModelTest::SetUp();
    for (const Layout& l : layouts_) ASSERT_GT(l.tp, cfg_.num_key_value_heads) << l.name() << " replicates no kv head";
  }
};

TEST_P(ReplicatedKvTest, ForwardEveryPathExact) {
  expect_forward_exact(cfg_, w_, kn_, bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutPathLengths), layouts_,
                       kEveryPath);
}

TEST_P(ReplicatedKvTest, BackwardExact) {
  expect_backward_exact(cfg_, w_, kn_, bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutGradLengths), layouts_);
}

// k and v captures come from one replica per kv head, at its head's columns.
TEST_P(ReplicatedKvTest, CapturesExact) {
  expect_captures_exact(cfg_, w_, kn_, bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutPathLengths),
                        layouts_.back(), Path::chunked({4}));
}

INSTANTIATE_TEST_SUITE_P(Models, ReplicatedKvTest, ::testing::ValuesIn(bp::test::replica_cases(true)),
                         bp::test::replica_case_name);
INSTANTIATE_TEST_SUITE_P(SlowModels, ReplicatedKvTest, ::testing::ValuesIn(bp::test::replica_cases(false)),
                         bp::test::replica_case_name);

// The negative control of the replicated layouts' dk/dv: the chain over a group's
// (query, head) slots cut between replicas — each replica's partials over its own
// query heads, summed — is not the group's chain (SPEC.md §5.6), so a layout that
// did so would fail BackwardExact; the whole group's chain on the gathered query
// side (what the replicas compute) is.
TEST(ReplicatedKv, GroupChainCutBetweenReplicasDiffers) {
  constexpr int G = 8, D = 64, S = 600, R = 2;  // one kv head, two replicas of four query heads; 5 chunks
  for (const bp::Contract& contract : bp::contracts()) {
    SCOPED_TRACE(contract.name);
    const bp::Knobs& kn = contract.knobs;
    const auto q = bp::random_bf16(size_t{S} * G * D, 1, 1.0f), k = bp::random_bf16(size_t{S} * D, 2, 1.0f),
               v = bp::random_bf16(size_t{S} * D, 3, 1.0f), dout = bp::random_bf16(size_t{S} * G * D, 4, 1.0f);
    std::vector<bf16> o(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<float> m(size_t{S} * G), l(m.size());
    const bp::ref::AttnSeq seq{0, S, 0, 0};
    bp::ref::attention_fwd(kn, {G, 1, D}, &seq, 1, q.data(), k.data(), v.data(), o.data(), m.data(), l.data());
    bp::ref::attention_bwd(kn, {G, 1, D}, &seq, 1, q.data(), k.data(), v.data(), o.data(), m.data(), l.data(),
                           dout.data(), dq.data(), dk.data(), dv.data());

    const int chunks = (S + kn.grad_token_chunk - 1) / kn.grad_token_chunk;
    auto kv_from = [&](int heads, const std::vector<bf16>& q_, const std::vector<bf16>& o_,
                       const std::vector<float>& m_, const std::vector<float>& l_, const std::vector<bf16>& do_,
                       std::vector<float>& pk, std::vector<float>& pv) {
      pk.assign(static_cast<size_t>(chunks) * S * D, 0.0f);
      pv.assign(pk.size(), 0.0f);
      bp::ref::attention_bwd_kv_partials(kn, {heads, 1, D}, seq, q_.data(), k.data(), v.data(), o_.data(), m_.data(),
                                         l_.data(), do_.data(), pk.data(), pv.data());
    };
    auto combine = [&](const std::vector<float>& pk, const std::vector<float>& pv) {
      std::pair<std::vector<bf16>, std::vector<bf16>> out{std::vector<bf16>(k.size()), std::vector<bf16>(v.size())};
      bp::ref::attention_bwd_kv_combine(kn, {1, 1, D}, S, chunks, pk.data(), pv.data(), out.first.data(),
                                        out.second.data());
      return out;
    };
    // The gathered group: the layout's replicas' computation.
    std::vector<float> pk, pv;
    kv_from(G, q, o, m, l, dout, pk, pv);
    const auto whole = combine(pk, pv);
    EXPECT_TRUE(whole.first == dk && whole.second == dv);

    // Cut: replica r's query heads [r·G/R, (r+1)·G/R) alone, partials summed over replicas.
    std::vector<float> sum_k(static_cast<size_t>(chunks) * S * D, 0.0f), sum_v(sum_k.size(), 0.0f);
    for (int r = 0; r < R; ++r) {
      const int Hr = G / R;
      auto heads_of = [&](const auto& full, int width) {
        std::decay_t<decltype(full)> part;
        for (int t = 0; t < S; ++t)
          part.insert(part.end(), full.begin() + (int64_t{t} * G + r * Hr) * width,
                      full.begin() + (int64_t{t} * G + (r + 1) * Hr) * width);
        return part;
      };
      kv_from(Hr, heads_of(q, D), heads_of(o, D), heads_of(m, 1), heads_of(l, 1), heads_of(dout, D), pk, pv);
      for (size_t i = 0; i < sum_k.size(); ++i) {
        sum_k[i] += pk[i];
        sum_v[i] += pv[i];
      }
    }
    const auto cut = combine(sum_k, sum_v);
    auto differing = [](const std::vector<bf16>& a, const std::vector<bf16>& b) {
      int n = 0;
      for (size_t i = 0; i < a.size(); ++i) n += a[i].bits != b[i].bits;
      return n;
    };
    // A few dozen of the 38,400 elements: the fp32 orders differ by far less than a bf16 ulp.
    EXPECT_GT(differing(cut.first, dk), 0);
    EXPECT_GT(differing(cut.second, dv), 0);
  }
}

// The comparison bites on a replicated layout too: the ring reduction at tp 8
// changes gradients that the tree keeps.
TEST(ReplicatedKv, RingReductionDiffers) {
  const bp::ModelConfig cfg = replica_model("mqa");
  const bp::Knobs kn = bp::find_contract("bf16-sm90tc-v2")->knobs;
  const auto w = bp::generate_weights(cfg, bp::test::kFixtureWeightSeed);
  const Seqs seqs = bp::test::make_seqs(cfg.vocab_size, {23, 41});
  const auto want = bp::host::Model(cfg, w, kn).backward(seqs, kCoefs);
  const auto ring = bp::host::sharded_backward(cfg, w, kn, *bp::layouts::parse_layout("tp8-ep1-cp1+ring"), seqs, kCoefs);
  int differ = 0;
  for (const auto& [name, g] : want.grads) differ += !same_bits(ring.grads.at(name), g);
  EXPECT_GT(differ, 0);
}

// ---- Sizes that are not multiples of tp_tree_width (SPEC.md §2.4.1, §7) -----------
// The unsharded model runs them (fixed chunks, the last short or empty); every path
// of the reference model gives its extend's bits, and emulated ranks at tp 1 with ep
// and cp give the reference's forward and backward bits.

class OddSizeTest : public bp::test::DerivedModelTest {};

TEST_P(OddSizeTest, ReferenceEveryPathEqualsExtend) {
  const Seqs seqs = bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutPathLengths);
  const bp::host::Model ref(cfg_, w_, kn_);
  bp::program::ForwardOptions opt;
  opt.entropy = true;
  const auto want = ref.forward(seqs, Path::extend(), opt);
  for (const auto& [name, path] : paths()) {
    const auto got = ref.forward(seqs, path, opt);
    EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob))) << name;
    EXPECT_TRUE(same_bits(flat(got.entropy), flat(want.entropy))) << name;
  }
}

TEST_P(OddSizeTest, LayoutsForwardEveryPathExact) {
  expect_forward_exact(cfg_, w_, kn_, bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutPathLengths), layouts_,
                       kEveryPath);
}

TEST_P(OddSizeTest, LayoutsBackwardExact) {
  expect_backward_exact(cfg_, w_, kn_, bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutGradLengths), layouts_);
}

INSTANTIATE_TEST_SUITE_P(Models, OddSizeTest, ::testing::ValuesIn(bp::test::odd_size_cases(false)),
                         bp::test::replica_case_name);

// tp > 1 needs q and kv dims in whole chunks (heads split evenly) and some of I and
// V on every rank: refused otherwise, naming the size; odd I and V shard.
TEST(OddSize, ShardedTpRefusedNamingTheSize) {
  const bp::Knobs kn = bp::find_contract("bf16-sm90tc-v1")->knobs;
  auto why = [&](const bp::ModelConfig& cfg, const char* layout) {
    return bp::layouts::shard_check(*bp::layouts::parse_layout(layout), cfg, kn);
  };
  bp::ModelConfig q108 = bp::test::load_fixture("qwen3-dense-tiny");
  q108.num_attention_heads = 6;
  q108.num_key_value_heads = 2;
  q108.head_dim = 18;
  EXPECT_NE(
      why(q108, "tp2-ep1-cp1").find("tp 2 needs q dim (heads x head_dim) 108 to be a multiple of tp_tree_width 8"),
      std::string::npos)
      << why(q108, "tp2-ep1-cp1");
  // I = 49 in chunks of 7: rank 7 of tp 8 would hold chunk 7 alone, which is empty.
  const bp::ModelConfig moe = bp::test::odd_size_model("odd-moe");
  EXPECT_NE(why(moe, "tp8-ep1-cp1").find("tp 8 would leave rank 7 no element of intermediate_size 49"),
            std::string::npos)
      << why(moe, "tp8-ep1-cp1");
  bp::ModelConfig vocab = bp::test::load_fixture("qwen3-dense-tiny");
  vocab.vocab_size = 9;
  EXPECT_NE(why(vocab, "tp4-ep1-cp1").find("tp 4 would leave rank 3 no element of vocab_size 9 (8 chunks of 2; "
                                            "rank 3's start at element 12)"),
            std::string::npos)
      << why(vocab, "tp4-ep1-cp1");
  EXPECT_EQ(why(vocab, "tp2-ep1-cp1"), "") << "chunks of 2: rank 1 holds [8, 9)";
  EXPECT_EQ(why(moe, "tp4-ep2-cp1"), "");
  EXPECT_EQ(why(bp::test::odd_size_model("odd-dense"), "tp8-ep1-cp1"), "");
}

// Negative control: the model's bits depend on the chunking of its odd sizes — a
// tp_tree_width of 4 (chunks of 75 instead of 38 over the vocabulary of 300, of 25
// instead of 13 over the intermediate 100) changes entropies (W/S sees the
// log-softmax's chunk sums, which logprob's log S and the bf16 roundings of the
// layers' outputs mostly absorb at these sizes).
TEST(OddSize, OtherChunkingChangesBits) {
  const bp::ModelConfig cfg = bp::test::odd_size_model("odd-dense");
  const auto w = bp::generate_weights(cfg, bp::test::kFixtureWeightSeed);
  const Seqs seqs = bp::test::make_seqs(cfg.vocab_size, {23, 41, 60});
  bp::program::ForwardOptions opt;
  opt.entropy = true;
  bp::Knobs kn = bp::find_contract("bf16-fmaseq-v1")->knobs;
  const bp::host::Model eight(cfg, w, kn);
  kn.tp_tree_width = 4;
  const bp::host::Model four(cfg, w, kn);
  EXPECT_FALSE(same_bits(flat(four.forward(seqs, Path::extend(), opt).entropy),
                         flat(eight.forward(seqs, Path::extend(), opt).entropy)));
}

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
  EXPECT_EQ(why("tp8-ep1-cp1", moe), "");  // kv heads replicated twice
  bp::ModelConfig six = dense;              // 12 query heads on 6 kv heads: tp 4 neither shards nor replicates them
  six.num_attention_heads = 12;
  six.num_key_value_heads = 6;
  EXPECT_NE(why("tp4-ep1-cp1", six).find("tp 4 neither divides num_key_value_heads 6 nor is a multiple of it"),
            std::string::npos)
      << why("tp4-ep1-cp1", six);
  EXPECT_EQ(why("tp2-ep1-cp1", six), "");
  const auto w = bp::generate_weights(dense, bp::test::kFixtureWeightSeed);
  EXPECT_THROW(bp::host::sharded_forward(dense, w, kn, *bp::layouts::parse_layout("tp1-ep2-cp1"), {{1, 2}},
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
    bp::host::sharded_forward(cfg, w, kn, *bp::layouts::parse_layout("tp2-ep2-cp2"), seqs, Path::extend());
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("512"), std::string::npos) << e.what();
  }
}

}  // namespace
