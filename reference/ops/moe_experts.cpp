#include "moe_experts.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "linear.h"
#include "moe_router.h"
#include "reference/numerics/chunked.h"
#include "swiglu.h"

namespace bp::ref {
namespace {

size_t row_of(int t, int j, int k) { return static_cast<size_t>(t) * k + j; }

// The per-slot row of plan entry n.
size_t plan_row(const MoeDispatch& plan, int n, int k) { return row_of(plan.token[n], plan.slot[n], k); }

// One expert's rows, gathered in plan order, and its forward intermediates.
struct ExpertRows {
  int n = 0;
  std::vector<bf16> x, g, u, m;  // [n][H], [n][I] x3
  std::vector<float> acc;        // [n][H]: the down projection before the routing weight
};

const bf16* expert_matrix(const bf16* const* table, int e) {
  if (!table[e]) throw std::invalid_argument("moe_experts: expert " + std::to_string(e) + " has rows but no weights");
  return table[e];
}

void check_range(const MoeDispatch& plan, int e_begin, int e_end) {
  if (e_begin < 0 || e_begin > e_end || e_end > plan.num_experts)
    throw std::invalid_argument("moe_experts: expert range outside [0, num_experts]");
}

// The forward of expert e up to the fp32 down accumulator, shared by both passes.
ExpertRows expert_forward(const Knobs& kn, const MoeDispatch& plan, int e, const bf16* a, const ExpertWeights& w,
                          int H, int I) {
  ExpertRows r;
  const int first = plan.offset[e];
  r.n = plan.offset[e + 1] - first;
  const size_t hidden = static_cast<size_t>(r.n) * I;
  r.x.resize(static_cast<size_t>(r.n) * H);
  r.g.resize(hidden);
  r.u.resize(hidden);
  r.m.resize(hidden);
  r.acc.resize(static_cast<size_t>(r.n) * H);
  for (int i = 0; i < r.n; ++i)
    std::copy(a + static_cast<size_t>(plan.token[first + i]) * H, a + static_cast<size_t>(plan.token[first + i] + 1) * H,
              r.x.begin() + static_cast<size_t>(i) * H);
  mlp_hidden_fwd(kn, r.x.data(), expert_matrix(w.gate, e), expert_matrix(w.up, e), r.g.data(), r.u.data(), r.m.data(),
                 r.n, H, I);
  linear_acc(kn, r.m.data(), expert_matrix(w.down, e), r.acc.data(), r.n, I, H, kn.tp_tree_width,
             fixed_chunk_len(I, kn.tp_tree_width));
  return r;
}

// The backward of expert e's rows: routing-weight gradients, da_slot rows and the
// expert's weight gradients.
void expert_backward(const Knobs& kn, const MoeDispatch& plan, int e, const bf16* a, const bf16* topk_w,
                     const ExpertWeights& w, const bf16* dout, float* da_slot, bf16* dtopk_w, const ExpertGrads& dw,
                     int k, int H, int I) {
  const size_t matrix = static_cast<size_t>(I) * H;
  if (plan.offset[e + 1] == plan.offset[e]) {  // no rows: +0 gradients, weights not read
    std::fill(dw.gate[e], dw.gate[e] + matrix, 0.0f);
    std::fill(dw.up[e], dw.up[e] + matrix, 0.0f);
    std::fill(dw.down[e], dw.down[e] + matrix, 0.0f);
    return;
  }
  const ExpertRows r = expert_forward(kn, plan, e, a, w, H, I);
  const int first = plan.offset[e];
  std::vector<bf16> dacc(static_cast<size_t>(r.n) * H), dm(static_cast<size_t>(r.n) * I);
  std::vector<float> dx(static_cast<size_t>(r.n) * H);
#pragma omp parallel
  {
    std::vector<float> lanes(kn.row_reduce.lanes);
#pragma omp for schedule(static)
    for (int i = 0; i < r.n; ++i) {
      const size_t slot_row = plan_row(plan, first + i, k);
      const bf16* y = dout + static_cast<size_t>(plan.token[first + i]) * H;
      const float* acc = r.acc.data() + static_cast<size_t>(i) * H;
      const float wt = widen(topk_w[slot_row]);
      dtopk_w[slot_row] = round_bf16(lane_sum(H, kn.row_reduce, lanes.data(),
                                              [&](int h) { return mul_rn(widen(y[h]), acc[h]); }));
      for (int h = 0; h < H; ++h) dacc[static_cast<size_t>(i) * H + h] = round_bf16(mul_rn(widen(y[h]), wt));
    }
  }
  mlp_down_bwd(kn, dacc.data(), expert_matrix(w.down, e), r.m.data(), dm.data(), dw.down[e], r.n, H, I);
  mlp_hidden_bwd(kn, r.x.data(), expert_matrix(w.gate, e), expert_matrix(w.up, e), r.g.data(), r.u.data(), dm.data(),
                 dx.data(), dw.gate[e], dw.up[e], r.n, H, I);
  for (int i = 0; i < r.n; ++i)
    std::copy(dx.begin() + static_cast<size_t>(i) * H, dx.begin() + static_cast<size_t>(i + 1) * H,
              da_slot + plan_row(plan, first + i, k) * H);
}

// Router forward and dispatch plan of a layer, shared by its forward and backward.
struct Routed {
  std::vector<bf16> logits, topk_w;
  std::vector<int> ids, offset, token, slot;
  MoeDispatch plan() const { return MoeDispatch{static_cast<int>(offset.size()) - 1, offset.data(), token.data(), slot.data()}; }
};

Routed route(const Knobs& kn, const bf16* a, const bf16* wr, int T, int H, int E, int k, bool norm_topk_prob) {
  Routed r;
  const size_t rows = static_cast<size_t>(T) * k;
  r.logits.resize(static_cast<size_t>(T) * E);
  r.topk_w.resize(rows);
  r.ids.resize(rows);
  r.offset.resize(E + 1);
  r.token.resize(rows);
  r.slot.resize(rows);
  router_fwd(kn, a, wr, r.logits.data(), r.ids.data(), r.topk_w.data(), T, H, E, k, norm_topk_prob);
  moe_dispatch(r.ids.data(), T, k, E, r.offset.data(), r.token.data(), r.slot.data());
  return r;
}

}  // namespace

void moe_dispatch(const int* ids, int T, int k, int E, int* offset, int* token, int* slot) {
  std::fill(offset, offset + E + 1, 0);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      const int e = ids[row_of(t, j, k)];
      if (e < 0 || e >= E) throw std::invalid_argument("moe_dispatch: expert id out of range");
      for (int i = 0; i < j; ++i)
        if (ids[row_of(t, i, k)] == e) throw std::invalid_argument("moe_dispatch: a token chose an expert twice");
      ++offset[e + 1];
    }
  for (int e = 0; e < E; ++e) offset[e + 1] += offset[e];
  std::vector<int> next(offset, offset + E);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      const int at = next[ids[row_of(t, j, k)]]++;
      token[at] = t;
      slot[at] = j;
    }
}

void moe_experts_fwd(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const bf16* a,
                     const bf16* topk_w, const ExpertWeights& w, bf16* c, int k, int H, int I) {
  check_range(plan, e_begin, e_end);
  for (int e = e_begin; e < e_end; ++e) {
    if (plan.offset[e + 1] == plan.offset[e]) continue;
    const ExpertRows r = expert_forward(kn, plan, e, a, w, H, I);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < r.n; ++i) {
      const size_t slot_row = plan_row(plan, plan.offset[e] + i, k);
      const float wt = widen(topk_w[slot_row]);
      for (int h = 0; h < H; ++h)
        c[slot_row * H + h] = round_bf16(mul_rn(r.acc[static_cast<size_t>(i) * H + h], wt));
    }
  }
}

void moe_combine_fwd(const bf16* c, bf16* out, int T, int k, int H) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum = add_rn(sum, widen(c[row_of(t, j, k) * H + h]));
      out[static_cast<size_t>(t) * H + h] = round_bf16(sum);
    }
}

void moe_experts_bwd(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const bf16* a,
                     const bf16* topk_w, const ExpertWeights& w, const bf16* dout, float* da_slot, bf16* dtopk_w,
                     const ExpertGrads& dw, int k, int H, int I) {
  check_range(plan, e_begin, e_end);
  for (int e = e_begin; e < e_end; ++e) expert_backward(kn, plan, e, a, topk_w, w, dout, da_slot, dtopk_w, dw, k, H, I);
}

void moe_combine_bwd(const float* da_slot, const float* router_da_acc, bf16* da, int T, int k, int H) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum = add_rn(sum, da_slot[row_of(t, j, k) * H + h]);
      if (router_da_acc) sum = add_rn(sum, router_da_acc[static_cast<size_t>(t) * H + h]);
      da[static_cast<size_t>(t) * H + h] = round_bf16(sum);
    }
}

void moe_layer_fwd(const Knobs& kn, const bf16* a, const bf16* wr, const ExpertWeights& w, bf16* out, int T, int H,
                   int E, int k, int I, bool norm_topk_prob) {
  const Routed r = route(kn, a, wr, T, H, E, k, norm_topk_prob);
  std::vector<bf16> c(static_cast<size_t>(T) * k * H);
  moe_experts_fwd(kn, r.plan(), 0, E, a, r.topk_w.data(), w, c.data(), k, H, I);
  moe_combine_fwd(c.data(), out, T, k, H);
}

void moe_layer_bwd(const Knobs& kn, const bf16* a, const bf16* wr, const ExpertWeights& w, const bf16* dout, bf16* da,
                   float* dwr, const ExpertGrads& dw, int T, int H, int E, int k, int I, bool norm_topk_prob) {
  const Routed r = route(kn, a, wr, T, H, E, k, norm_topk_prob);
  const size_t rows = static_cast<size_t>(T) * k;
  std::vector<float> da_slot(rows * H), router_acc(static_cast<size_t>(T) * H);
  std::vector<bf16> dtopk_w(rows), dlogits(static_cast<size_t>(T) * E);
  moe_experts_bwd(kn, r.plan(), 0, E, a, r.topk_w.data(), w, dout, da_slot.data(), dtopk_w.data(), dw, k, H, I);
  router_bwd(kn, a, wr, r.logits.data(), r.ids.data(), dtopk_w.data(), dlogits.data(), router_acc.data(), dwr, T, H, E,
             k, norm_topk_prob);
  moe_combine_bwd(da_slot.data(), router_acc.data(), da, T, k, H);
}

}  // namespace bp::ref
