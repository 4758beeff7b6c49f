// logprob on the GPU (SPEC.md §5.10): one team (device_util.cuh) per (row, chunk)
// for the chunk maxima and the chunk sums of exp and of the entropy terms (v2 on
// packed rows: the chunk staged in shared memory, read from DRAM once), one thread
// per row for the combines, and for the backward a thread per 8 logits of a row
// (packed rows) or per logit. Where the chunks are whole 16-byte packs (chunk_len, vec
// and ld multiples of 8, aligned pointers) every pass reads the logits with 16-byte
// loads, each lane taking its elements in its adding order (for_lane_values), else
// one bf16 at a time. The per-element arithmetic is the reference's own (the
// __host__ __device__ helpers of reference/ops/logprob.h), in the same order on
// every path.
#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/logprob.h"
#include "optimized/cuda/wgmma.cuh"
#include "reference/numerics/chunked.h"
#include "reference/ops/logprob.h"

namespace bp::cuda {
namespace {

// ---- The reference's refusals, messages included ---------------------------------
[[noreturn]] void refuse(const std::string& why) { throw std::invalid_argument("logprob: " + why); }

// The reference's checks and messages; the targets are read on the host.
void check_temperature(float temp) { ref::logprob_check_temperature(temp); }

// The whole op's refusals in the reference's order, the targets last: the constructor
// checks the rest and marks the work `stream` has before the call; finish() copies the
// targets into pinned host memory on a side stream that waits only for that mark, so
// the kernels enqueued on `stream` in between (which write nothing of the op's outputs)
// run while the copy and the host check happen.
class TargetCheck {
 public:
  TargetCheck(const Knobs& kn, const int32_t* targets, int T, int V, float temp, cudaStream_t stream)
      : kn_(kn), targets_(targets), T_(T), V_(V), temp_(temp) {
    ref::logprob_check_whole_op(kn, nullptr, 0, V, temp);  // everything but the targets, before any launch
    if (T == 0) return;
    staging_ = &staging_for(T);
    BP_CUDA_CHECK(cudaEventRecord(staging_->before_call, stream));
  }
  // Waits for the targets alone and refuses as the reference does.
  void finish() const {
    if (T_ == 0) return;
    Staging& st = *staging_;
    BP_CUDA_CHECK(cudaStreamWaitEvent(st.side, st.before_call));
    BP_CUDA_CHECK(cudaMemcpyAsync(st.host, targets_, sizeof(int32_t) * T_, cudaMemcpyDeviceToHost, st.side));
    BP_CUDA_CHECK(cudaStreamSynchronize(st.side));
    ref::logprob_check_whole_op(kn_, st.host, T_, V_, temp_);
  }

 private:
  // Per host thread and device: pinned memory (cudaMemcpyAsync into pageable memory
  // would wait) grown as needed, a non-blocking side stream (no implicit order with
  // the legacy default stream: the event gives the order) and the event.
  struct Staging {
    int32_t* host = nullptr;
    size_t n = 0;
    cudaStream_t side = nullptr;
    cudaEvent_t before_call = nullptr;
    ~Staging() {
      cudaFreeHost(host);
      if (side) cudaStreamDestroy(side);
      if (before_call) cudaEventDestroy(before_call);
    }
  };
  static Staging& staging_for(int T) {
    thread_local std::map<int, Staging> per_device;
    int device = 0;
    BP_CUDA_CHECK(cudaGetDevice(&device));
    Staging& st = per_device[device];
    if (!st.side) {
      BP_CUDA_CHECK(cudaStreamCreateWithFlags(&st.side, cudaStreamNonBlocking));
      BP_CUDA_CHECK(cudaEventCreateWithFlags(&st.before_call, cudaEventDisableTiming));
    }
    if (st.n < static_cast<size_t>(T)) {
      BP_CUDA_CHECK(cudaFreeHost(st.host));
      st.host = nullptr;
      st.n = 0;
      BP_CUDA_CHECK(cudaMallocHost(&st.host, sizeof(int32_t) * T));
      st.n = T;
    }
    return st;
  }

  const Knobs& kn_;
  const int32_t* targets_;
  int T_, V_;
  float temp_;
  Staging* staging_ = nullptr;
};

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

// ---- v2's chunk states from a staged chunk (one read of the logits) --------------------
// A block team (packed rows, runs of one pack) copies its whole chunk into shared memory
// with one bulk copy and reads it there twice, for the maximum and for the sums, so each
// logit leaves DRAM once and the loops stay rolled (small code, few registers). The
// maximum runs on the raw bf16 pairs: x = f(l) ÷ τ is non-decreasing in l and keeps a
// zero's sign, so the maximum of the x is the scaled maximum of the l; max.NaN.bf16x2
// (one instruction for two logits) is IEEE maximum but for the sign of a zero result,
// so a chunk whose maximum is a zero takes max_nan again. Where |m| < 2^30 or m = −Inf,
// every exponent t = fma(x, c, −m_c) is ≤ 64 (x ≤ m, and m_c = R(m·c) is off m·c by at
// most half its ulp, ≤ 64 below 2^31) and not NaN, so exp2_poly_core gives exp2_poly's
// bits; larger finite maxima take exp2_poly itself. A NaN or +Inf maximum comes from a
// NaN or +Inf x, whose t is NaN (fma(NaN, …), fma(+Inf, c, −Inf)), and NaN reaches s
// and w through exp2_poly, the adds and entropy_term: both sums are then the canonical
// NaN, written as such.
constexpr int kStagedChunkMax = 24576;  // 48 KB of bf16: the default dynamic shared memory limit
constexpr uint32_t kNegInfPair = 0xff80ff80u;  // the maximum's identity, two bf16 −Inf

__device__ inline uint32_t max_nan_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

template <bool kUnitTemp>
__global__ void __launch_bounds__(kMaxTeamThreads)
    chunk_states_staged_kernel(const bf16* __restrict__ logits, int64_t ld, int T, int vocab_len, int chunk_len,
                               int n_chunks, Temp<kUnitTemp> temp, float* __restrict__ chunk_max,
                               float* __restrict__ chunk_sum, float* __restrict__ chunk_tsum, int out_ld) {
  extern __shared__ uint4 staged[];  // the chunk's packs
  __shared__ float warp_totals[kWarp];
  __shared__ uint64_t landed;
  const auto team = RowTeam<false>::here();
  const ChunkOfTeam at(team.row, n_chunks, vocab_len, chunk_len);
  const int packs = at.len / kPack;
  if (team.lane == 0) {
    sm90::mbarrier_init(&landed, 1);
    sm90::mbarrier_init_fence();
  }
  __syncthreads();
  if (team.lane == 0 && packs > 0) {
    sm90::mbarrier_arrive_expect_tx(&landed, packs * 16u);
    sm90::bulk_load(staged, at.start(logits, ld, chunk_len), packs * 16u, &landed);
  }
  if (packs > 0) sm90::mbarrier_wait(&landed, 0);
  // Lane l's packs are l, l + L, … (LanePacks with vec = kPack), in its adding order.
  uint32_t pair_max = kNegInfPair;
  for (int k = team.lane; k < packs; k += team.size) {
    const uint4 b = staged[k];
    pair_max = max_nan_bf16x2(pair_max, max_nan_bf16x2(max_nan_bf16x2(b.x, b.y), max_nan_bf16x2(b.z, b.w)));
  }
  const bf16 lane_max{static_cast<uint16_t>(max_nan_bf16x2(pair_max, pair_max >> 16) & 0xffffu)};
  float m = team.reduce(temp.logit(lane_max), warp_totals, MaxNan{});
  if (m == 0.0f) {  // block-uniform and rare: the exact maximum, zero signs included
    float exact = kNegInf;
    for (int k = team.lane; k < packs; k += team.size) {
      const Bf16x8 pack{staged[k]};
#pragma unroll
      for (int j = 0; j < kPack; ++j) exact = ref::max_nan(exact, temp.logit(pack[j]));
    }
    m = team.reduce(exact, warp_totals, MaxNan{});
  }
  const int64_t out = static_cast<int64_t>(at.t) * out_ld + at.j;
  if (is_nan(m) || (is_inf(m) && m > 0.0f)) {  // block-uniform: every sum is NaN (above)
    if (team.lane == 0) {
      chunk_max[out] = m;
      chunk_sum[out] = float_of(kCanonicalNanF32);
      if (chunk_tsum) chunk_tsum[out] = float_of(kCanonicalNanF32);
    }
    return;
  }
  const float mc = ref::scaled_max_base2(m);
  float s = 0.0f, w = 0.0f;
  auto add_chunk = [&](auto bounded) {
    for (int k = team.lane; k < packs; k += team.size) {
      const Bf16x8 pack{staged[k]};
      float t[kPack], e[kPack];
#pragma unroll
      for (int j = 0; j < kPack; ++j) {
        t[j] = ref::exponent_base2(temp.logit(pack[j]), mc);
        e[j] = decltype(bounded)::value ? exp2_poly_core_floor(t[j]) : math::exp2_poly(t[j]);
      }
#pragma unroll
      for (int j = 0; j < kPack; ++j) {
        s = add_rn(s, e[j]);
        if (chunk_tsum) w = add_rn(w, ref::entropy_term(e[j], t[j]));
      }
    }
  };
  if (fabsf(m) < 0x1p30f || is_inf(m))  // block-uniform; an infinite m is −Inf here
    add_chunk(std::true_type{});
  else
    add_chunk(std::false_type{});
  s = team.tree(s, warp_totals);
  if (team.lane == 0) {
    chunk_max[out] = m;
    chunk_sum[out] = canonical(s);
  }
  if (chunk_tsum) {  // uniform over the block
    w = team.tree(w, warp_totals);
    if (team.lane == 0) chunk_tsum[out] = canonical(w);
  }
}

// Whether chunk_states_staged_kernel takes a slice of chunks of chunk_len: a packed
// block team with runs of one pack (every contract's row_reduce) and a chunk that
// fits the default shared memory.
bool chunk_fits_staging(int chunk_len, LaneShape shape, bool packed) {
  return packed && shape.vec == kPack && !warp_per_row(chunk_len, shape) && chunk_len <= kStagedChunkMax;
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
                               bool clamp, float* __restrict__ row_sum, float* __restrict__ logprob,
                               float* __restrict__ entropy) {
  for_each_index(T, [&](size_t t) {
    float tree[kMaxLogprobChunks];
    for (int c = 0; c < C; ++c) tree[c] = chunk_sum[t * C + c];
    const float S = pairwise_tree(tree, C);
    const float log_s = math::log(S);
    row_sum[t] = canonical(S);
    logprob[t] = canonical(ref::signed_logprob(sub_rn(sub_rn(x_target[t], row_max[t]), log_s), clamp));
    if (entropy) {
      for (int c = 0; c < C; ++c) tree[c] = chunk_tsum[t * C + c];
      entropy[t] = canonical(ref::signed_entropy(sub_rn(log_s, div_rn(pairwise_tree(tree, C), S)), clamp));
    }
  });
}

// Where v2's combine reads a row's x_target: gathered by the vocab-parallel stages
// (x_target), or from the whole row's logits (logprob_fwd, its targets checked on the
// host before the combine is launched), as target_logit_kernel reads it.
struct TargetLogits {
  const float* x_target;
  const bf16* logits;
  const int32_t* targets;
  int V;
  float temp;
  __device__ float operator()(size_t t) const {
    return x_target ? x_target[t] : ref::scaled_logit(logits[t * V + targets[t]], temp);
  }
};

// v2's combine (SPEC.md §5.10 v2): each row's C gathered states merged by the tree.
__global__ void merge_states_kernel(const float* __restrict__ chunk_max, const float* __restrict__ chunk_sum,
                                    const float* __restrict__ chunk_tsum, TargetLogits x_target, int T, int C,
                                    bool clamp, float* __restrict__ row_max, float* __restrict__ row_sum,
                                    float* __restrict__ logprob, float* __restrict__ entropy) {
  for_each_index(T, [&](size_t t) {
    ref::ChunkState states[kMaxLogprobChunks];
    for (int c = 0; c < C; ++c)
      states[c] = {chunk_max[t * C + c], chunk_sum[t * C + c], chunk_tsum ? chunk_tsum[t * C + c] : 0.0f};
    const ref::RowOutputs r = ref::merge_row_states(states, C, x_target(t), entropy != nullptr, clamp);
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
  __device__ bf16 operator()(float e, int64_t v) const { return from_p(div_rn(e, S), v == target); }
  __device__ bf16 from_p(float p, bool at_target) const {
    return round_bf16(temp.div(mul_rn(coef, sub_rn(at_target ? 1.0f : 0.0f, p))));
  }
  // Row t's constants from the saved (M, S), the coefficients and the targets (v2
  // forms m_c from M).
  __device__ static RowGrad of_row(Temp<kUnitTemp> temp, const float* row_max, const float* row_sum,
                                   const float* coefs, const int32_t* targets, int64_t t) {
    return {temp, kBase2 ? ref::scaled_max_base2(row_max[t]) : row_max[t], row_sum[t], coefs[t], targets[t]};
  }
};

// One thread per logit where the rows are not whole 16-byte packs (bwd_rows_kernel takes those).
template <bool kUnitTemp, bool kBase2>
__global__ void bwd_slice_kernel(const bf16* __restrict__ logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                                 const int32_t* __restrict__ targets, const float* __restrict__ coef,
                                 const float* __restrict__ row_max, const float* __restrict__ row_sum,
                                 Temp<kUnitTemp> temp, const int* __restrict__ refused, bf16* __restrict__ dlogits) {
  if (refused && *refused) return;
  for_each_index(static_cast<size_t>(T) * vocab_len, [&](size_t idx) {
    const int64_t t = static_cast<int64_t>(idx / vocab_len), v = static_cast<int64_t>(idx % vocab_len);
    const auto grad = RowGrad<kUnitTemp, kBase2>::of_row(temp, row_max, row_sum, coef, targets, t);
    dlogits[t * ld + v] = grad(grad.exp(grad.shifted(logits[t * ld + v])), vocab_begin + v);
  });
}

// e ÷ S for the many e of one row: div.rn's own sequence as nvcc 13 emits it (the
// reciprocal y of S by MUFU.RCP and one Newton step, q = e·y, one fma correction),
// with y formed once per row instead of once per logit. div.rn guards that sequence
// with FCHK and a slow path for operands near the range limits; here the row takes it
// only for S in [1, 2^30] and a logit only for e = +0 or e in [2^-90, 2^90], where the
// quotient is a normal number far from those limits, so the corrected quotient is
// correctly rounded (Markstein's theorem: y within an ulp of 1/S, q within an ulp of
// e/S) and equals div_rn's bits; every other e sets `off` and is divided by div_rn.
struct RowQuotient {
  float S, y;
  __device__ explicit RowQuotient(float s) : S(s) {
    float y0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(s));
    y = fma_rn(y0, fma_rn(-s, y0, 1.0f), y0);
  }
  __device__ static bool takes(float s) { return s >= 1.0f && s <= 0x1p30f; }
  __device__ float div(float e, bool& off) const {
    off |= !(e >= 0x1p-90f && e <= 0x1p90f) && e != 0.0f;
    const float q = mul_rn(e, y);
    return fma_rn(fma_rn(-S, q, e), y, q);
  }
};

// The gradient of a row's packed logits, 16-byte loads and stores: blockIdx.y strides
// over the rows, the threads of blockIdx.x over the row's packs, so a thread forms its
// row's constants once. Where S takes RowQuotient (every finite row: S ≥ 1) p = e ÷ S
// comes from it; δ is 0 but in the one pack holding the target. Each element's
// arithmetic is RowGrad's: the same operations in the same order.
template <bool kUnitTemp, bool kBase2>
__global__ void bwd_rows_kernel(const bf16* __restrict__ logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                                const int32_t* __restrict__ targets, const float* __restrict__ coef,
                                const float* __restrict__ row_max, const float* __restrict__ row_sum,
                                Temp<kUnitTemp> temp, const int* __restrict__ refused, bf16* __restrict__ dlogits) {
  if (refused && *refused) return;
  const int packs = vocab_len / kPack;
  for (int t = blockIdx.y; t < T; t += gridDim.y) {
    const auto grad = RowGrad<kUnitTemp, kBase2>::of_row(temp, row_max, row_sum, coef, targets, t);
    const bool fast_quotient = RowQuotient::takes(grad.S);  // block-uniform
    const RowQuotient quotient(fast_quotient ? grad.S : 1.0f);
    const bf16* row = logits + static_cast<int64_t>(t) * ld;
    bf16* drow = dlogits + static_cast<int64_t>(t) * ld;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < packs; k += gridDim.x * blockDim.x) {
      const int v = k * kPack;
      const Bf16x8 l = load8(row + v);
      float e[kPack], p[kPack];
#pragma unroll
      for (int j = 0; j < kPack; ++j) e[j] = grad.shifted(l[j]);
      softmax_exp_in_place<kBase2, kPack>(e);
      bool off = !fast_quotient;
      if (fast_quotient) {
#pragma unroll
        for (int j = 0; j < kPack; ++j) p[j] = quotient.div(e[j], off);
      }
      if (off) {  // rare (every pack of a row with S outside [1, 2^30])
#pragma unroll
        for (int j = 0; j < kPack; ++j) p[j] = div_rn(e[j], grad.S);
      }
      const int target_at = grad.target - (vocab_begin + v);
      if (static_cast<unsigned>(target_at) < static_cast<unsigned>(kPack)) {
        store8(drow + v, Bf16x8::of([&](int j) { return grad.from_p(p[j], j == target_at); }));
      } else {
        store8(drow + v, Bf16x8::of([&](int j) { return grad.from_p(p[j], false); }));
      }
    }
  }
}

// The device's copy of the host's target check (one block): *refused = whether some
// target lies outside [0, V). The whole op's gradient kernel reads it and writes
// nothing when it is set, so it can be launched before the host has checked.
__global__ void targets_refused_kernel(const int32_t* __restrict__ targets, int T, int V, int* __restrict__ refused) {
  int bad = 0;
  for (int t = threadIdx.x; t < T; t += blockDim.x) bad |= targets[t] < 0 || targets[t] >= V;
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) *refused = bad;
}

// bwd_rows_kernel's grid: about kBwdPacksPerThread packs per thread along a row
// (the row's constants amortised over them), the rows along y (at most 65535 at once).
constexpr int kBwdPacksPerThread = 4;
dim3 bwd_rows_grid(int T, int vocab_len) {
  const int packs = vocab_len / kPack, per_block = kBlockThreads * kBwdPacksPerThread;
  return dim3(static_cast<unsigned>(std::max(1, (packs + per_block - 1) / per_block)),
              static_cast<unsigned>(std::min(T, 65535)));
}

void merge_states(const Knobs& kn, const float* chunk_max, const float* chunk_sum, const float* chunk_tsum,
                  TargetLogits x_target, int T, float* row_max, float* row_sum, float* logprob, float* entropy,
                  cudaStream_t stream) {
  ref::logprob_check_softmax_knobs(kn, true);
  if (entropy && !chunk_tsum) refuse("entropy needs the chunk sums of the entropy terms");
  check_tree_width(kn.tp_tree_width);
  if (T == 0) return;
  merge_states_kernel<<<grid_for(T), kBlockThreads, 0, stream>>>(chunk_max, chunk_sum, chunk_tsum, x_target, T,
                                                                 kn.tp_tree_width, kn.sign_clamp, row_max, row_sum,
                                                                 logprob, entropy);
  BP_CUDA_CHECK_LAUNCH();
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

// logprob_bwd_slice; `refused` (nullable) is targets_refused_kernel's verdict.
void bwd_slice(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
               const int32_t* targets, const float* coef, const float* row_max, const float* row_sum, float temp,
               const int* refused, bf16* dlogits, cudaStream_t stream) {
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
        bwd_rows_kernel<kUnit, kBase2><<<bwd_rows_grid(T, vocab_len), kBlockThreads, 0, stream>>>(
            logits, ld, T, vocab_begin, vocab_len, targets, coef, row_max, row_sum, scale, refused, dlogits);
      else
        bwd_slice_kernel<kUnit, kBase2><<<grid_for(n), kBlockThreads, 0, stream>>>(
            logits, ld, T, vocab_begin, vocab_len, targets, coef, row_max, row_sum, scale, refused, dlogits);
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
        <<<grid, block, 0, s>>>(logits, ld, T, vocab_len, chunk_len, n_chunks, scale, kn.row_reduce, row_max, nullptr,
                                chunk_sum, chunk_tsum, out_ld);
  });
}

void logprob_chunk_states(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                       int n_chunks,
                          float temp, float* chunk_max, float* chunk_sum, float* chunk_tsum, int out_ld,
                          cudaStream_t stream) {
  check_temperature(temp);
  per_chunk_teams(kn, true, logits, ld, T, vocab_len, chunk_len, n_chunks, temp, stream,
                  [&](auto warp_per_row, auto packed, auto scale, dim3 grid, dim3 block, cudaStream_t s) {
    if (chunk_fits_staging(chunk_len, kn.row_reduce, packed))
      chunk_states_staged_kernel<<<grid, block, chunk_len * sizeof(bf16), s>>>(
          logits, ld, T, vocab_len, chunk_len, n_chunks, scale, chunk_max, chunk_sum, chunk_tsum, out_ld);
    else
      chunk_sums_kernel<decltype(warp_per_row)::value, decltype(packed)::value, decltype(scale)::kUnit, true>
          <<<grid, block, 0, s>>>(logits, ld, T, vocab_len, chunk_len, n_chunks, scale, kn.row_reduce, nullptr,
                                  chunk_max, chunk_sum, chunk_tsum, out_ld);
  });
}

void logprob_merge_states(const Knobs& kn, const float* chunk_max, const float* chunk_sum, const float* chunk_tsum,
                          const float* x_target, int T, float* row_max, float* row_sum, float* logprob, float* entropy,
                          cudaStream_t stream) {
  merge_states(kn, chunk_max, chunk_sum, chunk_tsum, TargetLogits{x_target, nullptr, nullptr, 0, 1.0f}, T, row_max,
               row_sum, logprob, entropy, stream);
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
                                                            kn.tp_tree_width, kn.sign_clamp, row_sum, logprob,
                                                            entropy);
  BP_CUDA_CHECK_LAUNCH();
}

void logprob_fwd(const Knobs& kn, const bf16* logits, const int32_t* targets, int T, int V, float temp, float* logprob,
                 float* row_max, float* row_sum, float* entropy, cudaStream_t stream) {
  const TargetCheck check(kn, targets, T, V, temp, stream);
  check_tree_width(kn.tp_tree_width);
  const int C = kn.tp_tree_width;
  const size_t partials = static_cast<size_t>(T) * C;
  const bool one_pass = kn.log_softmax == LogSoftmax::kOnePass;
  // One scratch allocation: the chunk maxima, sums, entropy sums and (v1) target logits.
  DeviceBuffer<float> scratch(partials * (entropy ? 3 : 2) + (one_pass ? 0 : T), stream);
  float* chunk_max = scratch.get();
  float* chunk_sum = chunk_max + partials;
  float* tsum = entropy ? chunk_sum + partials : nullptr;
  float* x_target = chunk_sum + partials * (entropy ? 2 : 1);
  // The first pass writes only the chunk partials: the targets' check overlaps it.
  if (one_pass) {
    logprob_chunk_states(kn, logits, V, T, V, fixed_chunk_len(V, C), C, temp, chunk_max, chunk_sum, tsum, C, stream);
    check.finish();
    merge_states(kn, chunk_max, chunk_sum, tsum, TargetLogits{nullptr, logits, targets, V, temp}, T, row_max, row_sum,
                 logprob, entropy, stream);
    return;
  }
  logprob_chunk_max(kn, logits, V, T, V, fixed_chunk_len(V, C), C, temp, chunk_max, C, stream);
  check.finish();
  logprob_row_max(kn, chunk_max, T, row_max, stream);
  logprob_chunk_sums(kn, logits, V, T, V, fixed_chunk_len(V, C), C, temp, row_max, chunk_sum, tsum, C, stream);
  logprob_target_logit(kn, logits, V, T, 0, V, targets, temp, x_target, stream);
  logprob_combine(kn, chunk_sum, tsum, x_target, row_max, T, row_sum, logprob, entropy, stream);
}

void logprob_bwd_slice(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                       const int32_t* targets, const float* coef, const float* row_max, const float* row_sum,
                       float temp, bf16* dlogits, cudaStream_t stream) {
  bwd_slice(kn, logits, ld, T, vocab_begin, vocab_len, targets, coef, row_max, row_sum, temp, nullptr, dlogits, stream);
}

void logprob_bwd(const Knobs& kn, const bf16* logits, const int32_t* targets, const float* coef, const float* row_max,
                 const float* row_sum, int T, int V, float temp, bf16* dlogits, cudaStream_t stream) {
  // The gradient kernel obeys the device's verdict on the targets, so it runs while
  // the host checks them (and writes nothing where the host then refuses).
  const TargetCheck check(kn, targets, T, V, temp, stream);
  DeviceBuffer<int> refused(1, stream);
  if (T > 0) {
    targets_refused_kernel<<<1, kBlockThreads, 0, stream>>>(targets, T, V, refused.get());
    BP_CUDA_CHECK_LAUNCH();
  }
  bwd_slice(kn, logits, V, T, 0, V, targets, coef, row_max, row_sum, temp, refused.get(), dlogits, stream);
  check.finish();
}

}  // namespace bp::cuda
