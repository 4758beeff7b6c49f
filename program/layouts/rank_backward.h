// The rank program's backward (SPEC.md §7): dlogits on the vocabulary slices,
// every layer's input and weight gradients, weight gradients over the global
// token chunks whichever rank holds the tokens.
// Part of rank_program.h; the class is declared in rank_program_class.h.
#pragma once
#include "program/layouts/rank_program_class.h"

namespace bp::layouts {

// Gradient blocks: every plane rank holds the reduced gradient; plane rank 0
// reports it — its TP slice, or (replicated over TP) rank t = 0 the whole; a kv
// slice is reported by whoever computes it (its first replica, backward_layer).
template <class B>
void RankProgram<B>::emit(Run& run, const std::string& name, FBuf g, Block b) const {
  if (comms_.plane.rank() != 0 || (b.whole && at_.t != 0)) return;
  run.result.grads.push_back({name, b.row0, b.rows, b.col0, b.cols, b.width, be_.take(std::move(g))});
}

// dW [n][k] of y = x·Wᵀ over the plane's tokens (dy [T][n], x [T][k] local rows).
template <class B>
typename RankProgram<B>::FBuf RankProgram<B>::split_wgrad(const TokenSplit& split, const Buf& dy, int n, const Buf& x,
                                                      int k) const {
  const Buf dy_c = split.route(be_, dy.data(), n);
  const Buf x_c = split.route(be_, x.data(), k);
  return split.reduce(be_, sz(int64_t{n} * k), [&](size_t c, float* out) {
    const int64_t r0 = split.chunk_row0(c);
    be_.linear_wgrad(kn_, dy_c.data() + r0 * n, x_c.data() + r0 * k, out, split.rows_in(c), k, n);
  });
}

// dw [n] of an RMSNorm over [T][heads][n] local rows.
template <class B>
typename RankProgram<B>::FBuf RankProgram<B>::split_norm_dw(const TokenSplit& split, const std::string& name,
                                                        const Buf& x, const FBuf& rstd, const Buf& dy, int heads,
                                                        int n) const {
  const int64_t width = int64_t{heads} * n;
  const Buf x_c = split.route(be_, x.data(), width);
  const Buf dy_c = split.route(be_, dy.data(), width);
  const FBuf r_c = split.route(be_, rstd.data(), heads);
  return split.reduce(be_, sz(n), [&](size_t c, float* out) {
    const int64_t r0 = split.chunk_row0(c);
    Buf dx_unused = zeros(split.rows_in(c) * width);
    be_.rmsnorm_bwd(kn_, x_c.data() + r0 * width, w(name), r_c.data() + r0 * heads, dy_c.data() + r0 * width,
                    dx_unused.data(), out, split.rows_in(c), heads, n);
  });
}

// An RMSNorm's backward: dx for my rows, dw reduced over the plane and reported.
// `slices`: the TP ranks whose head slices make up all heads, in head order (the
// q/k norms), or empty when every rank holds the whole rows.
template <class B>
typename RankProgram<B>::Buf RankProgram<B>::norm_bwd(Run& run, const TokenSplit& split, const std::string& name,
                                                  const Buf& x, const FBuf& rstd, const Buf& dy, int heads, int n,
                                                  const std::vector<int>& slices) const {
  const int T = static_cast<int>(rstd.size()) / heads;
  Buf dx = zeros(static_cast<int64_t>(x.size()));
  FBuf dw_unused = fzeros(n);
  be_.rmsnorm_bwd(kn_, x.data(), w(name), rstd.data(), dy.data(), dx.data(), dw_unused.data(), T, heads, n);
  if (!slices.empty()) {
    // q/k norms: a token chunk's rows interleave all heads, so gather the TP slices first.
    const Buf xs = gather_heads(x.data(), T, int64_t{heads} * n, slices);
    const Buf dys = gather_heads(dy.data(), T, int64_t{heads} * n, slices);
    const FBuf rs = gather_heads(rstd.data(), T, heads, slices);
    const int all_heads = heads * static_cast<int>(slices.size());
    emit(run, name, split_norm_dw(split, name, xs, rs, dys, all_heads, n), Block::entire(1, n));
  } else {
    emit(run, name, split_norm_dw(split, name, x, rstd, dy, heads, n), Block::entire(1, n));
  }
  return dx;
}

// One layer's backward; dx enters as the gradient of the layer's output and
// leaves as the gradient of its input. The order is host::Model::backward's.
template <class B>
void RankProgram<B>::backward_layer(Run& run, const TokenSplit& split, const Saved& sv, int64_t li, Buf& dx) const {
  const Dims& d = d_;
  const LayerSaved& s = sv.layers[sz(li)];
  const Tokens& tk = sv.tk;
  const int T = tk.size();
  const Buf da =
      cfg_.is_moe_layer(li) ? moe_bwd(run, split, tk, li, s.a2, dx) : dense_mlp_bwd(run, split, li, s.a2, dx);
  const Buf db =
      norm_bwd(run, split, lname(li, Param::PostNorm), s.x_mid, s.rstd2, da, 1, d.H, {});
  be_.residual_fwd(kn_, dx.data(), db.data(), dx.data(), dx.size());

  const std::string wo = lname(li, Param::OProj);
  Buf dO = zeros(int64_t{T} * d.QDl);
  be_.linear_dgrad(kn_, dx.data(), w(wo), dO.data(), T, d.QDl, d.H, 1);
  emit(run, wo, split_wgrad(split, dx, d.H, s.o, d.QDl), Block::column_slice(d.H, d.Q0, d.QDl, d.QD));

  const std::vector<ref::AttnSeq> runs = tk.runs_at(sv.kv_begin);
  Buf dq = zeros(int64_t{T} * d.QDl), dk = zeros(int64_t{T} * d.KDl), dv = zeros(int64_t{T} * d.KDl),
      dqn = zeros(int64_t{T} * d.QDl), dkn = zeros(int64_t{T} * d.KDl);
  be_.attention_bwd_dq(kn_, ref::AttnDims{d.Hql, d.Hkvl, d.D}, runs.data(), static_cast<int>(runs.size()),
                       s.q.data(), s.kp.data(), s.vp.data(), s.o.data(), s.m.data(), s.l.data(), dO.data(), dq.data());
  attention_kv_bwd(run, tk, s, sv.kv_begin, dO, dk, dv);
  const ref::RopeTable rt = rope_table();
  const auto pos_dev = be_.resident(tk.pos);
  be_.rope_bwd(kn_, rt, pos_dev.data(), dq.data(), dqn.data(), T, d.Hql);
  be_.rope_bwd(kn_, rt, pos_dev.data(), dk.data(), dkn.data(), T, d.Hkvl);
  const Buf dqp = norm_bwd(run, split, lname(li, Param::QNorm), s.q_pre, s.rstd_q, dqn, d.Hql, d.D, all_tp_ranks());
  const Buf dkp =
      norm_bwd(run, split, lname(li, Param::KNorm), s.k_pre, s.rstd_k, dkn, d.Hkvl, d.D, kv_head_ranks());

  // a1 feeds q, k and v: three column-parallel input gradients, rounded once.
  const std::string wq = lname(li, Param::QProj), wk = lname(li, Param::KProj),
                    wv = lname(li, Param::VProj);
  const FBuf from_q = column_dgrad(dqp.data(), w(wq), T, d.H, d.QD, d.QDl);
  const FBuf from_k = kv_dgrad(dkp, wk, T);
  const FBuf from_v = kv_dgrad(dv, wv, T);
  const float* parts[3] = {from_q.data(), from_k.data(), from_v.data()};
  Buf da1 = zeros(static_cast<int64_t>(from_q.size()));
  be_.sum_round(parts, 3, da1.data(), da1.size());
  emit(run, wq, split_wgrad(split, dqp, d.QDl, s.a1, d.H), Block::row_slice(d.Q0, d.QDl, d.H));
  if (kv_leader()) {  // replicas hold the same dk, dv: one computes the weight gradients (a whole plane: same t)
    const Block kv_rows = Block::row_slice(int64_t{kv_slice()} * d.KDl, d.KDl, d.H);
    emit(run, wk, split_wgrad(split, dkp, d.KDl, s.a1, d.H), kv_rows);
    emit(run, wv, split_wgrad(split, dv, d.KDl, s.a1, d.H), kv_rows);
  }
  const Buf dbi = norm_bwd(run, split, lname(li, Param::InputNorm), s.x_in, s.rstd1, da1, 1, d.H, {});
  be_.residual_fwd(kn_, dx.data(), dbi.data(), dx.data(), dx.size());
}

template <class B>
RankResult RankProgram<B>::backward(const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                                    float temperature) {
  const std::vector<std::vector<float>> c_of = coefs.for_batch(seqs);  // checked before any work
  const Dims& d = d_;
  program::ForwardOptions fo;
  fo.temperature = temperature;
  Run run = start(seqs, fo);
  Saved sv;
  step(run, program::path_steps(seqs, program::Path::ragged(), cfg_.max_position_embeddings).at(0), &sv);
  run.kc.clear();  // the backward reads the packed keys, not the caches
  run.vc.clear();
  const Tokens& tk = sv.tk;
  const int T = tk.size();
  const TokenSplit split(comms_.plane, tk.row, run.total, kn_.grad_token_chunk);

  // dlogits of my vocabulary slice.
  const std::vector<int>& rows = sv.target_rows;
  const int R = static_cast<int>(rows.size());
  std::vector<int32_t> targets;
  std::vector<float> coef;
  for (int i : rows) {
    const int s = tk.seq[sz(i)], p = tk.pos[sz(i)];
    targets.push_back(seqs[sz(s)][sz(p + 1)]);
    coef.push_back(c_of[sz(s)][sz(p)]);
  }
  const auto targets_dev = be_.resident(targets);
  const auto coef_dev = be_.resident(coef);
  Buf lg = zeros(int64_t{R} * d.Vl), dl_rows = zeros(int64_t{R} * d.Vl), dl = zeros(int64_t{T} * d.Vl);
  be_.gather_rows(sv.logits.data(), sz(d.Vl), rows, lg.data());
  be_.logprob_bwd_slice(kn_, lg.data(), d.Vl, R, d.V0, d.Vl, targets_dev.data(), coef_dev.data(), sv.row_max.data(),
                        sv.row_sum.data(), temperature, dl_rows.data());
  be_.scatter_rows(dl_rows.data(), sz(d.Vl), rows, dl.data());

  // lm_head: vocabulary-parallel (its input gradient reduces over V in C chunks).
  const Buf dh = round_all(column_dgrad(dl.data(), lm_head_, T, d.H, d.V, d.Vl));
  FBuf dlm = split_wgrad(split, dl, d.Vl, sv.hn, d.H);
  Buf dx = norm_bwd(run, split, graph::param_name(Param::FinalNorm), sv.x_final, sv.rstd_f, dh, 1, d.H, {});

  for (int64_t li = cfg_.num_hidden_layers - 1; li >= 0; --li) {
    program::run_control::at_layer("backward", li, cfg_.num_hidden_layers);
    backward_layer(run, split, sv, li, dx);
  }

  // Embedding (replicated table); tied: plus the lm_head gradient of my slice.
  const auto tok_dev = be_.resident(tk.tok);
  const IBuf tok_c = split.route(be_, tok_dev.data(), 1);
  const Buf dx_c = split.route(be_, dx.data(), d.H);
  const FBuf demb = split.reduce(be_, sz(int64_t{d.V} * d.H), [&](size_t c, float* out) {
    const int64_t r0 = split.chunk_row0(c);
    be_.embedding_bwd(kn_, tok_c.data() + r0, dx_c.data() + r0 * d.H, out, split.rows_in(c), d.V, d.H);
  });
  const int64_t slice = int64_t{d.Vl} * d.H;
  FBuf my_rows = fzeros(slice);
  be_.copy(my_rows.data(), demb.data() + int64_t{d.V0} * d.H, sz(slice));
  if (cfg_.tie_word_embeddings) {
    be_.add_f32(my_rows.data(), dlm.data(), my_rows.size());
  } else {
    emit(run, graph::param_name(Param::LmHead), std::move(dlm), Block::row_slice(d.V0, d.Vl, d.H));
  }
  emit(run, graph::param_name(Param::Embed), std::move(my_rows), Block::row_slice(d.V0, d.Vl, d.H));
  return std::move(run.result);
}

}  // namespace bp::layouts
