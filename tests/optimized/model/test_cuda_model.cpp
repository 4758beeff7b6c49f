// The whole model on the GPU (optimized/model/qwen3.h) against the CPU reference
// model: both tiny fixtures, all four contracts; every path's logprobs, entropies and
// captured op outputs, and the backward's every parameter gradient, bit for bit.
// Every path equal to the reference's extend is batch invariance and decode ==
// extend on the GPU. Repeated runs give the same raw bits. Negative control: a
// model with one weight's bit flipped differs (the comparison sees the weights).
#include <gtest/gtest.h>

#include "optimized/model/qwen3.h"
#include "support/model_cases.h"

namespace {

using bp::ref::Path;
using bp::test::flat;
using bp::test::same_bits;
using bp::test::Seqs;

using Case = bp::test::FixtureCase;
constexpr uint64_t kCoefSeed = bp::test::kFixtureCoefSeed;
const bp::ref::LossCoefficients kCoefs = bp::ref::LossCoefficients::generated(kCoefSeed);

class CudaModelTest : public bp::test::FixtureTest {
 protected:
  void SetUp() override {
    FixtureTest::SetUp();
    // 150 tokens: more than one attention KV split and two weight-gradient chunks.
    seqs_ = bp::test::make_seqs(cfg_.vocab_size, {13, 150, 7, 21});
    opt_.entropy = true;
    opt_.capture = true;
  }

  Seqs seqs_;
  bp::ref::ForwardOptions opt_;
};

TEST_P(CudaModelTest, EveryPathEqualsReferenceExtend) {
  const auto want = bp::ref::Model(cfg_, w_, kn_).forward(seqs_, Path::extend(), opt_);
  const bp::cuda::Model gpu(cfg_, w_, kn_);
  const std::pair<const char*, Path> paths[] = {{"extend", Path::extend()},
                                                    {"ragged", Path::ragged()},
                                                    {"chunked:5,3", Path::chunked({5, 3})},
                                                    {"chunked:64", Path::chunked({64})},
                                                    {"decode", Path::decode()}};
  for (const auto& [name, path] : paths) {
    const auto got = gpu.forward(seqs_, path, opt_);
    EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob))) << name;
    EXPECT_TRUE(same_bits(flat(got.entropy), flat(want.entropy))) << name;
    EXPECT_TRUE(bp::test::same_captures(got, want)) << name;
  }
}

TEST_P(CudaModelTest, BackwardEqualsReference) {
  const auto want = bp::ref::Model(cfg_, w_, kn_).backward(seqs_, kCoefs);
  const auto got = bp::cuda::Model(cfg_, w_, kn_).backward(seqs_, kCoefs);
  EXPECT_TRUE(same_bits(flat(got.logprob), flat(want.logprob)));
  EXPECT_TRUE(same_bits(flat(got.coef), flat(want.coef)));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (const auto& [name, g] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << "lacks " << name;
    EXPECT_TRUE(same_bits(got.grads.at(name), g)) << name;
  }
}

TEST_P(CudaModelTest, RepeatedRunsSameRawBits) {
  const bp::cuda::Model gpu(cfg_, w_, kn_);
  const auto a = gpu.backward(seqs_, kCoefs);
  const auto b = gpu.backward(seqs_, kCoefs);
  for (const auto& [name, g] : a.grads) EXPECT_TRUE(same_bits(b.grads.at(name), g)) << name;
  EXPECT_TRUE(same_bits(flat(gpu.forward(seqs_, Path::decode()).logprob),
                        flat(gpu.forward(seqs_, Path::decode()).logprob)));
}

TEST_P(CudaModelTest, FlippedWeightBitDiffers) {
  bp::Weights w = w_;
  w.at("model.layers.0.self_attn.q_proj.weight").data[5].bits ^= 0x0100;
  const auto want = bp::ref::Model(cfg_, w_, kn_).forward(seqs_, Path::extend());
  const auto got = bp::cuda::Model(cfg_, w, kn_).forward(seqs_, Path::extend());
  EXPECT_FALSE(same_bits(flat(got.logprob), flat(want.logprob)));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModelTest, bp::test::every_fixture_case(), bp::test::fixture_case_name);

}  // namespace
