// The sharded rank program (SPEC.md §7): what one rank of a layout computes,
// forward on every path and backward, talking to the other ranks only through
// comm.h. Written once over a backend (program/backend.h), like the
// unsharded model program: the reference runs it on host vectors and the ref ops
// (emulated ranks, host/layouts.h), the GPU on the bp::cuda ops (virtual ranks,
// optimized/layouts/virtual_ranks.h). Activations live in the backend and every
// operation on them is a backend call, collectives included (B::all_gather,
// B::all_to_all over a Comm); every reduction of rank or chunk partials is
// B::reduce_partials, the contract's tree. Small index data (tokens, positions,
// row lists, MoE plans) stays on the host.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "program/backend.h"
#include "program/layouts/comm.h"
#include "program/layouts/expert_exchange.h"
#include "program/layouts/layout.h"
#include "program/layouts/rank_result.h"
#include "program/layouts/sharding.h"
#include "program/layouts/token_split.h"
#include "program/results.h"
#include "program/schedule.h"
#include "reference/model/loss.h"
#include "reference/numerics/reduce.h"
#include "reference/ops/attention.h"
#include "reference/ops/moe_experts.h"
#include "reference/ops/rope.h"

namespace bp::layouts {

template <class B>
class RankModel {
 public:
  // Host backends keep views of `w`, which must then outlive the model; device
  // backends copy this rank's share of every weight it uses.
  RankModel(const ModelConfig& cfg, const Weights& w, const Knobs& kn, const Layout& layout, int rank,
            RankComms& comms, B backend = {});

  RankResult forward(const std::vector<std::vector<int32_t>>& seqs, const ref::Schedule& sched,
                     const ref::ForwardOptions& opt);
  RankResult backward(const std::vector<std::vector<int32_t>>& seqs, uint64_t coef_seed, float temperature);

 private:
  template <class T>
  using BufOf = typename B::template Buf<T>;
  using Buf = BufOf<bf16>;
  using FBuf = BufOf<float>;
  using IBuf = BufOf<int>;
  struct Dims;
  struct Tokens;
  struct Run;
  struct LayerSaved;
  struct Saved;
  struct Routing {
    Buf logits, weights;
    IBuf ids;
    std::vector<int> ids_host;  // the exchange plans on the host
  };
  struct Block {  // where a rank's gradient sits in the parameter
    enum Kind { Whole, RowSlice, ColumnSlice } kind;
    int64_t rows, cols;  // of this rank's block
  };

  static std::string lname(int64_t i, const std::string& what) {
    return "model.layers." + std::to_string(i) + "." + what;
  }
  static std::string cname(int64_t i, const char* what) { return "layers." + std::to_string(i) + "." + what; }
  static size_t sz(int64_t n) { return static_cast<size_t>(n); }
  Buf zeros(int64_t n) const { return be_.template zeros<bf16>(sz(n)); }
  FBuf fzeros(int64_t n) const { return be_.template zeros<float>(sz(n)); }
  // This rank's share of a weight (whole, its row slice or its column shard).
  const bf16* w(const std::string& name) const { return w_.at(name).data(); }
  ref::RopeTable rope_table() const {
    return {rope_cos_.data(), rope_sin_.data(), static_cast<int>(cfg_.max_position_embeddings), d_.D};
  }
  PartialSum tp_sum() const { return layout_.reduction == Reduction::Tree ? PartialSum::Tree : PartialSum::Ring; }

  void keep_weights(const Weights& weights);
  Run start(const std::vector<std::vector<int32_t>>& seqs, const ref::ForwardOptions& opt) const;
  Tokens my_tokens(const Run& run, const std::vector<ref::SchedulePiece>& pieces) const;
  void step(Run& run, const std::vector<ref::SchedulePiece>& pieces, Saved* saved);
  void capture(Run& run, const Tokens& tk, const std::string& name, const Buf& b, int64_t cols, int64_t col0,
               int64_t width) const;

  FBuf tp_reduce(const FBuf& mine, PartialSum how) const;
  Buf round_all(const FBuf& a) const;
  template <class T>
  BufOf<T> gather_heads(const T* mine, int tokens, int64_t slice) const;
  Buf row_parallel(const bf16* x, const std::string& name, int T, int k_local, int n) const;
  FBuf column_dgrad(const bf16* dy, const bf16* w_slice, int T, int k, int n_local) const;
  void share_kv(Run& run, const Tokens& tk, int64_t layer, const Buf& k, const Buf& v,
                const std::vector<ref::SchedulePiece>& pieces, Buf& kp, Buf& vp, std::map<int, int>& kv_begin) const;
  Buf dense_mlp(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const;
  ref::ExpertWeights expert_weights(int64_t li, int e_begin, int e_end, std::vector<const bf16*> (&ptr)[3]) const;
  Routing route(int64_t li, const Buf& a2, int T) const;
  Buf moe(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const;
  FBuf gather_chunks(const FBuf& mine, int R) const;
  void logprobs(Run& run, const Tokens& tk, const Buf& logits, Saved* saved) const;

  void emit(Run& run, const std::string& name, FBuf g, Block block) const;
  FBuf split_wgrad(const TokenSplit& split, const Buf& dy, int n, const Buf& x, int k) const;
  FBuf split_norm_dw(const TokenSplit& split, const std::string& name, const Buf& x, const FBuf& rstd, const Buf& dy,
                     int heads, int n) const;
  Buf norm_bwd(Run& run, const TokenSplit& split, const std::string& name, const Buf& x, const FBuf& rstd,
               const Buf& dy, int heads, int n, bool heads_sliced) const;
  Buf dense_mlp_bwd(Run& run, const TokenSplit& split, int64_t li, const Buf& a2, const Buf& dout) const;
  Buf moe_bwd(Run& run, const TokenSplit& split, const Tokens& tk, int64_t li, const Buf& a2, const Buf& dout) const;
  void attention_kv_bwd(const Run& run, const Tokens& tk, const LayerSaved& s, const std::map<int, int>& kv_begin,
                        const Buf& dO, Buf& dk, Buf& dv) const;
  void backward_layer(Run& run, const TokenSplit& split, const Saved& sv, int64_t li, Buf& dx) const;

  // Shapes: global, and this rank's TP slices.
  struct Dims {
    int H, D, Hq, Hkv, V, C, E, K, Ie, I;
    int tp, Hql, Hkvl, QDl, KDl, Il, Vl;
    int local_chunks;  // chunks of a C-chunk reduction one rank holds (1 under Ring: one local chain)
    float eps;
  };

  const ModelConfig& cfg_;
  Knobs kn_;
  Layout layout_;
  GridPos at_;
  RankComms& comms_;
  B be_;
  Dims d_{};
  std::map<std::string, typename B::template Resident<bf16>> w_;
  std::map<std::string, std::vector<bf16>> column_shards_;  // row-parallel weights' K slices, on the host
  const bf16* lm_head_ = nullptr;                           // my vocabulary rows
  std::vector<bf16> rope_cos_host_, rope_sin_host_;
  typename B::template Resident<bf16> rope_cos_, rope_sin_;
};

// ---- Per-call state -----------------------------------------------------------

// This rank's tokens in one model call, in packed order (pieces in order,
// positions increasing), and the attention runs they form.
template <class B>
struct RankModel<B>::Tokens {
  std::vector<int32_t> tok, pos;
  std::vector<int> seq;
  std::vector<int64_t> row;   // canonical row: seq_off[seq] + pos
  std::vector<ref::AttnSeq> runs;  // kv_begin filled when the keys are packed
  std::vector<int> run_seq;
  int size() const { return static_cast<int>(tok.size()); }

  // (sequence, position) of each token, flat: what CP ranks exchange to place rows.
  std::vector<int32_t> seq_pos() const {
    std::vector<int32_t> out;
    for (size_t i = 0; i < tok.size(); ++i) out.insert(out.end(), {seq[i], pos[i]});
    return out;
  }
  // The runs with each sequence's first key row in the packed K/V.
  std::vector<ref::AttnSeq> runs_at(const std::map<int, int>& kv_begin) const {
    std::vector<ref::AttnSeq> out = runs;
    for (size_t r = 0; r < out.size(); ++r) out[r].kv_begin = kv_begin.at(run_seq[r]);
    return out;
  }
};

// The state of one forward (or the backward's forward) on this rank.
template <class B>
struct RankModel<B>::Run {
  const std::vector<std::vector<int32_t>>& seqs;
  ref::ForwardOptions opt;
  std::vector<int64_t> seq_off;
  int64_t total = 0;
  std::map<int, int64_t> cache_row0;  // my sequences: first row of their keys in the caches
  std::vector<Buf> kc, vc;            // [layer]: my sequences' rows × KDl
  RankResult result;
  int len(int s) const { return static_cast<int>(seqs[static_cast<size_t>(s)].size()); }
};

template <class B>
struct RankModel<B>::LayerSaved {
  Buf x_in, a1, q_pre, k_pre, qn, kn, q, o, x_mid, a2, kp, vp;
  FBuf rstd1, rstd_q, rstd_k, m, l, rstd2;
};

template <class B>
struct RankModel<B>::Saved {
  Tokens tk;
  std::map<int, int> kv_begin;  // sequence → its first row in kp / vp
  std::vector<LayerSaved> layers;
  Buf x_final, hn, logits;
  FBuf rstd_f, row_max, row_sum;
  std::vector<int> target_rows;  // local rows with a target, in order
};

// ---- Construction -----------------------------------------------------------

template <class B>
RankModel<B>::RankModel(const ModelConfig& cfg, const Weights& w, const Knobs& kn, const Layout& layout, int rank,
                        RankComms& comms, B backend)
    : cfg_(cfg), kn_(kn), layout_(layout), at_(GridPos::of(layout, rank)), comms_(comms), be_(std::move(backend)) {
  Dims& d = d_;
  d.H = static_cast<int>(cfg.hidden_size);
  d.D = static_cast<int>(cfg.head_dim);
  d.Hq = static_cast<int>(cfg.num_attention_heads);
  d.Hkv = static_cast<int>(cfg.num_key_value_heads);
  d.V = static_cast<int>(cfg.vocab_size);
  d.C = kn.tp_tree_width;
  d.E = static_cast<int>(cfg.num_experts);
  d.K = static_cast<int>(cfg.num_experts_per_tok);
  d.Ie = static_cast<int>(cfg.moe_intermediate_size);
  d.I = static_cast<int>(cfg.intermediate_size);
  d.tp = layout.tp;
  d.Hql = d.Hq / d.tp;
  d.Hkvl = d.Hkv / d.tp;
  d.QDl = d.Hql * d.D;
  d.KDl = d.Hkvl * d.D;
  d.Il = d.I / d.tp;
  d.Vl = d.V / d.tp;
  d.local_chunks = layout.reduction == Reduction::Tree ? d.C / d.tp : 1;
  d.eps = static_cast<float>(cfg.rms_norm_eps);

  const int max_pos = static_cast<int>(cfg.max_position_embeddings);
  rope_cos_host_.resize(sz(max_pos) * sz(d.D / 2));
  rope_sin_host_.resize(rope_cos_host_.size());
  ref::rope_tables(static_cast<float>(cfg.rope_theta), d.D, max_pos, rope_cos_host_.data(), rope_sin_host_.data());
  rope_cos_ = be_.resident(rope_cos_host_);
  rope_sin_ = be_.resident(rope_sin_host_);
  keep_weights(w);
}

// This rank's share of every weight it uses: replicated ones whole; column-
// parallel ones (q, k, v, gate, up, the untied lm_head) their t-th block of rows;
// row-parallel ones (o_proj, dense down_proj) their t-th block of K columns,
// made contiguous; experts only where they live.
template <class B>
void RankModel<B>::keep_weights(const Weights& weights) {
  const Dims& d = d_;
  auto whole = [&](const std::string& name) { w_.emplace(name, be_.resident(weights.at(name).data)); };
  auto rows = [&](const std::string& name, int64_t rows_each) {
    const Tensor& t = weights.at(name);
    const int64_t n = rows_each * t.shape[1];
    w_.emplace(name, be_.resident(std::span<const bf16>(t.data.data() + int64_t{at_.t} * n, sz(n))));
  };
  auto columns = [&](const std::string& name, int k_full, int k_local) {
    const Tensor& t = weights.at(name);
    const int64_t n = t.shape[0];
    std::vector<bf16>& shard = column_shards_[name];
    shard.resize(sz(n * k_local));
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(t.data.begin() + r * k_full + int64_t{at_.t} * k_local, k_local, shard.begin() + r * k_local);
    w_.emplace(name, be_.resident(shard));
  };
  whole("model.embed_tokens.weight");
  whole("model.norm.weight");
  if (!cfg_.tie_word_embeddings) rows("lm_head.weight", d.Vl);
  const auto [e_begin, e_end] = ExpertExchange::held_experts(layout_, d.E, at_.plane_rank(layout_));
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                             "self_attn.k_norm.weight"})
      whole(lname(i, norm));
    rows(lname(i, "self_attn.q_proj.weight"), d.QDl);
    rows(lname(i, "self_attn.k_proj.weight"), d.KDl);
    rows(lname(i, "self_attn.v_proj.weight"), d.KDl);
    columns(lname(i, "self_attn.o_proj.weight"), d.Hq * d.D, d.QDl);
    if (cfg_.is_moe_layer(i)) {
      whole(lname(i, "mlp.gate.weight"));
      for (int e = e_begin; e < e_end; ++e)
        for (const char* kind : {"gate_proj", "up_proj", "down_proj"})
          whole(lname(i, "mlp.experts." + std::to_string(e) + "." + kind + ".weight"));
    } else {
      rows(lname(i, "mlp.gate_proj.weight"), d.Il);
      rows(lname(i, "mlp.up_proj.weight"), d.Il);
      columns(lname(i, "mlp.down_proj.weight"), d.I, d.Il);
    }
  }
  lm_head_ = cfg_.tie_word_embeddings ? w("model.embed_tokens.weight") + int64_t{at_.t} * d.Vl * d.H
                                      : w("lm_head.weight");
}

// ---- Collective building blocks --------------------------------------------

// The contract's reduction of TP rank partials (fp32, elementwise): all-gather,
// then pairwise_tree over the ranks' subtrees; or, for the Ring control, NCCL's
// ring order.
template <class B>
typename RankModel<B>::FBuf RankModel<B>::tp_reduce(const FBuf& mine, PartialSum how) const {
  const auto all = be_.all_gather(comms_.tp, mine.data(), mine.size());
  const std::vector<size_t> parts(all.offset.begin(), all.offset.end() - 1);
  FBuf out = fzeros(static_cast<int64_t>(mine.size()));
  be_.reduce_partials(all.data.data(), parts, mine.size(), how, out.data());
  return out;
}

template <class B>
typename RankModel<B>::Buf RankModel<B>::round_all(const FBuf& a) const {
  Buf out = zeros(static_cast<int64_t>(a.size()));
  be_.round_to_bf16(a.data(), out.data(), a.size());
  return out;
}

// [T][n_l·TP][w] from every TP rank's [T][n_l][w] head slice (heads in rank
// order), `slice` = n_l·w elements per token.
template <class B>
template <class T>
typename RankModel<B>::template BufOf<T> RankModel<B>::gather_heads(const T* mine, int tokens, int64_t slice) const {
  const auto all = be_.all_gather(comms_.tp, mine, sz(tokens * slice));
  const int P = comms_.tp.size();
  std::vector<int> rows;  // output row t·P + r is rank r's row t
  for (int t = 0; t < tokens; ++t)
    for (int r = 0; r < P; ++r) rows.push_back(static_cast<int>(all.offset[sz(r)] / sz(slice)) + t);
  BufOf<T> out = be_.template zeros<T>(rows.size() * sz(slice));
  be_.gather_rows(all.data.data(), sz(slice), rows, out.data());
  return out;
}

// R(x · W) for a row-parallel W whose K this rank holds a slice of: the local
// chunks' subtree (or local chain under Ring), reduced over TP, rounded once.
template <class B>
typename RankModel<B>::Buf RankModel<B>::row_parallel(const bf16* x, const std::string& name, int T, int k_local,
                                                      int n) const {
  FBuf acc = fzeros(int64_t{T} * n);
  be_.linear_acc(kn_, x, w(name), acc.data(), T, k_local, n, d_.local_chunks);
  return round_all(tp_reduce(acc, tp_sum()));
}

// The fp32 input gradient of a column-parallel W (its N sliced over TP): local
// chunks' subtree, reduced over TP (not rounded: callers may add more paths first).
template <class B>
typename RankModel<B>::FBuf RankModel<B>::column_dgrad(const bf16* dy, const bf16* w_slice, int T, int k,
                                                       int n_local) const {
  FBuf acc = fzeros(int64_t{T} * k);
  be_.linear_dgrad_acc(kn_, dy, w_slice, acc.data(), T, k, n_local, d_.local_chunks);
  return tp_reduce(acc, tp_sum());
}

template <class B>
void RankModel<B>::capture(Run& run, const Tokens& tk, const std::string& name, const Buf& b, int64_t cols,
                           int64_t col0, int64_t width) const {
  if (!run.opt.capture) return;
  if (cols == width && at_.t != 0) return;  // replicated over TP: rank t = 0 reports it
  run.result.captures.push_back({name, width, col0, cols, tk.row, be_.to_host(b.data(), b.size())});
}

// This rank's tokens of a model call: sequences of its e, positions of its c.
template <class B>
typename RankModel<B>::Tokens RankModel<B>::my_tokens(const Run& run,
                                                      const std::vector<ref::SchedulePiece>& pieces) const {
  Tokens tk;
  for (const ref::SchedulePiece& p : pieces) {
    if (seq_owner_e(layout_, p.seq) != at_.e) continue;
    for (int pos = p.start; pos < p.start + p.len; ++pos) {
      if (cp_owner(layout_, pos, run.len(p.seq)) != at_.c) continue;
      const bool extends = !tk.runs.empty() && tk.run_seq.back() == p.seq &&
                           tk.runs.back().past_len + tk.runs.back().q_len == pos;
      if (!extends) {
        tk.runs.push_back({tk.size(), 0, pos, 0});
        tk.run_seq.push_back(p.seq);
      }
      ++tk.runs.back().q_len;
      tk.tok.push_back(run.seqs[sz(p.seq)][sz(pos)]);
      tk.pos.push_back(pos);
      tk.seq.push_back(p.seq);
      tk.row.push_back(run.seq_off[sz(p.seq)] + pos);
    }
  }
  return tk;
}

// Context parallelism: every CP rank appends every rank's new keys and values to
// its caches (the all-gather of K/V), then packs each of the call's sequences'
// keys 0 .. start+len−1 for attention.
template <class B>
void RankModel<B>::share_kv(Run& run, const Tokens& tk, int64_t layer, const Buf& k, const Buf& v,
                            const std::vector<ref::SchedulePiece>& pieces, Buf& kp, Buf& vp,
                            std::map<int, int>& kv_begin) const {
  const size_t KDl = sz(d_.KDl);
  const auto all_where = all_gather(comms_.cp, std::span<const int32_t>(tk.seq_pos()));
  const auto all_k = be_.all_gather(comms_.cp, k.data(), k.size());
  const auto all_v = be_.all_gather(comms_.cp, v.data(), v.size());
  std::vector<int> cache_rows;  // each gathered row's row in the caches
  for (const std::vector<int32_t>& where : all_where)
    for (size_t i = 0; 2 * i < where.size(); ++i)
      cache_rows.push_back(static_cast<int>(run.cache_row0.at(where[2 * i]) + where[2 * i + 1]));
  be_.scatter_rows(all_k.data.data(), KDl, cache_rows, run.kc[sz(layer)].data());
  be_.scatter_rows(all_v.data.data(), KDl, cache_rows, run.vc[sz(layer)].data());
  kv_begin.clear();
  int rows = 0;
  for (const ref::SchedulePiece& p : pieces) {
    if (seq_owner_e(layout_, p.seq) != at_.e) continue;
    kv_begin[p.seq] = rows;
    rows += p.start + p.len;
  }
  kp = zeros(int64_t{rows} * d_.KDl);
  vp = zeros(int64_t{rows} * d_.KDl);
  for (const ref::SchedulePiece& p : pieces) {
    if (seq_owner_e(layout_, p.seq) != at_.e) continue;
    const size_t from = sz(run.cache_row0.at(p.seq)) * KDl, to = sz(kv_begin.at(p.seq)) * KDl;
    const size_t n = sz(p.start + p.len) * KDl;
    be_.copy(kp.data() + to, run.kc[sz(layer)].data() + from, n);
    be_.copy(vp.data() + to, run.vc[sz(layer)].data() + from, n);
  }
}

// Dense MLP: gate/up column-parallel (this rank's Il rows), down row-parallel.
template <class B>
typename RankModel<B>::Buf RankModel<B>::dense_mlp(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const {
  const Dims& d = d_;
  const int T = tk.size();
  Buf g = zeros(int64_t{T} * d.Il), u = zeros(int64_t{T} * d.Il), m = zeros(int64_t{T} * d.Il);
  be_.mlp_hidden_fwd(kn_, a2.data(), w(lname(li, "mlp.gate_proj.weight")), w(lname(li, "mlp.up_proj.weight")),
                     g.data(), u.data(), m.data(), T, d.H, d.Il);
  const int64_t col0 = int64_t{at_.t} * d.Il;
  capture(run, tk, cname(li, "mlp_gate"), g, d.Il, col0, d.I);
  capture(run, tk, cname(li, "mlp_up"), u, d.Il, col0, d.I);
  capture(run, tk, cname(li, "mlp_act"), m, d.Il, col0, d.I);
  return row_parallel(m.data(), lname(li, "mlp.down_proj.weight"), T, d.Il, d.H);
}

// The experts this rank holds (others null: it must never touch them).
template <class B>
ref::ExpertWeights RankModel<B>::expert_weights(int64_t li, int e_begin, int e_end,
                                                std::vector<const bf16*> (&ptr)[3]) const {
  static const char* kind[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int j = 0; j < 3; ++j) {
    ptr[j].assign(sz(d_.E), nullptr);
    for (int e = e_begin; e < e_end; ++e)
      ptr[j][sz(e)] = w(lname(li, "mlp.experts." + std::to_string(e) + "." + kind[j] + ".weight"));
  }
  return {ptr[0].data(), ptr[1].data(), ptr[2].data()};
}

// Routing on the token's home rank (replicated router weight).
template <class B>
typename RankModel<B>::Routing RankModel<B>::route(int64_t li, const Buf& a2, int T) const {
  const Dims& d = d_;
  Routing r{zeros(int64_t{T} * d.E), zeros(int64_t{T} * d.K), be_.template zeros<int>(sz(int64_t{T} * d.K)), {}};
  be_.router_fwd(kn_, a2.data(), w(lname(li, "mlp.gate.weight")), r.logits.data(), r.ids.data(), r.weights.data(), T,
                 d.H, d.E, d.K, cfg_.norm_topk_prob);
  r.ids_host = be_.to_host(r.ids.data(), r.ids.size());
  return r;
}

// MoE: route at home, experts where they live, combine at home in slot order.
template <class B>
typename RankModel<B>::Buf RankModel<B>::moe(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const {
  const Dims& d = d_;
  const int T = tk.size();
  const Routing r = route(li, a2, T);
  capture(run, tk, cname(li, "router_logits"), r.logits, d.E, 0, d.E);
  capture(run, tk, cname(li, "router_weights"), r.weights, d.K, 0, d.K);
  const ExpertExchange ex(comms_.plane, layout_, d.E, d.K, r.ids_host, tk.row);
  const Buf a_recv = ex.send_tokens(be_, a2.data(), d.H);
  const Buf w_recv = ex.send_slots(be_, r.weights.data(), 1);
  Buf c_recv = zeros(int64_t{ex.received_tokens()} * d.K * d.H);
  std::vector<const bf16*> ptr[3];
  be_.moe_experts_fwd(kn_, ex.plan(), ex.e_begin(), ex.e_end(), a_recv.data(), w_recv.data(),
                      expert_weights(li, ex.e_begin(), ex.e_end(), ptr), c_recv.data(), d.K, d.H, d.Ie);
  const Buf cs = ex.return_slots(be_, c_recv.data(), d.H);
  capture(run, tk, cname(li, "expert_out"), cs, int64_t{d.K} * d.H, 0, int64_t{d.K} * d.H);
  Buf out = zeros(int64_t{T} * d.H);
  be_.moe_combine_fwd(cs.data(), out.data(), T, d.K, d.H);
  return out;
}

// [R][n_local] chunk partials per rank → [R][C] for the logprob combine's tree.
// Under Ring (the control): each rank adds its chunks in order, NCCL's ring adds
// the ranks, and the sum sits in chunk 0 with +0 in the others, which the tree
// passes through unchanged.
template <class B>
typename RankModel<B>::FBuf RankModel<B>::gather_chunks(const FBuf& mine, int R) const {
  const int n_local = d_.C / d_.tp;
  if (layout_.reduction == Reduction::Tree) return gather_heads(mine.data(), R, n_local);
  std::vector<int> by_chunk;  // [R][n_local] → [n_local][R]
  std::vector<size_t> chunk_at;
  for (int j = 0; j < n_local; ++j) {
    chunk_at.push_back(sz(int64_t{j} * R));
    for (int r = 0; r < R; ++r) by_chunk.push_back(r * n_local + j);
  }
  FBuf chunks = fzeros(int64_t{R} * n_local), local = fzeros(R);
  be_.gather_rows(mine.data(), 1, by_chunk, chunks.data());
  be_.reduce_partials(chunks.data(), chunk_at, sz(R), PartialSum::Chain, local.data());
  const FBuf total = tp_reduce(local, PartialSum::Ring);
  std::vector<int> first_chunk;
  for (int r = 0; r < R; ++r) first_chunk.push_back(r * d_.C);
  FBuf out = fzeros(int64_t{R} * d_.C);
  be_.scatter_rows(total.data(), 1, first_chunk, out.data());
  return out;
}

// Vocabulary-parallel log-softmax of the rows that have a target: each TP rank
// runs the stages on its C/tp chunks; the combines run after gathers.
template <class B>
void RankModel<B>::logprobs(Run& run, const Tokens& tk, const Buf& logits, Saved* saved) const {
  const Dims& d = d_;
  std::vector<int> rows;
  std::vector<int32_t> targets;
  for (int i = 0; i < tk.size(); ++i)
    if (tk.pos[sz(i)] + 1 < run.len(tk.seq[sz(i)])) {
      rows.push_back(i);
      targets.push_back(run.seqs[sz(tk.seq[sz(i)])][sz(tk.pos[sz(i)] + 1)]);
    }
  const int R = static_cast<int>(rows.size()), n_local = d.C / d.tp, chunk_len = d.V / d.C;
  const float temp = run.opt.temperature;
  const bool entropy = run.opt.entropy;
  Buf lg = zeros(int64_t{R} * d.Vl);
  be_.gather_rows(logits.data(), sz(d.Vl), rows, lg.data());
  const auto targets_dev = be_.resident(targets);
  FBuf part = fzeros(int64_t{R} * n_local), tpart = fzeros(int64_t{R} * n_local), row_max = fzeros(R),
       row_sum = fzeros(R);
  be_.logprob_chunk_max(kn_, lg.data(), d.Vl, R, chunk_len, n_local, temp, part.data(), n_local);
  be_.logprob_row_max(kn_, gather_heads(part.data(), R, n_local).data(), R, row_max.data());
  be_.logprob_chunk_sums(kn_, lg.data(), d.Vl, R, chunk_len, n_local, temp, row_max.data(), part.data(),
                         entropy ? tpart.data() : nullptr, n_local);
  const FBuf sums = gather_chunks(part, R), tsums = entropy ? gather_chunks(tpart, R) : FBuf{};
  // The target's logit comes from the rank whose slice holds it.
  FBuf x_target = fzeros(R);
  be_.logprob_target_logit(kn_, lg.data(), d.Vl, R, at_.t * d.Vl, d.Vl, targets_dev.data(), temp, x_target.data());
  const auto all_x = be_.all_gather(comms_.tp, x_target.data(), x_target.size());
  std::vector<int> holder;
  for (int r = 0; r < R; ++r) holder.push_back(static_cast<int>(all_x.offset[sz(targets[sz(r)] / d.Vl)]) + r);
  be_.gather_rows(all_x.data.data(), 1, holder, x_target.data());
  FBuf lp = fzeros(R), ent = fzeros(R);
  be_.logprob_combine(kn_, sums.data(), entropy ? tsums.data() : nullptr, x_target.data(), row_max.data(), R,
                      row_sum.data(), lp.data(), entropy ? ent.data() : nullptr);
  if (at_.t == 0) {
    const std::vector<float> lp_host = be_.to_host(lp.data(), lp.size());
    const std::vector<float> ent_host = be_.to_host(ent.data(), ent.size());
    for (int r = 0; r < R; ++r) {
      const int i = rows[sz(r)];
      run.result.values.push_back({tk.seq[sz(i)], tk.pos[sz(i)], lp_host[sz(r)], ent_host[sz(r)]});
    }
  }
  if (saved) {
    saved->target_rows = rows;
    saved->row_max = std::move(row_max);
    saved->row_sum = std::move(row_sum);
  }
}

// ---- Forward ----------------------------------------------------------------------

template <class B>
void RankModel<B>::step(Run& run, const std::vector<ref::SchedulePiece>& pieces, Saved* saved) {
  const Dims& d = d_;
  const Tokens tk = my_tokens(run, pieces);
  const int T = tk.size();
  const ref::RopeTable rt = rope_table();
  const int64_t t0 = at_.t;
  const auto tok_dev = be_.resident(tk.tok);
  const auto pos_dev = be_.resident(tk.pos);

  Buf x = zeros(int64_t{T} * d.H);
  be_.embedding_fwd(kn_, tok_dev.data(), w("model.embed_tokens.weight"), x.data(), T, d.V, d.H);
  capture(run, tk, "embed", x, d.H, 0, d.H);
  if (saved) saved->layers.resize(sz(cfg_.num_hidden_layers));

  for (int64_t li = 0; li < cfg_.num_hidden_layers; ++li) {
    LayerSaved s;
    s.x_in = be_.clone(x);
    s.a1 = zeros(int64_t{T} * d.H);
    s.rstd1 = fzeros(T);
    be_.rmsnorm_fwd(kn_, x.data(), w(lname(li, "input_layernorm.weight")), d.eps, s.a1.data(), s.rstd1.data(), T, 1,
                    d.H);
    capture(run, tk, cname(li, "input_norm"), s.a1, d.H, 0, d.H);
    // Column-parallel q, k, v: this rank's heads.
    s.q_pre = zeros(int64_t{T} * d.QDl);
    s.k_pre = zeros(int64_t{T} * d.KDl);
    Buf v = zeros(int64_t{T} * d.KDl);
    be_.linear_fwd(kn_, s.a1.data(), w(lname(li, "self_attn.q_proj.weight")), s.q_pre.data(), T, d.H, d.QDl, 1);
    be_.linear_fwd(kn_, s.a1.data(), w(lname(li, "self_attn.k_proj.weight")), s.k_pre.data(), T, d.H, d.KDl, 1);
    be_.linear_fwd(kn_, s.a1.data(), w(lname(li, "self_attn.v_proj.weight")), v.data(), T, d.H, d.KDl, 1);
    capture(run, tk, cname(li, "q_proj"), s.q_pre, d.QDl, t0 * d.QDl, int64_t{d.Hq} * d.D);
    capture(run, tk, cname(li, "k_proj"), s.k_pre, d.KDl, t0 * d.KDl, int64_t{d.Hkv} * d.D);
    capture(run, tk, cname(li, "v_proj"), v, d.KDl, t0 * d.KDl, int64_t{d.Hkv} * d.D);
    s.qn = zeros(int64_t{T} * d.QDl);
    s.kn = zeros(int64_t{T} * d.KDl);
    s.rstd_q = fzeros(int64_t{T} * d.Hql);
    s.rstd_k = fzeros(int64_t{T} * d.Hkvl);
    be_.rmsnorm_fwd(kn_, s.q_pre.data(), w(lname(li, "self_attn.q_norm.weight")), d.eps, s.qn.data(), s.rstd_q.data(),
                    T, d.Hql, d.D);
    be_.rmsnorm_fwd(kn_, s.k_pre.data(), w(lname(li, "self_attn.k_norm.weight")), d.eps, s.kn.data(), s.rstd_k.data(),
                    T, d.Hkvl, d.D);
    capture(run, tk, cname(li, "q_norm"), s.qn, d.QDl, t0 * d.QDl, int64_t{d.Hq} * d.D);
    capture(run, tk, cname(li, "k_norm"), s.kn, d.KDl, t0 * d.KDl, int64_t{d.Hkv} * d.D);
    s.q = zeros(int64_t{T} * d.QDl);
    Buf kr = zeros(int64_t{T} * d.KDl);
    be_.rope_fwd(kn_, rt, pos_dev.data(), s.qn.data(), s.q.data(), T, d.Hql);
    be_.rope_fwd(kn_, rt, pos_dev.data(), s.kn.data(), kr.data(), T, d.Hkvl);
    capture(run, tk, cname(li, "q_rope"), s.q, d.QDl, t0 * d.QDl, int64_t{d.Hq} * d.D);
    capture(run, tk, cname(li, "k_rope"), kr, d.KDl, t0 * d.KDl, int64_t{d.Hkv} * d.D);

    std::map<int, int> kv_begin;
    share_kv(run, tk, li, kr, v, pieces, s.kp, s.vp, kv_begin);
    const std::vector<ref::AttnSeq> runs = tk.runs_at(kv_begin);
    s.o = zeros(int64_t{T} * d.QDl);
    s.m = fzeros(int64_t{T} * d.Hql);
    s.l = fzeros(int64_t{T} * d.Hql);
    be_.attention_fwd(kn_, ref::AttnDims{d.Hql, d.Hkvl, d.D}, runs.data(), static_cast<int>(runs.size()), s.q.data(),
                      s.kp.data(), s.vp.data(), s.o.data(), s.m.data(), s.l.data());
    capture(run, tk, cname(li, "attn"), s.o, d.QDl, t0 * d.QDl, int64_t{d.Hq} * d.D);
    const Buf ao = row_parallel(s.o.data(), lname(li, "self_attn.o_proj.weight"), T, d.QDl, d.H);
    capture(run, tk, cname(li, "attn_out"), ao, d.H, 0, d.H);
    be_.residual_fwd(kn_, x.data(), ao.data(), x.data(), x.size());
    capture(run, tk, cname(li, "resid_attn"), x, d.H, 0, d.H);
    s.x_mid = be_.clone(x);
    s.a2 = zeros(int64_t{T} * d.H);
    s.rstd2 = fzeros(T);
    be_.rmsnorm_fwd(kn_, x.data(), w(lname(li, "post_attention_layernorm.weight")), d.eps, s.a2.data(),
                    s.rstd2.data(), T, 1, d.H);
    capture(run, tk, cname(li, "post_norm"), s.a2, d.H, 0, d.H);
    const Buf mo = cfg_.is_moe_layer(li) ? moe(run, tk, li, s.a2) : dense_mlp(run, tk, li, s.a2);
    capture(run, tk, cname(li, "mlp_out"), mo, d.H, 0, d.H);
    be_.residual_fwd(kn_, x.data(), mo.data(), x.data(), x.size());
    capture(run, tk, cname(li, "resid_mlp"), x, d.H, 0, d.H);
    if (saved) {
      if (li == 0) saved->kv_begin = kv_begin;
      saved->layers[sz(li)] = std::move(s);
    }
  }

  Buf hn = zeros(int64_t{T} * d.H);
  FBuf rstd_f = fzeros(T);
  be_.rmsnorm_fwd(kn_, x.data(), w("model.norm.weight"), d.eps, hn.data(), rstd_f.data(), T, 1, d.H);
  capture(run, tk, "final_norm", hn, d.H, 0, d.H);
  Buf logits = zeros(int64_t{T} * d.Vl);
  be_.linear_fwd(kn_, hn.data(), lm_head_, logits.data(), T, d.H, d.Vl, 1);
  capture(run, tk, "logits", logits, d.Vl, t0 * d.Vl, d.V);
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
typename RankModel<B>::Run RankModel<B>::start(const std::vector<std::vector<int32_t>>& seqs,
                                               const ref::ForwardOptions& opt) const {
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
RankResult RankModel<B>::forward(const std::vector<std::vector<int32_t>>& seqs, const ref::Schedule& sched,
                                 const ref::ForwardOptions& opt) {
  Run run = start(seqs, opt);
  for (const auto& pieces : ref::schedule_steps(seqs, sched, cfg_.max_position_embeddings))
    step(run, pieces, nullptr);
  return std::move(run.result);
}

// ---- Backward -----------------------------------------------------------------------

// Gradient blocks: every plane rank holds the reduced gradient; plane rank 0
// reports it — its TP slice, or (replicated over TP) rank t = 0 the whole.
template <class B>
void RankModel<B>::emit(Run& run, const std::string& name, FBuf g, Block block) const {
  if (comms_.plane.rank() != 0) return;
  const int64_t t = at_.t;
  switch (block.kind) {
    case Block::Whole:
      if (t == 0) run.result.grads.push_back({name, 0, block.rows, 0, block.cols, block.cols, be_.take(std::move(g))});
      break;
    case Block::RowSlice:
      run.result.grads.push_back({name, t * block.rows, block.rows, 0, block.cols, block.cols, be_.take(std::move(g))});
      break;
    case Block::ColumnSlice:
      run.result.grads.push_back(
          {name, 0, block.rows, t * block.cols, block.cols, block.cols * layout_.tp, be_.take(std::move(g))});
      break;
  }
}

// dW [n][k] of y = x·Wᵀ over the plane's tokens (dy [T][n], x [T][k] local rows).
template <class B>
typename RankModel<B>::FBuf RankModel<B>::split_wgrad(const TokenSplit& split, const Buf& dy, int n, const Buf& x,
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
typename RankModel<B>::FBuf RankModel<B>::split_norm_dw(const TokenSplit& split, const std::string& name,
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
template <class B>
typename RankModel<B>::Buf RankModel<B>::norm_bwd(Run& run, const TokenSplit& split, const std::string& name,
                                                  const Buf& x, const FBuf& rstd, const Buf& dy, int heads, int n,
                                                  bool heads_sliced) const {
  const int T = static_cast<int>(rstd.size()) / heads;
  Buf dx = zeros(static_cast<int64_t>(x.size()));
  FBuf dw_unused = fzeros(n);
  be_.rmsnorm_bwd(kn_, x.data(), w(name), rstd.data(), dy.data(), dx.data(), dw_unused.data(), T, heads, n);
  if (heads_sliced) {
    // q/k norms: a token chunk's rows interleave all heads, so gather the TP slices first.
    const Buf xs = gather_heads(x.data(), T, int64_t{heads} * n);
    const Buf dys = gather_heads(dy.data(), T, int64_t{heads} * n);
    const FBuf rs = gather_heads(rstd.data(), T, heads);
    emit(run, name, split_norm_dw(split, name, xs, rs, dys, heads * layout_.tp, n), {Block::Whole, 1, n});
  } else {
    emit(run, name, split_norm_dw(split, name, x, rstd, dy, heads, n), {Block::Whole, 1, n});
  }
  return dx;
}

template <class B>
typename RankModel<B>::Buf RankModel<B>::dense_mlp_bwd(Run& run, const TokenSplit& split, int64_t li, const Buf& a2,
                                                       const Buf& dout) const {
  const Dims& d = d_;
  const int T = static_cast<int>(a2.size() / sz(d.H));
  const std::string wg = lname(li, "mlp.gate_proj.weight"), wu = lname(li, "mlp.up_proj.weight"),
                    wd = lname(li, "mlp.down_proj.weight");
  const int64_t n = int64_t{T} * d.Il;
  Buf g = zeros(n), u = zeros(n), m = zeros(n), dm = zeros(n), dg = zeros(n), du = zeros(n);
  be_.mlp_hidden_fwd(kn_, a2.data(), w(wg), w(wu), g.data(), u.data(), m.data(), T, d.H, d.Il);
  be_.linear_dgrad(kn_, dout.data(), w(wd), dm.data(), T, d.Il, d.H, 1);
  emit(run, wd, split_wgrad(split, dout, d.H, m, d.Il), {Block::ColumnSlice, d.H, d.Il});
  be_.swiglu_bwd(g.data(), u.data(), dm.data(), dg.data(), du.data(), static_cast<int>(n));
  FBuf from_gate = column_dgrad(dg.data(), w(wg), T, d.H, d.Il);
  const FBuf from_up = column_dgrad(du.data(), w(wu), T, d.H, d.Il);
  be_.add_f32(from_gate.data(), from_up.data(), from_gate.size());  // one fp32 addition, then one rounding
  Buf da = round_all(from_gate);
  emit(run, wg, split_wgrad(split, dg, d.Il, a2, d.H), {Block::RowSlice, d.Il, d.H});
  emit(run, wu, split_wgrad(split, du, d.Il, a2, d.H), {Block::RowSlice, d.Il, d.H});
  return da;
}

template <class B>
typename RankModel<B>::Buf RankModel<B>::moe_bwd(Run& run, const TokenSplit& split, const Tokens& tk, int64_t li,
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
  static const char* kind[3] = {"gate_proj", "up_proj", "down_proj"};
  if (at_.t == 0)
    for (int e = ex.e_begin(), i = 0; e < ex.e_end(); ++e)
      for (int j = 0; j < 3; ++j, ++i) {
        const int64_t rows = j == 2 ? d.H : d.Ie, cols = j == 2 ? d.Ie : d.H;
        run.result.grads.push_back({lname(li, "mlp.experts." + std::to_string(e) + "." + kind[j] + ".weight"), 0,
                                    rows, 0, cols, cols, be_.take(std::move(grads[sz(i)]))});
      }
  const FBuf da_slot = ex.return_slots(be_, da_slot_recv.data(), d.H);
  const Buf dtopk = ex.return_slots(be_, dw_recv.data(), 1);
  // The router at home: its input-gradient accumulator joins the slots' in the combine.
  const std::string wr = lname(li, "mlp.gate.weight");
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
       {Block::Whole, d.E, d.H});
  Buf da = zeros(int64_t{T} * d.H);
  be_.moe_combine_bwd(da_slot.data(), router_acc.data(), da.data(), T, d.K, d.H);
  return da;
}

// dk, dv of my tokens under CP: the CP ranks gather each sequence's query side;
// query chunk c's partials are computed by CP rank c mod cp, all-gathered, and
// every rank combines the chunks in order (attention's own tree).
template <class B>
void RankModel<B>::attention_kv_bwd(const Run& run, const Tokens& tk, const LayerSaved& s,
                                    const std::map<int, int>& kv_begin, const Buf& dO, Buf& dk, Buf& dv) const {
  const Dims& d = d_;
  const ref::AttnDims ad{d.Hql, d.Hkvl, d.D};
  const int CP = layout_.cp, chunk = kn_.grad_token_chunk;
  const auto all_where = all_gather(comms_.cp, std::span<const int32_t>(tk.seq_pos()));
  const auto all_q = be_.all_gather(comms_.cp, s.q.data(), s.q.size());
  const auto all_o = be_.all_gather(comms_.cp, s.o.data(), s.o.size());
  const auto all_do = be_.all_gather(comms_.cp, dO.data(), dO.size());
  const auto all_m = be_.all_gather(comms_.cp, s.m.data(), s.m.size());
  const auto all_l = be_.all_gather(comms_.cp, s.l.data(), s.l.size());
  for (const auto& [seq, kv0] : kv_begin) {
    const int S = run.len(seq), n_chunks = (S + chunk - 1) / chunk;
    // The gathered row (over all CP ranks' rows, in rank order) of each position.
    std::vector<int> at_pos(sz(S), -1);
    int gathered = 0;
    for (const std::vector<int32_t>& where : all_where)
      for (size_t i = 0; 2 * i < where.size(); ++i, ++gathered)
        if (where[2 * i] == seq) at_pos[sz(where[2 * i + 1])] = gathered;
    if (std::find(at_pos.begin(), at_pos.end(), -1) != at_pos.end())
      throw std::logic_error("layouts: a sequence's positions are not all on its CP ranks");
    Buf q = zeros(int64_t{S} * d.QDl), o = zeros(int64_t{S} * d.QDl), dout = zeros(int64_t{S} * d.QDl);
    FBuf m = fzeros(int64_t{S} * d.Hql), l = fzeros(int64_t{S} * d.Hql);
    be_.gather_rows(all_q.data.data(), sz(d.QDl), at_pos, q.data());
    be_.gather_rows(all_o.data.data(), sz(d.QDl), at_pos, o.data());
    be_.gather_rows(all_do.data.data(), sz(d.QDl), at_pos, dout.data());
    be_.gather_rows(all_m.data.data(), sz(d.Hql), at_pos, m.data());
    be_.gather_rows(all_l.data.data(), sz(d.Hql), at_pos, l.data());
    const size_t part = sz(int64_t{S} * d.KDl);
    const bf16* k = s.kp.data() + int64_t{kv0} * d.KDl;
    const bf16* v = s.vp.data() + int64_t{kv0} * d.KDl;
    const int mine = at_.c < n_chunks ? (n_chunks - at_.c + CP - 1) / CP : 0;
    FBuf mine_k = fzeros(static_cast<int64_t>(sz(mine) * part)), mine_v = fzeros(static_cast<int64_t>(sz(mine) * part));
    for (int c = at_.c, i = 0; c < n_chunks; c += CP, ++i) {
      const ref::AttnSeq a{c * chunk, std::min(chunk, S - c * chunk), c * chunk, 0};
      be_.attention_bwd_kv_partials(kn_, ad, a, q.data(), k, v, o.data(), m.data(), l.data(), dout.data(),
                                    mine_k.data() + sz(i) * part, mine_v.data() + sz(i) * part);
    }
    const auto all_k = be_.all_gather(comms_.cp, mine_k.data(), mine_k.size());
    const auto all_v = be_.all_gather(comms_.cp, mine_v.data(), mine_v.size());
    const int64_t all_parts = static_cast<int64_t>(part * sz(n_chunks));
    FBuf parts_k = fzeros(all_parts), parts_v = fzeros(all_parts);
    for (int c = 0; c < n_chunks; ++c) {
      const size_t from = sz(c / CP) * part;
      be_.copy(parts_k.data() + sz(c) * part, all_k.data.data() + all_k.offset[sz(c % CP)] + from, part);
      be_.copy(parts_v.data() + sz(c) * part, all_v.data.data() + all_v.offset[sz(c % CP)] + from, part);
    }
    Buf dk_seq = zeros(static_cast<int64_t>(part)), dv_seq = zeros(static_cast<int64_t>(part));
    be_.attention_bwd_kv_combine(kn_, ad, S, n_chunks, parts_k.data(), parts_v.data(), dk_seq.data(), dv_seq.data());
    std::vector<int> from_pos, to_row;
    for (int i = 0; i < tk.size(); ++i)
      if (tk.seq[sz(i)] == seq) {
        from_pos.push_back(tk.pos[sz(i)]);
        to_row.push_back(i);
      }
    be_.copy_rows(dk_seq.data(), sz(d.KDl), from_pos, dk.data(), to_row);
    be_.copy_rows(dv_seq.data(), sz(d.KDl), from_pos, dv.data(), to_row);
  }
}

// One layer's backward; dx enters as the gradient of the layer's output and
// leaves as the gradient of its input. The order is ref::Model::backward's.
template <class B>
void RankModel<B>::backward_layer(Run& run, const TokenSplit& split, const Saved& sv, int64_t li, Buf& dx) const {
  const Dims& d = d_;
  const LayerSaved& s = sv.layers[sz(li)];
  const Tokens& tk = sv.tk;
  const int T = tk.size();
  const Buf da =
      cfg_.is_moe_layer(li) ? moe_bwd(run, split, tk, li, s.a2, dx) : dense_mlp_bwd(run, split, li, s.a2, dx);
  const Buf db =
      norm_bwd(run, split, lname(li, "post_attention_layernorm.weight"), s.x_mid, s.rstd2, da, 1, d.H, false);
  be_.residual_fwd(kn_, dx.data(), db.data(), dx.data(), dx.size());

  const std::string wo = lname(li, "self_attn.o_proj.weight");
  Buf dO = zeros(int64_t{T} * d.QDl);
  be_.linear_dgrad(kn_, dx.data(), w(wo), dO.data(), T, d.QDl, d.H, 1);
  emit(run, wo, split_wgrad(split, dx, d.H, s.o, d.QDl), {Block::ColumnSlice, d.H, d.QDl});

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
  const Buf dqp = norm_bwd(run, split, lname(li, "self_attn.q_norm.weight"), s.q_pre, s.rstd_q, dqn, d.Hql, d.D, true);
  const Buf dkp = norm_bwd(run, split, lname(li, "self_attn.k_norm.weight"), s.k_pre, s.rstd_k, dkn, d.Hkvl, d.D, true);

  // a1 feeds q, k and v: three column-parallel input gradients, rounded once.
  const std::string wq = lname(li, "self_attn.q_proj.weight"), wk = lname(li, "self_attn.k_proj.weight"),
                    wv = lname(li, "self_attn.v_proj.weight");
  const FBuf from_q = column_dgrad(dqp.data(), w(wq), T, d.H, d.QDl);
  const FBuf from_k = column_dgrad(dkp.data(), w(wk), T, d.H, d.KDl);
  const FBuf from_v = column_dgrad(dv.data(), w(wv), T, d.H, d.KDl);
  const float* parts[3] = {from_q.data(), from_k.data(), from_v.data()};
  Buf da1 = zeros(static_cast<int64_t>(from_q.size()));
  be_.sum_round(parts, 3, da1.data(), da1.size());
  emit(run, wq, split_wgrad(split, dqp, d.QDl, s.a1, d.H), {Block::RowSlice, d.QDl, d.H});
  emit(run, wk, split_wgrad(split, dkp, d.KDl, s.a1, d.H), {Block::RowSlice, d.KDl, d.H});
  emit(run, wv, split_wgrad(split, dv, d.KDl, s.a1, d.H), {Block::RowSlice, d.KDl, d.H});
  const Buf dbi = norm_bwd(run, split, lname(li, "input_layernorm.weight"), s.x_in, s.rstd1, da1, 1, d.H, false);
  be_.residual_fwd(kn_, dx.data(), dbi.data(), dx.data(), dx.size());
}

template <class B>
RankResult RankModel<B>::backward(const std::vector<std::vector<int32_t>>& seqs, uint64_t coef_seed,
                                  float temperature) {
  const Dims& d = d_;
  ref::ForwardOptions fo;
  fo.temperature = temperature;
  Run run = start(seqs, fo);
  Saved sv;
  step(run, ref::schedule_steps(seqs, ref::Schedule::ragged(), cfg_.max_position_embeddings).at(0), &sv);
  run.kc.clear();  // the backward reads the packed keys, not the caches
  run.vc.clear();
  const Tokens& tk = sv.tk;
  const int T = tk.size();
  const TokenSplit split(comms_.plane, tk.row, run.total, kn_.grad_token_chunk);

  // dlogits of my vocabulary slice; target rows are numbered over the batch.
  std::vector<int64_t> target_off;
  for (int64_t s = 0, n = 0; s < static_cast<int64_t>(seqs.size()); n += run.len(static_cast<int>(s)) - 1, ++s)
    target_off.push_back(n);
  const std::vector<int>& rows = sv.target_rows;
  const int R = static_cast<int>(rows.size());
  std::vector<int32_t> targets;
  std::vector<float> coef;
  for (int i : rows) {
    const int s = tk.seq[sz(i)], p = tk.pos[sz(i)];
    targets.push_back(seqs[sz(s)][sz(p + 1)]);
    coef.push_back(ref::loss_coef(coef_seed, static_cast<uint64_t>(target_off[sz(s)] + p)));
  }
  const auto targets_dev = be_.resident(targets);
  const auto coef_dev = be_.resident(coef);
  Buf lg = zeros(int64_t{R} * d.Vl), dl_rows = zeros(int64_t{R} * d.Vl), dl = zeros(int64_t{T} * d.Vl);
  be_.gather_rows(sv.logits.data(), sz(d.Vl), rows, lg.data());
  be_.logprob_bwd_slice(kn_, lg.data(), d.Vl, R, at_.t * d.Vl, d.Vl, targets_dev.data(), coef_dev.data(),
                        sv.row_max.data(), sv.row_sum.data(), temperature, dl_rows.data());
  be_.scatter_rows(dl_rows.data(), sz(d.Vl), rows, dl.data());

  // lm_head: vocabulary-parallel (its input gradient reduces over V in C chunks).
  const Buf dh = round_all(column_dgrad(dl.data(), lm_head_, T, d.H, d.Vl));
  FBuf dlm = split_wgrad(split, dl, d.Vl, sv.hn, d.H);
  Buf dx = norm_bwd(run, split, "model.norm.weight", sv.x_final, sv.rstd_f, dh, 1, d.H, false);

  for (int64_t li = cfg_.num_hidden_layers - 1; li >= 0; --li) backward_layer(run, split, sv, li, dx);

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
  be_.copy(my_rows.data(), demb.data() + at_.t * slice, sz(slice));
  if (cfg_.tie_word_embeddings) {
    be_.add_f32(my_rows.data(), dlm.data(), my_rows.size());
  } else {
    emit(run, "lm_head.weight", std::move(dlm), {Block::RowSlice, d.Vl, d.H});
  }
  emit(run, "model.embed_tokens.weight", std::move(my_rows), {Block::RowSlice, d.Vl, d.H});
  return std::move(run.result);
}

}  // namespace bp::layouts
