// CUDA twin of reference/ops/moe_router.h (SPEC.md §5.8): same arguments, device
// pointers (ids too), bit-identical results under every contract. Asynchronous on
// `stream`, except router_bwd, which copies the ids to the host to refuse bad
// ones before writing anything, as the reference does.
#pragma once
#include <cuda_runtime_api.h>

#include "reference/contract/contract.h"

namespace bp::cuda {

// probs[t][:] = softmax of f(logits[t][:]) in fp32 (max, exp, lane_sum, divide).
void router_probs(const Knobs& kn, const bf16* logits, float* probs, int T, int E, cudaStream_t stream = 0);

// Top-k per row: descending probability, ties to the lower id, NaN above every
// number; weights fp32, renormalised when norm_topk_prob.
void router_topk(const float* probs, int* ids, float* weights, int T, int E, int k, bool norm_topk_prob,
                 cudaStream_t stream = 0);

// logits = R(a·wr), then router_probs, router_topk and topk_w = R(weights).
void router_fwd(const Knobs& kn, const bf16* a, const bf16* wr, bf16* logits, int* ids, bf16* topk_w, int T, int H,
                int E, int k, bool norm_topk_prob, cudaStream_t stream = 0);

// dlogits [T][E] bf16, da_acc [T][H] fp32 (dlogits·wr before rounding), dwr [E][H] fp32.
void router_bwd(const Knobs& kn, const bf16* a, const bf16* wr, const bf16* logits, const int* ids, const bf16* dtopk_w,
                bf16* dlogits, float* da_acc, float* dwr, int T, int H, int E, int k, bool norm_topk_prob,
                cudaStream_t stream = 0);

}  // namespace bp::cuda
