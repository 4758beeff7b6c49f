// attention: causal GQA softmax attention with a fixed-block online softmax and
// fixed KV splits, forward and backward (SPEC.md §5.6). One entry point serves
// full extend, extend with a prefix KV cache, chunked prefill, decode and ragged
// batches: the bits of a query's output depend only on its q, the keys and values
// at positions 0..p (p its absolute position) and the contract.
#pragma once
#include "reference/contract/contract.h"
#include "reference/numerics/math.h"

namespace bp::ref {

// Head geometry: query head h reads kv head h / (Hq / Hkv).
struct AttnDims {
  int Hq;   // query heads
  int Hkv;  // kv heads (divides Hq)
  int D;    // head_dim
};

// One sequence of a packed batch (plain data, so the CUDA twin can copy it).
// Activations are [T][Hq][D] (q, o, dout, dq) and stats [T][Hq], T packing all
// sequences; keys and values are [rows][Hkv][D] (k, v, dk, dv).
struct AttnSeq {
  int q_begin;   // first token of this sequence in q / o / stats
  int q_len;     // its queries sit at absolute positions past_len .. past_len + q_len - 1
  int past_len;  // keys cached before the first query (0 for a full extend)
  int kv_begin;  // row of key 0 in k / v; keys 0 .. past_len + q_len - 1 follow contiguously
};

// The arguments' checks every entry point makes (std::invalid_argument): valid
// knobs, Hq, Hkv, D >= 1 with Hkv dividing Hq, no negative sequence field. Shared
// with the CUDA twin.
void attention_check_args(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs);

// o = attention output (bf16); m, l = the query's final running max and sum
// (fp32, [T][Hq]): the statistics backward recomputes P from. Decode is q_len = 1
// with the new token's key and value already appended to the cache.
void attention_fwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, bf16* o, float* m, float* l);

// Gradients of L with respect to q, k, v given dout = dL/do, the forward's o, m
// and l. dq is [T][Hq][D]; dk and dv are written at each sequence's key rows
// (which must not overlap between sequences); other rows are left untouched.
void attention_bwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq, bf16* dk,
                   bf16* dv);

// ---- Backward stages: a context-parallel layout splits dk/dv by query chunk ----
// attention_bwd is attention_bwd_dq, then per sequence attention_bwd_kv_partials
// over its queries and attention_bwd_kv_combine over all ⌈S/C⌉ chunks (C =
// grad_token_chunk); chunks no query of the sequence falls in are +0.

// dq of every query of the sequences (dk, dv not computed).
void attention_bwd_dq(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                      const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq);

// The fp32 partials of dk (before the scale) and dv from one sequence's queries,
// for the query chunks they fall in, [past_len/C, ⌈S/C⌉) with S = past_len + q_len:
// written [chunk − past_len/C][key j < S][Hkv][D]. Whole chunks give their exact
// partial: a layout computes each chunk on the rank that holds all its queries.
// Returns the number of chunks written.
int attention_bwd_kv_partials(const Knobs& kn, AttnDims dims, const AttnSeq& seq, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout,
                              float* dk_part, float* dv_part);

// dk = R(scale · pairwise_tree over chunks), dv = R(pairwise_tree over chunks) from
// partials [n_chunks][S][Hkv][D] (chunk c: positions [c·C, (c+1)·C)), written to S
// key rows at dk, dv. Chunks ending at or before key j are +0 for it and not read.
void attention_bwd_kv_combine(const Knobs& kn, AttnDims dims, int S, int n_chunks, const float* dk_part,
                              const float* dv_part, bf16* dk, bf16* dv);

// ---- Scalar rules shared by forward, backward and the CUDA twin ----

// The fp32 softmax scale D^-0.5 as sqrt(1/D): correctly rounded whenever D is a
// power of two (1/D is then exact), so it equals float(D ** -0.5) for 64 and 128.
BP_HD inline float attn_scale(int D) { return sqrt_rn(div_rn(1.0f, static_cast<float>(D))); }

// c = RN(D^-0.5 · log2 e), the factor v2 folds into each score's base-2 exponent
// (SPEC.md §5.6 v2): the fp32 nearest to the real number, from a long double
// evaluation that tests/reference/ops/test_attention.cpp shows is never near a tie.
float attn_exp2_scale(int D);

// How the online softmax forms its exponentials (SPEC.md §5.6), one rule per
// contract generation, shared by the reference and the kernels. v1 (kBase2 false,
// softmax_exp = exp): state values are scores s = R(dot · scale), weights
// exp(s − m). v2 (exp2_poly): state values are the raw dots z, weights
// exp2_poly(fma(z, c, −R(m · c))). A rescaling factor is exp of the difference of
// the two states' scaled maxima, so in v2 the rounding of R(m · c) cancels.
template <bool kBase2>
struct SoftmaxRule {
  float scale;  // attn_scale(D)
  float c;      // attn_exp2_scale(D); unused in v1
  // The value the running maximum and the exponents take for one dot.
  BP_HD float state_value(float dot) const {
    if constexpr (kBase2) return dot;
    else return mul_rn(dot, scale);
  }
  // The maximum as the exponents subtract it (−Inf stays −Inf).
  BP_HD float scaled_max(float m) const {
    if constexpr (kBase2) return mul_rn(m, c);
    else return m;
  }
  // The exponent of a key's weight against the scaled maximum mc.
  BP_HD float weight_exponent(float value, float mc) const {
    if constexpr (kBase2) return fma_rn(value, c, -mc);
    else return sub_rn(value, mc);
  }
  // The exponent of the factor that moves a sum taken against mc_old onto mc_new.
  BP_HD static float factor_exponent(float mc_old, float mc_new) { return sub_rn(mc_old, mc_new); }
  BP_HD static float exp(float exponent) {
    if constexpr (kBase2) return math::exp2_poly(exponent);
    else return math::exp(exponent);
  }
  BP_HD float weight(float value, float mc) const { return exp(weight_exponent(value, mc)); }
  BP_HD static float rescale(float mc_old, float mc_new) { return exp(factor_exponent(mc_old, mc_new)); }
};

// The rule the knobs select, chosen at run time (the reference's loops are not hot).
struct SoftmaxForm {
  bool base2;
  SoftmaxRule<false> v1;
  SoftmaxRule<true> v2;
  float state_value(float dot) const { return base2 ? v2.state_value(dot) : v1.state_value(dot); }
  float scaled_max(float m) const { return base2 ? v2.scaled_max(m) : v1.scaled_max(m); }
  float weight(float value, float mc) const { return base2 ? v2.weight(value, mc) : v1.weight(value, mc); }
  float rescale(float mc_old, float mc_new) const {
    return base2 ? v2.rescale(mc_old, mc_new) : v1.rescale(mc_old, mc_new);
  }
};
SoftmaxForm softmax_form(const Knobs& kn, int D);

// IEEE 754-2019 maximumNumber: a NaN operand is ignored, +0 > -0. Commutative and
// associative, so a running max has the same bits in any reduction order.
BP_HD inline float max_num(float a, float b) {
  const float larger = total_order_key(b) > total_order_key(a) ? b : a;  // selects only
  const float b_unless_nan = is_nan(b) ? a : larger;
  return is_nan(a) ? b : b_unless_nan;
}

// Model::chain over a frame of n slots of which only [lo, hi) are present; absent
// slots are the product +0·+0 (never read). a and b point at slot lo. sm90-tc groups
// sit at fixed offsets 0, 16, ... of the frame. This is what a kernel computes over a
// zero-padded tile, and it makes the bits independent of whatever lies in absent
// slots (future keys, other sequences, padding).
template <class Model>
BP_HD float framed_chain(float c, const bf16* a, ptrdiff_t sa, const bf16* b, ptrdiff_t sb, int lo, int hi, int n) {
  if constexpr (Model::kModel == DotModel::Sm90Tc) {
    for (int g = 0; g < n; g += Model::kGroup) {
      const int g_end = g + Model::kGroup < n ? g + Model::kGroup : n;
      const int v0 = g > lo ? g : lo, v1 = g_end < hi ? g_end : hi;
      const int count = v1 > v0 ? v1 - v0 : 0;  // an empty group still runs: +-0 becomes +0
      c = Model::group(c, a + (v0 - lo) * sa, sa, b + (v0 - lo) * sb, sb, count);
    }
    return c;
  } else {
    // fma(+0, +0, c) = c + (+0): only a -0 accumulator changes (to +0).
    if (lo > 0) c = add_rn(c, 0.0f);
    c = Model::chain(c, a, sa, b, sb, hi - lo);
    if (hi < n) c = add_rn(c, 0.0f);
    return c;
  }
}

}  // namespace bp::ref
