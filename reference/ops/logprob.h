// logprob: log-softmax over the vocabulary, the target's log-probability, the
// entropy, and the gradient of L = sum_t c_t·logprob_t (SPEC.md §5.10).
// Logits [T][V] bf16 row-major; every per-token result is fp32.
//
// The vocabulary is cut into C = tp_tree_width fixed chunks of ⌈V/C⌉ logits, the
// last ones shorter or empty (SPEC.md §2.4.1). The forward runs in
// stages so that a vocab-parallel rank holding chunks [a, b) computes its partials
// alone and the combines run after a gather. v1 (two-pass):
//   1. logprob_chunk_max    (per rank)  -> gather -> logprob_row_max
//   2. logprob_chunk_sums   (per rank)  + logprob_target_logit (the target's owner)
//                                       -> gather -> logprob_combine
// v2 (one-pass):
//   1. logprob_chunk_states (per rank)  + logprob_target_logit -> gather -> logprob_merge_states
// logprob_fwd is these stages over the whole row. The backward is elementwise given
// the saved row max M and row sum S, so a rank runs logprob_bwd_slice on its chunks.
#pragma once
#include <cstdint>

#include "reference/contract/contract.h"
#include "reference/numerics/math.h"
#include "reference/numerics/reduce.h"

namespace bp::ref {

// x = f(l) ÷ temp: the scaled logit every stage reads (exact when temp = 1).
BP_HD inline float scaled_logit(bf16 logit, float temp) { return div_rn(widen(logit), temp); }

// IEEE 754-2019 maximum: NaN (canonical) if either input is NaN, and −0 < +0.
// Commutative and associative, so every max tree over a row gives these bits.
BP_HD inline float max_nan(float a, float b) {
  const float larger = total_order_key(b) > total_order_key(a) ? b : a;  // selects only
  return (is_nan(a) | is_nan(b)) ? float_of(kCanonicalNanF32) : larger;
}

// d = x − M and e = exp(d): the shifted exponential the forward sums and the
// backward divides by S. d <= 0 for every finite row, so e is in [0, 1].
BP_HD inline float shifted_diff(float x, float row_max) { return sub_rn(x, row_max); }
BP_HD inline float shifted_exp(float x, float row_max) { return math::exp(shifted_diff(x, row_max)); }

// e·d, the entropy sum's term (<= 0); a masked entry (e = 0, d = −Inf) adds +0,
// the limit of p·log p at p = 0, instead of 0·(−Inf) = NaN.
BP_HD inline float entropy_term(float e, float d) { return e == 0.0f ? 0.0f : mul_rn(e, d); }

// ---- Contract v2 (log_softmax = one-pass, softmax_exp = exp2_poly; SPEC.md §5.10 v2) ----
// Base-2 exponents t = fma(x, c, −m_c), c = RN(log2 e); each chunk against its own
// maximum; chunk states merged by pairwise_tree's shape.
inline constexpr float kLog2eF = 0x1.715476p+0f;  // RN(log2 e)
inline constexpr float kLn2F = 0x1.62e430p-1f;    // RN(ln 2)

// m_c = R(m · c), or +0 for an empty (all −Inf) chunk, whose exponents are then −Inf.
BP_HD inline float scaled_max_base2(float m) { return is_inf(m) && m < 0.0f ? 0.0f : mul_rn(m, kLog2eF); }
BP_HD inline float exponent_base2(float x, float mc) { return fma_rn(x, kLog2eF, -mc); }

// A chunk's (or subtree's) state: its maximum m, its sum s of 2^t against m_c and
// the sum w of 2^t·t (base-2 units) for the entropy.
struct ChunkState {
  float m, s, w;
};

// merge(A, B) of SPEC.md §5.10 v2 step 3; an empty side (m = −Inf) gives the other
// side bit for bit.
BP_HD inline ChunkState merge_chunk_states(ChunkState a, ChunkState b) {
  const bool a_empty = is_inf(a.m) && a.m < 0.0f, b_empty = is_inf(b.m) && b.m < 0.0f;
  const float m = max_nan(a.m, b.m), mc = mul_rn(m, kLog2eF);
  const float da = sub_rn(mul_rn(a.m, kLog2eF), mc), db = sub_rn(mul_rn(b.m, kLog2eF), mc);
  const float alpha_a = math::exp2_poly(da), alpha_b = math::exp2_poly(db);
  const ChunkState merged{m, add_rn(mul_rn(alpha_a, a.s), mul_rn(alpha_b, b.s)),
                          add_rn(mul_rn(alpha_a, fma_rn(da, a.s, a.w)), mul_rn(alpha_b, fma_rn(db, b.s, b.w)))};
  const ChunkState unless_b_empty = b_empty ? a : merged;  // selects only
  return a_empty ? b : unless_b_empty;
}

struct MergeChunkStates {
  BP_HD ChunkState operator()(ChunkState a, ChunkState b) const { return merge_chunk_states(a, b); }
};

// The outputs of one row (v2's merge; the entropy only where asked for), every NaN canonical.
struct RowOutputs {
  float row_max, row_sum, logprob, entropy;
};

// The sign_clamp knob (SPEC.md §5.10 v3): a logprob above +0 becomes +0 and an entropy
// below +0 becomes +0, the signs the exact values have; NaN and −Inf pass unchanged.
BP_HD inline float signed_logprob(float lp, bool clamp) { return clamp && lp > 0.0f ? 0.0f : lp; }
BP_HD inline float signed_entropy(float h, bool clamp) { return clamp && h < 0.0f ? 0.0f : h; }

// SPEC.md §5.10 v2 steps 3-4 for one row from its C states (merged in place):
// logprob = fma(t_target, ln2, −log S), t_target = fma(x_target, c, −m_c(M)),
// entropy = log S − (W·ln2) ÷ S, each then signed (clamp: v3). The reference and the
// CUDA combine both call it.
BP_HD inline RowOutputs merge_row_states(ChunkState* states, int C, float x_target, bool entropy, bool clamp) {
  const ChunkState root = pairwise_tree_merge(states, C, MergeChunkStates{});
  const float log_s = math::log(root.s);
  const float lp = fma_rn(exponent_base2(x_target, scaled_max_base2(root.m)), kLn2F, -log_s);
  const float h = entropy ? sub_rn(log_s, div_rn(mul_rn(root.w, kLn2F), root.s)) : 0.0f;
  return {root.m, float_of(canonical_bits(root.s)), float_of(canonical_bits(signed_logprob(lp, clamp))),
          float_of(canonical_bits(signed_entropy(h, clamp)))};
}

// v2 stage (one pass over the logits): every chunk's state, written as chunk_max,
// chunk_sum and (nullable) chunk_tsum at out[t·out_ld + j]. v1 knobs are refused.
void logprob_chunk_states(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                          int n_chunks,
                          float temp, float* chunk_max, float* chunk_sum, float* chunk_tsum, int out_ld);

// v2 combine over gathered [T][C] states: the merge tree's root (M, S, W) gives
// row_max = M, row_sum = S, logprob = fma(t_target, ln2, −log S) with t_target =
// fma(x_target, c, −m_c(M)), entropy (nullable, needs chunk_tsum) = log S − (W·ln2) ÷ S.
void logprob_merge_states(const Knobs& kn, const float* chunk_max, const float* chunk_sum, const float* chunk_tsum,
                          const float* x_target, int T, float* row_max, float* row_sum, float* logprob, float* entropy);

// ---- Stages (vocab-parallel layouts call these directly) ----------------------
// A rank's slice is n_chunks whole chunks of chunk_len logits of which the first
// vocab_len exist (the rest, the padded tail past V, is absent: a chunk past it is
// empty, with max −Inf and sums +0): `logits` points at its first logit in row 0,
// rows are `ld` elements apart. Partials are written to
// out[t·out_ld + j] for the slice's j-th chunk (pass out + first_chunk and
// out_ld = C to write straight into the gathered [T][C] layout).

// Stage 1: chunk_max = max over the chunk of x (max_nan).
void logprob_chunk_max(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                          int n_chunks,
                       float temp, float* chunk_max, int out_ld);

// Combine 1: row_max[t] = max_nan over the C gathered chunk maxima chunk_max[t][0..C).
void logprob_row_max(const Knobs& kn, const float* chunk_max, int T, float* row_max);

// Stage 2: chunk_sum = lane_sum over the chunk of exp(x − M) (row_reduce shape,
// chunk-local indices); chunk_tsum (nullable) = lane_sum of entropy_term.
void logprob_chunk_sums(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                          int n_chunks,
                        float temp, const float* row_max, float* chunk_sum, float* chunk_tsum, int out_ld);

// x_target[t] = scaled_logit(target) for every row whose target lies in this
// slice [vocab_begin, vocab_begin + vocab_len); other rows are left untouched.
void logprob_target_logit(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                          const int32_t* targets, float temp, float* x_target);

// Combine 2 over gathered [T][C] partials: row_sum = pairwise_tree(chunk sums);
// logprob = (x_target − M) − log(S); entropy (nullable, needs chunk_tsum) =
// log(S) − pairwise_tree(chunk tsums) ÷ S.
void logprob_combine(const Knobs& kn, const float* chunk_sum, const float* chunk_tsum, const float* x_target,
                     const float* row_max, int T, float* row_sum, float* logprob, float* entropy);

// ---- Argument checks (std::invalid_argument), shared with the CUDA twin ------------
// temp finite and > 0.
void logprob_check_temperature(float temp);
// The knobs' pair is one of the contracts' (exp with two-pass, v1; exp2_poly with
// one-pass, v2), and `one_pass` says which one a stage belongs to.
void logprob_check_softmax_knobs(const Knobs& kn, bool one_pass);
// The whole op's: temperature, V divisible by tp_tree_width, every target in [0, V)
// (`targets` readable on the host).
void logprob_check_whole_op(const Knobs& kn, const int32_t* targets, int T, int V, float temp);

// ---- Whole op ------------------------------------------------------------------

// Forward over [T][V] (V divisible by C, 0 <= targets < V, temp finite > 0, else
// std::invalid_argument). Saves row_max (M) and row_sum (S) for the backward;
// entropy may be nullptr.
void logprob_fwd(const Knobs& kn, const bf16* logits, const int32_t* targets, int T, int V, float temp,
                 float* logprob, float* row_max, float* row_sum, float* entropy);

// dlogits[t][v] = R(c_t·(δ(v, target) − p_v) ÷ temp), p_v = exp(x_v − M) ÷ S
// (v2: exp2_poly(fma(x_v, c, −m_c(M))) ÷ S),
// for the vocabulary slice [vocab_begin, vocab_begin + vocab_len) held at
// `logits` (row stride ld) into `dlogits` (same stride).
void logprob_bwd_slice(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                       const int32_t* targets, const float* coef, const float* row_max, const float* row_sum,
                       float temp, bf16* dlogits);

// The backward over the whole vocabulary (same checks as the forward).
void logprob_bwd(const Knobs& kn, const bf16* logits, const int32_t* targets, const float* coef,
                 const float* row_max, const float* row_sum, int T, int V, float temp, bf16* dlogits);

}  // namespace bp::ref
