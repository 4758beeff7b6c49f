// How a case's run ends in its report case (harness/engine/cases.h, case_outputs):
// its outputs, timed; skipped when the implementation cannot run here (CannotTest);
// the verdict "error" with the message and the seconds until it failed when the run
// failed (CaseFailed); any other exception still ends the sweep. Implementations
// throw these from inside CaseEngine::compare; here the test throws them.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "harness/engine/cases.h"

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
        return Outputs{NamedTensor{"logprobs.0", {3}, CmpType::F32, {1, 2, 3}, {}}};
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
