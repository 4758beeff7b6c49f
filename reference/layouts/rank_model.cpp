#include "reference/layouts/rank_model.h"

#include <algorithm>
#include <stdexcept>

#include "reference/layouts/expert_exchange.h"
#include "reference/layouts/token_split.h"
#include "reference/numerics/reduce.h"
#include "reference/ops/attention.h"
#include "reference/ops/embedding.h"
#include "reference/ops/linear.h"
#include "reference/ops/logprob.h"
#include "reference/ops/moe_experts.h"
#include "reference/ops/moe_router.h"
#include "reference/ops/residual.h"
#include "reference/ops/rmsnorm.h"
#include "reference/ops/rope.h"
#include "reference/ops/swiglu.h"

namespace bp::layouts {

using Buf = std::vector<bf16>;
using FBuf = std::vector<float>;
using ref::AttnSeq;

namespace {

std::string lname(int64_t i, const std::string& what) { return "model.layers." + std::to_string(i) + "." + what; }
std::string cname(int64_t i, const char* what) { return "layers." + std::to_string(i) + "." + what; }
size_t sz(int64_t n) { return static_cast<size_t>(n); }

// Rows `rows` of a [n][width] array, in that order.
template <class T>
std::vector<T> pick_rows(const std::vector<T>& a, const std::vector<int>& rows, int64_t width) {
  std::vector<T> out;
  out.reserve(rows.size() * sz(width));
  for (int r : rows) out.insert(out.end(), a.begin() + r * width, a.begin() + (r + 1) * width);
  return out;
}

}  // namespace

// Shapes: global, and this rank's TP slices.
struct RankModel::Dims {
  int H, D, Hq, Hkv, V, C, E, K, Ie, I;
  int tp, Hql, Hkvl, QDl, KDl, Il, Vl;
  int local_chunks;  // chunks of a C-chunk reduction one rank holds (1 under Ring: one local chain)
  float eps;
};

// This rank's tokens in one model call, in packed order (pieces in order,
// positions increasing), and the attention runs they form.
struct RankModel::Tokens {
  std::vector<int32_t> tok, pos;
  std::vector<int> seq;
  std::vector<int64_t> row;   // canonical row: seq_off[seq] + pos
  std::vector<AttnSeq> runs;  // kv_begin filled when the keys are packed
  std::vector<int> run_seq;
  int size() const { return static_cast<int>(tok.size()); }

  // (sequence, position) of each token, flat: what CP ranks exchange to place rows.
  std::vector<int32_t> seq_pos() const {
    std::vector<int32_t> out;
    for (size_t i = 0; i < tok.size(); ++i) out.insert(out.end(), {seq[i], pos[i]});
    return out;
  }
  // The runs with each sequence's first key row in the packed K/V.
  std::vector<AttnSeq> runs_at(const std::map<int, int>& kv_begin) const {
    std::vector<AttnSeq> out = runs;
    for (size_t r = 0; r < out.size(); ++r) out[r].kv_begin = kv_begin.at(run_seq[r]);
    return out;
  }
};

// The state of one forward (or the backward's forward) on this rank.
struct RankModel::Run {
  const std::vector<std::vector<int32_t>>& seqs;
  ref::ForwardOptions opt;
  std::vector<int64_t> seq_off;
  int64_t total = 0;
  std::map<int, std::vector<Buf>> kc, vc;  // my sequences: [layer] → S rows × KDl
  RankResult result;
  int len(int s) const { return static_cast<int>(seqs[sz(s)].size()); }
};

struct RankModel::LayerSaved {
  Buf x_in, a1, q_pre, k_pre, qn, kn, q, o, x_mid, a2, kp, vp;
  FBuf rstd1, rstd_q, rstd_k, m, l, rstd2;
};

struct RankModel::Saved {
  Tokens tk;
  std::map<int, int> kv_begin;  // sequence → its first row in kp / vp
  std::vector<LayerSaved> layers;
  Buf x_final, hn, logits;
  FBuf rstd_f, row_max, row_sum;
  std::vector<int> target_rows;  // local rows with a target, in order
};

namespace {

// ---- Collective building blocks --------------------------------------------

// The contract's reduction of rank partials (fp32, elementwise): all-gather, then
// pairwise_tree over the ranks' subtrees; or, for the Ring control, NCCL's ring
// order (segment s summed starting at rank s+1).
FBuf tp_reduce(Comm& tp, Reduction how, const FBuf& mine) {
  const auto all = all_gather(tp, std::span<const float>(mine));
  const int n = tp.size();
  FBuf out(mine.size());
  std::vector<float> tree(sz(n));
  for (size_t i = 0; i < out.size(); ++i) {
    if (how == Reduction::Tree) {
      for (int r = 0; r < n; ++r) tree[sz(r)] = all[sz(r)][i];
      out[i] = pairwise_tree(tree.data(), n);
    } else {
      const int segment = static_cast<int>(i * sz(n) / std::max<size_t>(out.size(), 1));
      float acc = all[sz((segment + 1) % n)][i];
      for (int j = 2; j <= n; ++j) acc = add_rn(acc, all[sz((segment + j) % n)][i]);
      out[i] = acc;
    }
  }
  return out;
}

Buf round_all(const FBuf& a) {
  Buf out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = round_bf16(a[i]);
  return out;
}

// [T][n_l·TP][w] from every TP rank's [T][n_l][w] head slice (heads in rank order).
template <class T>
std::vector<T> gather_heads(Comm& tp, const std::vector<T>& mine, int tokens, int64_t slice) {
  const auto all = all_gather(tp, std::span<const T>(mine));
  std::vector<T> out;
  out.reserve(mine.size() * all.size());
  for (int t = 0; t < tokens; ++t)
    for (const auto& r : all) out.insert(out.end(), r.begin() + t * slice, r.begin() + (t + 1) * slice);
  return out;
}

}  // namespace

// ---- Construction -----------------------------------------------------------

RankModel::RankModel(const ModelConfig& cfg, const Weights& w, const Knobs& kn, const Layout& layout, int rank,
                     RankComms& comms)
    : cfg_(cfg), w_(w), kn_(kn), layout_(layout), at_(GridPos::of(layout, rank)), comms_(comms) {
  Dims d{};
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
  d_ = std::make_unique<const Dims>(d);

  const int max_pos = static_cast<int>(cfg.max_position_embeddings);
  rope_cos_.resize(sz(max_pos) * sz(d.D / 2));
  rope_sin_.resize(rope_cos_.size());
  ref::rope_tables(static_cast<float>(cfg.rope_theta), d.D, max_pos, rope_cos_.data(), rope_sin_.data());

  // Row-parallel weights [N][K]: this rank's K columns, contiguous.
  auto keep_columns = [&](const std::string& name, int k_full, int k_local) {
    const Tensor& t = w.at(name);
    const int64_t n = t.shape[0];
    Buf shard(sz(n * k_local));
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(t.data.begin() + r * k_full + int64_t{at_.t} * k_local, k_local, shard.begin() + r * k_local);
    column_shards_[name] = std::move(shard);
  };
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    keep_columns(lname(i, "self_attn.o_proj.weight"), d.Hq * d.D, d.QDl);
    if (!cfg.is_moe_layer(i)) keep_columns(lname(i, "mlp.down_proj.weight"), d.I, d.Il);
  }
}

RankModel::~RankModel() = default;

// ---- Building blocks on this rank's slices ------------------------------------

const bf16* RankModel::weight(const std::string& name) const { return w_.at(name).data.data(); }

// The t-th block of `rows` rows of a [N][cols] weight: a column-parallel slice.
const bf16* RankModel::row_slice(const std::string& name, int rows, int cols) const {
  return weight(name) + int64_t{at_.t} * rows * cols;
}

// R(x · W) for a row-parallel W whose K this rank holds a slice of: the local
// chunks' subtree (or local chain under Ring), reduced over TP, rounded once.
Buf RankModel::row_parallel(const bf16* x, const std::string& name, int T, int k_local, int n) const {
  FBuf acc(sz(int64_t{T} * n));
  ref::linear_acc(kn_, x, column_shards_.at(name).data(), acc.data(), T, k_local, n, d_->local_chunks);
  return round_all(tp_reduce(comms_.tp, layout_.reduction, acc));
}

// The fp32 input gradient of a column-parallel W (its N sliced over TP): local
// chunks' subtree, reduced over TP (not rounded: callers may add more paths first).
FBuf RankModel::column_dgrad(const bf16* dy, const bf16* w_slice, int T, int k, int n_local) const {
  FBuf acc(sz(int64_t{T} * k));
  ref::linear_dgrad_acc(kn_, dy, w_slice, acc.data(), T, k, n_local, d_->local_chunks);
  return tp_reduce(comms_.tp, layout_.reduction, acc);
}

void RankModel::capture(Run& run, const Tokens& tk, const std::string& name, const Buf& b, int64_t cols,
                        int64_t col0, int64_t width) const {
  if (!run.opt.capture) return;
  if (cols == width && at_.t != 0) return;  // replicated over TP: rank t = 0 reports it
  run.result.captures.push_back({name, width, col0, cols, tk.row, b});
}

// This rank's tokens of a model call: sequences of its e, positions of its c.
RankModel::Tokens RankModel::my_tokens(const Run& run, const std::vector<ref::SchedulePiece>& pieces) const {
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
void RankModel::share_kv(Run& run, const Tokens& tk, int64_t layer, const Buf& k, const Buf& v,
                         const std::vector<ref::SchedulePiece>& pieces, Buf& kp, Buf& vp,
                         std::map<int, int>& kv_begin) const {
  const int KDl = d_->KDl;
  const auto all_where = all_gather(comms_.cp, std::span<const int32_t>(tk.seq_pos()));
  const auto all_k = all_gather(comms_.cp, std::span<const bf16>(k));
  const auto all_v = all_gather(comms_.cp, std::span<const bf16>(v));
  for (size_t r = 0; r < all_where.size(); ++r)
    for (size_t i = 0; 2 * i < all_where[r].size(); ++i) {
      const int s = all_where[r][2 * i], pos = all_where[r][2 * i + 1];
      auto& kc = run.kc[s];
      auto& vc = run.vc[s];
      if (kc.empty()) {
        kc.assign(sz(cfg_.num_hidden_layers), Buf(sz(int64_t{run.len(s)} * KDl)));
        vc.assign(kc.size(), kc[0]);
      }
      std::copy_n(all_k[r].begin() + static_cast<int64_t>(i) * KDl, KDl, kc[sz(layer)].begin() + int64_t{pos} * KDl);
      std::copy_n(all_v[r].begin() + static_cast<int64_t>(i) * KDl, KDl, vc[sz(layer)].begin() + int64_t{pos} * KDl);
    }
  kp.clear();
  vp.clear();
  kv_begin.clear();
  for (const ref::SchedulePiece& p : pieces) {
    if (seq_owner_e(layout_, p.seq) != at_.e) continue;
    kv_begin[p.seq] = static_cast<int>(kp.size() / sz(KDl));
    const int64_t n = int64_t{p.start + p.len} * KDl;
    kp.insert(kp.end(), run.kc[p.seq][sz(layer)].begin(), run.kc[p.seq][sz(layer)].begin() + n);
    vp.insert(vp.end(), run.vc[p.seq][sz(layer)].begin(), run.vc[p.seq][sz(layer)].begin() + n);
  }
}

// Dense MLP: gate/up column-parallel (this rank's Il rows), down row-parallel.
Buf RankModel::dense_mlp(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const {
  const Dims& d = *d_;
  const int T = tk.size();
  Buf g(sz(int64_t{T} * d.Il)), u(g.size()), m(g.size());
  ref::mlp_hidden_fwd(kn_, a2.data(), row_slice(lname(li, "mlp.gate_proj.weight"), d.Il, d.H),
                      row_slice(lname(li, "mlp.up_proj.weight"), d.Il, d.H), g.data(), u.data(), m.data(), T, d.H,
                      d.Il);
  const int64_t col0 = int64_t{at_.t} * d.Il;
  capture(run, tk, cname(li, "mlp_gate"), g, d.Il, col0, d.I);
  capture(run, tk, cname(li, "mlp_up"), u, d.Il, col0, d.I);
  capture(run, tk, cname(li, "mlp_act"), m, d.Il, col0, d.I);
  return row_parallel(m.data(), lname(li, "mlp.down_proj.weight"), T, d.Il, d.H);
}

// The experts this rank holds (others null: it must never touch them).
ref::ExpertWeights RankModel::expert_weights(int64_t li, int e_begin, int e_end,
                                             std::vector<const bf16*> (&ptr)[3]) const {
  static const char* kind[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int j = 0; j < 3; ++j) {
    ptr[j].assign(sz(d_->E), nullptr);
    for (int e = e_begin; e < e_end; ++e)
      ptr[j][sz(e)] = weight(lname(li, "mlp.experts." + std::to_string(e) + "." + kind[j] + ".weight"));
  }
  return {ptr[0].data(), ptr[1].data(), ptr[2].data()};
}

// Routing on the token's home rank (replicated router weight).
RankModel::Routing RankModel::route(int64_t li, const Buf& a2, int T) const {
  const Dims& d = *d_;
  Routing r;
  r.logits.resize(sz(int64_t{T} * d.E));
  r.ids.resize(sz(int64_t{T} * d.K));
  r.weights.resize(r.ids.size());
  ref::router_fwd(kn_, a2.data(), weight(lname(li, "mlp.gate.weight")), r.logits.data(), r.ids.data(),
                  r.weights.data(), T, d.H, d.E, d.K, cfg_.norm_topk_prob);
  return r;
}

// MoE: route at home, experts where they live, combine at home in slot order.
Buf RankModel::moe(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const {
  const Dims& d = *d_;
  const int T = tk.size();
  const Routing r = route(li, a2, T);
  capture(run, tk, cname(li, "router_logits"), r.logits, d.E, 0, d.E);
  capture(run, tk, cname(li, "router_weights"), r.weights, d.K, 0, d.K);
  const ExpertExchange ex(comms_.plane, layout_, d.E, d.K, r.ids, tk.row);
  const Buf a_recv = ex.send_tokens(a2.data(), d.H);
  const Buf w_recv = ex.send_slots(r.weights.data(), 1);
  Buf c_recv(sz(int64_t{ex.received_tokens()} * d.K * d.H));
  std::vector<const bf16*> ptr[3];
  ref::moe_experts_fwd(kn_, ex.plan(), ex.e_begin(), ex.e_end(), a_recv.data(), w_recv.data(),
                       expert_weights(li, ex.e_begin(), ex.e_end(), ptr), c_recv.data(), d.K, d.H, d.Ie);
  const Buf cs = ex.return_slots(c_recv.data(), d.H);
  capture(run, tk, cname(li, "expert_out"), cs, int64_t{d.K} * d.H, 0, int64_t{d.K} * d.H);
  Buf out(sz(int64_t{T} * d.H));
  ref::moe_combine_fwd(cs.data(), out.data(), T, d.K, d.H);
  return out;
}

// Vocabulary-parallel log-softmax of the rows that have a target: each TP rank
// runs the stages on its C/tp chunks; the combines run after gathers.
void RankModel::logprobs(Run& run, const Tokens& tk, const Buf& logits, Saved* saved) const {
  const Dims& d = *d_;
  std::vector<int> rows;
  std::vector<int32_t> targets;
  for (int i = 0; i < tk.size(); ++i)
    if (tk.pos[sz(i)] + 1 < run.len(tk.seq[sz(i)])) {
      rows.push_back(i);
      targets.push_back(run.seqs[sz(tk.seq[sz(i)])][sz(tk.pos[sz(i)] + 1)]);
    }
  const int R = static_cast<int>(rows.size()), n_local = d.C / d.tp, chunk_len = d.V / d.C;
  const float temp = run.opt.temperature;
  const Buf lg = pick_rows(logits, rows, d.Vl);
  // [R][n_local] per rank → [R][C] for the combine's tree. Under Ring (the control):
  // each rank adds its chunks in order, NCCL's ring adds the ranks, and the sum
  // sits in chunk 0 with +0 in the others, which the tree passes through unchanged.
  auto gather_chunks = [&](const FBuf& mine) {
    if (layout_.reduction == Reduction::Tree) return gather_heads(comms_.tp, mine, R, n_local);
    FBuf local(sz(R));
    for (int r = 0; r < R; ++r) {
      local[sz(r)] = mine[sz(r * n_local)];
      for (int j = 1; j < n_local; ++j) local[sz(r)] = add_rn(local[sz(r)], mine[sz(r * n_local + j)]);
    }
    const FBuf total = tp_reduce(comms_.tp, Reduction::Ring, local);
    FBuf out(sz(int64_t{R} * d.C), 0.0f);
    for (int r = 0; r < R; ++r) out[sz(int64_t{r} * d.C)] = total[sz(r)];
    return out;
  };
  FBuf part(sz(int64_t{R} * n_local)), tpart(part.size()), row_max(sz(R)), row_sum(sz(R));
  ref::logprob_chunk_max(kn_, lg.data(), d.Vl, R, chunk_len, n_local, temp, part.data(), n_local);
  ref::logprob_row_max(kn_, gather_heads(comms_.tp, part, R, n_local).data(), R, row_max.data());
  ref::logprob_chunk_sums(kn_, lg.data(), d.Vl, R, chunk_len, n_local, temp, row_max.data(), part.data(),
                          run.opt.entropy ? tpart.data() : nullptr, n_local);
  const FBuf sums = gather_chunks(part), tsums = run.opt.entropy ? gather_chunks(tpart) : FBuf{};
  // The target's logit comes from the rank whose slice holds it.
  FBuf x_target(sz(R), 0.0f);
  ref::logprob_target_logit(kn_, lg.data(), d.Vl, R, at_.t * d.Vl, d.Vl, targets.data(), temp, x_target.data());
  const auto all_x = all_gather(comms_.tp, std::span<const float>(x_target));
  for (int r = 0; r < R; ++r) x_target[sz(r)] = all_x[sz(targets[sz(r)] / d.Vl)][sz(r)];
  FBuf lp(sz(R)), ent(sz(R));
  ref::logprob_combine(kn_, sums.data(), run.opt.entropy ? tsums.data() : nullptr, x_target.data(), row_max.data(),
                       R, row_sum.data(), lp.data(), run.opt.entropy ? ent.data() : nullptr);
  if (at_.t == 0)
    for (int r = 0; r < R; ++r) {
      const int i = rows[sz(r)];
      run.result.values.push_back({tk.seq[sz(i)], tk.pos[sz(i)], lp[sz(r)], ent[sz(r)]});
    }
  if (saved) {
    saved->target_rows = rows;
    saved->row_max = row_max;
    saved->row_sum = row_sum;
  }
}

// ---- Forward ----------------------------------------------------------------------

void RankModel::step(Run& run, const std::vector<ref::SchedulePiece>& pieces, Saved* saved) {
  const Dims& d = *d_;
  const Tokens tk = my_tokens(run, pieces);
  const int T = tk.size();
  const ref::RopeTable rt{rope_cos_.data(), rope_sin_.data(), static_cast<int>(cfg_.max_position_embeddings), d.D};
  const int64_t t0 = at_.t;

  Buf x(sz(int64_t{T} * d.H));
  ref::embedding_fwd(kn_, tk.tok.data(), weight("model.embed_tokens.weight"), x.data(), T, d.V, d.H);
  capture(run, tk, "embed", x, d.H, 0, d.H);
  if (saved) saved->layers.resize(sz(cfg_.num_hidden_layers));

  for (int64_t li = 0; li < cfg_.num_hidden_layers; ++li) {
    LayerSaved s;
    s.x_in = x;
    s.a1.resize(x.size());
    s.rstd1.resize(sz(T));
    ref::rmsnorm_fwd(kn_, x.data(), weight(lname(li, "input_layernorm.weight")), d.eps, s.a1.data(), s.rstd1.data(), T,
                     1, d.H);
    capture(run, tk, cname(li, "input_norm"), s.a1, d.H, 0, d.H);
    // Column-parallel q, k, v: this rank's heads.
    s.q_pre.resize(sz(int64_t{T} * d.QDl));
    s.k_pre.resize(sz(int64_t{T} * d.KDl));
    Buf v(s.k_pre.size());
    ref::linear_fwd(kn_, s.a1.data(), row_slice(lname(li, "self_attn.q_proj.weight"), d.QDl, d.H), s.q_pre.data(), T,
                    d.H, d.QDl, 1);
    ref::linear_fwd(kn_, s.a1.data(), row_slice(lname(li, "self_attn.k_proj.weight"), d.KDl, d.H), s.k_pre.data(), T,
                    d.H, d.KDl, 1);
    ref::linear_fwd(kn_, s.a1.data(), row_slice(lname(li, "self_attn.v_proj.weight"), d.KDl, d.H), v.data(), T, d.H,
                    d.KDl, 1);
    capture(run, tk, cname(li, "q_proj"), s.q_pre, d.QDl, t0 * d.QDl, int64_t{d.Hq} * d.D);
    capture(run, tk, cname(li, "k_proj"), s.k_pre, d.KDl, t0 * d.KDl, int64_t{d.Hkv} * d.D);
    capture(run, tk, cname(li, "v_proj"), v, d.KDl, t0 * d.KDl, int64_t{d.Hkv} * d.D);
    s.qn.resize(s.q_pre.size());
    s.kn.resize(s.k_pre.size());
    s.rstd_q.resize(sz(int64_t{T} * d.Hql));
    s.rstd_k.resize(sz(int64_t{T} * d.Hkvl));
    ref::rmsnorm_fwd(kn_, s.q_pre.data(), weight(lname(li, "self_attn.q_norm.weight")), d.eps, s.qn.data(),
                     s.rstd_q.data(), T, d.Hql, d.D);
    ref::rmsnorm_fwd(kn_, s.k_pre.data(), weight(lname(li, "self_attn.k_norm.weight")), d.eps, s.kn.data(),
                     s.rstd_k.data(), T, d.Hkvl, d.D);
    capture(run, tk, cname(li, "q_norm"), s.qn, d.QDl, t0 * d.QDl, int64_t{d.Hq} * d.D);
    capture(run, tk, cname(li, "k_norm"), s.kn, d.KDl, t0 * d.KDl, int64_t{d.Hkv} * d.D);
    s.q.resize(s.qn.size());
    Buf kr(s.kn.size());
    ref::rope_fwd(kn_, rt, tk.pos.data(), s.qn.data(), s.q.data(), T, d.Hql);
    ref::rope_fwd(kn_, rt, tk.pos.data(), s.kn.data(), kr.data(), T, d.Hkvl);
    capture(run, tk, cname(li, "q_rope"), s.q, d.QDl, t0 * d.QDl, int64_t{d.Hq} * d.D);
    capture(run, tk, cname(li, "k_rope"), kr, d.KDl, t0 * d.KDl, int64_t{d.Hkv} * d.D);

    std::map<int, int> kv_begin;
    share_kv(run, tk, li, kr, v, pieces, s.kp, s.vp, kv_begin);
    const std::vector<AttnSeq> runs = tk.runs_at(kv_begin);
    s.o.resize(s.q.size());
    s.m.resize(sz(int64_t{T} * d.Hql));
    s.l.resize(s.m.size());
    ref::attention_fwd(kn_, {d.Hql, d.Hkvl, d.D}, runs.data(), static_cast<int>(runs.size()), s.q.data(),
                       s.kp.data(), s.vp.data(), s.o.data(), s.m.data(), s.l.data());
    capture(run, tk, cname(li, "attn"), s.o, d.QDl, t0 * d.QDl, int64_t{d.Hq} * d.D);
    const Buf ao = row_parallel(s.o.data(), lname(li, "self_attn.o_proj.weight"), T, d.QDl, d.H);
    capture(run, tk, cname(li, "attn_out"), ao, d.H, 0, d.H);
    ref::residual_fwd(kn_, x.data(), ao.data(), x.data(), x.size());
    capture(run, tk, cname(li, "resid_attn"), x, d.H, 0, d.H);
    s.x_mid = x;
    s.a2.resize(x.size());
    s.rstd2.resize(sz(T));
    ref::rmsnorm_fwd(kn_, x.data(), weight(lname(li, "post_attention_layernorm.weight")), d.eps, s.a2.data(),
                     s.rstd2.data(), T, 1, d.H);
    capture(run, tk, cname(li, "post_norm"), s.a2, d.H, 0, d.H);
    const Buf mo = cfg_.is_moe_layer(li) ? moe(run, tk, li, s.a2) : dense_mlp(run, tk, li, s.a2);
    capture(run, tk, cname(li, "mlp_out"), mo, d.H, 0, d.H);
    ref::residual_fwd(kn_, x.data(), mo.data(), x.data(), x.size());
    capture(run, tk, cname(li, "resid_mlp"), x, d.H, 0, d.H);
    if (saved) {
      if (li == 0) saved->kv_begin = kv_begin;
      saved->layers[sz(li)] = std::move(s);
    }
  }

  Buf hn(x.size());
  FBuf rstd_f(sz(T));
  ref::rmsnorm_fwd(kn_, x.data(), weight("model.norm.weight"), d.eps, hn.data(), rstd_f.data(), T, 1, d.H);
  capture(run, tk, "final_norm", hn, d.H, 0, d.H);
  Buf logits(sz(int64_t{T} * d.Vl));
  ref::linear_fwd(kn_, hn.data(), w_.lm_head(cfg_).data.data() + t0 * d.Vl * d.H, logits.data(), T, d.H, d.Vl, 1);
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

RankModel::Run RankModel::start(const std::vector<std::vector<int32_t>>& seqs, const ref::ForwardOptions& opt) const {
  Run run{seqs, opt, {}, 0, {}, {}, {}};
  for (const auto& s : seqs) {
    run.seq_off.push_back(run.total);
    run.total += static_cast<int64_t>(s.size());
  }
  return run;
}

RankResult RankModel::forward(const std::vector<std::vector<int32_t>>& seqs, const ref::Schedule& sched,
                              const ref::ForwardOptions& opt) {
  Run run = start(seqs, opt);
  for (const auto& pieces : ref::schedule_steps(seqs, sched, cfg_.max_position_embeddings))
    step(run, pieces, nullptr);
  return std::move(run.result);
}

// ---- Backward -----------------------------------------------------------------------

// Gradient blocks: every plane rank holds the reduced gradient; plane rank 0
// reports it — its TP slice, or (replicated over TP) rank t = 0 the whole.
void RankModel::emit(Run& run, const std::string& name, FBuf g, Block block) const {
  if (comms_.plane.rank() != 0) return;
  const int64_t t = at_.t;
  switch (block.kind) {
    case Block::Whole:
      if (t == 0) run.result.grads.push_back({name, 0, block.rows, 0, block.cols, block.cols, std::move(g)});
      break;
    case Block::RowSlice:
      run.result.grads.push_back({name, t * block.rows, block.rows, 0, block.cols, block.cols, std::move(g)});
      break;
    case Block::ColumnSlice:
      run.result.grads.push_back(
          {name, 0, block.rows, t * block.cols, block.cols, block.cols * layout_.tp, std::move(g)});
      break;
  }
}

// dW [n][k] of y = x·Wᵀ over the plane's tokens (dy [T][n], x [T][k] local rows).
FBuf RankModel::split_wgrad(const TokenSplit& split, const Buf& dy, int n, const Buf& x, int k) const {
  const auto dy_c = split.route(dy.data(), n), x_c = split.route(x.data(), k);
  return split.reduce(sz(int64_t{n} * k), [&](size_t c, float* out) {
    ref::linear_wgrad(kn_, dy_c[c].data(), x_c[c].data(), out, split.rows_in(c), k, n);
  });
}

// dw [n] of an RMSNorm over [T][heads][n] local rows.
FBuf RankModel::split_norm_dw(const TokenSplit& split, const std::string& name, const Buf& x, const FBuf& rstd,
                              const Buf& dy, int heads, int n) const {
  const int64_t width = int64_t{heads} * n;
  const auto x_c = split.route(x.data(), width), dy_c = split.route(dy.data(), width);
  const auto r_c = split.route(rstd.data(), heads);
  return split.reduce(sz(n), [&](size_t c, float* out) {
    Buf dx_unused(x_c[c].size());
    ref::rmsnorm_bwd(kn_, x_c[c].data(), weight(name), r_c[c].data(), dy_c[c].data(), dx_unused.data(), out,
                     split.rows_in(c), heads, n);
  });
}

// An RMSNorm's backward: dx for my rows, dw reduced over the plane and reported.
Buf RankModel::norm_bwd(Run& run, const TokenSplit& split, const std::string& name, const Buf& x, const FBuf& rstd,
                        const Buf& dy, int heads, int n, bool heads_sliced) const {
  const int T = static_cast<int>(rstd.size()) / heads;
  Buf dx(x.size());
  FBuf dw_unused(sz(n));
  ref::rmsnorm_bwd(kn_, x.data(), weight(name), rstd.data(), dy.data(), dx.data(), dw_unused.data(), T, heads, n);
  // q/k norms: a token chunk's rows interleave all heads, so gather the TP slices first.
  const int all_heads = heads_sliced ? heads * layout_.tp : heads;
  const Buf xs = heads_sliced ? gather_heads(comms_.tp, x, T, int64_t{heads} * n) : x;
  const Buf dys = heads_sliced ? gather_heads(comms_.tp, dy, T, int64_t{heads} * n) : dy;
  const FBuf rs = heads_sliced ? gather_heads(comms_.tp, rstd, T, heads) : rstd;
  emit(run, name, split_norm_dw(split, name, xs, rs, dys, all_heads, n), {Block::Whole, 1, n});
  return dx;
}

Buf RankModel::dense_mlp_bwd(Run& run, const TokenSplit& split, int64_t li, const Buf& a2, const Buf& dout) const {
  const Dims& d = *d_;
  const int T = static_cast<int>(a2.size() / sz(d.H));
  const std::string wg = lname(li, "mlp.gate_proj.weight"), wu = lname(li, "mlp.up_proj.weight"),
                    wd = lname(li, "mlp.down_proj.weight");
  Buf g(sz(int64_t{T} * d.Il)), u(g.size()), m(g.size()), dm(g.size()), dg(g.size()), du(g.size());
  ref::mlp_hidden_fwd(kn_, a2.data(), row_slice(wg, d.Il, d.H), row_slice(wu, d.Il, d.H), g.data(), u.data(),
                      m.data(), T, d.H, d.Il);
  ref::linear_dgrad(kn_, dout.data(), column_shards_.at(wd).data(), dm.data(), T, d.Il, d.H, 1);
  emit(run, wd, split_wgrad(split, dout, d.H, m, d.Il), {Block::ColumnSlice, d.H, d.Il});
  ref::swiglu_bwd(g.data(), u.data(), dm.data(), dg.data(), du.data(), T * d.Il);
  const FBuf from_gate = column_dgrad(dg.data(), row_slice(wg, d.Il, d.H), T, d.H, d.Il);
  const FBuf from_up = column_dgrad(du.data(), row_slice(wu, d.Il, d.H), T, d.H, d.Il);
  Buf da(from_gate.size());
  for (size_t i = 0; i < da.size(); ++i) da[i] = round_bf16(add_rn(from_gate[i], from_up[i]));
  emit(run, wg, split_wgrad(split, dg, d.Il, a2, d.H), {Block::RowSlice, d.Il, d.H});
  emit(run, wu, split_wgrad(split, du, d.Il, a2, d.H), {Block::RowSlice, d.Il, d.H});
  return da;
}

Buf RankModel::moe_bwd(Run& run, const TokenSplit& split, const Tokens& tk, int64_t li, const Buf& a2,
                       const Buf& dout) const {
  const Dims& d = *d_;
  const int T = tk.size();
  const Routing r = route(li, a2, T);
  const ExpertExchange ex(comms_.plane, layout_, d.E, d.K, r.ids, tk.row);
  const Buf a_recv = ex.send_tokens(a2.data(), d.H), dout_recv = ex.send_tokens(dout.data(), d.H);
  const Buf w_recv = ex.send_slots(r.weights.data(), 1);
  const int U = ex.received_tokens();
  FBuf da_slot_recv(sz(int64_t{U} * d.K * d.H));
  Buf dw_recv(sz(int64_t{U} * d.K));
  // This rank's experts' gradients (every row of theirs is here, in global order).
  std::vector<FBuf> grads(sz(3 * (ex.e_end() - ex.e_begin())));
  std::vector<float*> gp[3];
  for (int j = 0; j < 3; ++j) gp[j].assign(sz(d.E), nullptr);
  for (int e = ex.e_begin(), i = 0; e < ex.e_end(); ++e)
    for (int j = 0; j < 3; ++j, ++i) {
      grads[sz(i)].assign(sz(int64_t{d.Ie} * d.H), 0.0f);
      gp[j][sz(e)] = grads[sz(i)].data();
    }
  std::vector<const bf16*> ptr[3];
  ref::moe_experts_bwd(kn_, ex.plan(), ex.e_begin(), ex.e_end(), a_recv.data(), w_recv.data(),
                       expert_weights(li, ex.e_begin(), ex.e_end(), ptr), dout_recv.data(), da_slot_recv.data(),
                       dw_recv.data(), {gp[0].data(), gp[1].data(), gp[2].data()}, d.K, d.H, d.Ie);
  static const char* kind[3] = {"gate_proj", "up_proj", "down_proj"};
  if (at_.t == 0)
    for (int e = ex.e_begin(), i = 0; e < ex.e_end(); ++e)
      for (int j = 0; j < 3; ++j, ++i) {
        const int64_t rows = j == 2 ? d.H : d.Ie, cols = j == 2 ? d.Ie : d.H;
        run.result.grads.push_back({lname(li, "mlp.experts." + std::to_string(e) + "." + kind[j] + ".weight"), 0,
                                    rows, 0, cols, cols, std::move(grads[sz(i)])});
      }
  const FBuf da_slot = ex.return_slots(da_slot_recv.data(), d.H);
  const Buf dtopk = ex.return_slots(dw_recv.data(), 1);
  // The router at home: its input-gradient accumulator joins the slots' in the combine.
  const std::string wr = lname(li, "mlp.gate.weight");
  Buf dlogits(sz(int64_t{T} * d.E));
  FBuf router_acc(sz(int64_t{T} * d.H)), dwr_unused(sz(int64_t{d.E} * d.H));
  ref::router_bwd(kn_, a2.data(), weight(wr), r.logits.data(), r.ids.data(), dtopk.data(), dlogits.data(),
                  router_acc.data(), dwr_unused.data(), T, d.H, d.E, d.K, cfg_.norm_topk_prob);
  const auto a_c = split.route(a2.data(), d.H), lg_c = split.route(r.logits.data(), d.E);
  const auto ids_c = split.route(r.ids.data(), d.K);
  const auto dtopk_c = split.route(dtopk.data(), d.K);
  emit(run, wr,
       split.reduce(sz(int64_t{d.E} * d.H),
                    [&](size_t c, float* out) {
                      const int n = split.rows_in(c);
                      Buf dl(sz(int64_t{n} * d.E));
                      FBuf acc(sz(int64_t{n} * d.H));
                      ref::router_bwd(kn_, a_c[c].data(), weight(wr), lg_c[c].data(), ids_c[c].data(),
                                      dtopk_c[c].data(), dl.data(), acc.data(), out, n, d.H, d.E, d.K,
                                      cfg_.norm_topk_prob);
                    }),
       {Block::Whole, d.E, d.H});
  Buf da(sz(int64_t{T} * d.H));
  ref::moe_combine_bwd(da_slot.data(), router_acc.data(), da.data(), T, d.K, d.H);
  return da;
}

// dk, dv of my tokens under CP: the CP ranks gather each sequence's query side;
// query chunk c's partials are computed by CP rank c mod cp, all-gathered, and
// every rank combines the chunks in order (attention's own tree).
void RankModel::attention_kv_bwd(const Run& run, const Tokens& tk, const LayerSaved& s,
                                 const std::map<int, int>& kv_begin, const Buf& dO, Buf& dk, Buf& dv) const {
  const Dims& d = *d_;
  const ref::AttnDims ad{d.Hql, d.Hkvl, d.D};
  const int CP = layout_.cp, chunk = kn_.grad_token_chunk;
  const auto all_where = all_gather(comms_.cp, std::span<const int32_t>(tk.seq_pos()));
  const auto all_q = all_gather(comms_.cp, std::span<const bf16>(s.q));
  const auto all_o = all_gather(comms_.cp, std::span<const bf16>(s.o));
  const auto all_do = all_gather(comms_.cp, std::span<const bf16>(dO));
  const auto all_m = all_gather(comms_.cp, std::span<const float>(s.m));
  const auto all_l = all_gather(comms_.cp, std::span<const float>(s.l));
  for (const auto& [seq, kv0] : kv_begin) {
    const int S = run.len(seq), n_chunks = (S + chunk - 1) / chunk;
    Buf q(sz(int64_t{S} * d.QDl)), o(q.size()), dout(q.size());
    FBuf m(sz(int64_t{S} * d.Hql)), l(m.size());
    for (size_t r = 0; r < all_where.size(); ++r)
      for (size_t i = 0; 2 * i < all_where[r].size(); ++i) {
        if (all_where[r][2 * i] != seq) continue;
        const int64_t p = all_where[r][2 * i + 1], ii = static_cast<int64_t>(i);
        std::copy_n(all_q[r].begin() + ii * d.QDl, d.QDl, q.begin() + p * d.QDl);
        std::copy_n(all_o[r].begin() + ii * d.QDl, d.QDl, o.begin() + p * d.QDl);
        std::copy_n(all_do[r].begin() + ii * d.QDl, d.QDl, dout.begin() + p * d.QDl);
        std::copy_n(all_m[r].begin() + ii * d.Hql, d.Hql, m.begin() + p * d.Hql);
        std::copy_n(all_l[r].begin() + ii * d.Hql, d.Hql, l.begin() + p * d.Hql);
      }
    const size_t part = sz(int64_t{S} * d.KDl);
    const bf16* k = s.kp.data() + int64_t{kv0} * d.KDl;
    const bf16* v = s.vp.data() + int64_t{kv0} * d.KDl;
    FBuf mine_k, mine_v;
    for (int c = at_.c; c < n_chunks; c += CP) {
      mine_k.resize(mine_k.size() + part, 0.0f);
      mine_v.resize(mine_v.size() + part, 0.0f);
      const AttnSeq a{c * chunk, std::min(chunk, S - c * chunk), c * chunk, 0};
      ref::attention_bwd_kv_partials(kn_, ad, a, q.data(), k, v, o.data(), m.data(), l.data(), dout.data(),
                                     mine_k.data() + mine_k.size() - part, mine_v.data() + mine_v.size() - part);
    }
    const auto all_k = all_gather(comms_.cp, std::span<const float>(mine_k));
    const auto all_v = all_gather(comms_.cp, std::span<const float>(mine_v));
    FBuf parts_k(part * sz(n_chunks)), parts_v(parts_k.size());
    for (int c = 0; c < n_chunks; ++c) {
      const size_t from = sz(c / CP) * part;
      std::copy_n(all_k[sz(c % CP)].begin() + static_cast<int64_t>(from), part, parts_k.begin() + c * part);
      std::copy_n(all_v[sz(c % CP)].begin() + static_cast<int64_t>(from), part, parts_v.begin() + c * part);
    }
    Buf dk_seq(part), dv_seq(part);
    ref::attention_bwd_kv_combine(kn_, ad, S, n_chunks, parts_k.data(), parts_v.data(), dk_seq.data(), dv_seq.data());
    for (int i = 0; i < tk.size(); ++i)
      if (tk.seq[sz(i)] == seq) {
        std::copy_n(dk_seq.begin() + int64_t{tk.pos[sz(i)]} * d.KDl, d.KDl, dk.begin() + int64_t{i} * d.KDl);
        std::copy_n(dv_seq.begin() + int64_t{tk.pos[sz(i)]} * d.KDl, d.KDl, dv.begin() + int64_t{i} * d.KDl);
      }
  }
}

// One layer's backward; dx enters as the gradient of the layer's output and
// leaves as the gradient of its input. The order is ref::Model::backward's.
void RankModel::backward_layer(Run& run, const TokenSplit& split, const Saved& sv, int64_t li, Buf& dx) const {
  const Dims& d = *d_;
  const LayerSaved& s = sv.layers[sz(li)];
  const Tokens& tk = sv.tk;
  const int T = tk.size();
  const Buf da = cfg_.is_moe_layer(li) ? moe_bwd(run, split, tk, li, s.a2, dx) : dense_mlp_bwd(run, split, li, s.a2, dx);
  const Buf db = norm_bwd(run, split, lname(li, "post_attention_layernorm.weight"), s.x_mid, s.rstd2, da, 1, d.H, false);
  ref::residual_fwd(kn_, dx.data(), db.data(), dx.data(), dx.size());

  const std::string wo = lname(li, "self_attn.o_proj.weight");
  Buf dO(sz(int64_t{T} * d.QDl));
  ref::linear_dgrad(kn_, dx.data(), column_shards_.at(wo).data(), dO.data(), T, d.QDl, d.H, 1);
  emit(run, wo, split_wgrad(split, dx, d.H, s.o, d.QDl), {Block::ColumnSlice, d.H, d.QDl});

  const std::vector<AttnSeq> runs = tk.runs_at(sv.kv_begin);
  Buf dq(dO.size()), dk(sz(int64_t{T} * d.KDl)), dv(dk.size()), dqn(dq.size()), dkn(dk.size());
  ref::attention_bwd_dq(kn_, {d.Hql, d.Hkvl, d.D}, runs.data(), static_cast<int>(runs.size()), s.q.data(),
                        s.kp.data(), s.vp.data(), s.o.data(), s.m.data(), s.l.data(), dO.data(), dq.data());
  attention_kv_bwd(run, tk, s, sv.kv_begin, dO, dk, dv);
  const ref::RopeTable rt{rope_cos_.data(), rope_sin_.data(), static_cast<int>(cfg_.max_position_embeddings), d.D};
  ref::rope_bwd(kn_, rt, tk.pos.data(), dq.data(), dqn.data(), T, d.Hql);
  ref::rope_bwd(kn_, rt, tk.pos.data(), dk.data(), dkn.data(), T, d.Hkvl);
  const Buf dqp = norm_bwd(run, split, lname(li, "self_attn.q_norm.weight"), s.q_pre, s.rstd_q, dqn, d.Hql, d.D, true);
  const Buf dkp = norm_bwd(run, split, lname(li, "self_attn.k_norm.weight"), s.k_pre, s.rstd_k, dkn, d.Hkvl, d.D, true);

  // a1 feeds q, k and v: three column-parallel input gradients, rounded once.
  const std::string wq = lname(li, "self_attn.q_proj.weight"), wk = lname(li, "self_attn.k_proj.weight"),
                    wv = lname(li, "self_attn.v_proj.weight");
  const FBuf from_q = column_dgrad(dqp.data(), row_slice(wq, d.QDl, d.H), T, d.H, d.QDl);
  const FBuf from_k = column_dgrad(dkp.data(), row_slice(wk, d.KDl, d.H), T, d.H, d.KDl);
  const FBuf from_v = column_dgrad(dv.data(), row_slice(wv, d.KDl, d.H), T, d.H, d.KDl);
  const float* parts[3] = {from_q.data(), from_k.data(), from_v.data()};
  Buf da1(from_q.size());
  ref::sum_round(parts, 3, da1.data(), da1.size());
  emit(run, wq, split_wgrad(split, dqp, d.QDl, s.a1, d.H), {Block::RowSlice, d.QDl, d.H});
  emit(run, wk, split_wgrad(split, dkp, d.KDl, s.a1, d.H), {Block::RowSlice, d.KDl, d.H});
  emit(run, wv, split_wgrad(split, dv, d.KDl, s.a1, d.H), {Block::RowSlice, d.KDl, d.H});
  const Buf dbi = norm_bwd(run, split, lname(li, "input_layernorm.weight"), s.x_in, s.rstd1, da1, 1, d.H, false);
  ref::residual_fwd(kn_, dx.data(), dbi.data(), dx.data(), dx.size());
}

RankResult RankModel::backward(const std::vector<std::vector<int32_t>>& seqs, uint64_t coef_seed, float temperature) {
  const Dims& d = *d_;
  ref::ForwardOptions fo;
  fo.temperature = temperature;
  Run run = start(seqs, fo);
  Saved sv;
  step(run, ref::schedule_steps(seqs, ref::Schedule::ragged(), cfg_.max_position_embeddings).at(0), &sv);
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
  FBuf coef;
  for (int i : rows) {
    const int s = tk.seq[sz(i)], p = tk.pos[sz(i)];
    targets.push_back(seqs[sz(s)][sz(p + 1)]);
    coef.push_back(ref::loss_coef(coef_seed, static_cast<uint64_t>(target_off[sz(s)] + p)));
  }
  const Buf lg = pick_rows(sv.logits, rows, d.Vl);
  Buf dl_rows(lg.size()), dl(sz(int64_t{T} * d.Vl), bf16{0});
  ref::logprob_bwd_slice(kn_, lg.data(), d.Vl, R, at_.t * d.Vl, d.Vl, targets.data(), coef.data(), sv.row_max.data(),
                         sv.row_sum.data(), temperature, dl_rows.data());
  for (int r = 0; r < R; ++r)
    std::copy_n(dl_rows.begin() + int64_t{r} * d.Vl, d.Vl, dl.begin() + int64_t{rows[sz(r)]} * d.Vl);

  // lm_head: vocabulary-parallel (its input gradient reduces over V in C chunks).
  const bf16* w_lm = w_.lm_head(cfg_).data.data() + int64_t{at_.t} * d.Vl * d.H;
  const Buf dh = round_all(column_dgrad(dl.data(), w_lm, T, d.H, d.Vl));
  FBuf dlm = split_wgrad(split, dl, d.Vl, sv.hn, d.H);
  Buf dx = norm_bwd(run, split, "model.norm.weight", sv.x_final, sv.rstd_f, dh, 1, d.H, false);

  for (int64_t li = cfg_.num_hidden_layers - 1; li >= 0; --li) backward_layer(run, split, sv, li, dx);

  // Embedding (replicated table); tied: plus the lm_head gradient of my slice.
  const auto tok_c = split.route(tk.tok.data(), 1);
  const auto dx_c = split.route(dx.data(), d.H);
  FBuf demb = split.reduce(sz(int64_t{d.V} * d.H), [&](size_t c, float* out) {
    ref::embedding_bwd(kn_, tok_c[c].data(), dx_c[c].data(), out, split.rows_in(c), d.V, d.H);
  });
  FBuf my_rows(demb.begin() + int64_t{at_.t} * d.Vl * d.H, demb.begin() + int64_t{at_.t + 1} * d.Vl * d.H);
  if (cfg_.tie_word_embeddings) {
    for (size_t i = 0; i < my_rows.size(); ++i) my_rows[i] = add_rn(my_rows[i], dlm[i]);
  } else {
    emit(run, "lm_head.weight", std::move(dlm), {Block::RowSlice, d.Vl, d.H});
  }
  emit(run, "model.embed_tokens.weight", std::move(my_rows), {Block::RowSlice, d.Vl, d.H});
  return std::move(run.result);
}

}  // namespace bp::layouts
