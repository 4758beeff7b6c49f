// moe_experts: Qwen3-MoE experts and combine with SGLang fused-MoE semantics
// (SPEC.md §5.9), in stages an expert-parallel layout can cut between:
//   route (moe_router) -> dispatch -> experts (any subset, any order) -> combine.
// Each (token, slot) row of an expert is computed from that row alone, so the bits
// do not depend on the batch, on the EP size or on the order experts run in.
// Per-slot buffers are [T][k][H], indexed by the token and its slot.
#pragma once
#include "reference/contract/contract.h"

namespace bp::ref {

// Which (token, slot) rows each expert computes: expert e owns entries
// offset[e] .. offset[e+1]−1, in increasing token order. A view over arrays the
// caller owns (offset [E+1], token and slot [T·k]), as a kernel would receive it.
struct MoeDispatch {
  int num_experts;
  const int* offset;
  const int* token;
  const int* slot;
};

// Per-expert pointers, so that an EP rank holds only its own experts (the
// others may be null). gate and up [I][H], down [H][I]; gradients alike, fp32.
struct ExpertWeights {
  const bf16* const* gate;
  const bf16* const* up;
  const bf16* const* down;
};
struct ExpertGrads {
  float* const* gate;
  float* const* up;
  float* const* down;
};

// Counting sort of the router's ids [T][k] by expert, stable in token order.
// Refuses ids outside [0, E) and an expert chosen twice by one token.
void moe_dispatch(const int* ids, int T, int k, int E, int* offset, int* token, int* slot);

// Experts e_begin .. e_end−1 of the plan; for each of their rows (t, j):
//   g, u, m as in the dense MLP (mlp_hidden_fwd, I = moe_intermediate_size),
//   acc = dot(m, Wd_e) with K = I cut into tp_tree_width chunks (fp32),
//   c[t][j] = R(acc · f(topk_w[t][j])).
// Rows of other experts are left untouched.
void moe_experts_fwd(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const bf16* a,
                     const bf16* topk_w, const ExpertWeights& w, bf16* c, int k, int H, int I);

// out[t][h] = R(Σ_j f(c[t][j][h])): fp32 from +0, slots in increasing order.
void moe_combine_fwd(const bf16* c, bf16* out, int T, int k, int H);

// Backward of experts e_begin .. e_end−1 for dout [T][H] (every slot of token t
// receives dout[t]); g, u, m and acc are recomputed (the forward's bits).
// Per row (t, j), with w = f(topk_w[t][j]) and y = dout[t]:
//   dtopk_w[t][j] = R(lane_sum_h(f(y_h)·acc_h)),
//   dacc = R(f(y)·w) (the down projection's output gradient, bf16),
//   dm, dWd_e from dacc as the dense down_proj (mlp_down_bwd),
//   gate/up/swiglu as the dense MLP (mlp_hidden_bwd): da_slot[t][j] (fp32), dWg_e, dWu_e.
// Weight gradients are token-chunked over the expert's rows in their plan order;
// an expert without rows gets +0.
void moe_experts_bwd(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const bf16* a,
                     const bf16* topk_w, const ExpertWeights& w, const bf16* dout, float* da_slot, bf16* dtopk_w,
                     const ExpertGrads& dw, int k, int H, int I);

// da[t][h] = R(Σ_j da_slot[t][j][h] + router_da_acc[t][h]): fp32 from +0, slots in
// increasing order, the router's accumulator (may be null) added last.
void moe_combine_bwd(const float* da_slot, const float* router_da_acc, bf16* da, int T, int k, int H);

// The whole MoE block on one rank: router (wr [E][H]), dispatch, all experts, combine.
void moe_layer_fwd(const Knobs& kn, const bf16* a, const bf16* wr, const ExpertWeights& w, bf16* out, int T, int H,
                   int E, int k, int I, bool norm_topk_prob);

// Its backward: da bf16 [T][H], dwr [E][H] and the expert gradients fp32.
void moe_layer_bwd(const Knobs& kn, const bf16* a, const bf16* wr, const ExpertWeights& w, const bf16* dout, bf16* da,
                   float* dwr, const ExpertGrads& dw, int T, int H, int E, int k, int I, bool norm_topk_prob);

}  // namespace bp::ref
