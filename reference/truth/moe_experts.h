// Float64 twin of reference/ops/moe_experts.h: out[t] = Σ_j w[t][j]·mlp_e(a[t]) with
// e = ids[t][j], no intermediate rounding. The routing (ids) is an input.
#pragma once
#include <vector>

#include "moe_router.h"
#include "swiglu.h"

namespace bp::truth {

// Per-expert weights: gate and up [I][H], down [H][I]; unused experts may be empty.
struct Experts {
  std::vector<MatD> gate, up, down;
};

inline MatD expert_out(const Experts& ex, int e, const MatD& a_row) {
  return mlp_fwd(a_row, ex.gate[e], ex.up[e], ex.down[e]);
}

inline MatD moe_fwd(const MatD& a, const std::vector<int>& ids, const MatD& w, const Experts& ex, int k) {
  MatD out = MatD::Zero(a.rows(), a.cols());
  for (int t = 0; t < a.rows(); ++t)
    for (int j = 0; j < k; ++j) out.row(t) += w(t, j) * expert_out(ex, ids[static_cast<size_t>(t) * k + j], a.row(t));
  return out;
}

struct MoeGrads {
  MatD da, dw;  // [T][H], [T][k]
  std::vector<MatD> dgate, dup, ddown;
};

inline MoeGrads moe_bwd(const MatD& a, const std::vector<int>& ids, const MatD& w, const Experts& ex,
                        const MatD& dout, int k) {
  const int E = static_cast<int>(ex.gate.size());
  MoeGrads g{MatD::Zero(a.rows(), a.cols()), MatD::Zero(a.rows(), k), {}, {}, {}};
  for (int e = 0; e < E; ++e) {
    g.dgate.push_back(MatD::Zero(ex.gate[e].rows(), ex.gate[e].cols()));
    g.dup.push_back(MatD::Zero(ex.up[e].rows(), ex.up[e].cols()));
    g.ddown.push_back(MatD::Zero(ex.down[e].rows(), ex.down[e].cols()));
  }
  for (int t = 0; t < a.rows(); ++t)
    for (int j = 0; j < k; ++j) {
      const int e = ids[static_cast<size_t>(t) * k + j];
      g.dw(t, j) = dout.row(t).dot(expert_out(ex, e, a.row(t)).row(0));
      const MlpGrads m = mlp_bwd(a.row(t), ex.gate[e], ex.up[e], ex.down[e], w(t, j) * dout.row(t));
      g.da.row(t) += m.da;
      g.dgate[e] += m.dwg;
      g.dup[e] += m.dwu;
      g.ddown[e] += m.dwd;
    }
  return g;
}

// The whole MoE block for a fixed selection: router logits a·wr^T, weights, experts.
inline MatD moe_layer_fwd(const MatD& a, const MatD& wr, const Experts& ex, const std::vector<int>& ids, int k,
                          bool norm_topk_prob) {
  return moe_fwd(a, ids, router_weights(linear_fwd(a, wr), ids, k, norm_topk_prob), ex, k);
}

struct MoeLayerGrads {
  MatD da, dwr;
  std::vector<MatD> dgate, dup, ddown;
};

inline MoeLayerGrads moe_layer_bwd(const MatD& a, const MatD& wr, const Experts& ex, const std::vector<int>& ids,
                                   const MatD& dout, int k, bool norm_topk_prob) {
  const MatD logits = linear_fwd(a, wr);
  const MoeGrads g = moe_bwd(a, ids, router_weights(logits, ids, k, norm_topk_prob), ex, dout, k);
  const MatD dl = router_dlogits(logits, ids, g.dw, k, norm_topk_prob);
  return {g.da + linear_dgrad(dl, wr), linear_wgrad(dl, a), g.dgate, g.dup, g.ddown};
}

}  // namespace bp::truth
