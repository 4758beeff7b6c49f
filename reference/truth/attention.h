// Float64 twin of reference/ops/attention.h: plain causal softmax attention for
// one sequence (no blocks, no splits, no intermediate rounding) and its gradients.
#pragma once
#include <vector>

#include "tensor.h"

namespace bp::truth {

// q, dout: [n][Hq·D]; k, v: [S][Hkv·D] with S = past_len + n. Query i sits at
// position past_len + i and sees keys 0..past_len + i.
struct AttnGeometry {
  int Hq, Hkv, D, past_len;
};

struct AttnForward {
  MatD o;               // [n][Hq·D]
  std::vector<MatD> p;  // per query head, [n][S] softmax weights (0 for masked keys)
};

struct AttnBackward {
  MatD dq, dk, dv;       // shaped like q, k, v
  std::vector<MatD> dp;  // per query head, [n][S]: dout_i · v_j
  std::vector<MatD> ds;  // per query head, [n][S]: p (dp - delta)
  MatD delta;            // [n][Hq]: dout_i · o_i
};

AttnForward attention_fwd(const MatD& q, const MatD& k, const MatD& v, const AttnGeometry& g);
AttnBackward attention_bwd(const MatD& q, const MatD& k, const MatD& v, const MatD& dout, const AttnGeometry& g);

}  // namespace bp::truth
