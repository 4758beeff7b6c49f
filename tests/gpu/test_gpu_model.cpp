// The whole model on the GPU (gpu/cuda_model.h) against the CPU reference
// model: both tiny fixtures, all four contracts; every path's logprobs, entropies and
// captured op outputs, and the backward's every parameter gradient, bit for bit.
// Every path equal to the reference's extend is batch invariance and decode ==
// extend on the GPU. Repeated runs give the same raw bits. Negative control: a
// model with one weight's bit flipped differs (the comparison sees the weights).
#include <gtest/gtest.h>

#include "gpu/cuda_model.h"
#include "support/model_cases.h"

namespace {

using bp::program::Path;
using bp::test::expect_same_backward;
using bp::test::flat;
using bp::test::same_bits;
using bp::test::Seqs;

using Case = bp::test::FixtureCase;
constexpr uint64_t kCoefSeed = bp::test::kFixtureCoefSeed;
const bp::ref::LossCoefficients kCoefs = bp::ref::LossCoefficients::generated(kCoefSeed);

// 150 tokens: more than one attention KV split and two weight-gradient chunks.
Seqs model_seqs(const bp::ModelConfig& cfg) { return bp::test::make_seqs(cfg.vocab_size, {13, 150, 7, 21}); }

void expect_every_path_equals_reference_extend(const bp::ModelConfig& cfg, const bp::Weights& w, const bp::Knobs& kn,
                                               const Seqs& seqs, const bp::program::ForwardOptions& opt) {
  const auto want = bp::host::Model(cfg, w, kn).forward(seqs, Path::extend(), opt);
  const bp::gpu::Model gpu(cfg, w, kn);
  const std::pair<const char*, Path> paths[] = {{"extend", Path::extend()},
                                                    {"ragged", Path::ragged()},
                                                    {"chunked:5,3", Path::chunked({5, 3})},
                                                    {"chunked:64", Path::chunked({64})},
                                                    {"decode", Path::decode()}};
  for (const auto& [name, path] : paths) {
    const auto got = gpu.forward(seqs, path, opt);
    EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob))) << name;
    EXPECT_TRUE(same_bits(flat(got.entropy), flat(want.entropy))) << name;
    EXPECT_TRUE(bp::test::same_captures(got, want)) << name;
  }
}

void expect_backward_equals_reference(const bp::ModelConfig& cfg, const bp::Weights& w, const bp::Knobs& kn,
                                      const Seqs& seqs) {
  expect_same_backward(bp::gpu::Model(cfg, w, kn).backward(seqs, kCoefs),
                       bp::host::Model(cfg, w, kn).backward(seqs, kCoefs), "cuda model");
}

bp::program::ForwardOptions entropy_and_captures() {
  bp::program::ForwardOptions opt;
  opt.entropy = true;
  opt.capture = true;
  return opt;
}

class CudaModelTest : public bp::test::FixtureTest {
 protected:
  void SetUp() override {
    FixtureTest::SetUp();
    seqs_ = model_seqs(cfg_);
    opt_ = entropy_and_captures();
  }

  Seqs seqs_;
  bp::program::ForwardOptions opt_;
};

TEST_P(CudaModelTest, EveryPathEqualsReferenceExtend) {
  expect_every_path_equals_reference_extend(cfg_, w_, kn_, seqs_, opt_);
}

TEST_P(CudaModelTest, BackwardEqualsReference) { expect_backward_equals_reference(cfg_, w_, kn_, seqs_); }

// Sequences whose target rows the log-probability ops read in place, a call per
// sequence (program/qwen3_program.h, in_place_runs; model_seqs' are gathered):
// the logits rows start at offsets no call had before.
TEST_P(CudaModelTest, LongSequencesScoredInPlaceEqualReference) {
  const Seqs long_seqs = bp::test::make_seqs(cfg_.vocab_size, {90, 130});
  const auto want = bp::host::Model(cfg_, w_, kn_).forward(long_seqs, Path::extend(), opt_);
  const auto got = bp::gpu::Model(cfg_, w_, kn_).forward(long_seqs, Path::extend(), opt_);
  EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob)));
  EXPECT_TRUE(same_bits(flat(got.entropy), flat(want.entropy)));
  expect_backward_equals_reference(cfg_, w_, kn_, long_seqs);
}

TEST_P(CudaModelTest, RepeatedRunsSameRawBits) {
  const bp::gpu::Model gpu(cfg_, w_, kn_);
  const auto a = gpu.backward(seqs_, kCoefs);
  const auto b = gpu.backward(seqs_, kCoefs);
  for (const auto& [name, g] : a.grads) EXPECT_TRUE(same_bits(b.grads.at(name), g)) << name;
  EXPECT_TRUE(same_bits(flat(gpu.forward(seqs_, Path::decode()).logprob),
                        flat(gpu.forward(seqs_, Path::decode()).logprob)));
}

TEST_P(CudaModelTest, FlippedWeightBitDiffers) {
  bp::Weights w = w_;
  w.at("model.layers.0.self_attn.q_proj.weight").data[5].bits ^= 0x0100;
  const auto want = bp::host::Model(cfg_, w_, kn_).forward(seqs_, Path::extend());
  const auto got = bp::gpu::Model(cfg_, w, kn_).forward(seqs_, Path::extend());
  EXPECT_FALSE(same_bits(flat(got.logprob), flat(want.logprob)));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModelTest, bp::test::every_fixture_case(), bp::test::fixture_case_name);

// Sizes that are not multiples of tp_tree_width (model_cases.h: vocab 300 and 211,
// intermediate 100, moe_intermediate 36): the GPU model's fixed chunks (SPEC.md
// §2.4.1) against the CPU reference, every path and the backward.
class CudaOddSizeModelTest : public ::testing::TestWithParam<bp::test::ReplicaCase> {
 protected:
  void SetUp() override {
    cfg_ = bp::test::odd_size_model(GetParam().model);
    w_ = bp::generate_weights(cfg_, bp::test::kFixtureWeightSeed);
    kn_ = bp::find_contract(GetParam().contract)->knobs;
  }
  bp::ModelConfig cfg_;
  bp::Weights w_;
  bp::Knobs kn_;
};

TEST_P(CudaOddSizeModelTest, EveryPathAndBackwardEqualReference) {
  expect_every_path_equals_reference_extend(cfg_, w_, kn_, model_seqs(cfg_), entropy_and_captures());
  expect_backward_equals_reference(cfg_, w_, kn_, model_seqs(cfg_));
}

INSTANTIATE_TEST_SUITE_P(Models, CudaOddSizeModelTest, ::testing::ValuesIn(bp::test::odd_size_cases(true)),
                         bp::test::replica_case_name);

}  // namespace
