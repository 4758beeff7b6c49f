// The Qwen3 / Qwen3-MoE model program (SPEC.md §6), written once over a backend
// (backend.h): the reference model (host/model.h) runs it on the CPU ops, the CUDA
// model (gpu/cuda_model.h) on their GPU twins, so both make the same op
// calls in the same order on the same shapes. Results come back to the host in
// program::ForwardResult / program::BackwardResult (results.h).
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "program/model_check.h"
#include "program/path.h"
#include "program/results.h"
#include "program/run_control.h"
#include "reference/model/loss.h"
#include "reference/model/model_graph.h"
#include "reference/numerics/chunked.h"
#include "reference/ops/attention.h"
#include "reference/ops/moe_experts.h"
#include "reference/ops/moe_router.h"
#include "reference/ops/rope.h"

namespace bp::program {

// The target rows (packed logits rows that have a next token) as runs of
// consecutive rows: logits rows [first, first + count) are targets at, ..., at +
// count − 1; a sequence is one run, its rows but the last. The log-probability ops
// read the logits and write their gradient in place, a call per run, where the runs
// average kMinRunRows rows or more; below that the calls of many short runs cost
// more than copying the rows, and the ops run once over the rows gathered (empty).
struct TargetRun {
  int first, count, at;
};
constexpr size_t kMinRunRows = 64;
inline std::vector<TargetRun> in_place_runs(const std::vector<int>& rows) {
  std::vector<TargetRun> runs;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0 && rows[i] == rows[i - 1] + 1)
      ++runs.back().count;
    else
      runs.push_back({rows[i], 1, static_cast<int>(i)});
  }
  if (runs.size() * kMinRunRows > rows.size()) runs.clear();
  return runs;
}

template <class B>
class Qwen3Program {
 public:
  // Validates the knobs and the weights' names and shapes (std::invalid_argument)
  // and makes every weight resident in the backend. Host backends keep views of
  // `weights`, which must then outlive the program.
  Qwen3Program(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, B backend = {});

  ForwardResult forward(const std::vector<std::vector<int32_t>>& seqs, const Path& path,
                        const ForwardOptions& opt = {}) const;
  // Backward of L = Σ c_t·logprob_t (qwen3.h, Model::backward).
  BackwardResult backward(const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                          float temperature = 1.0f, const BackwardOptions& bo = {}) const;

  // The same backward with every gradient left in the backend's buffers (result's
  // grads stay empty): a GPU caller that keeps them on the device, or times the
  // backward apart from copying them out.
  template <class T>
  using Buf = typename B::template Buf<T>;
  struct ResidentBackward {
    BackwardResult result;
    std::map<std::string, Buf<float>> grads;
  };
  ResidentBackward backward_resident(const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                                     float temperature = 1.0f, const BackwardOptions& bo = {}) const;

  const ModelConfig& config() const { return cfg_; }
  const B& backend() const { return be_; }

 private:
  using BBuf = Buf<bf16>;
  using FBuf = Buf<float>;
  using Piece = PathPiece;
  struct Saved;
  struct State;

  using Param = graph::Param;
  using Op = graph::Op;
  static std::string lname(int64_t i, Param p) { return graph::param_name(i, p); }
  static std::string cname(int64_t i, Op op) { return graph::capture_name(i, op); }
  const bf16* w(const std::string& name) const { return w_.at(name).data(); }
  ref::RopeTable rope_table() const {
    return {rope_cos_.data(), rope_sin_.data(), rope_max_pos_, static_cast<int>(cfg_.head_dim)};
  }
  // The model's sizes (the rank program's Dims without the shards).
  struct Dims {
    int H, D, Hq, Hkv, QD, KD, V, C;  // QD, KD: q and kv features (heads × head_dim); C: tp_tree_width
    float eps;
  };
  // One step's tokens packed in piece order: ids, positions, canonical rows, and
  // the attention runs over the packed keys.
  struct Packed {
    std::vector<int32_t> tok, pos;
    std::vector<int64_t> crow;
    std::vector<ref::AttnSeq> aseq;
    int kv_rows = 0;
    int T() const { return static_cast<int>(tok.size()); }
  };
  struct LayerActs;   // one layer's forward activations (kept for the backward)
  struct StepBufs;    // a step's buffers every layer reuses
  struct LayerGrads;  // the backward's buffers every layer reuses
  using GradMap = std::map<std::string, FBuf>;

  BBuf zeros(int64_t rows, int64_t feat) const { return be_.template zeros<bf16>(static_cast<size_t>(rows * feat)); }
  FBuf fzeros(int64_t n) const { return be_.template zeros<float>(static_cast<size_t>(n)); }
  float* new_grad(GradMap& G, const std::string& name) const {
    FBuf& g = G[name];
    g = fzeros(numel_.at(name));
    return g.data();
  }

  State start(const std::vector<std::vector<int32_t>>& seqs, bool entropy) const;
  Packed pack(const std::vector<std::vector<int32_t>>& seqs, const std::vector<Piece>& pieces,
              const State& st) const;
  void step(const std::vector<std::vector<int32_t>>& seqs, const std::vector<Piece>& pieces, State& st,
            const ForwardOptions& opt, Saved* saved) const;
  void load_input(const ForwardOptions& opt, int64_t stage, const Packed& pk, const State& st, BBuf& x) const;
  LayerActs layer_fwd(int64_t li, const std::vector<Piece>& pieces, const Packed& pk, const int32_t* pos, State& st,
                      StepBufs& sb, BBuf& x, bool keep, bool cap) const;
  void attention_fwd(int64_t li, const std::vector<Piece>& pieces, const Packed& pk, const int32_t* pos, State& st,
                     StepBufs& sb, const BBuf& x, LayerActs& a, bool cap) const;
  void mlp_fwd(int64_t li, const BBuf& a2, BBuf& mo, const Packed& pk, State& st, bool cap) const;
  void moe_fwd(int64_t li, const BBuf& a2, BBuf& mo, const Packed& pk, State& st, bool cap) const;
  void head_fwd(const std::vector<std::vector<int32_t>>& seqs, const std::vector<Piece>& pieces, const Packed& pk,
                State& st, BBuf& x, const ForwardOptions& opt, Saved* saved) const;
  // Records b's rows as the capture `name`; then, where the forward substitutes
  // another engine's output for it (ForwardOptions::substitute), overwrites b with
  // those rows, so that the next op reads them, and returns true.
  bool capture(State& st, const std::vector<int64_t>& crow, const std::string& name, BBuf& b, int feat) const;
  BBuf loss_dlogits(const std::vector<std::vector<int32_t>>& seqs, const std::vector<std::vector<float>>& c_of,
                    const Saved& sv, float temperature) const;
  void layer_bwd(int64_t li, LayerActs& s, const Saved& sv, const int32_t* pos, LayerGrads& lg, GradMap& G) const;
  void mlp_bwd(int64_t li, int T, const LayerActs& s, LayerGrads& lg, GradMap& G) const;
  // The target rows of `logits` as runs the log-probability ops read in place, or
  // gathered into `copy` as one run (in_place_runs).
  struct Targets {
    std::vector<TargetRun> runs;
    BBuf copy;  // empty where the runs are read in place
    bool gathered() const { return copy.size() > 0; }
    const bf16* source(const BBuf& logits) const { return gathered() ? copy.data() : logits.data(); }
  };
  Targets target_runs(const BBuf& logits, const std::vector<int>& rows, int V) const;

  ModelConfig cfg_;
  Knobs kn_;
  Dims d_;
  B be_;
  std::map<std::string, typename B::template Resident<bf16>> w_;
  std::map<std::string, int64_t> numel_;
  const bf16* lm_head_ = nullptr;
  std::vector<bf16> rope_cos_host_, rope_sin_host_;
  typename B::template Resident<bf16> rope_cos_, rope_sin_;
  int rope_max_pos_ = 0;
  // Per MoE layer: expert pointer tables, host arrays of backend pointers (empty for dense layers).
  std::vector<std::vector<const bf16*>> eg_, eu_, ed_;
};

// ---- Implementation ----------------------------------------------------------

// One layer's forward activations: q and k after RoPE, q_pre and k_pre before
// their norms; x_in and x_mid (the residual stream at the layer's input and
// midpoint) only where the backward keeps them.
template <class B>
struct Qwen3Program<B>::LayerActs {
  BBuf x_in, a1, q_pre, k_pre, qn, kn, q, k, v, o, x_mid, a2;
  FBuf rstd1, rstd_q, rstd_k, m, l, rstd2;
};

// The buffers of a step that every layer overwrites: the attention and MLP
// outputs, and every piece's keys and values packed for attention.
template <class B>
struct Qwen3Program<B>::StepBufs {
  BBuf ao, mo, kp, vp;
};

// The backward's buffers that every layer overwrites; dx is the gradient of the
// residual stream, carried from layer to layer.
template <class B>
struct Qwen3Program<B>::LayerGrads {
  BBuf dx, da, db, dq, dk, dv, dqn, dkn, dqp, dkp, dO;
  FBuf accv, tmpq, tmpk;
};

// Per-call activations kept for the backward (the packed extend forward).
template <class B>
struct Qwen3Program<B>::Saved {
  std::vector<LayerActs> layers;
  BBuf x_final, hn, logits;
  FBuf rstd_f;
  std::vector<int32_t> tokens;
  std::vector<ref::AttnSeq> aseqs;
};

// The state of one forward over a batch: KV caches and the outputs.
template <class B>
struct Qwen3Program<B>::State {
  std::vector<std::vector<BBuf>> kc, vc;  // [seq][layer] len(seq) rows × Hkv × D
  std::vector<int> kv_len;                // rows of each sequence's caches filled
  std::vector<std::vector<float>> logprob, entropy;
  std::vector<int64_t> seq_off;  // canonical row of (s, 0)
  int64_t total = 0;
  std::vector<Capture> caps;
  std::map<std::string, size_t> cap_index;
  const std::map<std::string, std::vector<bf16>>* substitute = nullptr;  // ForwardOptions::substitute
};

template <class B>
Qwen3Program<B>::Qwen3Program(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, B backend)
    : cfg_(cfg), kn_(knobs), be_(std::move(backend)) {
  check_model(cfg, weights, knobs);
  const int D = static_cast<int>(cfg.head_dim), Hq = static_cast<int>(cfg.num_attention_heads),
            Hkv = static_cast<int>(cfg.num_key_value_heads);
  d_ = {static_cast<int>(cfg.hidden_size), D, Hq, Hkv, Hq * D, Hkv * D, static_cast<int>(cfg.vocab_size),
        knobs.tp_tree_width, static_cast<float>(cfg.rms_norm_eps)};
  for (const WeightSpec& s : weight_specs(cfg)) {
    w_.emplace(s.name, be_.resident(weights.at(s.name).data));
    numel_.emplace(s.name, s.numel());
  }
  lm_head_ = w(cfg.tie_word_embeddings ? graph::param_name(Param::Embed) : graph::param_name(Param::LmHead));
  rope_max_pos_ = static_cast<int>(cfg.max_position_embeddings);
  const size_t half = static_cast<size_t>(cfg.head_dim / 2);
  rope_cos_host_.resize(static_cast<size_t>(rope_max_pos_) * half);
  rope_sin_host_.resize(rope_cos_host_.size());
  ref::rope_tables(static_cast<float>(cfg.rope_theta), static_cast<int>(cfg.head_dim), rope_max_pos_,
              rope_cos_host_.data(), rope_sin_host_.data());
  rope_cos_ = be_.resident(rope_cos_host_);
  rope_sin_ = be_.resident(rope_sin_host_);
  const size_t L = static_cast<size_t>(cfg.num_hidden_layers);
  eg_.resize(L);
  eu_.resize(L);
  ed_.resize(L);
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    if (!cfg.is_moe_layer(i)) continue;
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      eg_[i].push_back(w(graph::param_name(i, e, Param::ExpertGate)));
      eu_[i].push_back(w(graph::param_name(i, e, Param::ExpertUp)));
      ed_[i].push_back(w(graph::param_name(i, e, Param::ExpertDown)));
    }
  }
}

template <class B>
typename Qwen3Program<B>::Targets Qwen3Program<B>::target_runs(const BBuf& logits, const std::vector<int>& rows,
                                                               int V) const {
  Targets t{in_place_runs(rows), BBuf{}};
  if (!t.runs.empty() || rows.empty()) return t;
  t.copy = be_.template unset<bf16>(rows.size() * static_cast<size_t>(V));  // the gather writes every row
  be_.gather_rows(logits.data(), static_cast<size_t>(V), rows, t.copy.data());
  t.runs = {{0, static_cast<int>(rows.size()), 0}};
  return t;
}

// Captured rows go to their canonical row (sequence by sequence), whatever the path.
template <class B>
bool Qwen3Program<B>::capture(State& st, const std::vector<int64_t>& crow, const std::string& name, BBuf& b,
                              int feat) const {
  auto it = st.cap_index.find(name);
  if (it == st.cap_index.end()) {
    Capture c;
    c.name = name;
    c.shape = {st.total, feat};
    c.bf16_data.assign(static_cast<size_t>(st.total * feat), bf16{0});
    it = st.cap_index.emplace(name, st.caps.size()).first;
    st.caps.push_back(std::move(c));
  }
  Capture& c = st.caps[it->second];
  const size_t f = static_cast<size_t>(feat);
  const std::vector<bf16> host = be_.to_host(b.data(), b.size());
  for (size_t t = 0; t < crow.size(); ++t)
    std::memcpy(&c.bf16_data[static_cast<size_t>(crow[t]) * f], &host[t * f], sizeof(bf16) * f);
  if (!st.substitute) return false;
  const auto sub = st.substitute->find(name);
  if (sub == st.substitute->end()) return false;
  if (sub->second.size() != c.bf16_data.size())
    throw std::invalid_argument("substitute: " + name + " has " + std::to_string(sub->second.size()) +
                                " values; the model's is " + std::to_string(st.total) + " tokens x " +
                                std::to_string(feat));
  std::vector<bf16> rows(crow.size() * f);
  for (size_t t = 0; t < crow.size(); ++t)
    std::memcpy(&rows[t * f], &sub->second[static_cast<size_t>(crow[t]) * f], sizeof(bf16) * f);
  const auto dev = be_.resident(rows);
  be_.copy(b.data(), dev.data(), rows.size());
  return true;
}

// The MoE block by its stages (bit-identical to moe_layer_fwd, which is this chain),
// so that the intermediate outputs can be captured. The dispatch plan is made on
// the host from the router's ids.
template <class B>
void Qwen3Program<B>::moe_fwd(int64_t li, const BBuf& a2, BBuf& mo, const Packed& pk, State& st, bool cap) const {
  const std::vector<int64_t>& crow = pk.crow;
  const int T = pk.T(), H = d_.H, E = static_cast<int>(cfg_.num_experts);
  const int K = static_cast<int>(cfg_.num_experts_per_tok), I = static_cast<int>(cfg_.moe_intermediate_size);
  const size_t l = static_cast<size_t>(li);
  const ref::ExpertWeights ew{eg_[l].data(), eu_[l].data(), ed_[l].data()};
  BBuf rl = be_.template zeros<bf16>(static_cast<size_t>(T) * E), tw = be_.template zeros<bf16>(static_cast<size_t>(T) * K),
       cs = be_.template zeros<bf16>(static_cast<size_t>(T) * K * H);
  Buf<int> ids = be_.template zeros<int>(static_cast<size_t>(T) * K);
  be_.router_fwd(kn_, a2.data(), w(lname(li, Param::Router)), rl.data(), ids.data(), tw.data(), T, H, E, K,
                 cfg_.norm_topk_prob);
  if (cap && capture(st, crow, cname(li, Op::RouterLogits), rl, E)) {
    // Another engine's logits: its routing is theirs too, so the experts judged
    // next are the ones that engine chose (substitution runs on the host reference).
    std::vector<int> ids_sub(ids.size());
    std::vector<bf16> tw_sub(tw.size());
    ref::router_select(kn_, be_.to_host(rl.data(), rl.size()).data(), ids_sub.data(), tw_sub.data(), T, E, K,
                       cfg_.norm_topk_prob);
    be_.copy(ids.data(), be_.resident(ids_sub).data(), ids_sub.size());
    be_.copy(tw.data(), be_.resident(tw_sub).data(), tw_sub.size());
  }
  if (cap) capture(st, crow, cname(li, Op::RouterWeights), tw, K);
  const std::vector<int> ids_host = be_.to_host(ids.data(), ids.size());
  std::vector<int> off(static_cast<size_t>(E) + 1), ptok(ids_host.size()), pslot(ids_host.size());
  ref::moe_dispatch(ids_host.data(), T, K, E, off.data(), ptok.data(), pslot.data());
  const ref::MoeDispatch plan{E, off.data(), ptok.data(), pslot.data()};
  be_.moe_experts_fwd(kn_, plan, 0, E, a2.data(), tw.data(), ew, cs.data(), K, H, I);
  if (cap) capture(st, crow, cname(li, Op::ExpertOut), cs, K * H);
  be_.moe_combine_fwd(cs.data(), mo.data(), T, K, H);
}

template <class B>
typename Qwen3Program<B>::Packed Qwen3Program<B>::pack(const std::vector<std::vector<int32_t>>& seqs,
                                                       const std::vector<Piece>& pieces, const State& st) const {
  Packed pk;
  for (const Piece& p : pieces) {
    pk.aseq.push_back({pk.T(), p.len, p.start, pk.kv_rows});
    pk.kv_rows += p.start + p.len;
    for (int i = 0; i < p.len; ++i) {
      pk.tok.push_back(seqs[p.seq][p.start + i]);
      pk.pos.push_back(p.start + i);
      pk.crow.push_back(st.seq_off[p.seq] + p.start + i);
    }
  }
  return pk;
}

// A replayed stage starts from its given input rows instead of the previous one's output.
template <class B>
void Qwen3Program<B>::load_input(const ForwardOptions& opt, int64_t stage, const Packed& pk, const State& st,
                                 BBuf& x) const {
  if (!opt.replay) return;
  const int H = d_.H, T = pk.T();
  const std::vector<bf16>& in = opt.replay->at(stage);
  if (in.size() != static_cast<size_t>(st.total * H))
    throw std::invalid_argument("replay: stage " + std::to_string(stage) + "'s input has " +
                                std::to_string(in.size()) + " values, not tokens x hidden");
  std::vector<bf16> rows(static_cast<size_t>(T) * H);
  for (int t = 0; t < T; ++t)
    std::memcpy(&rows[static_cast<size_t>(t) * H], &in[static_cast<size_t>(pk.crow[t] * H)], sizeof(bf16) * H);
  const auto dev = be_.resident(rows);
  be_.copy(x.data(), dev.data(), rows.size());
}

// One model call over the pieces of one path step: the embedding, every layer,
// then the final norm, the logits and the pieces' log-probabilities.
template <class B>
void Qwen3Program<B>::step(const std::vector<std::vector<int32_t>>& seqs, const std::vector<Piece>& pieces, State& st,
                           const ForwardOptions& opt, Saved* saved) const {
  const Packed pk = pack(seqs, pieces, st);
  const int T = pk.T(), H = d_.H;
  if (T == 0) return;
  for (const Piece& p : pieces)
    if (st.kv_len[p.seq] != p.start) throw std::logic_error("model: KV cache out of step");
  const auto tok_dev = be_.resident(pk.tok);
  const auto pos_dev = be_.resident(pk.pos);
  auto replays = [&](int64_t stage) { return !opt.replay || opt.replay->count(stage); };

  BBuf x = zeros(T, H);
  be_.embedding_fwd(kn_, tok_dev.data(), w(graph::param_name(Param::Embed)), x.data(), T, d_.V, H);
  if (opt.capture) capture(st, pk.crow, graph::capture_name(Op::Embed), x, H);
  if (saved) {
    saved->layers.resize(static_cast<size_t>(cfg_.num_hidden_layers));
    saved->tokens = pk.tok;
    saved->aseqs = pk.aseq;
  }

  StepBufs sb{zeros(T, H), zeros(T, H), zeros(pk.kv_rows, d_.KD), zeros(pk.kv_rows, d_.KD)};
  for (int64_t li = 0; li < cfg_.num_hidden_layers; ++li) {
    run_control::at_layer("forward", li, cfg_.num_hidden_layers);
    if (!replays(li)) continue;
    load_input(opt, li, pk, st, x);
    const bool cap = opt.capture && (!opt.capture_layers || opt.capture_layers->count(li));
    LayerActs a = layer_fwd(li, pieces, pk, pos_dev.data(), st, sb, x, saved != nullptr, cap);
    if (saved) saved->layers[static_cast<size_t>(li)] = std::move(a);
  }
  for (const Piece& p : pieces) st.kv_len[p.seq] = p.start + p.len;
  if (!replays(cfg_.num_hidden_layers)) return;
  load_input(opt, cfg_.num_hidden_layers, pk, st, x);
  head_fwd(seqs, pieces, pk, st, x, opt, saved);
}

// One decoder layer on the step's rows; x, the residual stream, is updated in
// place (`keep`: its input and midpoint are kept for the backward). Fresh
// activations per layer: the backward keeps them (moved, not copied).
template <class B>
typename Qwen3Program<B>::LayerActs Qwen3Program<B>::layer_fwd(int64_t li, const std::vector<Piece>& pieces,
                                                               const Packed& pk, const int32_t* pos, State& st,
                                                               StepBufs& sb, BBuf& x, bool keep, bool cap) const {
  const int T = pk.T(), H = d_.H, Hq = d_.Hq, Hkv = d_.Hkv, QD = d_.QD, KD = d_.KD;
  LayerActs a;
  a.a1 = zeros(T, H), a.q_pre = zeros(T, QD), a.k_pre = zeros(T, KD), a.v = zeros(T, KD), a.qn = zeros(T, QD);
  a.kn = zeros(T, KD), a.q = zeros(T, QD), a.k = zeros(T, KD), a.o = zeros(T, QD), a.a2 = zeros(T, H);
  a.rstd1 = fzeros(T), a.rstd_q = fzeros(int64_t{T} * Hq), a.rstd_k = fzeros(int64_t{T} * Hkv);
  a.m = fzeros(int64_t{T} * Hq), a.l = fzeros(int64_t{T} * Hq), a.rstd2 = fzeros(T);
  if (keep) a.x_in = be_.clone(x);
  attention_fwd(li, pieces, pk, pos, st, sb, x, a, cap);
  be_.residual_fwd(kn_, x.data(), sb.ao.data(), x.data(), x.size());
  if (cap) capture(st, pk.crow, cname(li, Op::ResidAttn), x, H);
  if (keep) a.x_mid = be_.clone(x);
  be_.rmsnorm_fwd(kn_, x.data(), w(lname(li, Param::PostNorm)), d_.eps, a.a2.data(), a.rstd2.data(), T, 1, H);
  if (cap) capture(st, pk.crow, cname(li, Op::PostNorm), a.a2, H);
  if (cfg_.is_moe_layer(li))
    moe_fwd(li, a.a2, sb.mo, pk, st, cap);
  else
    mlp_fwd(li, a.a2, sb.mo, pk, st, cap);
  if (cap) capture(st, pk.crow, cname(li, Op::MlpOut), sb.mo, H);
  be_.residual_fwd(kn_, x.data(), sb.mo.data(), x.data(), x.size());
  if (cap) capture(st, pk.crow, cname(li, Op::ResidMlp), x, H);
  return a;
}

// The attention block from the layer's input x to o_proj's output (sb.ao): the
// norm, q/k/v, their norms and RoPE, the KV caches, attention.
template <class B>
void Qwen3Program<B>::attention_fwd(int64_t li, const std::vector<Piece>& pieces, const Packed& pk,
                                    const int32_t* pos, State& st, StepBufs& sb, const BBuf& x, LayerActs& a,
                                    bool cap) const {
  const int T = pk.T(), H = d_.H, D = d_.D, Hq = d_.Hq, Hkv = d_.Hkv, QD = d_.QD, KD = d_.KD;
  const ref::RopeTable rt = rope_table();
  auto cap_out = [&](Op op, BBuf& b, int feat) {
    if (cap) capture(st, pk.crow, cname(li, op), b, feat);
  };
  be_.rmsnorm_fwd(kn_, x.data(), w(lname(li, Param::InputNorm)), d_.eps, a.a1.data(), a.rstd1.data(), T, 1, H);
  cap_out(Op::InputNorm, a.a1, H);
  be_.linear_fwd(kn_, a.a1.data(), w(lname(li, Param::QProj)), a.q_pre.data(), T, H, QD, 1);
  be_.linear_fwd(kn_, a.a1.data(), w(lname(li, Param::KProj)), a.k_pre.data(), T, H, KD, 1);
  be_.linear_fwd(kn_, a.a1.data(), w(lname(li, Param::VProj)), a.v.data(), T, H, KD, 1);
  cap_out(Op::QProj, a.q_pre, QD);
  cap_out(Op::KProj, a.k_pre, KD);
  cap_out(Op::VProj, a.v, KD);
  be_.rmsnorm_fwd(kn_, a.q_pre.data(), w(lname(li, Param::QNorm)), d_.eps, a.qn.data(), a.rstd_q.data(), T, Hq, D);
  be_.rmsnorm_fwd(kn_, a.k_pre.data(), w(lname(li, Param::KNorm)), d_.eps, a.kn.data(), a.rstd_k.data(), T, Hkv, D);
  cap_out(Op::QNorm, a.qn, QD);
  cap_out(Op::KNorm, a.kn, KD);
  be_.rope_fwd(kn_, rt, pos, a.qn.data(), a.q.data(), T, Hq);
  be_.rope_fwd(kn_, rt, pos, a.kn.data(), a.k.data(), T, Hkv);
  cap_out(Op::QRope, a.q, QD);
  cap_out(Op::KRope, a.k, KD);
  // Append the new keys and values to each sequence's cache, then pack every
  // piece's keys 0 .. start+len−1 at its kv_begin.
  const size_t l = static_cast<size_t>(li);
  for (size_t pi = 0; pi < pieces.size(); ++pi) {
    const Piece& p = pieces[pi];
    BBuf& kc = st.kc[p.seq][l];
    BBuf& vc = st.vc[p.seq][l];
    const size_t from = static_cast<size_t>(pk.aseq[pi].q_begin) * KD, at = static_cast<size_t>(p.start) * KD;
    const size_t n = static_cast<size_t>(p.len) * KD, all = static_cast<size_t>(p.start + p.len) * KD;
    be_.copy(kc.data() + at, a.k.data() + from, n);
    be_.copy(vc.data() + at, a.v.data() + from, n);
    be_.copy(sb.kp.data() + static_cast<size_t>(pk.aseq[pi].kv_begin) * KD, kc.data(), all);
    be_.copy(sb.vp.data() + static_cast<size_t>(pk.aseq[pi].kv_begin) * KD, vc.data(), all);
  }
  be_.attention_fwd(kn_, ref::AttnDims{Hq, Hkv, D}, pk.aseq.data(), static_cast<int>(pk.aseq.size()), a.q.data(),
                    sb.kp.data(), sb.vp.data(), a.o.data(), a.m.data(), a.l.data());
  cap_out(Op::Attn, a.o, QD);
  be_.linear_fwd(kn_, a.o.data(), w(lname(li, Param::OProj)), sb.ao.data(), T, QD, H, d_.C);
  cap_out(Op::AttnOut, sb.ao, H);
}

// The dense MLP by its stages (bit-identical to mlp_fwd, which is this chain), so
// that the intermediate outputs can be captured.
template <class B>
void Qwen3Program<B>::mlp_fwd(int64_t li, const BBuf& a2, BBuf& mo, const Packed& pk, State& st, bool cap) const {
  const int T = pk.T(), H = d_.H, I = static_cast<int>(cfg_.intermediate_size);
  BBuf g = zeros(T, I), u = zeros(T, I), hm = zeros(T, I);
  be_.mlp_hidden_fwd(kn_, a2.data(), w(lname(li, Param::MlpGate)), w(lname(li, Param::MlpUp)), g.data(), u.data(),
                     hm.data(), T, H, I);
  if (cap) {
    capture(st, pk.crow, cname(li, Op::MlpGate), g, I);
    capture(st, pk.crow, cname(li, Op::MlpUp), u, I);
    capture(st, pk.crow, cname(li, Op::MlpAct), hm, I);
  }
  be_.linear_fwd(kn_, hm.data(), w(lname(li, Param::MlpDown)), mo.data(), T, I, H, d_.C);
}

// The final norm, the logits and, teacher forcing, the log-probability (and
// entropy) of every packed row whose position has a next token.
template <class B>
void Qwen3Program<B>::head_fwd(const std::vector<std::vector<int32_t>>& seqs, const std::vector<Piece>& pieces,
                               const Packed& pk, State& st, BBuf& x, const ForwardOptions& opt, Saved* saved) const {
  const int T = pk.T(), H = d_.H, V = d_.V;
  BBuf hn = zeros(T, H);
  FBuf rstd_f = fzeros(T);
  be_.rmsnorm_fwd(kn_, x.data(), w(graph::param_name(Param::FinalNorm)), d_.eps, hn.data(), rstd_f.data(), T, 1, H);
  if (opt.capture) capture(st, pk.crow, graph::capture_name(Op::FinalNorm), hn, H);
  BBuf logits = be_.template unset<bf16>(static_cast<size_t>(T) * V);
  be_.linear_fwd(kn_, hn.data(), lm_head_, logits.data(), T, H, V, 1);
  if (opt.capture) capture(st, pk.crow, graph::capture_name(Op::Logits), logits, V);

  std::vector<int> rows;
  std::vector<int32_t> tgt;
  std::vector<std::pair<int, int>> where;
  int t = 0;
  for (const Piece& p : pieces)
    for (int i = 0; i < p.len; ++i, ++t) {
      const int ps = p.start + i;
      if (ps + 1 >= static_cast<int>(seqs[p.seq].size())) continue;
      rows.push_back(t);
      tgt.push_back(seqs[p.seq][ps + 1]);
      where.emplace_back(p.seq, ps);
    }
  const int R = static_cast<int>(tgt.size());
  if (saved) {
    saved->x_final = std::move(x);
    saved->hn = std::move(hn);
    saved->rstd_f = std::move(rstd_f);
  }
  if (R > 0) {
    const Targets targets = target_runs(logits, rows, V);
    const bf16* src = targets.source(logits);
    const auto tgt_dev = be_.resident(tgt);
    FBuf lp = fzeros(R), M = fzeros(R), S = fzeros(R), ent = fzeros(R);
    for (const TargetRun& u : targets.runs)
      be_.logprob_fwd(kn_, src + static_cast<size_t>(u.first) * V, tgt_dev.data() + u.at, u.count, V, opt.temperature,
                      lp.data() + u.at, M.data() + u.at, S.data() + u.at, opt.entropy ? ent.data() + u.at : nullptr);
    const std::vector<float> lp_host = be_.to_host(lp.data(), lp.size());
    const std::vector<float> ent_host = opt.entropy ? be_.to_host(ent.data(), ent.size()) : std::vector<float>{};
    for (int r = 0; r < R; ++r) {
      st.logprob[where[r].first][where[r].second] = lp_host[r];
      if (opt.entropy) st.entropy[where[r].first][where[r].second] = ent_host[r];
    }
  }
  if (saved) saved->logits = std::move(logits);
}

template <class B>
typename Qwen3Program<B>::State Qwen3Program<B>::start(const std::vector<std::vector<int32_t>>& seqs,
                                                       bool entropy) const {
  const int KD = static_cast<int>(cfg_.num_key_value_heads * cfg_.head_dim);
  State st;
  st.kv_len.assign(seqs.size(), 0);
  for (const std::vector<int32_t>& s : seqs) {
    st.kc.emplace_back();
    st.vc.emplace_back();
    for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
      st.kc.back().push_back(be_.template zeros<bf16>(s.size() * KD));
      st.vc.back().push_back(be_.template zeros<bf16>(s.size() * KD));
    }
    st.seq_off.push_back(st.total);
    st.total += static_cast<int64_t>(s.size());
    st.logprob.emplace_back(s.size() - 1, 0.0f);
    if (entropy) st.entropy.emplace_back(s.size() - 1, 0.0f);
  }
  return st;
}

template <class B>
ForwardResult Qwen3Program<B>::forward(const std::vector<std::vector<int32_t>>& seqs, const Path& path,
                                       const ForwardOptions& opt) const {
  if (opt.replay && path.kind != Path::Kind::Extend)
    throw std::invalid_argument("replay runs the extend path only (one step over every token)");
  if (opt.substitute && !opt.capture) throw std::invalid_argument("substitute works through the captures: capture");
  const auto steps = path_steps(seqs, path, cfg_.max_position_embeddings);
  State st = start(seqs, opt.entropy);
  st.substitute = opt.substitute;
  for (const auto& pieces : steps) step(seqs, pieces, st, opt, nullptr);
  ForwardResult r;
  r.logprob = std::move(st.logprob);
  r.entropy = std::move(st.entropy);
  r.captures = std::move(st.caps);
  return r;
}

template <class B>
BackwardResult Qwen3Program<B>::backward(const std::vector<std::vector<int32_t>>& seqs,
                                         const ref::LossCoefficients& coefs, float temperature,
                                         const BackwardOptions& bo) const {
  ResidentBackward r = backward_resident(seqs, coefs, temperature, bo);
  for (auto& [name, g] : r.grads) r.result.grads[name] = be_.take(std::move(g));
  return std::move(r.result);
}

template <class B>
typename Qwen3Program<B>::ResidentBackward Qwen3Program<B>::backward_resident(
    const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs, float temperature,
    const BackwardOptions& bo) const {
  const std::vector<std::vector<float>> c_of = coefs.for_batch(seqs);  // checked before any work
  const int H = d_.H, V = d_.V;

  // The packed forward (bit-identical to extend), keeping its activations.
  const std::vector<Piece> ps = path_steps(seqs, Path::ragged(), cfg_.max_position_embeddings).at(0);
  State st = start(seqs, false);
  Saved sv;
  ForwardOptions fo;
  fo.temperature = temperature;
  fo.replay = bo.replay_inputs;
  step(seqs, ps, st, fo, &sv);
  st.kc.clear();  // the backward reads the packed keys, not the caches
  st.vc.clear();
  const int T = static_cast<int>(sv.tokens.size());

  BackwardResult res;
  res.logprob = st.logprob;
  res.coef = c_of;
  BBuf dlogits = loss_dlogits(seqs, c_of, sv, temperature);
  sv.logits = BBuf{};

  GradMap G;
  LayerGrads lg{zeros(T, H),  zeros(T, H),  zeros(T, H),    zeros(T, d_.QD), zeros(T, d_.KD),
                zeros(T, d_.KD), zeros(T, d_.QD), zeros(T, d_.KD), zeros(T, d_.QD), zeros(T, d_.KD),
                zeros(T, d_.QD), fzeros(int64_t{T} * H), fzeros(int64_t{T} * H), fzeros(int64_t{T} * H)};
  // lm_head (vocab-parallel: its input gradient reduces over V in C chunks), into da.
  FBuf dlm = fzeros(int64_t{V} * H);
  be_.linear_dgrad(kn_, dlogits.data(), lm_head_, lg.da.data(), T, H, V, d_.C);
  be_.linear_wgrad(kn_, dlogits.data(), sv.hn.data(), dlm.data(), T, H, V);
  dlogits = BBuf{};
  const std::string final_norm = graph::param_name(Param::FinalNorm);
  be_.rmsnorm_bwd(kn_, sv.x_final.data(), w(final_norm), sv.rstd_f.data(), lg.da.data(), lg.dx.data(),
                  new_grad(G, final_norm), T, 1, H);
  // The packed rows of this forward (one ragged step) are the canonical rows.
  auto capture_grad = [&](int64_t stage) {
    if (bo.capture_resid_grads)
      res.captures.push_back({graph::resid_grad_name(stage), {T, H}, be_.to_host(lg.dx.data(), lg.dx.size())});
  };
  capture_grad(cfg_.num_hidden_layers);

  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (const ref::AttnSeq& a : sv.aseqs)
    for (int i = 0; i < a.q_len; ++i) pos[static_cast<size_t>(a.q_begin + i)] = a.past_len + i;
  const auto pos_dev = be_.resident(pos);
  const auto tok_dev = be_.resident(sv.tokens);
  for (int64_t li = cfg_.num_hidden_layers - 1; li >= 0; --li) {
    run_control::at_layer("backward", li, cfg_.num_hidden_layers);
    if (bo.replay_inputs && !bo.replay_inputs->count(li)) continue;
    if (bo.replay_output_grads) {
      const std::vector<bf16>& dy = bo.replay_output_grads->at(li);
      if (dy.size() != lg.dx.size())
        throw std::invalid_argument("replay: layer " + std::to_string(li) + "'s output gradient has " +
                                    std::to_string(dy.size()) + " values, not tokens x hidden");
      const auto dev = be_.resident(dy);
      be_.copy(lg.dx.data(), dev.data(), dy.size());
    }
    LayerActs& s = sv.layers[static_cast<size_t>(li)];
    layer_bwd(li, s, sv, pos_dev.data(), lg, G);
    capture_grad(li);
    s = LayerActs{};  // this layer's activations are spent
  }

  // A replay without layer 0 has no embedding gradient (tied: nor the lm_head's alone).
  if (bo.replay_inputs && !bo.replay_inputs->count(0)) {
    if (!cfg_.tie_word_embeddings) G[graph::param_name(Param::LmHead)] = std::move(dlm);
    return {std::move(res), std::move(G)};
  }
  // Embedding; tied: dE = embedding_bwd + lm_head wgrad, one fp32 addition per element.
  float* demb = new_grad(G, graph::param_name(Param::Embed));
  be_.embedding_bwd(kn_, tok_dev.data(), lg.dx.data(), demb, T, V, H);
  if (cfg_.tie_word_embeddings)
    be_.add_f32(demb, dlm.data(), dlm.size());
  else
    G[graph::param_name(Param::LmHead)] = std::move(dlm);
  return {std::move(res), std::move(G)};
}

// The gradient of L = Σ c_t·logprob_t with respect to the packed forward's
// logits: target rows (t < len−1) get logprob_bwd, the last position of each
// sequence +0 (it has no target).
template <class B>
typename Qwen3Program<B>::BBuf Qwen3Program<B>::loss_dlogits(const std::vector<std::vector<int32_t>>& seqs,
                                                             const std::vector<std::vector<float>>& c_of,
                                                             const Saved& sv, float temperature) const {
  const int T = static_cast<int>(sv.tokens.size()), V = d_.V;
  std::vector<int32_t> tgt;
  std::vector<int> row_of;  // packed token of each target row
  std::vector<float> coef;
  int t = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (size_t i = 0; i < seqs[s].size(); ++i, ++t) {
      if (i + 1 >= seqs[s].size()) continue;
      coef.push_back(c_of[s][i]);
      tgt.push_back(seqs[s][i + 1]);
      row_of.push_back(t);
    }
  const int R = static_cast<int>(tgt.size());
  BBuf dlogits = zeros(T, V);
  if (R == 0) return dlogits;
  const Targets targets = target_runs(sv.logits, row_of, V);
  BBuf dl;  // the gathered rows' gradient (logprob_bwd writes every row), then scattered
  if (targets.gathered()) dl = be_.template unset<bf16>(static_cast<size_t>(R) * V);
  const bf16* src = targets.source(sv.logits);
  bf16* dst = targets.gathered() ? dl.data() : dlogits.data();
  FBuf lp = fzeros(R), M = fzeros(R), S = fzeros(R);
  const auto tgt_dev = be_.resident(tgt);
  const auto coef_dev = be_.resident(coef);
  for (const TargetRun& u : targets.runs) {
    const size_t row = static_cast<size_t>(u.first) * V;
    be_.logprob_fwd(kn_, src + row, tgt_dev.data() + u.at, u.count, V, temperature, lp.data() + u.at,
                    M.data() + u.at, S.data() + u.at, nullptr);
    be_.logprob_bwd(kn_, src + row, tgt_dev.data() + u.at, coef_dev.data() + u.at, M.data() + u.at,
                    S.data() + u.at, u.count, V, temperature, dst + row);
  }
  if (targets.gathered()) be_.scatter_rows(dl.data(), static_cast<size_t>(V), row_of, dlogits.data());
  return dlogits;
}

// One layer's backward: lg.dx, the gradient of its output x_out = R(x_mid +
// mlp_out), becomes the gradient of its input; its parameters' gradients go to G.
template <class B>
void Qwen3Program<B>::layer_bwd(int64_t li, LayerActs& s, const Saved& sv, const int32_t* pos, LayerGrads& lg,
                                GradMap& G) const {
  const int T = static_cast<int>(sv.tokens.size()), H = d_.H, D = d_.D, Hq = d_.Hq, Hkv = d_.Hkv, QD = d_.QD,
            KD = d_.KD, C = d_.C;
  const ref::RopeTable rt = rope_table();
  auto grad = [&](Param p) { return new_grad(G, lname(li, p)); };
  // MLP branch: its output gradient is dx.
  mlp_bwd(li, T, s, lg, G);
  be_.rmsnorm_bwd(kn_, s.x_mid.data(), w(lname(li, Param::PostNorm)), s.rstd2.data(), lg.da.data(), lg.db.data(),
                  grad(Param::PostNorm), T, 1, H);
  // x_mid feeds the skip and the post-attention norm: the residual op adds them.
  be_.residual_fwd(kn_, lg.dx.data(), lg.db.data(), lg.dx.data(), lg.dx.size());
  // Attention branch: o_proj is row-parallel; its input gradient reduces over H (one chain).
  be_.linear_dgrad(kn_, lg.dx.data(), w(lname(li, Param::OProj)), lg.dO.data(), T, QD, H, 1);
  be_.linear_wgrad(kn_, lg.dx.data(), s.o.data(), grad(Param::OProj), T, QD, H);
  be_.attention_bwd(kn_, ref::AttnDims{Hq, Hkv, D}, sv.aseqs.data(), static_cast<int>(sv.aseqs.size()), s.q.data(),
                    s.k.data(), s.v.data(), s.o.data(), s.m.data(), s.l.data(), lg.dO.data(), lg.dq.data(),
                    lg.dk.data(), lg.dv.data());
  be_.rope_bwd(kn_, rt, pos, lg.dq.data(), lg.dqn.data(), T, Hq);
  be_.rope_bwd(kn_, rt, pos, lg.dk.data(), lg.dkn.data(), T, Hkv);
  be_.rmsnorm_bwd(kn_, s.q_pre.data(), w(lname(li, Param::QNorm)), s.rstd_q.data(), lg.dqn.data(), lg.dqp.data(),
                  grad(Param::QNorm), T, Hq, D);
  be_.rmsnorm_bwd(kn_, s.k_pre.data(), w(lname(li, Param::KNorm)), s.rstd_k.data(), lg.dkn.data(), lg.dkp.data(),
                  grad(Param::KNorm), T, Hkv, D);
  // a1 feeds q, k and v (column-parallel: each input gradient in C chunks over its
  // output features); one rounding of the fp32 sum ((0 + q) + k) + v.
  be_.linear_dgrad_acc(kn_, lg.dqp.data(), w(lname(li, Param::QProj)), lg.tmpq.data(), T, H, QD, C,
                       fixed_chunk_len(QD, C));
  be_.linear_dgrad_acc(kn_, lg.dkp.data(), w(lname(li, Param::KProj)), lg.tmpk.data(), T, H, KD, C,
                       fixed_chunk_len(KD, C));
  be_.linear_dgrad_acc(kn_, lg.dv.data(), w(lname(li, Param::VProj)), lg.accv.data(), T, H, KD, C,
                       fixed_chunk_len(KD, C));
  const float* qkv_parts[3] = {lg.tmpq.data(), lg.tmpk.data(), lg.accv.data()};
  be_.sum_round(qkv_parts, 3, lg.da.data(), lg.accv.size());
  be_.linear_wgrad(kn_, lg.dqp.data(), s.a1.data(), grad(Param::QProj), T, H, QD);
  be_.linear_wgrad(kn_, lg.dkp.data(), s.a1.data(), grad(Param::KProj), T, H, KD);
  be_.linear_wgrad(kn_, lg.dv.data(), s.a1.data(), grad(Param::VProj), T, H, KD);
  be_.rmsnorm_bwd(kn_, s.x_in.data(), w(lname(li, Param::InputNorm)), s.rstd1.data(), lg.da.data(), lg.db.data(),
                  grad(Param::InputNorm), T, 1, H);
  be_.residual_fwd(kn_, lg.dx.data(), lg.db.data(), lg.dx.data(), lg.dx.size());
}

// The MLP branch's backward: from dx, the gradient of its output, to lg.da, the
// gradient of the post-attention norm's output, and the MLP's weight gradients.
template <class B>
void Qwen3Program<B>::mlp_bwd(int64_t li, int T, const LayerActs& s, LayerGrads& lg, GradMap& G) const {
  const int H = d_.H;
  auto grad = [&](const std::string& name) { return new_grad(G, name); };
  if (!cfg_.is_moe_layer(li)) {
    be_.mlp_bwd(kn_, s.a2.data(), w(lname(li, Param::MlpGate)), w(lname(li, Param::MlpUp)),
                w(lname(li, Param::MlpDown)), lg.dx.data(), lg.da.data(), grad(lname(li, Param::MlpGate)),
                grad(lname(li, Param::MlpUp)), grad(lname(li, Param::MlpDown)), T, H,
                static_cast<int>(cfg_.intermediate_size));
    return;
  }
  const size_t l = static_cast<size_t>(li);
  const int E = static_cast<int>(cfg_.num_experts);
  std::vector<float*> pg, pu, pd;
  for (int e = 0; e < E; ++e) {
    pg.push_back(grad(graph::param_name(li, e, Param::ExpertGate)));
    pu.push_back(grad(graph::param_name(li, e, Param::ExpertUp)));
    pd.push_back(grad(graph::param_name(li, e, Param::ExpertDown)));
  }
  const ref::ExpertWeights ew{eg_[l].data(), eu_[l].data(), ed_[l].data()};
  const ref::ExpertGrads eg{pg.data(), pu.data(), pd.data()};
  be_.moe_layer_bwd(kn_, s.a2.data(), w(lname(li, Param::Router)), ew, lg.dx.data(), lg.da.data(),
                    grad(lname(li, Param::Router)), eg, T, H, E, static_cast<int>(cfg_.num_experts_per_tok),
                    static_cast<int>(cfg_.moe_intermediate_size), cfg_.norm_topk_prob);
}

}  // namespace bp::program
