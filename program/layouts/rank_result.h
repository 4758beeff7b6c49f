// What one rank of a layout reports (SPEC.md §7): its share of the results, put
// together by the runners (rank_runs.h). The rank program that computes it is
// rank_program.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "reference/numerics/bf16.h"

namespace bp::layouts {

// One rank's share of the results; the runner puts the shares together.
struct RankResult {
  struct Value {
    int seq, pos;  // logprob of token pos+1 given 0..pos
    float logprob, entropy;
  };
  std::vector<Value> values;  // ranks with t == 0: their tokens that have a target
  struct GradBlock {          // rows × cols of a [*][width] parameter gradient at (row0, col0)
    std::string name;
    int64_t row0, rows, col0, cols, width;
    std::vector<float> data;
  };
  std::vector<GradBlock> grads;
  struct CaptureBlock {  // rows (canonical) × cols of a [tokens][width] capture at col0
    std::string name;
    int64_t width, col0, cols;
    std::vector<int64_t> rows;
    std::vector<bf16> data;
  };
  std::vector<CaptureBlock> captures;  // in execution order
};

}  // namespace bp::layouts
