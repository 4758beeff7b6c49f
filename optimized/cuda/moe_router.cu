// The MoE router on the GPU (SPEC.md §5.8): one row team (device_util.cuh) per
// token for the softmax, whose sum is the contract's lane_sum; a warp per token for
// the top-k selection and a thread per token for the gradient row, running the reference's own
// __host__ __device__ helpers (reference/ops/moe_router.h); the router's GEMMs are
// the CUDA linear.
#include <stdexcept>
#include <string>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/linear.h"
#include "optimized/cuda/moe_router.h"
#include "reference/numerics/math.h"
#include "reference/ops/logprob.h"  // max_nan
#include "reference/ops/moe_router.h"

namespace bp::cuda {
namespace {

struct MaxNan {
  __device__ float operator()(float a, float b) const { return ref::max_nan(a, b); }
};

// p_i = exp(x_i − M) / Σ: M by max_nan (any order gives its bits; a NaN row gives
// the canonical NaN, as the reference's row_max), Σ by the lane sum. Each lane
// recomputes its own exponentials for the division, so nothing is stored twice.
template <bool kWarpPerRow>
__global__ void __launch_bounds__(kMaxTeamThreads)
    softmax_kernel(const bf16* __restrict__ logits, int T, int E, LaneShape shape, float* __restrict__ probs) {
  __shared__ float warp_totals[kWarp];
  const auto team = RowTeam<kWarpPerRow>::here();
  if (team.row >= T) return;  // whole warps only (a block team's row is always valid)
  const bf16* x = logits + static_cast<size_t>(team.row) * E;
  float* p = probs + static_cast<size_t>(team.row) * E;
  float m = float_of(0xff800000u);  // −Inf
  for_lane_indices(team.lane, E, shape, [&](int i) { m = ref::max_nan(m, widen(x[i])); });
  m = team.reduce(m, warp_totals, MaxNan{});
  auto e_of = [&](int i) { return math::exp(sub_rn(widen(x[i]), m)); };
  const float sum = team.tree(lane_partial(team.lane, E, shape, e_of), warp_totals);
  for_lane_indices(team.lane, E, shape, [&](int i) { p[i] = div_rn(e_of(i), sum); });
}

// A warp per token: slot j's expert is the first, by ranks_before, of those ranking
// after slot j − 1's, as in select_row; each lane finds it among its experts
// (lane, lane + 32, ...) and a shuffle tree picks the warp's. ranks_before is a strict
// total order, so its first element does not depend on the order of the comparisons.
// Then, by lane 0, the weights (fp32) and, when set, topk_w = R(weights).
__global__ void topk_kernel(const float* __restrict__ probs, int T, int E, int k, bool norm_topk_prob,
                            int* __restrict__ ids, float* __restrict__ weights, bf16* __restrict__ topk_w) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const size_t warps = static_cast<size_t>(gridDim.x) * blockDim.x / kWarp;
  for (size_t t = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; t < static_cast<size_t>(T);
       t += warps) {
    const float* p = probs + t * E;
    int* id = ids + t * k;
    int prev = -1;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      float p_best = 0.0f;
      const float p_prev = prev < 0 ? 0.0f : p[prev];
      for (int e = lane; e < E; e += kWarp) {
        const float pe = p[e];
        if (prev >= 0 && !ref::ranks_before(p_prev, prev, pe, e)) continue;
        if (best < 0 || ref::ranks_before(pe, e, p_best, best)) best = e, p_best = pe;
      }
#pragma unroll
      for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        const int other = __shfl_xor_sync(kFullMask, best, offset);
        const float p_other = __shfl_xor_sync(kFullMask, p_best, offset);
        if (other >= 0 && (best < 0 || ref::ranks_before(p_other, other, p_best, best))) best = other, p_best = p_other;
      }
      if (lane == 0) id[j] = best;
      prev = best;
    }
    if (lane == 0) {
      float* w = weights + t * k;
      ref::selected_weights(p, id, w, k, norm_topk_prob);
      if (topk_w)
        for (int j = 0; j < k; ++j) topk_w[t * k + j] = round_bf16(w[j]);
    }
  }
}

// `w` is a [T][k] fp32 scratch for the recomputed weights.
__global__ void grad_row_kernel(const float* __restrict__ probs, const int* __restrict__ ids,
                                const bf16* __restrict__ dtopk_w, int T, int E, int k, bool norm_topk_prob,
                                bf16* __restrict__ dlogits, float* __restrict__ w) {
  for_each_index(T, [&](size_t t) {
    ref::router_grad_row(probs + t * E, ids + t * k, dtopk_w + t * k, dlogits + t * E, E, k, norm_topk_prob, w + t * k);
  });
}

void check_topk(int E, int k) {
  if (k < 1 || k > E) throw std::invalid_argument("moe_router: top-k must be in [1, E]");
}

// The reference's refusal of ids outside [0, E), read on the host.
void check_ids(const int* ids, int T, int E, int k, cudaStream_t stream) {
  for (int id : copy_to_host(ids, static_cast<size_t>(T) * k, stream))
    if (id < 0 || id >= E) throw std::invalid_argument("moe_router: expert id out of range");
}

void topk(const float* probs, int* ids, float* weights, bf16* topk_w, int T, int E, int k, bool norm_topk_prob,
          cudaStream_t stream) {
  check_topk(E, k);
  if (T <= 0) return;
  topk_kernel<<<grid_for(static_cast<size_t>(T) * kWarp), kBlockThreads, 0, stream>>>(probs, T, E, k, norm_topk_prob,
                                                                                       ids, weights, topk_w);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void router_probs(const Knobs& kn, const bf16* logits, float* probs, int T, int E, cudaStream_t stream) {
  check_lane_shape(kn.row_reduce, "router_probs");
  if (T <= 0 || E <= 0) return;
  with_row_team(E, kn.row_reduce, [&](auto warp_per_row) {
    using Team = RowTeam<decltype(warp_per_row)::value>;
    softmax_kernel<decltype(warp_per_row)::value>
        <<<Team::grid(T), Team::block(kn.row_reduce), 0, stream>>>(logits, T, E, kn.row_reduce, probs);
  });
  BP_CUDA_CHECK_LAUNCH();
}

void router_topk(const float* probs, int* ids, float* weights, int T, int E, int k, bool norm_topk_prob,
                 cudaStream_t stream) {
  topk(probs, ids, weights, nullptr, T, E, k, norm_topk_prob, stream);
}

void router_fwd(const Knobs& kn, const bf16* a, const bf16* wr, bf16* logits, int* ids, bf16* topk_w, int T, int H,
                int E, int k, bool norm_topk_prob, cudaStream_t stream) {
  check_topk(E, k);
  DeviceBuffer<float> probs(static_cast<size_t>(T) * E, stream), weights(static_cast<size_t>(T) * k, stream);
  linear_fwd(kn, a, wr, logits, T, H, E, 1, stream);
  router_probs(kn, logits, probs.get(), T, E, stream);
  topk(probs.get(), ids, weights.get(), topk_w, T, E, k, norm_topk_prob, stream);
}

void router_bwd(const Knobs& kn, const bf16* a, const bf16* wr, const bf16* logits, const int* ids, const bf16* dtopk_w,
                bf16* dlogits, float* da_acc, float* dwr, int T, int H, int E, int k, bool norm_topk_prob,
                cudaStream_t stream) {
  check_ids(ids, T, E, k, stream);
  DeviceBuffer<float> probs(static_cast<size_t>(T) * E, stream), w(static_cast<size_t>(T) * k, stream);
  router_probs(kn, logits, probs.get(), T, E, stream);
  if (T > 0) {
    grad_row_kernel<<<grid_for(T), kBlockThreads, 0, stream>>>(probs.get(), ids, dtopk_w, T, E, k, norm_topk_prob,
                                                               dlogits, w.get());
    BP_CUDA_CHECK_LAUNCH();
  }
  linear_dgrad_acc(kn, dlogits, wr, da_acc, T, H, E, 1, E, stream);
  linear_wgrad(kn, dlogits, a, dwr, T, H, E, stream);
}

}  // namespace bp::cuda
