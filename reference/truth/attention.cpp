#include "attention.h"

#include <cmath>

namespace bp::truth {
namespace {

MatD head(const MatD& x, int h, int D) { return x.middleCols(static_cast<Eigen::Index>(h) * D, D); }

// Causal softmax of scale · q_h k_gᵀ, rows at positions past_len + i.
MatD softmax_weights(const MatD& qh, const MatD& kg, const AttnGeometry& g) {
  MatD s = (qh * kg.transpose()) / std::sqrt(static_cast<double>(g.D));
  MatD p = MatD::Zero(s.rows(), s.cols());
  for (Eigen::Index i = 0; i < s.rows(); ++i) {
    const Eigen::Index visible = g.past_len + i + 1;
    const double mx = s.row(i).head(visible).maxCoeff();
    p.row(i).head(visible) = (s.row(i).head(visible).array() - mx).exp().matrix();
    p.row(i).head(visible) /= p.row(i).head(visible).sum();
  }
  return p;
}

}  // namespace

AttnForward attention_fwd(const MatD& q, const MatD& k, const MatD& v, const AttnGeometry& g) {
  AttnForward f{MatD::Zero(q.rows(), q.cols()), {}};
  for (int h = 0; h < g.Hq; ++h) {
    const int kv = h / (g.Hq / g.Hkv);
    f.p.push_back(softmax_weights(head(q, h, g.D), head(k, kv, g.D), g));
    f.o.middleCols(static_cast<Eigen::Index>(h) * g.D, g.D) = f.p.back() * head(v, kv, g.D);
  }
  return f;
}

AttnBackward attention_bwd(const MatD& q, const MatD& k, const MatD& v, const MatD& dout, const AttnGeometry& g) {
  const AttnForward f = attention_fwd(q, k, v, g);
  const double scale = 1.0 / std::sqrt(static_cast<double>(g.D));
  AttnBackward b{MatD::Zero(q.rows(), q.cols()), MatD::Zero(k.rows(), k.cols()), MatD::Zero(v.rows(), v.cols()), {}, {},
                 MatD::Zero(q.rows(), g.Hq)};
  for (int h = 0; h < g.Hq; ++h) {
    const int kv = h / (g.Hq / g.Hkv);
    const MatD& p = f.p[h];
    const MatD doh = head(dout, h, g.D), qh = head(q, h, g.D), kg = head(k, kv, g.D), vg = head(v, kv, g.D);
    b.delta.col(h) = doh.cwiseProduct(head(f.o, h, g.D)).rowwise().sum();
    b.dp.push_back(doh * vg.transpose());
    b.ds.push_back(p.cwiseProduct(b.dp.back() - b.delta.col(h).replicate(1, p.cols())));
    b.dq.middleCols(static_cast<Eigen::Index>(h) * g.D, g.D) = scale * b.ds.back() * kg;
    b.dk.middleCols(static_cast<Eigen::Index>(kv) * g.D, g.D) += scale * b.ds.back().transpose() * qh;
    b.dv.middleCols(static_cast<Eigen::Index>(kv) * g.D, g.D) += p.transpose() * doh;
  }
  return b;
}

}  // namespace bp::truth
