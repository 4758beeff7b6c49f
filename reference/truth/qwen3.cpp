#include "qwen3.h"

#include <cmath>
#include <numeric>
#include <stdexcept>

#include "attention.h"
#include "embedding.h"
#include "logprob.h"
#include "moe_experts.h"
#include "reference/model/loss.h"
#include "reference/model/model_graph.h"
#include "residual.h"
#include "rmsnorm.h"
#include "rope.h"

namespace bp::truth {

namespace {

using graph::Param;
using graph::param_name;

MatD to_fp32(const MatD& x) {
  return x.unaryExpr([](double v) { return static_cast<double>(static_cast<float>(v)); });
}

}  // namespace

// One sequence's forward; with `keep`, its activations for the backward.
struct Model::Seq {
  struct Layer {
    MatD x_in, a1, q_pre, k_pre, q, k, v, o, x_mid, a2;
    std::vector<int> ids;  // MoE top-k, [T][k]
  };
  std::vector<Layer> layers;
  MatD cos, sin, x_final, hn, logits;
};

Model::Model(const ModelConfig& cfg, const Weights& weights) : cfg_(cfg) {
  for (const WeightSpec& s : weight_specs(cfg)) {
    if (!weights.contains(s.name)) throw std::invalid_argument("truth model: missing weight " + s.name);
    const Tensor& t = weights.at(s.name);
    if (t.shape != s.shape) throw std::invalid_argument("truth model: wrong shape for " + s.name);
    const int rows = s.shape.size() == 1 ? 1 : static_cast<int>(s.shape[0]);
    w_[s.name] = widen(t.data, rows, static_cast<int>(t.numel() / rows));
  }
}

Model::Model(const ModelConfig& cfg, WeightsD weights) : cfg_(cfg), w_(std::move(weights)) {
  for (const WeightSpec& s : weight_specs(cfg)) {
    auto it = w_.find(s.name);
    if (it == w_.end() || it->second.size() != s.numel())
      throw std::invalid_argument("truth model: missing or mis-sized weight " + s.name);
  }
}

const MatD& Model::w(const std::string& name) const { return w_.at(name); }
const MatD& Model::lm_head() const {
  return w(param_name(cfg_.tie_word_embeddings ? Param::Embed : Param::LmHead));
}

Model::Seq Model::run(const std::vector<int32_t>& tok, bool keep, bool fp32_storage) const {
  const int T = static_cast<int>(tok.size()), D = static_cast<int>(cfg_.head_dim);
  const int Hq = static_cast<int>(cfg_.num_attention_heads), Hkv = static_cast<int>(cfg_.num_key_value_heads);
  const double eps = cfg_.rms_norm_eps;
  const AttnGeometry geo{Hq, Hkv, D, 0};
  auto st = [&](MatD m) { return fp32_storage ? to_fp32(m) : m; };
  Seq sq;
  std::vector<int32_t> positions(T);
  std::iota(positions.begin(), positions.end(), 0);
  rope_angles(rope_inv_freq(cfg_.rope_theta, D), positions, sq.cos, sq.sin);
  sq.cos = st(sq.cos);
  sq.sin = st(sq.sin);

  MatD x = embedding_fwd(tok.data(), T, w(param_name(Param::Embed)));
  for (int64_t li = 0; li < cfg_.num_hidden_layers; ++li) {
    Seq::Layer L;
    L.x_in = x;
    L.a1 = st(rmsnorm_fwd(x, vec(w(param_name(li, Param::InputNorm))), eps));
    L.q_pre = st(linear_fwd(L.a1, w(param_name(li, Param::QProj))));
    L.k_pre = st(linear_fwd(L.a1, w(param_name(li, Param::KProj))));
    L.v = st(linear_fwd(L.a1, w(param_name(li, Param::VProj))));
    const MatD qn = st(unheads(rmsnorm_fwd(heads(L.q_pre, D), vec(w(param_name(li, Param::QNorm))), eps), T));
    const MatD kn = st(unheads(rmsnorm_fwd(heads(L.k_pre, D), vec(w(param_name(li, Param::KNorm))), eps), T));
    L.q = st(rope_fwd(qn, sq.cos, sq.sin, Hq, D));
    L.k = st(rope_fwd(kn, sq.cos, sq.sin, Hkv, D));
    L.o = st(attention_fwd(L.q, L.k, L.v, geo).o);
    L.x_mid = st(residual_fwd(x, st(linear_fwd(L.o, w(param_name(li, Param::OProj))))));
    L.a2 = st(rmsnorm_fwd(L.x_mid, vec(w(param_name(li, Param::PostNorm))), eps));
    MatD mo;
    if (cfg_.is_moe_layer(li)) {
      const int K = static_cast<int>(cfg_.num_experts_per_tok);
      const Experts exs = experts(li);
      const MatD& wr = w(param_name(li, Param::Router));
      L.ids = topk_ids(softmax_rows(linear_fwd(L.a2, wr)), K);
      mo = moe_layer_fwd(L.a2, wr, exs, L.ids, K, cfg_.norm_topk_prob);
    } else {
      mo = mlp_fwd(L.a2, w(param_name(li, Param::MlpGate)), w(param_name(li, Param::MlpUp)),
                   w(param_name(li, Param::MlpDown)));
    }
    x = st(residual_fwd(L.x_mid, st(mo)));
    if (keep) sq.layers.push_back(std::move(L));
  }
  sq.x_final = x;
  sq.hn = st(rmsnorm_fwd(x, vec(w(param_name(Param::FinalNorm))), eps));
  sq.logits = st(linear_fwd(sq.hn, lm_head()));
  return sq;
}

Experts Model::experts(int64_t li) const {
  Experts exs;
  for (int64_t e = 0; e < cfg_.num_experts; ++e) {
    exs.gate.push_back(w(param_name(li, e, Param::ExpertGate)));
    exs.up.push_back(w(param_name(li, e, Param::ExpertUp)));
    exs.down.push_back(w(param_name(li, e, Param::ExpertDown)));
  }
  return exs;
}

ForwardResult Model::forward(const std::vector<std::vector<int32_t>>& seqs, const ForwardOptions& opt) const {
  ForwardResult r;
  for (const auto& s : seqs) {
    if (s.empty()) throw std::invalid_argument("truth model: empty sequence");
    const Seq sq = run(s, false, opt.fp32_storage);
    const int n = static_cast<int>(s.size()) - 1;
    const MatD lg = sq.logits.topRows(n);
    const VecD lp = logprob_fwd(lg, std::vector<int32_t>(s.begin() + 1, s.end()), opt.temperature);
    r.logprob.emplace_back(lp.data(), lp.data() + n);
    if (opt.entropy) {
      const VecD h = entropy(lg, opt.temperature);
      r.entropy.emplace_back(h.data(), h.data() + n);
    }
  }
  return r;
}

BackwardResult Model::backward(const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                               double temperature, bool fp32_storage) const {
  for (const auto& s : seqs)
    if (s.empty()) throw std::invalid_argument("truth model: empty sequence");
  const std::vector<std::vector<float>> c_of = coefs.for_batch(seqs);
  const int D = static_cast<int>(cfg_.head_dim), V = static_cast<int>(cfg_.vocab_size);
  const int Hq = static_cast<int>(cfg_.num_attention_heads), Hkv = static_cast<int>(cfg_.num_key_value_heads);
  const double eps = cfg_.rms_norm_eps;
  BackwardResult res;
  WeightsD g;
  for (const auto& [name, m] : w_) g[name] = MatD::Zero(m.rows(), m.cols());
  MatD dlm = MatD::Zero(lm_head().rows(), lm_head().cols());
  for (size_t si = 0; si < seqs.size(); ++si) {
    const std::vector<int32_t>& s = seqs[si];
    const int T = static_cast<int>(s.size()), n = T - 1;
    const Seq sq = run(s, true, fp32_storage);
    const std::vector<int32_t> tgt(s.begin() + 1, s.end());
    VecD c(n);
    for (int t = 0; t < n; ++t) c(t) = c_of[si][static_cast<size_t>(t)];
    const VecD lp = logprob_fwd(sq.logits.topRows(n), tgt, temperature);
    res.logprob.emplace_back(lp.data(), lp.data() + n);
    res.coef.emplace_back(c.data(), c.data() + n);

    MatD dlogits = MatD::Zero(T, V);
    dlogits.topRows(n) = logprob_grad(sq.logits.topRows(n), tgt, c, temperature);
    dlm += linear_wgrad(dlogits, sq.hn);
    const RmsNormGrads fn =
        rmsnorm_bwd(sq.x_final, vec(w(param_name(Param::FinalNorm))), eps, linear_dgrad(dlogits, lm_head()));
    g[param_name(Param::FinalNorm)] += fn.dw.transpose();
    MatD dx = fn.dx;
    for (int64_t li = cfg_.num_hidden_layers - 1; li >= 0; --li) {
      const Seq::Layer& L = sq.layers[static_cast<size_t>(li)];
      MatD da2;
      if (cfg_.is_moe_layer(li)) {
        const int E = static_cast<int>(cfg_.num_experts), K = static_cast<int>(cfg_.num_experts_per_tok);
        const MoeLayerGrads mg =
            moe_layer_bwd(L.a2, w(param_name(li, Param::Router)), experts(li), L.ids, dx, K, cfg_.norm_topk_prob);
        da2 = mg.da;
        g[param_name(li, Param::Router)] += mg.dwr;
        for (int e = 0; e < E; ++e) {
          g[param_name(li, e, Param::ExpertGate)] += mg.dgate[static_cast<size_t>(e)];
          g[param_name(li, e, Param::ExpertUp)] += mg.dup[static_cast<size_t>(e)];
          g[param_name(li, e, Param::ExpertDown)] += mg.ddown[static_cast<size_t>(e)];
        }
      } else {
        const MlpGrads mg = mlp_bwd(L.a2, w(param_name(li, Param::MlpGate)), w(param_name(li, Param::MlpUp)),
                                    w(param_name(li, Param::MlpDown)), dx);
        da2 = mg.da;
        g[param_name(li, Param::MlpGate)] += mg.dwg;
        g[param_name(li, Param::MlpUp)] += mg.dwu;
        g[param_name(li, Param::MlpDown)] += mg.dwd;
      }
      const RmsNormGrads pn = rmsnorm_bwd(L.x_mid, vec(w(param_name(li, Param::PostNorm))), eps, da2);
      g[param_name(li, Param::PostNorm)] += pn.dw.transpose();
      dx += pn.dx;  // x_mid feeds the skip and the norm
      const MatD& wo = w(param_name(li, Param::OProj));
      g[param_name(li, Param::OProj)] += linear_wgrad(dx, L.o);
      const AttnBackward ab = attention_bwd(L.q, L.k, L.v, linear_dgrad(dx, wo), {Hq, Hkv, D, 0});
      const MatD dqn = rope_bwd(ab.dq, sq.cos, sq.sin, Hq, D), dkn = rope_bwd(ab.dk, sq.cos, sq.sin, Hkv, D);
      const RmsNormGrads qg =
          rmsnorm_bwd(heads(L.q_pre, D), vec(w(param_name(li, Param::QNorm))), eps, heads(dqn, D));
      const RmsNormGrads kg =
          rmsnorm_bwd(heads(L.k_pre, D), vec(w(param_name(li, Param::KNorm))), eps, heads(dkn, D));
      g[param_name(li, Param::QNorm)] += qg.dw.transpose();
      g[param_name(li, Param::KNorm)] += kg.dw.transpose();
      const MatD dq = unheads(qg.dx, T), dk = unheads(kg.dx, T);
      const MatD &wq = w(param_name(li, Param::QProj)), &wk = w(param_name(li, Param::KProj)),
                 &wv = w(param_name(li, Param::VProj));
      g[param_name(li, Param::QProj)] += linear_wgrad(dq, L.a1);
      g[param_name(li, Param::KProj)] += linear_wgrad(dk, L.a1);
      g[param_name(li, Param::VProj)] += linear_wgrad(ab.dv, L.a1);
      const MatD da = linear_dgrad(dq, wq) + linear_dgrad(dk, wk) + linear_dgrad(ab.dv, wv);
      const RmsNormGrads in = rmsnorm_bwd(L.x_in, vec(w(param_name(li, Param::InputNorm))), eps, da);
      g[param_name(li, Param::InputNorm)] += in.dw.transpose();
      dx += in.dx;
    }
    g[param_name(Param::Embed)] += embedding_bwd(s.data(), T, dx, V);
  }
  if (cfg_.tie_word_embeddings)
    g[param_name(Param::Embed)] += dlm;
  else
    g[param_name(Param::LmHead)] = dlm;
  for (auto& [name, m] : g) res.grads[name].assign(m.data(), m.data() + m.size());
  return res;
}

}  // namespace bp::truth
