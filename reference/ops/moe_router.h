// moe_router: the Qwen3-MoE router (SPEC.md §5.8). Router weight wr is [E][H]
// (replicated on every rank); logits [T][E] bf16; the top-k of each token are
// `ids` [T][k] and `weights` [T][k], slot 0 holding the highest probability.
#pragma once
#include "reference/contract/contract.h"
#include "reference/numerics/bf16.h"
#include "reference/numerics/fp.h"

namespace bp::ref {

// Per-token helpers, __host__ __device__ so that the CUDA twin runs this code.

// The total order of the top-k: NaN first, then descending probability, ties
// (including +0 = −0) to the lower expert id.
BP_HD inline bool ranks_before(float pa, int a, float pb, int b) {
  const bool na = is_nan(pa), nb = is_nan(pb);
  if (na != nb) return na;
  if (!na && pa != pb) return pa > pb;
  return a < b;
}

// Slot j holds the first expert ranking after slot j−1's: k passes over the row,
// no marking, the same as a warp argmax per slot.
BP_HD inline void select_row(const float* p, int* ids, int E, int k) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (j > 0 && !ranks_before(p[ids[j - 1]], ids[j - 1], p[e], e)) continue;
      if (best < 0 || ranks_before(p[e], e, p[best], best)) best = e;
    }
    ids[j] = best;
  }
}

// The fp32 weights of the selected experts: their probabilities, divided by
// their sum (from +0, in slot order) when norm_topk_prob.
BP_HD inline void selected_weights(const float* p, const int* ids, float* w, int k, bool norm_topk_prob) {
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    w[j] = p[ids[j]];
    sum = add_rn(sum, w[j]);
  }
  if (norm_topk_prob)
    for (int j = 0; j < k; ++j) w[j] = div_rn(w[j], sum);
}

// dlogits of one row. With P the fp32 probabilities that the weights are (w when
// renormalised: the softmax over the selected logits; p otherwise: the softmax
// over all E) and G the weight gradient scattered to experts, dx_e = P_e·(G_e − σ)
// with σ = Σ_j G_j·P_j by fma in slot order from +0. Renormalised weights do not
// depend on unselected logits: those get +0.
BP_HD inline void router_grad_row(const float* p, const int* ids, const bf16* dw, bf16* dlogits, int E, int k,
                                   bool norm_topk_prob, float* w) {
  selected_weights(p, ids, w, k, norm_topk_prob);
  float sigma = 0.0f;
  for (int j = 0; j < k; ++j) sigma = fma_rn(widen(dw[j]), w[j], sigma);
  for (int e = 0; e < E; ++e)
    dlogits[e] = norm_topk_prob ? bf16{0} : round_bf16(mul_rn(p[e], sub_rn(0.0f, sigma)));
  for (int j = 0; j < k; ++j) dlogits[ids[j]] = round_bf16(mul_rn(w[j], sub_rn(widen(dw[j]), sigma)));
}

// probs[t][:] = softmax of f(logits[t][:]) in fp32: max (exact), e_i = exp(x_i − max),
// sum by lane_sum (row_reduce shape), p_i = e_i / sum.
void router_probs(const Knobs& kn, const bf16* logits, float* probs, int T, int E);

// Top-k of each row by descending probability, ties to the lower expert id, NaN
// above every number. weights (fp32, before rounding) are the selected
// probabilities, divided by their slot-order sum when norm_topk_prob.
void router_topk(const float* probs, int* ids, float* weights, int T, int E, int k, bool norm_topk_prob);

// The routing of given logits: router_probs, router_topk and topk_w = R(weights).
void router_select(const Knobs& kn, const bf16* logits, int* ids, bf16* topk_w, int T, int E, int k,
                   bool norm_topk_prob);

// logits = R(a·wr) (K = H unsplit), then router_select.
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
