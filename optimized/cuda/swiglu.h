// CUDA twin of reference/ops/swiglu.h (SPEC.md §5.7): swiglu forward and
// backward, and the dense MLP composed of the CUDA linear and swiglu op for op as
// the reference composes it. Device pointers; asynchronous on `stream`; the
// composites allocate their intermediates stream-ordered.
#pragma once
#include <cuda_runtime_api.h>

#include "reference/contract/contract.h"

namespace bp::cuda {

// m = R(f(R(silu(f(g))))·f(u)) per element.
void swiglu_fwd(const bf16* g, const bf16* u, bf16* m, int n, cudaStream_t stream = 0);

// du = R(f(dm)·f(s)), dg = R(f(R(f(dm)·f(u)))·silu'(f(g))) per element.
void swiglu_bwd(const bf16* g, const bf16* u, const bf16* dm, bf16* dg, bf16* du, int n, cudaStream_t stream = 0);

// g = R(a·Wg), u = R(a·Wu), m = swiglu(g, u); g, u, m [T][I].
void mlp_hidden_fwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, bf16* g, bf16* u, bf16* m, int T,
                    int H, int I, cudaStream_t stream = 0);

// d = R(m·Wd), K = I cut into tp_tree_width chunks.
void mlp_fwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* wd, bf16* d, int T, int H,
             int I, cudaStream_t stream = 0);

// acc [T][H] fp32 = tree_C(dg·Wg) + tree_C(du·Wu).
void mlp_input_grad_acc(const Knobs& kn, const bf16* dg, const bf16* du, const bf16* wg, const bf16* wu, float* acc,
                        int T, int H, int I, cudaStream_t stream = 0);

// dm = R(dy·Wd), dwd = token-chunked wgrad of (dy, m).
void mlp_down_bwd(const Knobs& kn, const bf16* dy, const bf16* wd, const bf16* m, bf16* dm, float* dwd, int T, int H,
                  int I, cudaStream_t stream = 0);

// swiglu, gate and up backward: da_acc [T][H], dwg and dwu [I][H] fp32.
void mlp_hidden_bwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* g, const bf16* u,
                    const bf16* dm, float* da_acc, float* dwg, float* dwu, int T, int H, int I,
                    cudaStream_t stream = 0);

// The whole dense MLP backward (g, u, m recomputed): da = R(da_acc), weight gradients fp32.
void mlp_bwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* wd, const bf16* dd, bf16* da,
             float* dwg, float* dwu, float* dwd, int T, int H, int I, cudaStream_t stream = 0);

}  // namespace bp::cuda
