// MoE experts on the GPU (SPEC.md §5.9), bit-identical to reference/ops/moe_experts.cpp.
//
// Host plan: the dispatch plan is host memory. The rows of experts
// e_begin .. e_end−1 are the plan entries offset[e_begin] .. offset[e_end]−1; their
// tokens' activations are gathered once into a packed [rows][H] buffer in plan
// order, so each expert's rows are one contiguous slice of it, and the reference's
// per-expert ops run on those slices: the forward GEMMs of all experts as one
// grouped launch per matrix (linear_fwd_grouped: a device table of every expert's
// output tiles; a row's bits depend on that row alone), the backward per expert by
// the dense MLP composites (the CUDA linear and swiglu), whose weight gradients
// are token-chunked over the expert's rows in plan order from its first row. The per-row steps around the
// GEMMs (routing weight on the fp32 accumulator, its gradient, the scatter to the
// per-slot rows t·k + j) are one launch over all rows of the range. No atomics:
// every output element has exactly one writer.
#include <stdexcept>
#include <string>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/linear.h"
#include "optimized/cuda/moe_experts.h"
#include "optimized/cuda/moe_router.h"
#include "optimized/cuda/rows.h"
#include "optimized/cuda/swiglu.h"
#include "reference/numerics/chunked.h"

namespace bp::cuda {
namespace {

BP_HD inline size_t elems(size_t rows, int cols) { return rows * static_cast<size_t>(cols); }

// ---- Host plan ----------------------------------------------------------------
// The plan entries of an expert range, in plan order.
struct RangeRows {
  int first = 0;               // plan entry of packed row 0
  std::vector<int> tokens;     // token of each packed row
  std::vector<int> slot_rows;  // its per-slot row t·k + j
  size_t size() const { return tokens.size(); }
};

// The reference's refusals, before anything is launched.
void check_range(const MoeDispatch& plan, int e_begin, int e_end) {
  if (e_begin < 0 || e_begin > e_end || e_end > plan.num_experts)
    throw std::invalid_argument("moe_experts: expert range outside [0, num_experts]");
}

int rows_of(const MoeDispatch& plan, int e) { return plan.offset[e + 1] - plan.offset[e]; }

void check_weights(const MoeDispatch& plan, int e_begin, int e_end, const ExpertWeights& w) {
  for (int e = e_begin; e < e_end; ++e)
    if (rows_of(plan, e) > 0 && (!w.gate[e] || !w.up[e] || !w.down[e]))
      throw std::invalid_argument("moe_experts: expert " + std::to_string(e) + " has rows but no weights");
}

RangeRows range_rows(const MoeDispatch& plan, int e_begin, int e_end, int k) {
  RangeRows r;
  r.first = plan.offset[e_begin];
  for (int n = r.first; n < plan.offset[e_end]; ++n) {
    r.tokens.push_back(plan.token[n]);
    r.slot_rows.push_back(plan.token[n] * k + plan.slot[n]);
  }
  return r;
}

// ---- Kernels --------------------------------------------------------------------
// c[slot row of i][h] = R(acc[i][h] · f(topk_w[slot row of i])); by packs of 8 (one
// index division each, 16-byte loads and stores) where H is a multiple of 8.
__global__ void weigh_rows_kernel(const float* __restrict__ acc, const int* __restrict__ slot_rows,
                                  const bf16* __restrict__ topk_w, size_t rows, int H, bf16* __restrict__ c,
                                  bool packed) {
  const auto out_at = [&](size_t idx, float& wt) {
    const size_t r = static_cast<size_t>(slot_rows[idx / H]);
    wt = widen(topk_w[r]);
    return r * H + idx % H;
  };
  for_each_packed(
      rows * H, packed,
      [&](size_t idx) {
        float wt;
        const size_t at = out_at(idx, wt);
        const F32x8 a = load8(acc + idx);
        store8(c + at, Bf16x8::of([&](int j) { return round_bf16(mul_rn(a.v[j], wt)); }));
      },
      [&](size_t idx) {
        float wt;
        const size_t at = out_at(idx, wt);
        c[at] = round_bf16(mul_rn(acc[idx], wt));
      });
}

// One row team per packed row i (token t, slot row r), y = dout[t]:
// dtopk_w[r] = R(lane_sum_h(f(y_h)·acc_h)) and dacc[i][h] = R(f(y_h)·f(topk_w[r])).
template <bool kWarpPerRow>
__global__ void __launch_bounds__(kMaxTeamThreads)
    routing_grads_kernel(const float* __restrict__ acc, const int* __restrict__ tokens,
                         const int* __restrict__ slot_rows, const bf16* __restrict__ topk_w,
                         const bf16* __restrict__ dout, int rows, int H, LaneShape shape, bf16* __restrict__ dtopk_w,
                         bf16* __restrict__ dacc) {
  __shared__ float warp_totals[kWarp];
  const auto team = RowTeam<kWarpPerRow>::here();
  if (team.row >= rows) return;  // whole warps only (a block team's row is always valid)
  const bf16* y = dout + elems(tokens[team.row], H);
  const float* a = acc + elems(team.row, H);
  const int r = slot_rows[team.row];
  const float s =
      team.tree(lane_partial(team.lane, H, shape, [&](int h) { return mul_rn(widen(y[h]), a[h]); }), warp_totals);
  if (team.lane == 0) dtopk_w[r] = round_bf16(s);
  const float wt = widen(topk_w[r]);
  bf16* d = dacc + elems(team.row, H);
  for (int h = team.lane; h < H; h += team.size) d[h] = round_bf16(mul_rn(widen(y[h]), wt));
}

__global__ void combine_fwd_kernel(const bf16* __restrict__ c, bf16* __restrict__ out, size_t T, int k, int H) {
  for_each_index(T * H, [&](size_t i) {
    const size_t t = i / H, h = i % H;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum = add_rn(sum, widen(c[(t * k + j) * H + h]));
    out[i] = round_bf16(sum);
  });
}

__global__ void combine_bwd_kernel(const float* __restrict__ da_slot, const float* __restrict__ router_da_acc,
                                   bf16* __restrict__ da, size_t T, int k, int H) {
  for_each_index(T * H, [&](size_t i) {
    const size_t t = i / H, h = i % H;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum = add_rn(sum, da_slot[(t * k + j) * H + h]);
    if (router_da_acc) sum = add_rn(sum, router_da_acc[i]);
    da[i] = round_bf16(sum);
  });
}

// ---- The experts' forward, shared by both passes ------------------------------------
// Packed in plan order: x [rows][H], g, u, m [rows][I], acc [rows][H] (the down
// projection before the routing weight).
struct ExpertsForward {
  DeviceBuffer<bf16> x, g, u, m;
  DeviceBuffer<float> acc;
};

// Calls f(e, i0, n) for each expert of the range with n > 0 rows, i0 its first packed row.
template <class F>
void for_each_expert_slice(const MoeDispatch& plan, int e_begin, int e_end, const RangeRows& rows, F&& f) {
  for (int e = e_begin; e < e_end; ++e)
    if (rows_of(plan, e) > 0) f(e, static_cast<size_t>(plan.offset[e] - rows.first), rows_of(plan, e));
}

// Gate and up of every expert in one grouped launch, swiglu over all rows, the down
// projection in another: per expert, mlp_hidden_fwd and linear_acc's bits.
ExpertsForward experts_forward(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const RangeRows& rows,
                               const bf16* a, const ExpertWeights& w, int H, int I, cudaStream_t stream) {
  const size_t n = rows.size();
  ExpertsForward f{DeviceBuffer<bf16>(elems(n, H), stream), DeviceBuffer<bf16>(elems(n, I), stream),
                   DeviceBuffer<bf16>(elems(n, I), stream), DeviceBuffer<bf16>(elems(n, I), stream),
                   DeviceBuffer<float>(elems(n, H), stream)};
  gather_rows(a, H, rows.tokens, f.x.get(), stream);
  std::vector<LinearGroup> gate_up, down;
  for_each_expert_slice(plan, e_begin, e_end, rows, [&](int e, size_t i0, int ne) {
    const bf16* x = f.x.get() + elems(i0, H);
    gate_up.push_back({x, w.gate[e], ne, nullptr, f.g.get() + elems(i0, I)});
    gate_up.push_back({x, w.up[e], ne, nullptr, f.u.get() + elems(i0, I)});
    down.push_back({f.m.get() + elems(i0, I), w.down[e], ne, f.acc.get() + elems(i0, H), nullptr});
  });
  linear_fwd_grouped(kn, gate_up.data(), static_cast<int>(gate_up.size()), H, I, 1, stream);
  swiglu_fwd(f.g.get(), f.u.get(), f.m.get(), static_cast<int>(elems(n, I)), stream);
  linear_fwd_grouped(kn, down.data(), static_cast<int>(down.size()), I, H, kn.tp_tree_width, stream);
  return f;
}

// Per expert, mlp_down_bwd then mlp_hidden_bwd (swiglu.cu) from the output
// gradient dacc of its rows: the same GEMMs grouped over the experts, one launch
// each, and the elementwise stages once over all rows (rows are independent).
// dx gets every row's input-gradient accumulator (gate's plus up's).
void experts_mlp_bwd(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const RangeRows& rows,
                     const ExpertsForward& f, const ExpertWeights& w, const bf16* dacc, float* dx,
                     const ExpertGrads& dw, int H, int I, cudaStream_t stream) {
  const size_t n = rows.size();
  DeviceBuffer<bf16> dm(elems(n, I), stream), dg(elems(n, I), stream), du(elems(n, I), stream);
  std::vector<LinearGroup> down_dgrad;
  std::vector<DgradPair> gate_up_dgrad;
  std::vector<WgradGroup> down_wgrad, hidden_wgrad;
  for_each_expert_slice(plan, e_begin, e_end, rows, [&](int e, size_t i0, int ne) {
    const bf16* dy = dacc + elems(i0, H);
    const bf16* x = f.x.get() + elems(i0, H);
    bf16* dg_e = dg.get() + elems(i0, I);
    bf16* du_e = du.get() + elems(i0, I);
    down_dgrad.push_back({dy, w.down[e], ne, nullptr, dm.get() + elems(i0, I)});
    down_wgrad.push_back({dy, f.m.get() + elems(i0, I), ne, dw.down[e]});
    gate_up_dgrad.push_back({dg_e, w.gate[e], du_e, w.up[e], ne, dx + elems(i0, H)});
    hidden_wgrad.push_back({dg_e, x, ne, dw.gate[e]});
    hidden_wgrad.push_back({du_e, x, ne, dw.up[e]});
  });
  const auto count = [](const auto& groups) { return static_cast<int>(groups.size()); };
  linear_dgrad_grouped(kn, down_dgrad.data(), count(down_dgrad), I, H, 1, stream);
  linear_wgrad_grouped(kn, down_wgrad.data(), count(down_wgrad), I, H, stream);
  swiglu_bwd(f.g.get(), f.u.get(), dm.get(), dg.get(), du.get(), static_cast<int>(elems(n, I)), stream);
  linear_dgrad_pair_grouped(kn, gate_up_dgrad.data(), count(gate_up_dgrad), H, I, kn.tp_tree_width,
                            fixed_chunk_len(I, kn.tp_tree_width), stream);
  linear_wgrad_grouped(kn, hidden_wgrad.data(), count(hidden_wgrad), H, I, stream);
}

// ---- The layer's routing, shared by its forward and backward ----------------------
struct Routed {
  DeviceBuffer<bf16> logits, topk_w;
  DeviceBuffer<int> ids;
  std::vector<int> offset, token, slot;
  MoeDispatch plan() const {
    return MoeDispatch{static_cast<int>(offset.size()) - 1, offset.data(), token.data(), slot.data()};
  }
};

Routed route(const Knobs& kn, const bf16* a, const bf16* wr, int T, int H, int E, int k, bool norm_topk_prob,
             cudaStream_t stream) {
  const size_t rows = elems(T, k);
  Routed r{DeviceBuffer<bf16>(elems(T, E), stream),
           DeviceBuffer<bf16>(rows, stream),
           DeviceBuffer<int>(rows, stream),
           std::vector<int>(E + 1),
           std::vector<int>(rows),
           std::vector<int>(rows)};
  router_fwd(kn, a, wr, r.logits.get(), r.ids.get(), r.topk_w.get(), T, H, E, k, norm_topk_prob, stream);
  const std::vector<int> ids = r.ids.download();
  ref::moe_dispatch(ids.data(), T, k, E, r.offset.data(), r.token.data(), r.slot.data());
  return r;
}

}  // namespace

void moe_experts_fwd(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const bf16* a,
                     const bf16* topk_w, const ExpertWeights& w, bf16* c, int k, int H, int I, cudaStream_t stream) {
  check_range(plan, e_begin, e_end);
  check_weights(plan, e_begin, e_end, w);
  const RangeRows rows = range_rows(plan, e_begin, e_end, k);
  if (rows.size() == 0 || H == 0) return;
  const ExpertsForward f = experts_forward(kn, plan, e_begin, e_end, rows, a, w, H, I, stream);
  const DeviceBuffer<int> slot_rows(rows.slot_rows, stream);
  const bool packed = H % kPack == 0 && all_aligned16({f.acc.get(), c});
  weigh_rows_kernel<<<grid_for_packed(elems(rows.size(), H), packed), kBlockThreads, 0, stream>>>(
      f.acc.get(), slot_rows.get(), topk_w, rows.size(), H, c, packed);
  BP_CUDA_CHECK_LAUNCH();
}

void moe_combine_fwd(const bf16* c, bf16* out, int T, int k, int H, cudaStream_t stream) {
  if (elems(T, H) == 0) return;
  combine_fwd_kernel<<<grid_for(elems(T, H)), kBlockThreads, 0, stream>>>(c, out, T, k, H);
  BP_CUDA_CHECK_LAUNCH();
}

void moe_experts_bwd(const Knobs& kn, const MoeDispatch& plan, int e_begin, int e_end, const bf16* a,
                     const bf16* topk_w, const ExpertWeights& w, const bf16* dout, float* da_slot, bf16* dtopk_w,
                     const ExpertGrads& dw, int k, int H, int I, cudaStream_t stream) {
  check_range(plan, e_begin, e_end);
  check_weights(plan, e_begin, e_end, w);
  check_lane_shape(kn.row_reduce, "moe_experts_bwd");
  const size_t matrix_bytes = elems(I, H) * sizeof(float);
  for (int e = e_begin; e < e_end; ++e)  // no rows: +0 gradients, weights not read
    if (rows_of(plan, e) == 0 && matrix_bytes > 0)
      for (float* g : {dw.gate[e], dw.up[e], dw.down[e]}) BP_CUDA_CHECK(cudaMemsetAsync(g, 0, matrix_bytes, stream));
  const RangeRows rows = range_rows(plan, e_begin, e_end, k);
  const size_t n = rows.size();
  if (n == 0) return;
  const ExpertsForward f = experts_forward(kn, plan, e_begin, e_end, rows, a, w, H, I, stream);
  const DeviceBuffer<int> tokens(rows.tokens, stream), slot_rows(rows.slot_rows, stream);
  DeviceBuffer<bf16> dacc(elems(n, H), stream);
  DeviceBuffer<float> dx(elems(n, H), stream);
  with_row_team(H, kn.row_reduce, [&](auto warp_per_row) {
    using Team = RowTeam<decltype(warp_per_row)::value>;
    routing_grads_kernel<decltype(warp_per_row)::value>
        <<<Team::grid(static_cast<int>(n)), Team::block(kn.row_reduce), 0, stream>>>(
            f.acc.get(), tokens.get(), slot_rows.get(), topk_w, dout, static_cast<int>(n), H, kn.row_reduce, dtopk_w,
            dacc.get());
  });
  BP_CUDA_CHECK_LAUNCH();
  experts_mlp_bwd(kn, plan, e_begin, e_end, rows, f, w, dacc.get(), dx.get(), dw, H, I, stream);
  scatter_rows(dx.get(), H, rows.slot_rows, da_slot, stream);
}

void moe_combine_bwd(const float* da_slot, const float* router_da_acc, bf16* da, int T, int k, int H,
                     cudaStream_t stream) {
  if (elems(T, H) == 0) return;
  combine_bwd_kernel<<<grid_for(elems(T, H)), kBlockThreads, 0, stream>>>(da_slot, router_da_acc, da, T, k, H);
  BP_CUDA_CHECK_LAUNCH();
}

void moe_layer_fwd(const Knobs& kn, const bf16* a, const bf16* wr, const ExpertWeights& w, bf16* out, int T, int H,
                   int E, int k, int I, bool norm_topk_prob, cudaStream_t stream) {
  const Routed r = route(kn, a, wr, T, H, E, k, norm_topk_prob, stream);
  DeviceBuffer<bf16> c(elems(elems(T, k), H), stream);
  moe_experts_fwd(kn, r.plan(), 0, E, a, r.topk_w.get(), w, c.get(), k, H, I, stream);
  moe_combine_fwd(c.get(), out, T, k, H, stream);
}

void moe_layer_bwd(const Knobs& kn, const bf16* a, const bf16* wr, const ExpertWeights& w, const bf16* dout, bf16* da,
                   float* dwr, const ExpertGrads& dw, int T, int H, int E, int k, int I, bool norm_topk_prob,
                   cudaStream_t stream) {
  const Routed r = route(kn, a, wr, T, H, E, k, norm_topk_prob, stream);
  const size_t rows = elems(T, k);
  DeviceBuffer<float> da_slot(elems(rows, H), stream), router_acc(elems(T, H), stream);
  DeviceBuffer<bf16> dtopk_w(rows, stream), dlogits(elems(T, E), stream);
  moe_experts_bwd(kn, r.plan(), 0, E, a, r.topk_w.get(), w, dout, da_slot.get(), dtopk_w.get(), dw, k, H, I, stream);
  router_bwd(kn, a, wr, r.logits.get(), r.ids.get(), dtopk_w.get(), dlogits.get(), router_acc.get(), dwr, T, H, E, k,
             norm_topk_prob, stream);
  moe_combine_bwd(da_slot.get(), router_acc.get(), da, T, k, H, stream);
}

}  // namespace bp::cuda
