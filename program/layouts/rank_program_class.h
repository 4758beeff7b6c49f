// The sharded rank program (SPEC.md §7): what one rank of a layout computes,
// forward on every path and backward, talking to the other ranks only through
// comm.h. Written once over a backend (program/backend.h), like the
// unsharded model program: the reference runs it on host vectors and the ref ops
// (emulated ranks, host/layouts.h), the GPU on the bp::cuda ops (virtual ranks,
// gpu/virtual_ranks.h). Activations live in the backend and every
// operation on them is a backend call, collectives included (B::all_gather,
// B::all_to_all over a Comm); every reduction of rank or chunk partials is
// B::reduce_partials, the contract's tree. Small index data (tokens, positions,
// row lists, MoE plans) stays on the host.
//
// This file declares the program, its per-call state and its construction (each
// rank's share of the weights); the members are defined by concern in
// rank_sharded_linear.h (TP), rank_context_parallel.h (CP), rank_expert_parallel.h
// (the MLPs, EP), rank_vocab_logprob.h, rank_forward.h and rank_backward.h, each of
// which includes this file. Users include rank_program.h, which includes them all.
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
#include "program/run_control.h"
#include "program/results.h"
#include "program/path.h"
#include "reference/model/loss.h"
#include "reference/model/model_graph.h"
#include "reference/numerics/chunked.h"
#include "reference/numerics/reduce.h"
#include "reference/ops/attention.h"
#include "reference/ops/moe_experts.h"
#include "reference/ops/rope.h"

namespace bp::layouts {

template <class B>
class RankProgram {
 public:
  // Host backends keep views of `w`, which must then outlive the model; device
  // backends copy this rank's share of every weight it uses.
  RankProgram(const ModelConfig& cfg, const Weights& w, const Knobs& kn, const Layout& layout, int rank,
              RankComms& comms, B backend = {});

  RankResult forward(const std::vector<std::vector<int32_t>>& seqs, const program::Path& path,
                     const program::ForwardOptions& opt);
  RankResult backward(const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                      float temperature);

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
  struct Block {  // where a rank's gradient sits in its [*][width] parameter
    int64_t row0, rows, col0, cols, width;
    bool whole;  // the whole parameter, alike on every TP rank: rank t = 0 reports it
    static Block entire(int64_t rows, int64_t cols) { return {0, rows, 0, cols, cols, true}; }
    static Block row_slice(int64_t row0, int64_t rows, int64_t cols) { return {row0, rows, 0, cols, cols, false}; }
    static Block column_slice(int64_t rows, int64_t col0, int64_t cols, int64_t width) {
      return {0, rows, col0, cols, width, false};
    }
  };

  using Param = graph::Param;
  using Op = graph::Op;
  static std::string lname(int64_t i, Param p) { return graph::param_name(i, p); }
  static std::string cname(int64_t i, Op op) { return graph::capture_name(i, op); }
  // An expert's parameters, in the order of ExpertWeights' pointer tables.
  static constexpr Param kExpertParams[3] = {Param::ExpertGate, Param::ExpertUp, Param::ExpertDown};
  static size_t sz(int64_t n) { return static_cast<size_t>(n); }
  Buf zeros(int64_t n) const { return be_.template zeros<bf16>(sz(n)); }
  FBuf fzeros(int64_t n) const { return be_.template zeros<float>(sz(n)); }
  // This rank's share of a weight (whole, its row slice or its column shard).
  const bf16* w(const std::string& name) const { return w_.at(name).data(); }
  ref::RopeTable rope_table() const {
    return {rope_cos_.data(), rope_sin_.data(), static_cast<int>(cfg_.max_position_embeddings), d_.D};
  }
  // Replicated kv heads (SPEC.md §7): my slice of the kv heads, and whether I am
  // its first replica (the one that reports what the replicas compute alike).
  int kv_slice() const { return at_.t / d_.R; }
  bool kv_leader() const { return at_.t % d_.R == 0; }
  PartialSum tp_sum() const { return layout_.reduction == Reduction::Tree ? PartialSum::Tree : PartialSum::Ring; }

  void keep_weights(const Weights& weights);
  Run start(const std::vector<std::vector<int32_t>>& seqs, const program::ForwardOptions& opt) const;
  Tokens my_tokens(const Run& run, const std::vector<program::PathPiece>& pieces) const;
  void step(Run& run, const std::vector<program::PathPiece>& pieces, Saved* saved);
  void capture(Run& run, const Tokens& tk, const std::string& name, const Buf& b, int64_t cols, int64_t col0,
               int64_t width) const;

  FBuf tp_reduce(const FBuf& mine, PartialSum how) const;
  Buf round_all(const FBuf& a) const;
  template <class T>
  BufOf<T> gather_heads(const T* mine, int tokens, int64_t slice, const std::vector<int>& ranks) const;
  std::vector<int> all_tp_ranks() const;
  std::vector<int> kv_head_ranks() const;
  std::vector<int> kv_group_ranks() const;
  int local_chunk_len(int full, int local) const;
  Buf row_parallel(const bf16* x, const std::string& name, int T, int k_full, int k_local, int n) const;
  FBuf column_dgrad(const bf16* dy, const bf16* w_slice, int T, int k, int n_full, int n_local) const;
  FBuf kv_dgrad(const Buf& dy, const std::string& name, int T) const;
  void share_kv(Run& run, const Tokens& tk, int64_t layer, const Buf& k, const Buf& v,
                const std::vector<program::PathPiece>& pieces, Buf& kp, Buf& vp, std::map<int, int>& kv_begin) const;
  Buf dense_mlp(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const;
  ref::ExpertWeights expert_weights(int64_t li, int e_begin, int e_end, std::vector<const bf16*> (&ptr)[3]) const;
  Routing route(int64_t li, const Buf& a2, int T) const;
  Buf moe(Run& run, const Tokens& tk, int64_t li, const Buf& a2) const;
  // Per target row: the saved M and S, the logprob and (where asked for) the entropy.
  struct RowStats {
    FBuf row_max, row_sum, logprob, entropy;
  };
  int vocab_holder(int32_t v) const;
  FBuf gather_chunks(const FBuf& mine, int R) const;
  RowStats two_pass_logprobs(const Buf& lg, const std::vector<int32_t>& targets, const int32_t* targets_dev,
                             float temp, bool entropy) const;
  RowStats one_pass_logprobs(const Buf& lg, const std::vector<int32_t>& targets, const int32_t* targets_dev,
                             float temp, bool entropy) const;
  void logprobs(Run& run, const Tokens& tk, const Buf& logits, Saved* saved) const;

  void emit(Run& run, const std::string& name, FBuf g, Block block) const;
  FBuf split_wgrad(const TokenSplit& split, const Buf& dy, int n, const Buf& x, int k) const;
  FBuf split_norm_dw(const TokenSplit& split, const std::string& name, const Buf& x, const FBuf& rstd, const Buf& dy,
                     int heads, int n) const;
  Buf norm_bwd(Run& run, const TokenSplit& split, const std::string& name, const Buf& x, const FBuf& rstd,
               const Buf& dy, int heads, int n, const std::vector<int>& slices) const;
  Buf dense_mlp_bwd(Run& run, const TokenSplit& split, int64_t li, const Buf& a2, const Buf& dout) const;
  Buf moe_bwd(Run& run, const TokenSplit& split, const Tokens& tk, int64_t li, const Buf& a2, const Buf& dout) const;
  void attention_kv_bwd(const Run& run, const Tokens& tk, const LayerSaved& s, const std::map<int, int>& kv_begin,
                        const Buf& dO, Buf& dk, Buf& dv) const;
  void backward_layer(Run& run, const TokenSplit& split, const Saved& sv, int64_t li, Buf& dx) const;

  // Shapes: global, and this rank's TP slices.
  struct Dims {
    int H, D, Hq, Hkv, QD, KD, V, C, E, K, Ie, I;  // QD, KD: q and kv dims (heads × head_dim)
    int tp, Hql, Hkvl, Q0, QDl, KDl;                // Q0: my first q column (my heads')
    int I0, Il, V0, Vl;  // my chunks' slices of I and V: first element, length (Slice::of_chunks)
    int R;  // replicas of each kv head: tp / Hkv when tp > Hkv, else 1 (then Hkvl = Hkv / tp)
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

// This rank's tokens in one model call, in packed order (pieces in order,
// positions increasing), and the attention runs they form.
template <class B>
struct RankProgram<B>::Tokens {
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
struct RankProgram<B>::Run {
  const std::vector<std::vector<int32_t>>& seqs;
  program::ForwardOptions opt;
  std::vector<int64_t> seq_off;
  int64_t total = 0;
  std::map<int, int64_t> cache_row0;  // my sequences: first row of their keys in the caches
  std::vector<Buf> kc, vc;            // [layer]: my sequences' rows × KDl
  RankResult result;
  int len(int s) const { return static_cast<int>(seqs[static_cast<size_t>(s)].size()); }
};

template <class B>
struct RankProgram<B>::LayerSaved {
  Buf x_in, a1, q_pre, k_pre, qn, kn, q, o, x_mid, a2, kp, vp;
  FBuf rstd1, rstd_q, rstd_k, m, l, rstd2;
};

template <class B>
struct RankProgram<B>::Saved {
  Tokens tk;
  std::map<int, int> kv_begin;  // sequence → its first row in kp / vp
  std::vector<LayerSaved> layers;
  Buf x_final, hn, logits;
  FBuf rstd_f, row_max, row_sum;
  std::vector<int> target_rows;  // local rows with a target, in order
};

template <class B>
RankProgram<B>::RankProgram(const ModelConfig& cfg, const Weights& w, const Knobs& kn, const Layout& layout,
                            int rank, RankComms& comms, B backend)
    : cfg_(cfg), kn_(kn), layout_(layout), at_(GridPos::of(layout, rank)), comms_(comms), be_(std::move(backend)) {
  Dims& d = d_;
  d.H = static_cast<int>(cfg.hidden_size);
  d.D = static_cast<int>(cfg.head_dim);
  d.Hq = static_cast<int>(cfg.num_attention_heads);
  d.Hkv = static_cast<int>(cfg.num_key_value_heads);
  d.QD = d.Hq * d.D;
  d.KD = d.Hkv * d.D;
  d.V = static_cast<int>(cfg.vocab_size);
  d.C = kn.tp_tree_width;
  d.E = static_cast<int>(cfg.num_experts);
  d.K = static_cast<int>(cfg.num_experts_per_tok);
  d.Ie = static_cast<int>(cfg.moe_intermediate_size);
  d.I = static_cast<int>(cfg.intermediate_size);
  d.tp = layout.tp;
  d.Hql = d.Hq / d.tp;
  d.R = d.tp > d.Hkv ? d.tp / d.Hkv : 1;
  d.Hkvl = d.Hkv * d.R / d.tp;
  d.QDl = d.Hql * d.D;
  d.Q0 = at_.t * d.QDl;
  d.KDl = d.Hkvl * d.D;
  const Slice i_slice = Slice::of_chunks(d.I, d.C, d.tp, at_.t), v_slice = Slice::of_chunks(d.V, d.C, d.tp, at_.t);
  d.I0 = i_slice.begin;
  d.Il = i_slice.len;
  d.V0 = v_slice.begin;
  d.Vl = v_slice.len;
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
// parallel ones (q, gate, up, the untied lm_head) their t-th block of rows, k
// and v their kv_slice()-th (t's unless kv heads are replicated);
// row-parallel ones (o_proj, dense down_proj) their t-th block of K columns,
// made contiguous; experts only where they live.
template <class B>
void RankProgram<B>::keep_weights(const Weights& weights) {
  const Dims& d = d_;
  auto whole = [&](const std::string& name) { w_.emplace(name, be_.resident(weights.at(name).data)); };
  auto rows = [&](const std::string& name, int64_t row0, int64_t count) {
    const Tensor& t = weights.at(name);
    w_.emplace(name, be_.resident(std::span<const bf16>(t.data.data() + row0 * t.shape[1], sz(count * t.shape[1]))));
  };
  auto columns = [&](const std::string& name, int k_full, int k0, int k_local) {
    const Tensor& t = weights.at(name);
    const int64_t n = t.shape[0];
    std::vector<bf16>& shard = column_shards_[name];
    shard.resize(sz(n * k_local));
    for (int64_t r = 0; r < n; ++r) std::copy_n(t.data.begin() + r * k_full + k0, k_local, shard.begin() + r * k_local);
    w_.emplace(name, be_.resident(shard));
  };
  whole(graph::param_name(Param::Embed));
  whole(graph::param_name(Param::FinalNorm));
  if (!cfg_.tie_word_embeddings) rows(graph::param_name(Param::LmHead), d.V0, d.Vl);
  const auto [e_begin, e_end] = ExpertExchange::held_experts(layout_, d.E, at_.plane_rank(layout_));
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    for (const Param norm : {Param::InputNorm, Param::PostNorm, Param::QNorm, Param::KNorm}) whole(lname(i, norm));
    rows(lname(i, Param::QProj), d.Q0, d.QDl);
    rows(lname(i, Param::KProj), int64_t{kv_slice()} * d.KDl, d.KDl);
    rows(lname(i, Param::VProj), int64_t{kv_slice()} * d.KDl, d.KDl);
    columns(lname(i, Param::OProj), d.QD, d.Q0, d.QDl);
    if (cfg_.is_moe_layer(i)) {
      whole(lname(i, Param::Router));
      for (int e = e_begin; e < e_end; ++e)
        for (const Param p : kExpertParams) whole(graph::param_name(i, e, p));
    } else {
      rows(lname(i, Param::MlpGate), d.I0, d.Il);
      rows(lname(i, Param::MlpUp), d.I0, d.Il);
      columns(lname(i, Param::MlpDown), d.I, d.I0, d.Il);
    }
  }
  lm_head_ = cfg_.tie_word_embeddings ? w(graph::param_name(Param::Embed)) + int64_t{d.V0} * d.H
                                      : w(graph::param_name(Param::LmHead));
}

}  // namespace bp::layouts
