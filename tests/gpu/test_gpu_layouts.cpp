// Virtual ranks (gpu/virtual_ranks.h): the layouts' rank program on
// one GPU, every rank a thread with its own stream, collectives as device copies,
// against the CPU reference model: both tiny fixtures, all four contracts; TP, EP,
// CP (zigzag) and a mix of all three, every path's logprobs and entropies, the
// captured op outputs, and the backward's every parameter gradient, bit for bit;
// tp 8 replicates the fixtures' 4 kv heads, and the replicated-kv models of the CPU
// suite (MQA, GQA 2, a Qwen3-30B-A3B-shaped MoE; model_cases.h) run their layouts too,
// and so do the odd-size models (vocabularies and dimensions not multiples of 8).
// Negative control: the Ring reduction (a local chain per rank, NCCL's ring order)
// differs from the reference at TP 2 — with the very bits of the CPU's emulated
// Ring ranks, so the GPU's control is the same control.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "host/layouts.h"
#include "gpu/virtual_ranks.h"
#include "program/layouts/sharding.h"
#include "support/model_cases.h"

namespace {

using bp::layouts::Layout;
using bp::program::Path;
using bp::test::expect_same_backward;
using bp::test::flat;
using bp::test::same_bits;
using bp::test::Seqs;

using Case = bp::test::FixtureCase;
constexpr uint64_t kCoefSeed = bp::test::kFixtureCoefSeed;
const bp::ref::LossCoefficients kCoefs = bp::ref::LossCoefficients::generated(kCoefSeed);

using bp::test::same_captures;

class CudaLayoutsTest : public bp::test::FixtureTest {
 protected:
  void SetUp() override {
    FixtureTest::SetUp();
    grad_seqs_ = bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutGradLengths);
    path_seqs_ = bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutPathLengths);
  }

  // TP, EP (MoE only), CP zigzag, a mix, and tp 8 (replicated kv heads); the dense fixture drops EP.
  std::vector<Layout> layouts() const {
    std::vector<Layout> out;
    for (const char* name : {"tp2-ep1-cp1", "tp1-ep2-cp1", "tp1-ep1-cp2z", "tp2-ep2-cp2", "tp8-ep2-cp1"}) {
      Layout l = *bp::layouts::parse_layout(name);
      if (!cfg_.is_moe_model()) l.ep = 1;
      if (std::find(out.begin(), out.end(), l) == out.end() && bp::layouts::shard_check(l, cfg_, kn_).empty())
        out.push_back(l);
    }
    return out;
  }

  Layout layout(const char* name) const { return *bp::layouts::parse_layout(name); }

  Seqs grad_seqs_, path_seqs_;
};

TEST_P(CudaLayoutsTest, EveryPathEqualsReferenceExtend) {
  bp::program::ForwardOptions opt;
  opt.entropy = true;
  const auto want = bp::host::Model(cfg_, w_, kn_).forward(path_seqs_, Path::extend(), opt);
  const std::pair<const char*, Path> paths[] = {{"extend", Path::extend()},
                                                    {"ragged", Path::ragged()},
                                                    {"chunked:5,3", Path::chunked({5, 3})},
                                                    {"decode", Path::decode()}};
  for (const Layout& l : layouts())
    for (const auto& [name, path] : paths) {
      const auto got = bp::gpu::sharded_forward(cfg_, w_, kn_, l, path_seqs_, path, opt);
      EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob))) << l.name() << " " << name;
      EXPECT_TRUE(same_bits(flat(got.entropy), flat(want.entropy))) << l.name() << " " << name;
    }
}

// Every op's captured output is the unsharded model's, row for row.
TEST_P(CudaLayoutsTest, CapturesEqualReference) {
  bp::program::ForwardOptions opt;
  opt.capture = true;
  const auto want = bp::host::Model(cfg_, w_, kn_).forward(path_seqs_, Path::extend(), opt);
  for (const Layout& l : layouts()) {
    const auto got = bp::gpu::sharded_forward(cfg_, w_, kn_, l, path_seqs_, Path::chunked({4}), opt);
    ASSERT_EQ(got.captures.size(), want.captures.size()) << l.name();
    for (size_t i = 0; i < want.captures.size(); ++i) {
      EXPECT_EQ(got.captures[i].name, want.captures[i].name) << l.name();
      EXPECT_EQ(got.captures[i].shape, want.captures[i].shape) << l.name() << " " << want.captures[i].name;
      EXPECT_TRUE(got.captures[i].bf16_data == want.captures[i].bf16_data) << l.name() << " " << want.captures[i].name;
    }
  }
}

TEST_P(CudaLayoutsTest, BackwardEqualsReference) {
  const auto want = bp::host::Model(cfg_, w_, kn_).backward(grad_seqs_, kCoefs);
  for (const Layout& l : layouts()) {
    expect_same_backward(bp::gpu::sharded_backward(cfg_, w_, kn_, l, grad_seqs_, kCoefs), want, l.name());
  }
}

TEST_P(CudaLayoutsTest, RingReductionDiffersAsOnTheCpu) {
  bp::program::ForwardOptions opt;
  opt.capture = true;
  const auto want = bp::host::Model(cfg_, w_, kn_).forward(path_seqs_, Path::extend(), opt);
  const Layout ring = layout("tp2-ep1-cp1+ring");
  const auto gpu = bp::gpu::sharded_forward(cfg_, w_, kn_, ring, path_seqs_, Path::extend(), opt);
  const auto cpu = bp::host::sharded_forward(cfg_, w_, kn_, ring, path_seqs_, Path::extend(), opt);
  EXPECT_FALSE(same_captures(gpu, want));
  EXPECT_TRUE(same_captures(gpu, cpu));
  EXPECT_TRUE(same_bits(flat(gpu.logprob), flat(cpu.logprob)));
}

// A rank that fails (a token outside the vocabulary on one rank only) fails the
// run with its own message; the other ranks are released, not deadlocked.
TEST_P(CudaLayoutsTest, RankFailureIsReportedNotDeadlocked) {
  Seqs seqs = bp::test::make_seqs(cfg_.vocab_size, {6, 6});
  seqs[1][4] = static_cast<int32_t>(cfg_.vocab_size);
  EXPECT_THROW(bp::gpu::sharded_forward(cfg_, w_, kn_, layout("tp2-ep1-cp2"), seqs, Path::extend()),
               std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaLayoutsTest, bp::test::every_fixture_case(), bp::test::fixture_case_name);

// Replicated kv heads and sizes that are not multiples of tp_tree_width on virtual
// ranks: every path, the captures and the backward of the CPU suites' derived models
// and CI layouts, against the CPU reference model.
class CudaDerivedModelTest : public bp::test::DerivedModelTest {};

TEST_P(CudaDerivedModelTest, EveryPathCapturesAndBackwardEqualReference) {
  const Seqs path_seqs = bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutPathLengths);
  const Seqs grad_seqs = bp::test::make_seqs(cfg_.vocab_size, bp::test::kLayoutGradLengths);
  const bp::host::Model ref(cfg_, w_, kn_);
  bp::program::ForwardOptions opt;
  opt.entropy = true;
  opt.capture = true;
  const auto want = ref.forward(path_seqs, Path::extend(), opt);
  const auto want_bwd = ref.backward(grad_seqs, kCoefs);
  const std::pair<const char*, Path> paths[] = {{"extend", Path::extend()},
                                                    {"ragged", Path::ragged()},
                                                    {"chunked:5,3", Path::chunked({5, 3})},
                                                    {"decode", Path::decode()}};
  for (const Layout& l : layouts_) {
    for (const auto& [name, path] : paths) {
      const auto got = bp::gpu::sharded_forward(cfg_, w_, kn_, l, path_seqs, path, opt);
      EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob))) << l.name() << " " << name;
      EXPECT_TRUE(same_bits(flat(got.entropy), flat(want.entropy))) << l.name() << " " << name;
      EXPECT_TRUE(same_captures(got, want)) << l.name() << " " << name;
    }
    expect_same_backward(bp::gpu::sharded_backward(cfg_, w_, kn_, l, grad_seqs, kCoefs), want_bwd, l.name());
  }
}

INSTANTIATE_TEST_SUITE_P(ReplicatedKv, CudaDerivedModelTest, ::testing::ValuesIn(bp::test::replica_cases(true)),
                         bp::test::replica_case_name);
INSTANTIATE_TEST_SUITE_P(OddSize, CudaDerivedModelTest, ::testing::ValuesIn(bp::test::odd_size_cases(true)),
                         bp::test::replica_case_name);

}  // namespace
