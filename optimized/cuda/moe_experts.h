// CUDA twin of reference/ops/moe_experts.h (SPEC.md §5.9): same names and
// arguments, a cudaStream_t last. Activations, per-slot buffers and routing
// weights are device pointers; the dispatch plan (MoeDispatch: offset, token,
// slot) is HOST memory, from which the host plans the gathers and the per-expert
// GEMMs; ExpertWeights / ExpertGrads are host tables of device pointers.
// moe_dispatch itself is the reference's host function. Asynchronous on
// `stream`, except the layer composites, which download the router's ids to
// build the plan.
#pragma once
#include <cuda_runtime_api.h>

#include "reference/contract/contract.h"
#include "reference/ops/moe_experts.h"

namespace bp::cuda {

using ref::ExpertGrads;
using ref::ExpertWeights;
using ref::MoeDispatch;

// Experts e_begin .. e_end−1: c[t][j] = R(dot(m, Wd_e) · f(topk_w[t][j])) for
// each of their rows (t, j); rows of other experts are left untouched.
void moe_experts_fwd(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const bf16* a,
                     const bf16* topk_w, const ExpertWeights& w, bf16* c, int k, int H, int I, cudaStream_t stream = 0);

// out[t][h] = R(Σ_j f(c[t][j][h])), slots in increasing order from +0.
void moe_combine_fwd(const bf16* c, bf16* out, int T, int k, int H, cudaStream_t stream = 0);

// Backward of experts e_begin .. e_end−1 (forward recomputed): da_slot and
// dtopk_w rows of their (t, j), and their weight gradients (+0 for an expert
// without rows), token-chunked over the expert's rows in plan order.
void moe_experts_bwd(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const bf16* a,
                     const bf16* topk_w, const ExpertWeights& w, const bf16* dout, float* da_slot, bf16* dtopk_w,
                     const ExpertGrads& dw, int k, int H, int I, cudaStream_t stream = 0);

// da[t][h] = R(Σ_j da_slot[t][j][h] + router_da_acc[t][h]) (router part may be null).
void moe_combine_bwd(const float* da_slot, const float* router_da_acc, bf16* da, int T, int k, int H,
                     cudaStream_t stream = 0);

// The whole MoE block: router on the device, ids downloaded, ref::moe_dispatch
// on the host, experts and combine on the device.
void moe_layer_fwd(const Knobs& kn, const bf16* a, const bf16* wr, const ExpertWeights& w, bf16* out, int T, int H,
                   int E, int k, int I, bool norm_topk_prob, cudaStream_t stream = 0);

// Its backward: da bf16 [T][H], dwr [E][H] and the expert gradients fp32.
void moe_layer_bwd(const Knobs& kn, const bf16* a, const bf16* wr, const ExpertWeights& w, const bf16* dout, bf16* da,
                   float* dwr, const ExpertGrads& dw, int T, int H, int E, int k, int I, bool norm_topk_prob,
                   cudaStream_t stream = 0);

}  // namespace bp::cuda
