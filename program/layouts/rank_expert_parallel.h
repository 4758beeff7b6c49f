// The rank program's MLPs (SPEC.md §7): the dense MLP with gate/up column-parallel
// and down row-parallel, and the MoE block with experts on their plane rank,
// (token, slot) rows dispatched and combined at home in slot order; forward and
// backward.
// Part of rank_program.h; the class is declared in rank_program_class.h.
#pragma once
#include "program/layouts/rank_program_class.h"

namespace bp::layouts {

// Dense MLP: gate/up column-parallel (this rank's Il rows), down row-parallel.
template <class B>
typename RankProgram<B>::Buf RankProgram<B>::dense_mlp(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const {
  const Dims& d = d_;
  const int T = tk.size();
  Buf g = zeros(int64_t{T} * d.Il), u = zeros(int64_t{T} * d.Il), m = zeros(int64_t{T} * d.Il);
  be_.mlp_hidden_fwd(kn_, a2.data(), w(lname(li, Param::MlpGate)), w(lname(li, Param::MlpUp)),
                     g.data(), u.data(), m.data(), T, d.H, d.Il);
  const int64_t col0 = d.I0;
  capture(run, tk, cname(li, Op::MlpGate), g, d.Il, col0, d.I);
  capture(run, tk, cname(li, Op::MlpUp), u, d.Il, col0, d.I);
  capture(run, tk, cname(li, Op::MlpAct), m, d.Il, col0, d.I);
  return row_parallel(m.data(), lname(li, Param::MlpDown), T, d.I, d.Il, d.H);
}

// The experts this rank holds (others null: it must never touch them).
template <class B>
ref::ExpertWeights RankProgram<B>::expert_weights(int64_t li, int e_begin, int e_end,
                                                std::vector<const bf16*> (&ptr)[3]) const {
  for (int j = 0; j < 3; ++j) {
    ptr[j].assign(sz(d_.E), nullptr);
    for (int e = e_begin; e < e_end; ++e)
      ptr[j][sz(e)] = w(graph::param_name(li, e, kExpertParams[j]));
  }
  return {ptr[0].data(), ptr[1].data(), ptr[2].data()};
}

// Routing on the token's home rank (replicated router weight).
template <class B>
typename RankProgram<B>::Routing RankProgram<B>::route(int64_t li, const Buf& a2, int T) const {
  const Dims& d = d_;
  Routing r{zeros(int64_t{T} * d.E), zeros(int64_t{T} * d.K), be_.template zeros<int>(sz(int64_t{T} * d.K)), {}};
  be_.router_fwd(kn_, a2.data(), w(lname(li, Param::Router)), r.logits.data(), r.ids.data(), r.weights.data(), T,
                 d.H, d.E, d.K, cfg_.norm_topk_prob);
  r.ids_host = be_.to_host(r.ids.data(), r.ids.size());
  return r;
}

// MoE: route at home, experts where they live, combine at home in slot order.
template <class B>
typename RankProgram<B>::Buf RankProgram<B>::moe(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const {
  const Dims& d = d_;
  const int T = tk.size();
  const Routing r = route(li, a2, T);
  capture(run, tk, cname(li, Op::RouterLogits), r.logits, d.E, 0, d.E);
  capture(run, tk, cname(li, Op::RouterWeights), r.weights, d.K, 0, d.K);
  const ExpertExchange ex(comms_.plane, layout_, d.E, d.K, r.ids_host, tk.row);
  const Buf a_recv = ex.send_tokens(be_, a2.data(), d.H);
  const Buf w_recv = ex.send_slots(be_, r.weights.data(), 1);
  Buf c_recv = zeros(int64_t{ex.received_tokens()} * d.K * d.H);
  std::vector<const bf16*> ptr[3];
  be_.moe_experts_fwd(kn_, ex.plan(), ex.e_begin(), ex.e_end(), a_recv.data(), w_recv.data(),
                      expert_weights(li, ex.e_begin(), ex.e_end(), ptr), c_recv.data(), d.K, d.H, d.Ie);
  const Buf cs = ex.return_slots(be_, c_recv.data(), d.H);
  capture(run, tk, cname(li, Op::ExpertOut), cs, int64_t{d.K} * d.H, 0, int64_t{d.K} * d.H);
  Buf out = zeros(int64_t{T} * d.H);
  be_.moe_combine_fwd(cs.data(), out.data(), T, d.K, d.H);
  return out;
}

template <class B>
typename RankProgram<B>::Buf RankProgram<B>::dense_mlp_bwd(Run& run, const TokenSplit& split, int64_t li, const Buf& a2,
                                                       const Buf& dout) const {
  const Dims& d = d_;
  const int T = static_cast<int>(a2.size() / sz(d.H));
  const std::string wg = lname(li, Param::MlpGate), wu = lname(li, Param::MlpUp),
                    wd = lname(li, Param::MlpDown);
  const int64_t n = int64_t{T} * d.Il;
  Buf g = zeros(n), u = zeros(n), m = zeros(n), dm = zeros(n), dg = zeros(n), du = zeros(n);
  be_.mlp_hidden_fwd(kn_, a2.data(), w(wg), w(wu), g.data(), u.data(), m.data(), T, d.H, d.Il);
  be_.linear_dgrad(kn_, dout.data(), w(wd), dm.data(), T, d.Il, d.H, 1);
  emit(run, wd, split_wgrad(split, dout, d.H, m, d.Il), Block::column_slice(d.H, d.I0, d.Il, d.I));
  be_.swiglu_bwd(g.data(), u.data(), dm.data(), dg.data(), du.data(), static_cast<int>(n));
  FBuf from_gate = column_dgrad(dg.data(), w(wg), T, d.H, d.I, d.Il);
  const FBuf from_up = column_dgrad(du.data(), w(wu), T, d.H, d.I, d.Il);
  be_.add_f32(from_gate.data(), from_up.data(), from_gate.size());  // one fp32 addition, then one rounding
  Buf da = round_all(from_gate);
  emit(run, wg, split_wgrad(split, dg, d.Il, a2, d.H), Block::row_slice(d.I0, d.Il, d.H));
  emit(run, wu, split_wgrad(split, du, d.Il, a2, d.H), Block::row_slice(d.I0, d.Il, d.H));
  return da;
}

template <class B>
typename RankProgram<B>::Buf RankProgram<B>::moe_bwd(Run& run, const TokenSplit& split, const Tokens& tk, int64_t li,
                                                 const Buf& a2, const Buf& dout) const {
  const Dims& d = d_;
  const int T = tk.size();
  const Routing r = route(li, a2, T);
  const ExpertExchange ex(comms_.plane, layout_, d.E, d.K, r.ids_host, tk.row);
  const Buf a_recv = ex.send_tokens(be_, a2.data(), d.H);
  const Buf dout_recv = ex.send_tokens(be_, dout.data(), d.H);
  const Buf w_recv = ex.send_slots(be_, r.weights.data(), 1);
  const int U = ex.received_tokens();
  FBuf da_slot_recv = fzeros(int64_t{U} * d.K * d.H);
  Buf dw_recv = zeros(int64_t{U} * d.K);
  // This rank's experts' gradients (every row of theirs is here, in global order).
  std::vector<FBuf> grads;
  std::vector<float*> gp[3];
  for (int j = 0; j < 3; ++j) gp[j].assign(sz(d.E), nullptr);
  for (int e = ex.e_begin(); e < ex.e_end(); ++e)
    for (int j = 0; j < 3; ++j) {
      grads.push_back(fzeros(int64_t{d.Ie} * d.H));
      gp[j][sz(e)] = grads.back().data();
    }
  std::vector<const bf16*> ptr[3];
  be_.moe_experts_bwd(kn_, ex.plan(), ex.e_begin(), ex.e_end(), a_recv.data(), w_recv.data(),
                      expert_weights(li, ex.e_begin(), ex.e_end(), ptr), dout_recv.data(), da_slot_recv.data(),
                      dw_recv.data(), ref::ExpertGrads{gp[0].data(), gp[1].data(), gp[2].data()}, d.K, d.H, d.Ie);
  if (at_.t == 0)
    for (int e = ex.e_begin(), i = 0; e < ex.e_end(); ++e)
      for (int j = 0; j < 3; ++j, ++i) {
        const int64_t rows = j == 2 ? d.H : d.Ie, cols = j == 2 ? d.Ie : d.H;
        run.result.grads.push_back({graph::param_name(li, e, kExpertParams[j]), 0,
                                    rows, 0, cols, cols, be_.take(std::move(grads[sz(i)]))});
      }
  const FBuf da_slot = ex.return_slots(be_, da_slot_recv.data(), d.H);
  const Buf dtopk = ex.return_slots(be_, dw_recv.data(), 1);
  // The router at home: its input-gradient accumulator joins the slots' in the combine.
  const std::string wr = lname(li, Param::Router);
  Buf dlogits = zeros(int64_t{T} * d.E);
  FBuf router_acc = fzeros(int64_t{T} * d.H), dwr_unused = fzeros(int64_t{d.E} * d.H);
  be_.router_bwd(kn_, a2.data(), w(wr), r.logits.data(), r.ids.data(), dtopk.data(), dlogits.data(),
                 router_acc.data(), dwr_unused.data(), T, d.H, d.E, d.K, cfg_.norm_topk_prob);
  const Buf a_c = split.route(be_, a2.data(), d.H);
  const Buf lg_c = split.route(be_, r.logits.data(), d.E);
  const IBuf ids_c = split.route(be_, r.ids.data(), d.K);
  const Buf dtopk_c = split.route(be_, dtopk.data(), d.K);
  emit(run, wr,
       split.reduce(be_, sz(int64_t{d.E} * d.H),
                    [&](size_t c, float* out) {
                      const int n = split.rows_in(c);
                      const int64_t r0 = split.chunk_row0(c);
                      Buf dl = zeros(int64_t{n} * d.E);
                      FBuf acc = fzeros(int64_t{n} * d.H);
                      be_.router_bwd(kn_, a_c.data() + r0 * d.H, w(wr), lg_c.data() + r0 * d.E,
                                     ids_c.data() + r0 * d.K, dtopk_c.data() + r0 * d.K, dl.data(), acc.data(), out, n,
                                     d.H, d.E, d.K, cfg_.norm_topk_prob);
                    }),
       Block::entire(d.E, d.H));
  Buf da = zeros(int64_t{T} * d.H);
  be_.moe_combine_bwd(da_slot.data(), router_acc.data(), da.data(), T, d.K, d.H);
  return da;
}

}  // namespace bp::layouts
