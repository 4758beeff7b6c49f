#include "moe_router.h"

#include <stdexcept>
#include <vector>

#include "linear.h"
#include "reference/numerics/math.h"

namespace bp::ref {
namespace {

// The largest f(x_i), NaN if any x_i is NaN (a kernel's fmaxf would drop NaNs, so
// it must carry the flag explicitly). Which zero wins does not matter: x − (±0)
// then exp give the same bits.
float row_max(const bf16* x, int n) {
  float mx = float_of(0xff800000u);  // −Inf
  for (int i = 0; i < n; ++i) {
    const float v = widen(x[i]);
    if (is_nan(v)) return float_of(kCanonicalNanF32);
    if (v > mx) mx = v;
  }
  return mx;
}

void softmax_row(const bf16* x, float* p, int n, LaneShape shape, float* lanes) {
  const float mx = row_max(x, n);
  for (int i = 0; i < n; ++i) p[i] = math::exp(sub_rn(widen(x[i]), mx));
  const float sum = lane_sum(n, shape, lanes, [&](int i) { return p[i]; });
  for (int i = 0; i < n; ++i) p[i] = div_rn(p[i], sum);
}

void check_ids(const int* ids, int T, int E, int k) {
  for (int i = 0; i < T * k; ++i)
    if (ids[i] < 0 || ids[i] >= E) throw std::invalid_argument("moe_router: expert id out of range");
}

}  // namespace

void router_probs(const Knobs& kn, const bf16* logits, float* probs, int T, int E) {
#pragma omp parallel
  {
    std::vector<float> lanes(kn.row_reduce.lanes);
#pragma omp for schedule(static)
    for (int t = 0; t < T; ++t)
      softmax_row(logits + static_cast<size_t>(t) * E, probs + static_cast<size_t>(t) * E, E, kn.row_reduce,
                  lanes.data());
  }
}

void router_topk(const float* probs, int* ids, float* weights, int T, int E, int k, bool norm_topk_prob) {
  if (k < 1 || k > E) throw std::invalid_argument("moe_router: top-k must be in [1, E]");
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) {
    const float* p = probs + static_cast<size_t>(t) * E;
    int* id = ids + static_cast<size_t>(t) * k;
    select_row(p, id, E, k);
    selected_weights(p, id, weights + static_cast<size_t>(t) * k, k, norm_topk_prob);
  }
}

void router_select(const Knobs& kn, const bf16* logits, int* ids, bf16* topk_w, int T, int E, int k,
                   bool norm_topk_prob) {
  std::vector<float> probs(static_cast<size_t>(T) * E), weights(static_cast<size_t>(T) * k);
  router_probs(kn, logits, probs.data(), T, E);
  router_topk(probs.data(), ids, weights.data(), T, E, k, norm_topk_prob);
  for (size_t i = 0; i < weights.size(); ++i) topk_w[i] = round_bf16(weights[i]);
}

void router_fwd(const Knobs& kn, const bf16* a, const bf16* wr, bf16* logits, int* ids, bf16* topk_w, int T, int H,
                int E, int k, bool norm_topk_prob) {
  linear_fwd(kn, a, wr, logits, T, H, E, 1);
  router_select(kn, logits, ids, topk_w, T, E, k, norm_topk_prob);
}

void router_bwd(const Knobs& kn, const bf16* a, const bf16* wr, const bf16* logits, const int* ids,
                const bf16* dtopk_w, bf16* dlogits, float* da_acc, float* dwr, int T, int H, int E, int k,
                bool norm_topk_prob) {
  check_ids(ids, T, E, k);
  std::vector<float> probs(static_cast<size_t>(T) * E);
  router_probs(kn, logits, probs.data(), T, E);
#pragma omp parallel
  {
    std::vector<float> w(k);
#pragma omp for schedule(static)
    for (int t = 0; t < T; ++t)
      router_grad_row(probs.data() + static_cast<size_t>(t) * E, ids + static_cast<size_t>(t) * k,
                      dtopk_w + static_cast<size_t>(t) * k, dlogits + static_cast<size_t>(t) * E, E, k,
                      norm_topk_prob, w.data());
  }
  linear_dgrad_acc(kn, dlogits, wr, da_acc, T, H, E, 1, E);
  linear_wgrad(kn, dlogits, a, dwr, T, H, E);
}

}  // namespace bp::ref
