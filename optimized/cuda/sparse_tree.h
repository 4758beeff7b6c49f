// pairwise_tree (reference/numerics/reduce.h) over leaves 0..n) of which only some
// are present, fed one at a time in increasing leaf order, in O(log n) state.
//
// Node i at level l of pairwise_tree covers leaves [i·2^l, (i+1)·2^l); a node whose
// right half is empty passes its left half up unchanged. An absent leaf stands for
// +0, and x + (+0) = x for every x but −0, so where no present value is −0 (sums
// that start at +0 never are) the tree equals the same tree with the absent leaves
// left out: each node adds its two halves if both hold a present leaf, else passes
// the one that does. Two consecutive present leaves a < b first meet at the node
// of level 32 − clz(a ^ b); the leaves are joined lowest level first, like an
// expression whose operators bind tighter the lower their level (a shunting yard).
#pragma once
#include "reference/numerics/fp.h"

namespace bp::cuda {

class SparsePairwiseTree {
 public:
  // Adds present leaf `leaf` (greater than every leaf before) with value v.
  BP_HD void push(int leaf, float v) {
    if (size_ > 0) {
      const int level = meet_level(last_leaf_, leaf);
      while (size_ > 1 && join_[size_ - 1] < level) reduce_top();
      join_[size_] = level;
    }
    value_[size_++] = v;
    last_leaf_ = leaf;
  }

  // The tree's value: +0 when no leaf is present.
  BP_HD float finish() {
    while (size_ > 1) reduce_top();
    return size_ == 0 ? 0.0f : value_[0];
  }

 private:
  // Pending joins have strictly increasing levels down the stack (at most 32), plus one.
  static constexpr int kMaxDepth = 33;

  BP_HD static int meet_level(int a, int b) {
    const unsigned x = static_cast<unsigned>(a ^ b);
    int level = 0;
    while ((x >> level) != 0) ++level;
    return level;
  }

  BP_HD void reduce_top() {
    value_[size_ - 2] = add_rn(value_[size_ - 2], value_[size_ - 1]);
    --size_;
  }

  float value_[kMaxDepth];
  int join_[kMaxDepth];  // join_[k]: level at which entry k meets entry k − 1
  int size_ = 0;
  int last_leaf_ = 0;
};

}  // namespace bp::cuda
