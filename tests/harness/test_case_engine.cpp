// How a case's run ends in its report case (harness/engine/cases.h, case_outputs):
// its outputs, timed; skipped when the implementation cannot run here (CannotTest);
// the verdict "error" with the message and the seconds until it failed when the run
// failed (CaseFailed); any other exception still ends the sweep. Implementations
// throw these from inside CaseEngine::compare; here the test throws them. Which
// layers a --verify-layers spec names (plan.h, verify_layer_list). And a tokens file's
// text, once read, is what the tokens are planned from (run records that text). A
// gradient left on the GPU is compared by its digest, fetched only where it differs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "harness/engine/cases.h"
#include "harness/io/errors.h"

namespace bp::harness {
namespace {

using Outputs = std::vector<NamedTensor>;

void busy(std::chrono::milliseconds ms) { std::this_thread::sleep_for(ms); }

TEST(CaseOutputs, ARunGivesItsOutputsAndItsTimeWithoutThePreparation) {
  Case c;
  const auto got = case_outputs(
      c, [] { busy(std::chrono::milliseconds(200)); },
      [] {
        busy(std::chrono::milliseconds(5));
        return Outputs{NamedTensor{"logprobs.0", {3}, CmpType::F32, {1, 2, 3}, {}, {}, {}}};
      });
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].name, "logprobs.0");
  EXPECT_EQ(c.verdict, Verdict::kExact);
  EXPECT_GE(c.seconds, 0.005);
  EXPECT_LT(c.seconds, 0.2);  // the preparation is not the run's time
}

TEST(CaseOutputs, CannotTestIsSkippedWithTheReason) {
  for (const bool in_prepare : {true, false}) {
    Case c;
    bool ran = false;
    const auto got = case_outputs(
        c,
        [&] {
          if (in_prepare) throw CannotTest("no Hopper GPU");
        },
        [&]() -> Outputs {
          ran = true;
          throw CannotTest("no Hopper GPU");
        });
    EXPECT_FALSE(got.has_value());
    EXPECT_EQ(ran, !in_prepare);
    EXPECT_EQ(c.verdict, Verdict::kSkipped);
    EXPECT_EQ(c.skip_reason, "no Hopper GPU");
    EXPECT_EQ(c.seconds, 0);
    EXPECT_EQ(c.error, "");
  }
}

TEST(CaseOutputs, CaseFailedIsAnErrorCaseWithTheMessageAndItsSecondsSoFar) {
  Case c;
  const auto got = case_outputs(
      c, [] {},
      []() -> Outputs {
        busy(std::chrono::milliseconds(5));
        throw CaseFailed("rank 1 was killed by signal 9 during the case");
      });
  EXPECT_FALSE(got.has_value());
  EXPECT_EQ(c.verdict, Verdict::kError);
  EXPECT_EQ(c.error, "rank 1 was killed by signal 9 during the case");
  EXPECT_EQ(c.skip_reason, "");
  EXPECT_GE(c.seconds, 0.005);
  // Failed while preparing: no run time.
  Case early;
  EXPECT_FALSE(case_outputs(early, [] { throw CaseFailed("rank 0 threw: upload"); }, [] { return Outputs{}; }));
  EXPECT_EQ(early.verdict, Verdict::kError);
  EXPECT_EQ(early.seconds, 0);
}

// Negative control: an exception that is not the case's own failure is not turned
// into a verdict; it ends the sweep (exit 3 through the command's guard, no report).
TEST(CaseOutputs, OtherExceptionsPropagate) {
  Case c;
  EXPECT_THROW(case_outputs(c, [] {}, []() -> Outputs { throw std::runtime_error("bug"); }), std::runtime_error);
  EXPECT_THROW(case_outputs(c, [] { throw std::logic_error("bug"); }, [] { return Outputs{}; }), std::logic_error);
  EXPECT_EQ(c.verdict, Verdict::kExact);
  EXPECT_EQ(c.error, "");
}

}  // namespace
}  // namespace bp::harness

namespace bp::harness {
namespace {

std::vector<int64_t> layers_of(const std::string& spec, int64_t num_layers,
                               Implementation canonical = Implementation::kCuda) {
  std::string why;
  const auto l = verify_layer_list(spec, num_layers, canonical, &why);
  EXPECT_TRUE(l.has_value()) << spec << ": " << why;
  return l.value_or(std::vector<int64_t>{});
}

// --verify-layers: the forms, the defaults by canonical and model size, the refusals.
// The canonical's values (with their digest) and a tensor as the GPU leaves it: its
// digest, and a fetch that counts its calls.
struct LeftOnGpu {
  NamedTensor ref, got;
  int fetches = 0;
  LeftOnGpu(std::vector<float> canonical, std::vector<float> on_gpu) {
    ref.name = got.name = "grads.w";
    ref.shape = got.shape = {2, canonical.size() / 2};
    ref.f32_values = std::move(canonical);
    ref.digest = tensor_digest(std::span<const float>(ref.f32_values));
    got.digest = tensor_digest(std::span<const float>(on_gpu));
    got.fetch = [this, on_gpu] {
      ++fetches;
      return on_gpu;
    };
  }
};

void expect_same_metrics(const TensorMetrics& a, const TensorMetrics& b) {
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.bit_identical, b.bit_identical);
  EXPECT_EQ(a.elements, b.elements);
  EXPECT_EQ(a.mismatches, b.mismatches);
  EXPECT_EQ(a.max_abs_diff, b.max_abs_diff);
  EXPECT_EQ(a.max_ulp_diff, b.max_ulp_diff);
  EXPECT_EQ(a.mean_abs_diff, b.mean_abs_diff);
  EXPECT_EQ(a.first_mismatch, b.first_mismatch);
  EXPECT_EQ(a.nan_a, b.nan_a);
  EXPECT_EQ(a.nan_b, b.nan_b);
  EXPECT_EQ(a.inf_a, b.inf_a);
  EXPECT_EQ(a.inf_b, b.inf_b);
  EXPECT_EQ(a.ulp_histogram, b.ulp_histogram);
}

// Equal bits: compare()'s metrics of the pair (NaN and Inf counts included), and no
// value leaves the GPU.
TEST(LeftOnGpu, EqualDigestsGiveTheMetricsWithoutAFetch) {
  const std::vector<float> v = {1.0f, NAN, -INFINITY, -0.0f, 3.5f, 1e-40f};
  std::vector<float> other_nan = v;
  other_nan[1] = -NAN;
  LeftOnGpu t(v, other_nan);
  const TensorRecord rec = compare_tensors(t.ref, &t.got);
  ASSERT_TRUE(rec.metrics);
  expect_same_metrics(*rec.metrics, compare(std::span<const float>(v), std::span<const float>(other_nan), t.ref.shape));
  EXPECT_TRUE(rec.matches());
  EXPECT_EQ(t.fetches, 0);
}

// Negative control: one element one ulp off is fetched and compared in full.
TEST(LeftOnGpu, DifferentDigestsFetchAndCompareInFull) {
  const std::vector<float> v = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> off = v;
  off[2] = std::nextafter(3.0f, 4.0f);
  LeftOnGpu t(v, off);
  const TensorRecord rec = compare_tensors(t.ref, &t.got);
  ASSERT_TRUE(rec.metrics);
  expect_same_metrics(*rec.metrics, compare(std::span<const float>(v), std::span<const float>(off), t.ref.shape));
  EXPECT_FALSE(rec.matches());
  EXPECT_EQ(rec.metrics->mismatches, 1u);
  EXPECT_EQ(t.fetches, 1);
}

TEST(VerifyLayerList, FormsDefaultsAndRefusals) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(layers_of("", 3), (V{0, 1, 2}));  // under the GPU canonical: every layer of a small model
  EXPECT_EQ(layers_of("", 4), (V{0, 1, 2, 3}));
  EXPECT_EQ(layers_of("", 48), (V{0, 24, 47}));  // else 3, first and last among them
  EXPECT_EQ(layers_of("", 48, Implementation::kReference), V{});  // the CPU canonical: only when asked
  EXPECT_EQ(layers_of("all", 5), (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(layers_of("5", 48), (V{0, 12, 24, 35, 47}));
  EXPECT_EQ(layers_of("100", 3), (V{0, 1, 2}));  // more than there are: all
  EXPECT_EQ(layers_of("1", 48), V{0});
  EXPECT_EQ(layers_of("47,0,23,23", 48), (V{0, 23, 47}));
  EXPECT_EQ(layers_of("7,7", 48), V{7});
  EXPECT_EQ(layers_of("999999999", kAnyNumberOfLayers), V{});  // the plan reader checks the form only
  for (const char* bad : {"first", "0", "-1", "1,", ",1", "1,,2", "1.5", "all,1"}) {
    std::string why;
    EXPECT_FALSE(verify_layer_list(bad, 48, Implementation::kCuda, &why)) << bad;
    EXPECT_NE(why.find("expected \"all\""), std::string::npos) << bad << ": " << why;
  }
  std::string why;
  EXPECT_FALSE(verify_layer_list("3,48", 48, Implementation::kCuda, &why));
  EXPECT_EQ(why, "layer 48 does not exist: the model has 48 layers (0 .. 47)");
}

TEST(PlanTokens, AFileReadOnceIsPlannedFromItsText) {
  SweepPlan plan;
  plan.tokens.file = "no/such/tokens.json";
  EXPECT_THROW(plan_tokens(plan, 100, 64), io::BadInput);  // the file itself: not there
  plan.tokens.text = R"({"sequences": [[1, 2, 3], [4, 5]]})";
  EXPECT_EQ(plan_tokens(plan, 100, 64).seqs, (std::vector<std::vector<int32_t>>{{1, 2, 3}, {4, 5}}));
}

}  // namespace
}  // namespace bp::harness
