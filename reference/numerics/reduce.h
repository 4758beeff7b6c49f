// Deterministic fp32 reductions whose shape is part of the contract (SPEC.md §2.4).
#pragma once
#include <cstddef>

#include "fp.h"

namespace bp {

// Pairwise tree over n partials, in place: each level adds neighbours
// (v[2i] + v[2i+1]); an odd last element moves up unchanged. For n a power of two
// this is the complete binary tree, so any 2^j ranks holding equal contiguous
// slices can each reduce their subtree and the last levels run after a gather.
// `merge` combines two neighbours (any type: contract v2's log-softmax merges
// chunk states by this shape, SPEC.md §5.10); n >= 1.
template <class T, class Merge>
BP_HD T pairwise_tree_merge(T* v, int n, Merge merge) {
  for (int width = n; width > 1; width = (width + 1) / 2) {
    for (int i = 0; 2 * i < width; ++i) v[i] = (2 * i + 1 < width) ? merge(v[2 * i], v[2 * i + 1]) : v[2 * i];
  }
  return v[0];
}

struct AddRn {
  BP_HD float operator()(float a, float b) const { return add_rn(a, b); }
};

BP_HD inline float pairwise_tree(float* v, int n) { return n <= 0 ? 0.0f : pairwise_tree_merge(v, n, AddRn{}); }

// pairwise_tree over v(0), …, v(n−1) without a scratch array (a device thread
// reducing one element across partials): the tree of n is the complete tree of
// its largest power-of-two prefix block, plus the tree of the rest. Blocks are
// built left to right on a stack (equal neighbours merge, as the levels pair
// them); the leftover blocks then fold from the right: B0 + (B1 + (… + Bk)).
template <class Get>
BP_HD float pairwise_tree_by(int n, Get&& v) {
  float sum[32];
  int size[32], top = 0;
  for (int j = 0; j < n; ++j) {
    sum[top] = v(j);
    size[top++] = 1;
    while (top >= 2 && size[top - 1] == size[top - 2]) {
      sum[top - 2] = add_rn(sum[top - 2], sum[top - 1]);
      size[top - 2] *= 2;
      --top;
    }
  }
  if (top == 0) return 0.0f;
  float acc = sum[--top];
  while (top > 0) acc = add_rn(sum[--top], acc);
  return acc;
}

// How partials held by several ranks (or chunks) are added, elementwise.
//   Tree:  the contract's pairwise_tree over the partials in order.
//   Chain: ((p0 + p1) + p2) + … in order (a rank's local chain, Ring control only).
//   Ring:  NCCL's ring order, the negative control: element i of n lies in
//          segment s = ⌊i·P/n⌋, summed starting at partial s+1 and wrapping round.
enum class PartialSum { Tree, Chain, Ring };

// Element i (of n per partial) of the sum of P partials; part(j) is partial j's element i.
template <class Get>
BP_HD float sum_partials(PartialSum how, int P, size_t i, size_t n, Get&& part) {
  if (how == PartialSum::Tree) return pairwise_tree_by(P, part);
  const int first = how == PartialSum::Ring ? static_cast<int>(i * static_cast<size_t>(P) / (n > 0 ? n : 1)) + 1 : 0;
  float acc = part(first % P);
  for (int j = 1; j < P; ++j) acc = add_rn(acc, part((first + j) % P));
  return acc;
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
