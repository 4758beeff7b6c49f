// Error bounds derived from the rounding points (SPEC.md §6), never tuned.
// u32 = 2^-24 (fp32 unit roundoff), u16 = 2^-8 (bf16 unit roundoff).
#pragma once
#include <cmath>

#include "reference/numerics/dot.h"
#include "reference/numerics/reduce.h"

namespace bp::test {

constexpr double kU32 = 0x1p-24;
constexpr double kU16 = 0x1p-8;

// |dot - exact| <= dot_gamma(...) · sum_k |a_k b_k|  for a dot over k terms cut
// into `chunks` chunks combined by the pairwise tree.
//  fma-seq: one rounding per step, gamma_k = k·u/(1 - k·u).
//  sm90-tc: per 16-group step every one of <= 17 terms is truncated by < 2^(E-25)
//    <= 2^-25·max|term|, and the RZ conversion loses < 2^-23 of the result:
//    (17·2^-25 + 2^-23) = 21·2^-25 per group, times the number of groups, with a
//    (1 + 2^-20) factor for the growth of the partial sums the later errors scale.
//  tree: each of ceil(log2 chunks) levels adds one fp32 rounding of a partial sum.
inline double dot_gamma(DotModel model, int k, int chunks = 1) {
  const int per_chunk = (k + chunks - 1) / chunks;
  double g;
  if (model == DotModel::FmaSeq) {
    g = per_chunk * kU32 / (1.0 - per_chunk * kU32);
  } else {
    const int groups = (per_chunk + 15) / 16;
    g = groups * 21.0 * 0x1p-25 * (1.0 + 0x1p-20);
  }
  int levels = 0;
  while ((1 << levels) < chunks) ++levels;
  return g + levels * kU32 * (1.0 + g);
}

// gamma_m = m·u/(1 − m·u): |computed − exact| <= gamma_m · sum |terms| for an fp32
// sum in which every term passes through at most m rounding additions.
inline double gamma_n(int m) { return m * kU32 / (1.0 - m * kU32); }

// The lane tree of SPEC.md §2.4.2 over n terms: a term passes through at most
// ceil(n / (lanes·vec))·vec adds in its lane, then log2(lanes) tree levels.
inline double lane_sum_gamma(int n, LaneShape shape) {
  int levels = 0;
  while ((1 << levels) < shape.lanes) ++levels;
  const int per_lane = (n + shape.lanes * shape.vec - 1) / (shape.lanes * shape.vec) * shape.vec;
  return gamma_n(per_lane + levels);
}

// |R(d) - t| <= u16·|t| + (1 + u16)·|d - t| : the bound of a bf16 output whose
// fp32 value d has absolute error |d - t| against the exact t.
inline double bf16_output_bound(double truth, double fp32_error) {
  return kU16 * std::fabs(truth) + (1.0 + kU16) * fp32_error;
}

}  // namespace bp::test
