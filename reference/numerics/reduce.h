// Deterministic fp32 reductions whose shape is part of the contract (SPEC.md §2.4).
#pragma once
#include "fp.h"

namespace bp {

// Pairwise tree over n partials, in place: each level adds neighbours
// (v[2i] + v[2i+1]); an odd last element moves up unchanged. For n a power of two
// this is the complete binary tree, so any 2^j ranks holding equal contiguous
// slices can each reduce their subtree and the last levels run after a gather.
BP_HD inline float pairwise_tree(float* v, int n) {
  if (n <= 0) return 0.0f;
  for (int width = n; width > 1; width = (width + 1) / 2) {
    for (int i = 0; 2 * i < width; ++i) v[i] = (2 * i + 1 < width) ? add_rn(v[2 * i], v[2 * i + 1]) : v[2 * i];
  }
  return v[0];
}

// Shape of a block-wide row reduction: `lanes` (a multiple of 32, power of two)
// lanes, each owning runs of `vec` consecutive elements, run r going to lane r % lanes.
struct LaneShape {
  int lanes;
  int vec;
};

// Tree over lane partials v[0..lanes): offsets 16,8,4,2,1 inside each group of 32
// lanes (a warp's xor-shuffle tree), then offsets lanes/2 .. 32 over warp totals.
BP_HD inline float lane_tree(float* v, int lanes) {
  for (int w = 0; w < lanes; w += 32)
    for (int off = 16; off >= 1; off /= 2)
      for (int l = 0; l < off; ++l) v[w + l] = add_rn(v[w + l], v[w + l + off]);
  for (int off = lanes / 2; off >= 32; off /= 2)
    for (int l = 0; l < off; l += 32) v[l] = add_rn(v[l], v[l + off]);
  return v[0];
}

// sum_i term(i) for i in [0, n): each lane starts at +0 and adds its elements in
// increasing i; then lane_tree. `scratch` holds shape.lanes floats.
template <class Term>
BP_HD float lane_sum(int n, LaneShape shape, float* scratch, Term&& term) {
  for (int l = 0; l < shape.lanes; ++l) scratch[l] = 0.0f;
  const int runs = (n + shape.vec - 1) / shape.vec;
  for (int r = 0; r < runs; ++r) {
    float& acc = scratch[r % shape.lanes];
    const int end = (r + 1) * shape.vec < n ? (r + 1) * shape.vec : n;
    for (int i = r * shape.vec; i < end; ++i) acc = add_rn(acc, term(i));
  }
  return lane_tree(scratch, shape.lanes);
}

}  // namespace bp
