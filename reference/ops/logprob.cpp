#include "logprob.h"

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/numerics/chunked.h"
#include "reference/numerics/reduce.h"

namespace bp::ref {
namespace {

[[noreturn]] void refuse(const std::string& why) { throw std::invalid_argument("logprob: " + why); }

// The softmax knobs come in the contracts' pairs, and a stage serves one of them.
void check_softmax_knobs(const Knobs& kn, bool one_pass) {
  const bool v1 = kn.softmax_exp == SoftmaxExp::kExp && kn.log_softmax == LogSoftmax::kTwoPass;
  const bool v2 = kn.softmax_exp == SoftmaxExp::kExp2Poly && kn.log_softmax == LogSoftmax::kOnePass;
  if (!v1 && !v2)
    refuse("softmax_exp " + std::string(softmax_exp_name(kn.softmax_exp)) + " with log_softmax " +
           std::string(log_softmax_name(kn.log_softmax)) + " is no contract's pair (exp with two-pass, exp2_poly with one-pass)");
  if (v2 != one_pass)
    refuse(std::string("this stage belongs to the ") + (one_pass ? "one-pass" : "two-pass") + " log-softmax, the knobs to the " +
           (v2 ? "one-pass" : "two-pass"));
}

void check_temperature(float temp) {
  if (!(temp > 0.0f) || is_inf(temp)) refuse("temperature must be finite and > 0, got " + std::to_string(temp));
}

// Any V >= 1 has C fixed chunks (SPEC.md §2.4.1); the trailing ones may be empty.
void check_vocab(int V, int chunks) {
  if (V < 1 || chunks < 1)
    refuse("V = " + std::to_string(V) + " and tp_tree_width = " + std::to_string(chunks) + " must both be >= 1");
}

// A slice's chunks must cover its logits (those past vocab_len are empty).
void check_slice(int vocab_len, int chunk_len, int n_chunks) {
  const int64_t span = static_cast<int64_t>(chunk_len) * n_chunks;
  if (vocab_len < 0 || chunk_len < 1 || n_chunks < 1 || vocab_len > span)
    refuse("a slice of " + std::to_string(vocab_len) + " logits is not covered by " + std::to_string(n_chunks) +
           " chunks of " + std::to_string(chunk_len));
}

void check_targets(const int32_t* targets, int T, int V) {
  for (int t = 0; t < T; ++t)
    if (targets[t] < 0 || targets[t] >= V)
      refuse("target " + std::to_string(targets[t]) + " of row " + std::to_string(t) + " is outside [0, " +
             std::to_string(V) + ")");
}

}  // namespace

void logprob_check_temperature(float temp) { check_temperature(temp); }
void logprob_check_softmax_knobs(const Knobs& kn, bool one_pass) { check_softmax_knobs(kn, one_pass); }

void logprob_check_whole_op(const Knobs& kn, const int32_t* targets, int T, int V, float temp) {
  check_softmax_knobs(kn, kn.log_softmax == LogSoftmax::kOnePass);
  check_temperature(temp);
  check_vocab(V, kn.tp_tree_width);
  check_targets(targets, T, V);
}

namespace {

// Stored fp32 results carry the one canonical NaN (SPEC.md §4), whatever NaN the
// arithmetic produced.
float canonical(float x) { return float_of(canonical_bits(x)); }

// The identity of max_nan: a fold over a chunk starts here.
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Chunk j of row t: its first logit and its length (0 past the slice's vocab_len).
struct Chunk {
  const bf16* p;
  int len;
};
Chunk chunk_at(const bf16* logits, int64_t ld, int t, int j, int vocab_len, int chunk_len) {
  const int len = chunk_extent(vocab_len, chunk_len, j);
  return {logits + t * ld + (len ? static_cast<int64_t>(j) * chunk_len : 0), len};
}

// body(t, j, scratch) for every row t and slice chunk j, in parallel over these
// independent outputs; each thread owns a lane scratch of `lanes` floats.
template <class Body>
void for_each_chunk(int T, int n_chunks, int lanes, Body body) {
#pragma omp parallel
  {
    std::vector<float> scratch(lanes);
#pragma omp for collapse(2) schedule(static)
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < n_chunks; ++j) body(t, j, scratch.data());
  }
}

// The maximum of the chunk's x (max_nan).
float chunk_maximum(const bf16* c, int chunk_len, float temp) {
  float m = kNegInf;
  for (int i = 0; i < chunk_len; ++i) m = max_nan(m, scaled_logit(c[i], temp));
  return m;
}

// The chunk's lane sums of e = exp(d) and, where tsum is asked for, of
// entropy_term(e, d), with d = exponent(x): v1 x − M and math::exp, v2 the base-2
// exponent and exp2_poly (SPEC.md §5.10 step 4 and its v2 rows).
template <class Exponent, class Exp>
void chunk_lane_sums(const Knobs& kn, const bf16* c, int chunk_len, float temp, float* scratch, Exponent exponent,
                     Exp exp, float* sum, float* tsum) {
  auto d = [&](int i) { return exponent(scaled_logit(c[i], temp)); };
  *sum = canonical(lane_sum(chunk_len, kn.row_reduce, scratch, [&](int i) { return exp(d(i)); }));
  if (tsum)
    *tsum = canonical(lane_sum(chunk_len, kn.row_reduce, scratch, [&](int i) {
      const float di = d(i);
      return entropy_term(exp(di), di);
    }));
}

}  // namespace

void logprob_chunk_max(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                       int n_chunks, float temp, float* chunk_max, int out_ld) {
  check_softmax_knobs(kn, false);
  check_temperature(temp);
  check_slice(vocab_len, chunk_len, n_chunks);
  for_each_chunk(T, n_chunks, 0, [&](int t, int j, float*) {
    const Chunk c = chunk_at(logits, ld, t, j, vocab_len, chunk_len);
    chunk_max[static_cast<int64_t>(t) * out_ld + j] = chunk_maximum(c.p, c.len, temp);
  });
}

void logprob_row_max(const Knobs& kn, const float* chunk_max, int T, float* row_max) {
  const int C = kn.tp_tree_width;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) {
    float m = kNegInf;
    for (int c = 0; c < C; ++c) m = max_nan(m, chunk_max[static_cast<int64_t>(t) * C + c]);
    row_max[t] = m;
  }
}

void logprob_chunk_sums(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                        int n_chunks, float temp, const float* row_max, float* chunk_sum, float* chunk_tsum, int out_ld) {
  check_softmax_knobs(kn, false);
  check_temperature(temp);
  check_slice(vocab_len, chunk_len, n_chunks);
  for_each_chunk(T, n_chunks, kn.row_reduce.lanes, [&](int t, int j, float* scratch) {
    const float M = row_max[t];
    const int64_t out = static_cast<int64_t>(t) * out_ld + j;
    const Chunk c = chunk_at(logits, ld, t, j, vocab_len, chunk_len);
    chunk_lane_sums(
        kn, c.p, c.len, temp, scratch,
        [M](float x) { return shifted_diff(x, M); }, [](float d) { return math::exp(d); }, chunk_sum + out,
        chunk_tsum ? chunk_tsum + out : nullptr);
  });
}

void logprob_target_logit(const Knobs&, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                          const int32_t* targets, float temp, float* x_target) {
  check_temperature(temp);
  for (int t = 0; t < T; ++t) {
    const int local = targets[t] - vocab_begin;
    if (local >= 0 && local < vocab_len) x_target[t] = scaled_logit(logits[t * ld + local], temp);
  }
}

void logprob_combine(const Knobs& kn, const float* chunk_sum, const float* chunk_tsum, const float* x_target,
                     const float* row_max, int T, float* row_sum, float* logprob, float* entropy) {
  if (entropy && !chunk_tsum) refuse("entropy needs the chunk sums of the entropy terms");
  const int C = kn.tp_tree_width;
#pragma omp parallel
  {
    std::vector<float> tree(C);
#pragma omp for schedule(static)
    for (int t = 0; t < T; ++t) {
      const float* s = chunk_sum + static_cast<int64_t>(t) * C;
      tree.assign(s, s + C);
      const float S = pairwise_tree(tree.data(), C);
      const float log_s = math::log(S);
      row_sum[t] = canonical(S);
      logprob[t] = canonical(signed_logprob(sub_rn(sub_rn(x_target[t], row_max[t]), log_s), kn.sign_clamp));
      if (entropy) {
        const float* w = chunk_tsum + static_cast<int64_t>(t) * C;
        tree.assign(w, w + C);
        entropy[t] = canonical(signed_entropy(sub_rn(log_s, div_rn(pairwise_tree(tree.data(), C), S)), kn.sign_clamp));
      }
    }
  }
}

void logprob_chunk_states(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                          int n_chunks, float temp, float* chunk_max, float* chunk_sum, float* chunk_tsum, int out_ld) {
  check_softmax_knobs(kn, true);
  check_temperature(temp);
  check_slice(vocab_len, chunk_len, n_chunks);
  for_each_chunk(T, n_chunks, kn.row_reduce.lanes, [&](int t, int j, float* scratch) {
    const Chunk c = chunk_at(logits, ld, t, j, vocab_len, chunk_len);
    const float m = chunk_maximum(c.p, c.len, temp), mc = scaled_max_base2(m);
    const int64_t out = static_cast<int64_t>(t) * out_ld + j;
    chunk_max[out] = m;
    chunk_lane_sums(
        kn, c.p, c.len, temp, scratch, [mc](float x) { return exponent_base2(x, mc); },
        [](float d) { return math::exp2_poly(d); }, chunk_sum + out, chunk_tsum ? chunk_tsum + out : nullptr);
  });
}

void logprob_merge_states(const Knobs& kn, const float* chunk_max, const float* chunk_sum, const float* chunk_tsum,
                          const float* x_target, int T, float* row_max, float* row_sum, float* logprob, float* entropy) {
  check_softmax_knobs(kn, true);
  if (entropy && !chunk_tsum) refuse("entropy needs the chunk sums of the entropy terms");
  const int C = kn.tp_tree_width;
#pragma omp parallel
  {
    std::vector<ChunkState> tree(C);
#pragma omp for schedule(static)
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < C; ++j) {
        const int64_t at = static_cast<int64_t>(t) * C + j;
        tree[j] = {chunk_max[at], chunk_sum[at], chunk_tsum ? chunk_tsum[at] : 0.0f};
      }
      const RowOutputs r = merge_row_states(tree.data(), C, x_target[t], entropy != nullptr, kn.sign_clamp);
      row_max[t] = r.row_max;
      row_sum[t] = r.row_sum;
      logprob[t] = r.logprob;
      if (entropy) entropy[t] = r.entropy;
    }
  }
}

void logprob_fwd(const Knobs& kn, const bf16* logits, const int32_t* targets, int T, int V, float temp,
                 float* logprob, float* row_max, float* row_sum, float* entropy) {
  logprob_check_whole_op(kn, targets, T, V, temp);
  const int C = kn.tp_tree_width, n = fixed_chunk_len(V, C);
  const size_t partials = static_cast<size_t>(T) * C;
  std::vector<float> chunk_max(partials), chunk_sum(partials), chunk_tsum(entropy ? partials : 0), x_target(T);
  float* tsum = entropy ? chunk_tsum.data() : nullptr;
  if (kn.log_softmax == LogSoftmax::kOnePass) {
    logprob_chunk_states(kn, logits, V, T, V, n, C, temp, chunk_max.data(), chunk_sum.data(), tsum, C);
    logprob_target_logit(kn, logits, V, T, 0, V, targets, temp, x_target.data());
    logprob_merge_states(kn, chunk_max.data(), chunk_sum.data(), tsum, x_target.data(), T, row_max, row_sum, logprob,
                         entropy);
    return;
  }
  logprob_chunk_max(kn, logits, V, T, V, n, C, temp, chunk_max.data(), C);
  logprob_row_max(kn, chunk_max.data(), T, row_max);
  logprob_chunk_sums(kn, logits, V, T, V, n, C, temp, row_max, chunk_sum.data(), tsum, C);
  logprob_target_logit(kn, logits, V, T, 0, V, targets, temp, x_target.data());
  logprob_combine(kn, chunk_sum.data(), tsum, x_target.data(), row_max, T, row_sum, logprob, entropy);
}

void logprob_bwd_slice(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                       const int32_t* targets, const float* coef, const float* row_max, const float* row_sum,
                       float temp, bf16* dlogits) {
  const bool one_pass = kn.log_softmax == LogSoftmax::kOnePass;
  check_softmax_knobs(kn, one_pass);
  check_temperature(temp);
#pragma omp parallel for collapse(2) schedule(static)
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < vocab_len; ++v) {
      const int64_t at = t * ld + v;
      const float x = scaled_logit(logits[at], temp);
      const float e = one_pass ? math::exp2_poly(exponent_base2(x, scaled_max_base2(row_max[t])))
                               : shifted_exp(x, row_max[t]);
      const float p = div_rn(e, row_sum[t]);
      const float delta = vocab_begin + v == targets[t] ? 1.0f : 0.0f;
      dlogits[at] = round_bf16(div_rn(mul_rn(coef[t], sub_rn(delta, p)), temp));
    }
}

void logprob_bwd(const Knobs& kn, const bf16* logits, const int32_t* targets, const float* coef,
                 const float* row_max, const float* row_sum, int T, int V, float temp, bf16* dlogits) {
  logprob_check_whole_op(kn, targets, T, V, temp);
  logprob_bwd_slice(kn, logits, V, T, 0, V, targets, coef, row_max, row_sum, temp, dlogits);
}

}  // namespace bp::ref
