// The rank program's forward (SPEC.md §7): one model call of any path on this
// rank's tokens, layer by layer, with captures in canonical rows.
// Part of rank_program.h; the class is declared in rank_program_class.h.
#pragma once
#include "program/layouts/rank_program_class.h"

namespace bp::layouts {

template <class B>
void RankProgram<B>::capture(Run& run, const Tokens& tk, const std::string& name, const Buf& b, int64_t cols,
                           int64_t col0, int64_t width) const {
  if (!run.opt.capture) return;
  if (cols == width && at_.t != 0) return;  // replicated over TP: rank t = 0 reports it
  run.result.captures.push_back({name, width, col0, cols, tk.row, be_.to_host(b.data(), b.size())});
}

template <class B>
void RankProgram<B>::step(Run& run, const std::vector<program::PathPiece>& pieces, Saved* saved) {
  const Dims& d = d_;
  const Tokens tk = my_tokens(run, pieces);
  const int T = tk.size();
  const ref::RopeTable rt = rope_table();
  const int64_t kv0 = kv_slice();
  // k and v columns: my kv heads', reported by their first replica.
  auto capture_kv = [&](const std::string& name, const Buf& b) {
    if (kv_leader()) capture(run, tk, name, b, d.KDl, kv0 * d.KDl, d.KD);
  };
  const auto tok_dev = be_.resident(tk.tok);
  const auto pos_dev = be_.resident(tk.pos);

  Buf x = zeros(int64_t{T} * d.H);
  be_.embedding_fwd(kn_, tok_dev.data(), w(graph::param_name(Param::Embed)), x.data(), T, d.V, d.H);
  capture(run, tk, graph::capture_name(Op::Embed), x, d.H, 0, d.H);
  if (saved) saved->layers.resize(sz(cfg_.num_hidden_layers));

  for (int64_t li = 0; li < cfg_.num_hidden_layers; ++li) {
    program::run_control::at_layer("forward", li, cfg_.num_hidden_layers);
    LayerSaved s;
    s.x_in = be_.clone(x);
    s.a1 = zeros(int64_t{T} * d.H);
    s.rstd1 = fzeros(T);
    be_.rmsnorm_fwd(kn_, x.data(), w(lname(li, Param::InputNorm)), d.eps, s.a1.data(), s.rstd1.data(), T, 1,
                    d.H);
    capture(run, tk, cname(li, Op::InputNorm), s.a1, d.H, 0, d.H);
    // Column-parallel q, k, v: this rank's heads.
    s.q_pre = zeros(int64_t{T} * d.QDl);
    s.k_pre = zeros(int64_t{T} * d.KDl);
    Buf v = zeros(int64_t{T} * d.KDl);
    be_.linear_fwd(kn_, s.a1.data(), w(lname(li, Param::QProj)), s.q_pre.data(), T, d.H, d.QDl, 1);
    be_.linear_fwd(kn_, s.a1.data(), w(lname(li, Param::KProj)), s.k_pre.data(), T, d.H, d.KDl, 1);
    be_.linear_fwd(kn_, s.a1.data(), w(lname(li, Param::VProj)), v.data(), T, d.H, d.KDl, 1);
    capture(run, tk, cname(li, Op::QProj), s.q_pre, d.QDl, d.Q0, d.QD);
    capture_kv(cname(li, Op::KProj), s.k_pre);
    capture_kv(cname(li, Op::VProj), v);
    s.qn = zeros(int64_t{T} * d.QDl);
    s.kn = zeros(int64_t{T} * d.KDl);
    s.rstd_q = fzeros(int64_t{T} * d.Hql);
    s.rstd_k = fzeros(int64_t{T} * d.Hkvl);
    be_.rmsnorm_fwd(kn_, s.q_pre.data(), w(lname(li, Param::QNorm)), d.eps, s.qn.data(), s.rstd_q.data(),
                    T, d.Hql, d.D);
    be_.rmsnorm_fwd(kn_, s.k_pre.data(), w(lname(li, Param::KNorm)), d.eps, s.kn.data(), s.rstd_k.data(),
                    T, d.Hkvl, d.D);
    capture(run, tk, cname(li, Op::QNorm), s.qn, d.QDl, d.Q0, d.QD);
    capture_kv(cname(li, Op::KNorm), s.kn);
    s.q = zeros(int64_t{T} * d.QDl);
    Buf kr = zeros(int64_t{T} * d.KDl);
    be_.rope_fwd(kn_, rt, pos_dev.data(), s.qn.data(), s.q.data(), T, d.Hql);
    be_.rope_fwd(kn_, rt, pos_dev.data(), s.kn.data(), kr.data(), T, d.Hkvl);
    capture(run, tk, cname(li, Op::QRope), s.q, d.QDl, d.Q0, d.QD);
    capture_kv(cname(li, Op::KRope), kr);

    std::map<int, int> kv_begin;
    share_kv(run, tk, li, kr, v, pieces, s.kp, s.vp, kv_begin);
    const std::vector<ref::AttnSeq> runs = tk.runs_at(kv_begin);
    s.o = zeros(int64_t{T} * d.QDl);
    s.m = fzeros(int64_t{T} * d.Hql);
    s.l = fzeros(int64_t{T} * d.Hql);
    be_.attention_fwd(kn_, ref::AttnDims{d.Hql, d.Hkvl, d.D}, runs.data(), static_cast<int>(runs.size()), s.q.data(),
                      s.kp.data(), s.vp.data(), s.o.data(), s.m.data(), s.l.data());
    capture(run, tk, cname(li, Op::Attn), s.o, d.QDl, d.Q0, d.QD);
    const Buf ao = row_parallel(s.o.data(), lname(li, Param::OProj), T, d.QD, d.QDl, d.H);
    capture(run, tk, cname(li, Op::AttnOut), ao, d.H, 0, d.H);
    be_.residual_fwd(kn_, x.data(), ao.data(), x.data(), x.size());
    capture(run, tk, cname(li, Op::ResidAttn), x, d.H, 0, d.H);
    s.x_mid = be_.clone(x);
    s.a2 = zeros(int64_t{T} * d.H);
    s.rstd2 = fzeros(T);
    be_.rmsnorm_fwd(kn_, x.data(), w(lname(li, Param::PostNorm)), d.eps, s.a2.data(),
                    s.rstd2.data(), T, 1, d.H);
    capture(run, tk, cname(li, Op::PostNorm), s.a2, d.H, 0, d.H);
    const Buf mo = cfg_.is_moe_layer(li) ? moe(run, tk, li, s.a2) : dense_mlp(run, tk, li, s.a2);
    capture(run, tk, cname(li, Op::MlpOut), mo, d.H, 0, d.H);
    be_.residual_fwd(kn_, x.data(), mo.data(), x.data(), x.size());
    capture(run, tk, cname(li, Op::ResidMlp), x, d.H, 0, d.H);
    if (saved) {
      if (li == 0) saved->kv_begin = kv_begin;
      saved->layers[sz(li)] = std::move(s);
    }
  }

  Buf hn = zeros(int64_t{T} * d.H);
  FBuf rstd_f = fzeros(T);
  be_.rmsnorm_fwd(kn_, x.data(), w(graph::param_name(Param::FinalNorm)), d.eps, hn.data(), rstd_f.data(), T, 1, d.H);
  capture(run, tk, graph::capture_name(Op::FinalNorm), hn, d.H, 0, d.H);
  Buf logits = zeros(int64_t{T} * d.Vl);
  be_.linear_fwd(kn_, hn.data(), lm_head_, logits.data(), T, d.H, d.Vl, 1);
  capture(run, tk, graph::capture_name(Op::Logits), logits, d.Vl, d.V0, d.V);
  logprobs(run, tk, logits, saved);
  if (saved) {
    saved->tk = tk;
    saved->x_final = std::move(x);
    saved->hn = std::move(hn);
    saved->logits = std::move(logits);
    saved->rstd_f = std::move(rstd_f);
  }
}

template <class B>
typename RankProgram<B>::Run RankProgram<B>::start(const std::vector<std::vector<int32_t>>& seqs,
                                               const program::ForwardOptions& opt) const {
  Run run{seqs, opt, {}, 0, {}, {}, {}, {}};
  int64_t cache_rows = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    run.seq_off.push_back(run.total);
    run.total += static_cast<int64_t>(seqs[s].size());
    if (seq_owner_e(layout_, static_cast<int>(s)) != at_.e) continue;
    run.cache_row0[static_cast<int>(s)] = cache_rows;
    cache_rows += static_cast<int64_t>(seqs[s].size());
  }
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    run.kc.push_back(zeros(cache_rows * d_.KDl));
    run.vc.push_back(zeros(cache_rows * d_.KDl));
  }
  return run;
}

template <class B>
RankResult RankProgram<B>::forward(const std::vector<std::vector<int32_t>>& seqs, const program::Path& path,
                                 const program::ForwardOptions& opt) {
  Run run = start(seqs, opt);
  for (const auto& pieces : program::path_steps(seqs, path, cfg_.max_position_embeddings))
    step(run, pieces, nullptr);
  return std::move(run.result);
}

}  // namespace bp::layouts
