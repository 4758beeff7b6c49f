// moe_router: the Qwen3-MoE router (SPEC.md §5.8). Router weight wr is [E][H]
// (replicated on every rank); logits [T][E] bf16; the top-k of each token are
// `ids` [T][k] and `weights` [T][k], slot 0 holding the highest probability.
#pragma once
#include "reference/contract/contract.h"

namespace bp::ref {

// probs[t][:] = softmax of f(logits[t][:]) in fp32: max (exact), e_i = exp(x_i − max),
// sum by lane_sum (row_reduce shape), p_i = e_i / sum.
void router_probs(const Knobs& kn, const bf16* logits, float* probs, int T, int E);

// Top-k of each row by descending probability, ties to the lower expert id, NaN
// above every number. weights (fp32, before rounding) are the selected
// probabilities, divided by their slot-order sum when norm_topk_prob.
void router_topk(const float* probs, int* ids, float* weights, int T, int E, int k, bool norm_topk_prob);

// logits = R(a·wr) (K = H unsplit), then router_probs, router_topk and topk_w = R(weights).
void router_fwd(const Knobs& kn, const bf16* a, const bf16* wr, bf16* logits, int* ids, bf16* topk_w, int T, int H,
                int E, int k, bool norm_topk_prob);

// Backward from the gradient dtopk_w [T][k] (bf16) of the routing weights: the
// softmax (and renormalisation) are recomputed from the logits; dlogits [T][E] bf16,
// da_acc [T][H] fp32 = dot over E of dlogits·wr (the MoE layer adds it to the
// experts' input gradient before rounding, §5.9), dwr [E][H] fp32 (token-chunked).
void router_bwd(const Knobs& kn, const bf16* a, const bf16* wr, const bf16* logits, const int* ids,
                const bf16* dtopk_w, bf16* dlogits, float* da_acc, float* dwr, int T, int H, int E, int k,
                bool norm_topk_prob);

}  // namespace bp::ref
