// swiglu and the dense MLP (Hugging Face Qwen3MLP in bf16), SPEC.md §5.7.
// MLP weights in nn.Linear layout: gate and up [I][H] (column-parallel), down
// [H][I] (row-parallel); activations [T][H], hidden [T][I], row-major.
#pragma once
#include "reference/contract/contract.h"
#include "reference/numerics/math.h"

namespace bp::ref {

// silu'(x) = σ·(1 + x·(1 − σ)) with σ = math::sigmoid(x), in this fp32 order:
// one subtraction, one fma, one multiplication.
BP_HD inline float silu_grad(float x) {
  const float sg = math::sigmoid(x);
  return mul_rn(sg, fma_rn(x, sub_rn(1.0f, sg), 1.0f));
}

// s = R(silu(f(g))): the gate's activation, recomputed by the backward.
BP_HD inline bf16 silu_bf16(bf16 g) { return round_bf16(math::silu(widen(g))); }

// One element of the forward: m = R(f(s)·f(u)).
BP_HD inline bf16 swiglu_value(bf16 g, bf16 u) { return round_bf16(mul_rn(widen(silu_bf16(g)), widen(u))); }

// One element of the backward (s recomputed as in the forward):
// du = R(f(dm)·f(s)), ds = R(f(dm)·f(u)), dg = R(f(ds)·silu'(f(g))).
BP_HD inline void swiglu_grads(bf16 g, bf16 u, bf16 dm, bf16& dg, bf16& du) {
  du = round_bf16(mul_rn(widen(dm), widen(silu_bf16(g))));
  const bf16 ds = round_bf16(mul_rn(widen(dm), widen(u)));
  dg = round_bf16(mul_rn(widen(ds), silu_grad(widen(g))));
}

// Elementwise over n elements. No knob enters.
void swiglu_fwd(const bf16* g, const bf16* u, bf16* m, int n);
void swiglu_bwd(const bf16* g, const bf16* u, const bf16* dm, bf16* dg, bf16* du, int n);

// The MLP up to the hidden activation: g = R(a·Wg), u = R(a·Wu) (two separate
// linears, K = H unsplit), m = swiglu(g, u). g, u, m are [T][I].
void mlp_hidden_fwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, bf16* g, bf16* u, bf16* m, int T,
                    int H, int I);

// d = R(m·Wd) with K = I cut into tp_tree_width chunks (row-parallel down_proj).
void mlp_fwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* wd, bf16* d, int T, int H,
             int I);

// The input-gradient accumulator of gate and up, fp32 [T][H]:
// acc = tree_C(dg·Wg) + tree_C(du·Wu), each an N = I dot cut into C = tp_tree_width chunks.
void mlp_input_grad_acc(const Knobs& kn, const bf16* dg, const bf16* du, const bf16* wg, const bf16* wu, float* acc,
                        int T, int H, int I);

// Backward of the down projection for an output gradient dy [T][H]:
// dm = R(dy·Wd) (N = H unsplit), dwd = token-chunked wgrad of (dy, m).
void mlp_down_bwd(const Knobs& kn, const bf16* dy, const bf16* wd, const bf16* m, bf16* dm, float* dwd, int T, int H,
                  int I);

// Backward of gate, up and swiglu for a hidden gradient dm [T][I]; g and u are the
// forward's. da_acc [T][H] as mlp_input_grad_acc; dwg, dwu [I][H] fp32.
void mlp_hidden_bwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* g, const bf16* u,
                    const bf16* dm, float* da_acc, float* dwg, float* dwu, int T, int H, int I);

// Whole dense MLP backward for dd [T][H]: g, u, m recomputed from a (the forward's
// bits), da = R(da_acc) bf16 [T][H], dwg, dwu [I][H] and dwd [H][I] fp32.
void mlp_bwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* wd, const bf16* dd, bf16* da,
             float* dwg, float* dwu, float* dwd, int T, int H, int I);

}  // namespace bp::ref
