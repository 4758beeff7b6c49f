// The reduction shapes of SPEC.md §2.4: written out by hand for small cases, and
// the subtree property the TP layouts rely on.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "reference/numerics/reduce.h"

namespace bp {
namespace {

std::vector<float> random_floats(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-20.0f, 20.0f);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mant(rng), static_cast<int>(exponent(rng)));
  return v;
}

TEST(PairwiseTree, SmallShapesByHand) {
  std::vector<float> v = {1e8f, 1.0f, -1e8f, 1.0f, 3.0f};
  // ((a+b)+(c+d)) + e  — the odd element joins at the top.
  const float expect = ((1e8f + 1.0f) + (-1e8f + 1.0f)) + 3.0f;
  EXPECT_EQ(bits_of(pairwise_tree(v.data(), 5)), bits_of(expect));
  std::vector<float> one = {-0.0f};
  EXPECT_EQ(bits_of(pairwise_tree(one.data(), 1)), bits_of(-0.0f));
  EXPECT_EQ(bits_of(pairwise_tree(nullptr, 0)), bits_of(0.0f));
}

// A rank holding 1/R of the partials reduces its subtree; the last levels over
// the R subtree results give the same bits for every R dividing the width.
TEST(PairwiseTree, SubtreesComposeForEveryPowerOfTwoSplit) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    const std::vector<float> v = random_floats(8, seed);
    std::vector<float> whole = v;
    const uint32_t expect = bits_of(pairwise_tree(whole.data(), 8));
    for (int ranks : {1, 2, 4, 8}) {
      std::vector<float> tops(ranks);
      for (int r = 0; r < ranks; ++r) {
        std::vector<float> part(v.begin() + r * (8 / ranks), v.begin() + (r + 1) * (8 / ranks));
        tops[r] = pairwise_tree(part.data(), 8 / ranks);
      }
      EXPECT_EQ(bits_of(pairwise_tree(tops.data(), ranks)), expect) << "seed " << seed << " ranks " << ranks;
    }
  }
}

// Negative control: a ring order (what NCCL's all-reduce does) gives other bits.
TEST(PairwiseTree, NegativeControlRingOrderDiffers) {
  int differ = 0;
  for (uint32_t seed = 0; seed < 200; ++seed) {
    std::vector<float> v = random_floats(8, seed);
    float ring = v[3];
    for (int i = 4; i < 11; ++i) ring += v[i % 8];
    differ += bits_of(ring) != bits_of(pairwise_tree(v.data(), 8));
  }
  EXPECT_GT(differ, 0);
}

// The scratch-free form (what a device thread runs per element) is the same tree,
// for every count, including signed zeros, where an extra +0 would show.
TEST(PairwiseTree, ByAccessorEqualsInPlaceForEveryCount) {
  for (int n = 0; n <= 300; ++n) {
    std::vector<float> v = random_floats(n, static_cast<uint32_t>(n));
    if (n % 3 == 0) std::fill(v.begin(), v.end(), -0.0f);
    const uint32_t by = bits_of(pairwise_tree_by(n, [&](int j) { return v[static_cast<size_t>(j)]; }));
    std::vector<float> scratch = v;
    EXPECT_EQ(by, bits_of(pairwise_tree(scratch.data(), n))) << n;
  }
}

// sum_partials: Chain adds in order, Ring starts each segment one partial later.
TEST(PairwiseTree, PartialSumOrders) {
  const float p[3] = {1.0f, 1e8f, -1e8f};
  auto part = [&](int j) { return p[j]; };
  EXPECT_EQ(bits_of(sum_partials(PartialSum::Chain, 3, 0, 3, part)), bits_of(0.0f));  // (1 + 1e8) − 1e8
  EXPECT_EQ(bits_of(sum_partials(PartialSum::Tree, 3, 0, 3, part)), bits_of(0.0f));
  // Element 0 lies in segment 0: partials 1, 2, 0 — (1e8 − 1e8) + 1.
  EXPECT_EQ(bits_of(sum_partials(PartialSum::Ring, 3, 0, 3, part)), bits_of(1.0f));
  // Element 2 lies in segment 2: partials 0, 1, 2.
  EXPECT_EQ(bits_of(sum_partials(PartialSum::Ring, 3, 2, 3, part)), bits_of(0.0f));
}

TEST(LaneTree, WarpShapeByHand) {
  std::vector<float> v = random_floats(32, 7);
  std::vector<float> t = v;
  // offsets 16,8,4,2,1: level by level, lane l += lane l+off.
  for (int off = 16; off >= 1; off /= 2)
    for (int l = 0; l < off; ++l) t[l] = t[l] + t[l + off];
  std::vector<float> w = v;
  EXPECT_EQ(bits_of(lane_tree(w.data(), 32)), bits_of(t[0]));
}

TEST(LaneTree, BlockIsWarpTreesThenTreeOverWarpTotals) {
  std::vector<float> v = random_floats(256, 11);
  std::vector<float> warp_totals(8);
  for (int w = 0; w < 8; ++w) {
    std::vector<float> lanes(v.begin() + 32 * w, v.begin() + 32 * (w + 1));
    warp_totals[w] = lane_tree(lanes.data(), 32);
  }
  // warps: offsets 4,2,1 over warp index = pairs (0,4),(1,5).. then (0,2).. then (0,1)
  for (int off = 4; off >= 1; off /= 2)
    for (int l = 0; l < off; ++l) warp_totals[l] = warp_totals[l] + warp_totals[l + off];
  std::vector<float> all = v;
  EXPECT_EQ(bits_of(lane_tree(all.data(), 256)), bits_of(warp_totals[0]));
}

TEST(LaneSum, RunsGoToLanesRoundRobin) {
  const std::vector<float> x = random_floats(1000, 3);
  const LaneShape shape{32, 8};  // one warp: no stage over warp totals
  std::vector<float> lanes(32, 0.0f);
  for (int i = 0; i < 1000; ++i) lanes[(i / 8) % 32] += x[i];
  const float expect = lane_tree(lanes.data(), 32);
  std::vector<float> scratch(64);  // GCC 12 -Warray-bounds misfires on exactly 32
  EXPECT_EQ(bits_of(lane_sum(1000, shape, scratch.data(), [&](int i) { return x[i]; })), bits_of(expect));
}

TEST(LaneSum, NegativeControlOtherShapeDiffers) {
  int differ = 0;
  for (uint32_t seed = 0; seed < 50; ++seed) {
    const std::vector<float> x = random_floats(2048, seed);
    std::vector<float> s(256);
    const float a = lane_sum(2048, LaneShape{256, 8}, s.data(), [&](int i) { return x[i]; });
    const float b = lane_sum(2048, LaneShape{128, 8}, s.data(), [&](int i) { return x[i]; });
    differ += bits_of(a) != bits_of(b);
  }
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace bp
