// Float64 twin of reference/ops/moe_router.h. The top-k selection is an input of
// the weights and their gradient (piecewise constant, it has no derivative).
#pragma once
#include <vector>

#include "linear.h"

namespace bp::truth {

inline MatD softmax_rows(const MatD& x) {
  MatD p(x.rows(), x.cols());
  for (int t = 0; t < x.rows(); ++t) {
    const Eigen::RowVectorXd e = (x.row(t).array() - x.row(t).maxCoeff()).exp();
    p.row(t) = e / e.sum();
  }
  return p;
}

// Top-k of each row of p by descending value, ties to the lower index; ids [T][k].
inline std::vector<int> topk_ids(const MatD& p, int k) {
  std::vector<int> ids(static_cast<size_t>(p.rows()) * k);
  for (int t = 0; t < p.rows(); ++t)
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < p.cols(); ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken |= ids[static_cast<size_t>(t) * k + i] == e;
        if (!taken && (best < 0 || p(t, e) > p(t, best))) best = e;
      }
      ids[static_cast<size_t>(t) * k + j] = best;
    }
  return ids;
}

// Routing weights [T][k] of the selected experts: softmax probabilities, divided by
// their sum when norm_topk_prob.
inline MatD router_weights(const MatD& logits, const std::vector<int>& ids, int k, bool norm_topk_prob) {
  const MatD p = softmax_rows(logits);
  MatD w(logits.rows(), k);
  for (int t = 0; t < logits.rows(); ++t) {
    for (int j = 0; j < k; ++j) w(t, j) = p(t, ids[static_cast<size_t>(t) * k + j]);
    if (norm_topk_prob) w.row(t) /= w.row(t).sum();
  }
  return w;
}

// d(logits) [T][E] for the weight gradient dw [T][k]: the softmax backward over
// the experts the weights are a softmax of (selected ones when renormalised).
inline MatD router_dlogits(const MatD& logits, const std::vector<int>& ids, const MatD& dw, int k,
                           bool norm_topk_prob) {
  const MatD p = softmax_rows(logits), w = router_weights(logits, ids, k, norm_topk_prob);
  MatD dx = MatD::Zero(logits.rows(), logits.cols());
  for (int t = 0; t < logits.rows(); ++t) {
    const double sigma = dw.row(t).dot(w.row(t));
    if (!norm_topk_prob) dx.row(t) = -sigma * p.row(t);  // all E logits feed the weights
    for (int j = 0; j < k; ++j)
      dx(t, ids[static_cast<size_t>(t) * k + j]) += w(t, j) * (norm_topk_prob ? dw(t, j) - sigma : dw(t, j));
  }
  return dx;
}

}  // namespace bp::truth
