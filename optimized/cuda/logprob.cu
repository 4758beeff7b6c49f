// logprob on the GPU (SPEC.md §5.10): one team (device_util.cuh) per (row, chunk)
// for the chunk maxima and the chunk sums of exp and of the entropy terms, one
// thread per row for the combines, one per 8 logits for the backward. Where the
// chunks are whole 16-byte packs (chunk_len, vec and ld multiples of 8, aligned
// pointers) every pass reads the logits with 16-byte loads, each lane taking its
// elements in its adding order (for_lane_values), else one bf16 at a time. The
// per-element arithmetic is the reference's own (the __host__ __device__ helpers of
// reference/ops/logprob.h), in the same order on either path.
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/logprob.h"
#include "reference/numerics/chunked.h"
#include "reference/ops/logprob.h"

namespace bp::cuda {
namespace {

// ---- The reference's refusals, messages included ---------------------------------
[[noreturn]] void refuse(const std::string& why) { throw std::invalid_argument("logprob: " + why); }

// The reference's checks and messages; the targets are read on the host.
void check_temperature(float temp) { ref::logprob_check_temperature(temp); }

void check_whole_op(const Knobs& kn, const int32_t* targets, int T, int V, float temp, cudaStream_t stream) {
  const std::vector<int32_t> host = copy_to_host(targets, T, stream);
  ref::logprob_check_whole_op(kn, host.data(), T, V, temp);
}

void check_tree_width(int C) {
  if (C > kMaxLogprobChunks)
    refuse("tp_tree_width = " + std::to_string(C) + " is above the CUDA backend's " +
           std::to_string(kMaxLogprobChunks));
}

// ---- Kernels ----------------------------------------------------------------------
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

__device__ float canonical(float x) { return float_of(canonical_bits(x)); }

struct MaxNan {
  __device__ float operator()(float a, float b) const { return ref::max_nan(a, b); }
};

// Team k is (row t, slice chunk j) = (k / n_chunks, k % n_chunks); the chunk holds
// the slice's logits [j·chunk_len, min((j+1)·chunk_len, vocab_len)), len of them
// (SPEC.md §2.4.1: a short or empty last chunk where the vocabulary is not a
// multiple of C; an empty one reads nothing and gives max −Inf, sums +0).
struct ChunkOfTeam {
  int t, j, len;
  __device__ ChunkOfTeam(int team_row, int n_chunks, int vocab_len, int chunk_len)
      : t(team_row / n_chunks), j(team_row % n_chunks), len(chunk_extent(vocab_len, chunk_len, j)) {}
  __device__ const bf16* start(const bf16* logits, int64_t ld, int chunk_len) const {
    return logits + t * ld + (len ? static_cast<int64_t>(j) * chunk_len : 0);
  }
};

// x = f(l) ÷ τ (ref::scaled_logit) and the backward's final ÷ τ. The kernels are
// also instantiated for τ = 1, where they skip the division: x ÷ 1 = x for every
// non-NaN x, and a NaN stays a NaN that every output canonicalises. IEEE division
// compiles to a call behind a branch, which would serialise a thread's batch of
// logits as exp's branch did.
template <bool kUnitTemp>
struct Temp {
  static constexpr bool kUnit = kUnitTemp;
  float temp;
  __device__ float div(float x) const {
    if constexpr (kUnitTemp) return x;
    else return div_rn(x, temp);
  }
  __device__ float logit(bf16 l) const {
    if constexpr (kUnitTemp) return widen(l);
    else return ref::scaled_logit(l, temp);
  }
};

// max_nan is commutative and associative: any lane order and tree give its bits.
template <bool kWarpPerRow, bool kPacked, bool kUnitTemp>
__global__ void __launch_bounds__(kMaxTeamThreads)
    chunk_max_kernel(const bf16* __restrict__ logits, int64_t ld, int T, int vocab_len, int chunk_len, int n_chunks,
                     Temp<kUnitTemp> temp, LaneShape shape, float* __restrict__ chunk_max, int out_ld) {
  __shared__ float warp_totals[kWarp];
  const auto team = RowTeam<kWarpPerRow>::here();
  if (team.row >= T * n_chunks) return;
  const ChunkOfTeam at(team.row, n_chunks, vocab_len, chunk_len);
  const bf16* c = at.start(logits, ld, chunk_len);
  float m = kNegInf;
  for_lane_values<kPacked>(c, team.lane, at.len, shape, [&](bf16 l) { m = ref::max_nan(m, temp.logit(l)); });
  m = team.reduce(m, warp_totals, MaxNan{});
  if (team.lane == 0) chunk_max[static_cast<int64_t>(at.t) * out_ld + at.j] = m;
}

__global__ void row_max_kernel(const float* __restrict__ chunk_max, int T, int C, float* __restrict__ row_max) {
  for_each_index(T, [&](size_t t) {
    float m = kNegInf;
    for (int c = 0; c < C; ++c) m = ref::max_nan(m, chunk_max[t * C + c]);
    row_max[t] = m;
  });
}

// The lane sums of e = exp(d) and (with tsum) of entropy_term(e, d), each the
// reference's lane_sum over the chunk-local indices. v1 (two-pass): d = x − M, M
// the row's maximum. v2 (kOnePass, SPEC.md §5.10 v2): the chunk's own maximum m
// first (written to chunk_max), then d = fma(x, c, −m_c) and e = exp2_poly(d).
template <bool kWarpPerRow, bool kPacked, bool kUnitTemp, bool kOnePass>
__global__ void __launch_bounds__(kMaxTeamThreads)
    chunk_sums_kernel(const bf16* __restrict__ logits, int64_t ld, int T, int vocab_len, int chunk_len, int n_chunks,
                      Temp<kUnitTemp> temp, LaneShape shape, const float* __restrict__ row_max,
                      float* __restrict__ chunk_max, float* __restrict__ chunk_sum, float* __restrict__ chunk_tsum,
                      int out_ld) {
  __shared__ float warp_totals[kWarp];
  const auto team = RowTeam<kWarpPerRow>::here();
  if (team.row >= T * n_chunks) return;
  const ChunkOfTeam at(team.row, n_chunks, vocab_len, chunk_len);
  const bf16* c = at.start(logits, ld, chunk_len);
  const int64_t out = static_cast<int64_t>(at.t) * out_ld + at.j;
  float M;  // what the exponents subtract: v1 the row's maximum, v2 the chunk's scaled one
  if constexpr (kOnePass) {
    float m = kNegInf;
    for_lane_values<kPacked>(c, team.lane, at.len, shape, [&](bf16 l) { m = ref::max_nan(m, temp.logit(l)); });
    m = team.reduce(m, warp_totals, MaxNan{});
    if (team.lane == 0) chunk_max[out] = m;
    M = ref::scaled_max_base2(m);
  } else {
    M = row_max[at.t];
  }
  auto exponent = [&](float x) { return kOnePass ? ref::exponent_base2(x, M) : ref::shifted_diff(x, M); };
  float s = 0.0f, w = 0.0f;
  auto add_terms = [&](float e, float d) {
    s = add_rn(s, e);
    if (chunk_tsum) w = add_rn(w, ref::entropy_term(e, d));
  };
  if constexpr (kPacked) {  // a pack's 8 exps at once (exp_in_place), then added in order
    LanePacks{team.lane, at.len, shape}.for_each([&](int i) {
      const Bf16x8 pack = load8(c + i);
      float d[kPack], e[kPack];
#pragma unroll
      for (int j = 0; j < kPack; ++j) e[j] = d[j] = exponent(temp.logit(pack[j]));
      softmax_exp_in_place<kOnePass, kPack>(e);
#pragma unroll
      for (int j = 0; j < kPack; ++j) add_terms(e[j], d[j]);
    });
  } else {
    for_lane_indices(team.lane, at.len, shape, [&](int i) {
      const float d = exponent(temp.logit(c[i]));
      add_terms(kOnePass ? math::exp2_poly(d) : math::exp(d), d);
    });
  }
  s = team.tree(s, warp_totals);
  if (team.lane == 0) chunk_sum[out] = canonical(s);
  if (chunk_tsum) {  // uniform over the block
    w = team.tree(w, warp_totals);
    if (team.lane == 0) chunk_tsum[out] = canonical(w);
  }
}

__global__ void target_logit_kernel(const bf16* __restrict__ logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                                    const int32_t* __restrict__ targets, float temp, float* __restrict__ x_target) {
  for_each_index(T, [&](size_t t) {
    const int local = targets[t] - vocab_begin;
    if (local >= 0 && local < vocab_len) x_target[t] = ref::scaled_logit(logits[t * ld + local], temp);
  });
}

__global__ void combine_kernel(const float* __restrict__ chunk_sum, const float* __restrict__ chunk_tsum,
                               const float* __restrict__ x_target, const float* __restrict__ row_max, int T, int C,
                               float* __restrict__ row_sum, float* __restrict__ logprob, float* __restrict__ entropy) {
  for_each_index(T, [&](size_t t) {
    float tree[kMaxLogprobChunks];
    for (int c = 0; c < C; ++c) tree[c] = chunk_sum[t * C + c];
    const float S = pairwise_tree(tree, C);
    const float log_s = math::log(S);
    row_sum[t] = canonical(S);
    logprob[t] = canonical(sub_rn(sub_rn(x_target[t], row_max[t]), log_s));
    if (entropy) {
      for (int c = 0; c < C; ++c) tree[c] = chunk_tsum[t * C + c];
      entropy[t] = canonical(sub_rn(log_s, div_rn(pairwise_tree(tree, C), S)));
    }
  });
}

// v2's combine (SPEC.md §5.10 v2): each row's C gathered states merged by the tree.
__global__ void merge_states_kernel(const float* __restrict__ chunk_max, const float* __restrict__ chunk_sum,
                                    const float* __restrict__ chunk_tsum, const float* __restrict__ x_target, int T,
                                    int C, float* __restrict__ row_max, float* __restrict__ row_sum,
                                    float* __restrict__ logprob, float* __restrict__ entropy) {
  for_each_index(T, [&](size_t t) {
    ref::ChunkState states[kMaxLogprobChunks];
    for (int c = 0; c < C; ++c)
      states[c] = {chunk_max[t * C + c], chunk_sum[t * C + c], chunk_tsum ? chunk_tsum[t * C + c] : 0.0f};
    const ref::RowOutputs r = ref::merge_row_states(states, C, x_target[t], entropy != nullptr);
    row_max[t] = r.row_max;
    row_sum[t] = r.row_sum;
    logprob[t] = r.logprob;
    if (entropy) entropy[t] = r.entropy;
  });
}

// dl = R((c·(δ − p)) ÷ τ), p = e ÷ S, for the logit l of row t at vocabulary index
// v: shifted(l) is e's exponent (v1 x − M; v2 fma(x, c, −m_c(M)), kBase2), then the
// gradient from e.
template <bool kUnitTemp, bool kBase2>
struct RowGrad {
  Temp<kUnitTemp> temp;
  float M, S, coef;  // M: v1 the row's maximum, v2 its scaled maximum m_c
  int target;
  __device__ float shifted(bf16 l) const {
    if constexpr (kBase2) return ref::exponent_base2(temp.logit(l), M);
    else return ref::shifted_diff(temp.logit(l), M);
  }
  __device__ static float exp(float d) { return kBase2 ? math::exp2_poly(d) : math::exp(d); }
  __device__ bf16 operator()(float e, int64_t v) const {
    const float p = div_rn(e, S);
    const float delta = v == target ? 1.0f : 0.0f;
    return round_bf16(temp.div(mul_rn(coef, sub_rn(delta, p))));
  }
};

// One thread per kStep logits of a row: kStep = 8 (16-byte loads and stores) where
// vocab_len and ld are multiples of 8 and the pointers 16-byte aligned, else 1.
template <int kStep, bool kUnitTemp, bool kBase2>
__global__ void bwd_slice_kernel(const bf16* __restrict__ logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                                 const int32_t* __restrict__ targets, const float* __restrict__ coef,
                                 const float* __restrict__ row_max, const float* __restrict__ row_sum,
                                 Temp<kUnitTemp> temp, bf16* __restrict__ dlogits) {
  const int steps = vocab_len / kStep;
  for_each_index(static_cast<size_t>(T) * steps, [&](size_t idx) {
    const int64_t t = static_cast<int64_t>(idx / steps), v = static_cast<int64_t>(idx % steps) * kStep;
    const int64_t at = t * ld + v;
    const float M = kBase2 ? ref::scaled_max_base2(row_max[t]) : row_max[t];
    const RowGrad<kUnitTemp, kBase2> grad{temp, M, row_sum[t], coef[t], targets[t]};
    if constexpr (kStep == kPack) {
      const Bf16x8 l = load8(logits + at);
      float e[kPack];
#pragma unroll
      for (int j = 0; j < kPack; ++j) e[j] = grad.shifted(l[j]);
      softmax_exp_in_place<kBase2, kPack>(e);
      store8(dlogits + at, Bf16x8::of([&](int j) { return grad(e[j], vocab_begin + v + j); }));
    } else {
      dlogits[at] = grad(grad.exp(grad.shifted(logits[at])), vocab_begin + v);
    }
  });
}

// Launches kernel<kWarpPerRow, kPacked, kUnitTemp> with one team per (row, slice
// chunk): launch(warp_per_row, packed, Temp<τ == 1>, grid, block, stream).
template <class Launch>
void per_chunk_teams(const Knobs& kn, bool one_pass, const bf16* logits, int64_t ld, int T, int vocab_len,
                     int chunk_len, int n_chunks, float temp, cudaStream_t stream, Launch launch) {
  ref::logprob_check_softmax_knobs(kn, one_pass);
  if (vocab_len < 0 || chunk_len < 1 || n_chunks < 1 || vocab_len > static_cast<int64_t>(chunk_len) * n_chunks)
    refuse("a slice of " + std::to_string(vocab_len) + " logits is not covered by " + std::to_string(n_chunks) +
           " chunks of " + std::to_string(chunk_len));
  check_lane_shape(kn.row_reduce, "logprob");
  const int teams = T * n_chunks;
  if (teams == 0) return;
  // Packs need every chunk, the short last one too, to be whole packs.
  const bool packed = row_packed(chunk_len, kn.row_reduce) && vocab_len % kPack == 0 && ld % kPack == 0 &&
                      aligned16(logits);
  with_row_team(chunk_len, kn.row_reduce, [&](auto warp_per_row) {
    with_flag(packed, [&](auto packed_flag) {
      with_flag(temp == 1.0f, [&](auto unit) {
        using Team = RowTeam<decltype(warp_per_row)::value>;
        launch(warp_per_row, packed_flag, Temp<decltype(unit)::value>{temp}, Team::grid(teams),
               Team::block(kn.row_reduce), stream);
      });
    });
  });
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void logprob_chunk_max(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                       int n_chunks, float temp,
                       float* chunk_max, int out_ld, cudaStream_t stream) {
  check_temperature(temp);
  per_chunk_teams(kn, false, logits, ld, T, vocab_len, chunk_len, n_chunks, temp, stream,
                  [&](auto warp_per_row, auto packed, auto scale, dim3 grid, dim3 block, cudaStream_t s) {
    chunk_max_kernel<decltype(warp_per_row)::value, decltype(packed)::value>
        <<<grid, block, 0, s>>>(logits, ld, T, vocab_len, chunk_len, n_chunks, scale, kn.row_reduce, chunk_max, out_ld);
  });
}

void logprob_row_max(const Knobs& kn, const float* chunk_max, int T, float* row_max, cudaStream_t stream) {
  if (T == 0) return;
  row_max_kernel<<<grid_for(T), kBlockThreads, 0, stream>>>(chunk_max, T, kn.tp_tree_width, row_max);
  BP_CUDA_CHECK_LAUNCH();
}

void logprob_chunk_sums(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                       int n_chunks, float temp,
                        const float* row_max, float* chunk_sum, float* chunk_tsum, int out_ld, cudaStream_t stream) {
  check_temperature(temp);
  per_chunk_teams(kn, false, logits, ld, T, vocab_len, chunk_len, n_chunks, temp, stream,
                  [&](auto warp_per_row, auto packed, auto scale, dim3 grid, dim3 block, cudaStream_t s) {
    chunk_sums_kernel<decltype(warp_per_row)::value, decltype(packed)::value, decltype(scale)::kUnit, false>
        <<<grid, block, 0, s>>>(logits, ld, T, vocab_len, chunk_len, n_chunks, scale, kn.row_reduce, row_max, nullptr, chunk_sum,
                                chunk_tsum, out_ld);
  });
}

void logprob_chunk_states(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                       int n_chunks,
                          float temp, float* chunk_max, float* chunk_sum, float* chunk_tsum, int out_ld,
                          cudaStream_t stream) {
  check_temperature(temp);
  per_chunk_teams(kn, true, logits, ld, T, vocab_len, chunk_len, n_chunks, temp, stream,
                  [&](auto warp_per_row, auto packed, auto scale, dim3 grid, dim3 block, cudaStream_t s) {
    chunk_sums_kernel<decltype(warp_per_row)::value, decltype(packed)::value, decltype(scale)::kUnit, true>
        <<<grid, block, 0, s>>>(logits, ld, T, vocab_len, chunk_len, n_chunks, scale, kn.row_reduce, nullptr, chunk_max,
                                chunk_sum, chunk_tsum, out_ld);
  });
}

void logprob_merge_states(const Knobs& kn, const float* chunk_max, const float* chunk_sum, const float* chunk_tsum,
                          const float* x_target, int T, float* row_max, float* row_sum, float* logprob, float* entropy,
                          cudaStream_t stream) {
  ref::logprob_check_softmax_knobs(kn, true);
  if (entropy && !chunk_tsum) refuse("entropy needs the chunk sums of the entropy terms");
  check_tree_width(kn.tp_tree_width);
  if (T == 0) return;
  merge_states_kernel<<<grid_for(T), kBlockThreads, 0, stream>>>(chunk_max, chunk_sum, chunk_tsum, x_target, T,
                                                                 kn.tp_tree_width, row_max, row_sum, logprob, entropy);
  BP_CUDA_CHECK_LAUNCH();
}

void logprob_target_logit(const Knobs&, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                          const int32_t* targets, float temp, float* x_target, cudaStream_t stream) {
  check_temperature(temp);
  if (T == 0) return;
  target_logit_kernel<<<grid_for(T), kBlockThreads, 0, stream>>>(logits, ld, T, vocab_begin, vocab_len, targets, temp,
                                                                 x_target);
  BP_CUDA_CHECK_LAUNCH();
}

void logprob_combine(const Knobs& kn, const float* chunk_sum, const float* chunk_tsum, const float* x_target,
                     const float* row_max, int T, float* row_sum, float* logprob, float* entropy, cudaStream_t stream) {
  if (entropy && !chunk_tsum) refuse("entropy needs the chunk sums of the entropy terms");
  check_tree_width(kn.tp_tree_width);
  if (T == 0) return;
  combine_kernel<<<grid_for(T), kBlockThreads, 0, stream>>>(chunk_sum, chunk_tsum, x_target, row_max, T,
                                                            kn.tp_tree_width, row_sum, logprob, entropy);
  BP_CUDA_CHECK_LAUNCH();
}

void logprob_fwd(const Knobs& kn, const bf16* logits, const int32_t* targets, int T, int V, float temp, float* logprob,
                 float* row_max, float* row_sum, float* entropy, cudaStream_t stream) {
  check_whole_op(kn, targets, T, V, temp, stream);
  check_tree_width(kn.tp_tree_width);
  const int C = kn.tp_tree_width;
  const size_t partials = static_cast<size_t>(T) * C;
  DeviceBuffer<float> chunk_max(partials, stream), chunk_sum(partials, stream),
      chunk_tsum(entropy ? partials : 0, stream), x_target(T, stream);
  float* tsum = entropy ? chunk_tsum.get() : nullptr;
  if (kn.log_softmax == LogSoftmax::kOnePass) {
    logprob_chunk_states(kn, logits, V, T, V, fixed_chunk_len(V, C), C, temp, chunk_max.get(), chunk_sum.get(), tsum, C, stream);
    logprob_target_logit(kn, logits, V, T, 0, V, targets, temp, x_target.get(), stream);
    logprob_merge_states(kn, chunk_max.get(), chunk_sum.get(), tsum, x_target.get(), T, row_max, row_sum, logprob,
                         entropy, stream);
    return;
  }
  logprob_chunk_max(kn, logits, V, T, V, fixed_chunk_len(V, C), C, temp, chunk_max.get(), C, stream);
  logprob_row_max(kn, chunk_max.get(), T, row_max, stream);
  logprob_chunk_sums(kn, logits, V, T, V, fixed_chunk_len(V, C), C, temp, row_max, chunk_sum.get(), tsum, C, stream);
  logprob_target_logit(kn, logits, V, T, 0, V, targets, temp, x_target.get(), stream);
  logprob_combine(kn, chunk_sum.get(), tsum, x_target.get(), row_max, T, row_sum, logprob, entropy, stream);
}

void logprob_bwd_slice(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                       const int32_t* targets, const float* coef, const float* row_max, const float* row_sum,
                       float temp, bf16* dlogits, cudaStream_t stream) {
  const bool base2 = kn.log_softmax == LogSoftmax::kOnePass;
  ref::logprob_check_softmax_knobs(kn, base2);
  check_temperature(temp);
  const size_t n = static_cast<size_t>(T) * vocab_len;
  if (n == 0) return;
  const bool packed = vocab_len % kPack == 0 && ld % kPack == 0 && aligned16(logits) && aligned16(dlogits);
  with_flag(temp == 1.0f, [&](auto unit) {
    with_flag(base2, [&](auto base2_flag) {
      constexpr bool kUnit = decltype(unit)::value, kBase2 = decltype(base2_flag)::value;
      const Temp<kUnit> scale{temp};
      if (packed)
        bwd_slice_kernel<kPack, kUnit, kBase2><<<grid_for(n / kPack), kBlockThreads, 0, stream>>>(
            logits, ld, T, vocab_begin, vocab_len, targets, coef, row_max, row_sum, scale, dlogits);
      else
        bwd_slice_kernel<1, kUnit, kBase2><<<grid_for(n), kBlockThreads, 0, stream>>>(
            logits, ld, T, vocab_begin, vocab_len, targets, coef, row_max, row_sum, scale, dlogits);
    });
  });
  BP_CUDA_CHECK_LAUNCH();
}

void logprob_bwd(const Knobs& kn, const bf16* logits, const int32_t* targets, const float* coef, const float* row_max,
                 const float* row_sum, int T, int V, float temp, bf16* dlogits, cudaStream_t stream) {
  check_whole_op(kn, targets, T, V, temp, stream);
  logprob_bwd_slice(kn, logits, V, T, 0, V, targets, coef, row_max, row_sum, temp, dlogits, stream);
}

}  // namespace bp::cuda
