#include "reference/model/qwen3.h"

#include <cstring>
#include <stdexcept>

#include "reference/common/rng.h"
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

namespace bp::ref {

namespace {

using Buf = std::vector<bf16>;
using FBuf = std::vector<float>;

std::string lname(int64_t i, const char* what) { return "model.layers." + std::to_string(i) + "." + what; }
std::string cname(int64_t i, const char* what) { return "layers." + std::to_string(i) + "." + what; }

}  // namespace

float loss_coef(uint64_t seed, uint64_t row) { return counter_uniform(seed, row); }

// Per-call activations kept for the backward (the packed extend forward).
struct Model::Saved {
  struct Layer {
    Buf x_in, a1, q_pre, k_pre, qn, kn, q, k, v, o, x_mid, a2;
    FBuf rstd1, rstd_q, rstd_k, m, l, rstd2;
  };
  std::vector<Layer> layers;
  Buf x_final, hn, logits;
  FBuf rstd_f;
  std::vector<int32_t> tokens;
  std::vector<AttnSeq> aseqs;
};

// The state of one forward over a batch: KV caches and the outputs.
struct Model::State {
  std::vector<std::vector<Buf>> kc, vc;  // [seq][layer] rows × Hkv × D
  std::vector<std::vector<float>> logprob, entropy;
  std::vector<int64_t> seq_off;  // canonical row of (s, 0)
  int64_t total = 0;
  std::vector<Capture> caps;
  std::map<std::string, size_t> cap_index;
};

Model::Model(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs) : cfg_(cfg), w_(weights), kn_(knobs) {
  const std::string bad = validate(knobs);
  if (!bad.empty()) throw std::invalid_argument("model: " + bad);
  for (const WeightSpec& s : weight_specs(cfg)) {
    if (!weights.contains(s.name)) throw std::invalid_argument("model: missing weight " + s.name);
    if (weights.at(s.name).shape != s.shape) throw std::invalid_argument("model: wrong shape for " + s.name);
  }
  if (cfg.head_dim % 2 != 0 || cfg.num_key_value_heads <= 0 || cfg.num_attention_heads % cfg.num_key_value_heads)
    throw std::invalid_argument("model: bad head geometry");
  rope_max_pos_ = static_cast<int>(cfg.max_position_embeddings);
  const size_t half = static_cast<size_t>(cfg.head_dim / 2);
  rope_cos_.resize(static_cast<size_t>(rope_max_pos_) * half);
  rope_sin_.resize(rope_cos_.size());
  rope_tables(static_cast<float>(cfg.rope_theta), static_cast<int>(cfg.head_dim), rope_max_pos_, rope_cos_.data(),
              rope_sin_.data());
  const size_t L = static_cast<size_t>(cfg.num_hidden_layers);
  eg_.resize(L);
  eu_.resize(L);
  ed_.resize(L);
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    if (!cfg.is_moe_layer(i)) continue;
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      const std::string p = lname(i, "mlp.experts.") + std::to_string(e) + ".";
      eg_[i].push_back(weights.at(p + "gate_proj.weight").data.data());
      eu_[i].push_back(weights.at(p + "up_proj.weight").data.data());
      ed_[i].push_back(weights.at(p + "down_proj.weight").data.data());
    }
  }
}

void Model::step(const std::vector<std::vector<int32_t>>& seqs, const std::vector<Piece>& pieces, State& st,
                 const ForwardOptions& opt, Saved* saved) const {
  const int H = static_cast<int>(cfg_.hidden_size), D = static_cast<int>(cfg_.head_dim);
  const int Hq = static_cast<int>(cfg_.num_attention_heads), Hkv = static_cast<int>(cfg_.num_key_value_heads);
  const int QD = Hq * D, KD = Hkv * D, V = static_cast<int>(cfg_.vocab_size), C = kn_.tp_tree_width;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const RopeTable rt{rope_cos_.data(), rope_sin_.data(), rope_max_pos_, D};

  // Packed tokens, positions and canonical rows.
  std::vector<int32_t> tok, pos;
  std::vector<int64_t> crow;
  std::vector<AttnSeq> aseq;
  int kv_rows = 0;
  for (const Piece& p : pieces) {
    aseq.push_back({static_cast<int>(tok.size()), p.len, p.start, kv_rows});
    kv_rows += p.start + p.len;
    for (int i = 0; i < p.len; ++i) {
      tok.push_back(seqs[p.seq][p.start + i]);
      pos.push_back(p.start + i);
      crow.push_back(st.seq_off[p.seq] + p.start + i);
    }
  }
  const int T = static_cast<int>(tok.size());
  if (T == 0) return;

  auto cap = [&](const std::string& name, const Buf& b, int feat) {
    if (!opt.capture) return;
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
    for (int t = 0; t < T; ++t)
      std::memcpy(&c.bf16_data[static_cast<size_t>(crow[t] * feat)], &b[static_cast<size_t>(t) * feat],
                  sizeof(bf16) * static_cast<size_t>(feat));
  };

  Buf x(static_cast<size_t>(T) * H);
  embedding_fwd(kn_, tok.data(), w_.at("model.embed_tokens.weight").data.data(), x.data(), T, V, H);
  cap("embed", x, H);
  if (saved) {
    saved->layers.resize(static_cast<size_t>(cfg_.num_hidden_layers));
    saved->tokens = tok;
    saved->aseqs = aseq;
  }

  Buf a(x.size()), q(static_cast<size_t>(T) * QD), k(static_cast<size_t>(T) * KD), v(k.size());
  Buf qn(q.size()), kn(k.size()), o(q.size()), ao(x.size()), a2(x.size()), mo(x.size());
  FBuf rstd1(T), rstd_q(static_cast<size_t>(T) * Hq), rstd_k(static_cast<size_t>(T) * Hkv), ms(rstd_q.size()),
      ls(rstd_q.size()), rstd2(T);
  Buf kp(static_cast<size_t>(kv_rows) * KD), vp(kp.size());

  for (int64_t li = 0; li < cfg_.num_hidden_layers; ++li) {
    const size_t l = static_cast<size_t>(li);
    const Buf x_in = x;
    rmsnorm_fwd(kn_, x.data(), w_.at(lname(li, "input_layernorm.weight")).data.data(), eps, a.data(), rstd1.data(), T,
                1, H);
    cap(cname(li, "input_norm"), a, H);
    linear_fwd(kn_, a.data(), w_.at(lname(li, "self_attn.q_proj.weight")).data.data(), q.data(), T, H, QD, 1);
    linear_fwd(kn_, a.data(), w_.at(lname(li, "self_attn.k_proj.weight")).data.data(), k.data(), T, H, KD, 1);
    linear_fwd(kn_, a.data(), w_.at(lname(li, "self_attn.v_proj.weight")).data.data(), v.data(), T, H, KD, 1);
    cap(cname(li, "q_proj"), q, QD);
    cap(cname(li, "k_proj"), k, KD);
    cap(cname(li, "v_proj"), v, KD);
    rmsnorm_fwd(kn_, q.data(), w_.at(lname(li, "self_attn.q_norm.weight")).data.data(), eps, qn.data(),
                rstd_q.data(), T, Hq, D);
    rmsnorm_fwd(kn_, k.data(), w_.at(lname(li, "self_attn.k_norm.weight")).data.data(), eps, kn.data(),
                rstd_k.data(), T, Hkv, D);
    cap(cname(li, "q_norm"), qn, QD);
    cap(cname(li, "k_norm"), kn, KD);
    Buf qr(q.size()), kr(k.size());
    rope_fwd(kn_, rt, pos.data(), qn.data(), qr.data(), T, Hq);
    rope_fwd(kn_, rt, pos.data(), kn.data(), kr.data(), T, Hkv);
    cap(cname(li, "q_rope"), qr, QD);
    cap(cname(li, "k_rope"), kr, KD);
    // Append the new keys and values to each sequence's cache, then pack every
    // piece's keys 0 .. start+len−1 at its kv_begin.
    for (size_t pi = 0; pi < pieces.size(); ++pi) {
      const Piece& p = pieces[pi];
      Buf& kc = st.kc[p.seq][l];
      Buf& vc = st.vc[p.seq][l];
      if (kc.size() != static_cast<size_t>(p.start) * KD) throw std::logic_error("model: KV cache out of step");
      const size_t b = static_cast<size_t>(aseq[pi].q_begin) * KD, n = static_cast<size_t>(p.len) * KD;
      kc.insert(kc.end(), kr.begin() + b, kr.begin() + b + n);
      vc.insert(vc.end(), v.begin() + b, v.begin() + b + n);
      std::copy(kc.begin(), kc.end(), kp.begin() + static_cast<size_t>(aseq[pi].kv_begin) * KD);
      std::copy(vc.begin(), vc.end(), vp.begin() + static_cast<size_t>(aseq[pi].kv_begin) * KD);
    }
    attention_fwd(kn_, {Hq, Hkv, D}, aseq.data(), static_cast<int>(aseq.size()), qr.data(), kp.data(), vp.data(),
                  o.data(), ms.data(), ls.data());
    cap(cname(li, "attn"), o, QD);
    linear_fwd(kn_, o.data(), w_.at(lname(li, "self_attn.o_proj.weight")).data.data(), ao.data(), T, QD, H, C);
    cap(cname(li, "attn_out"), ao, H);
    residual_fwd(kn_, x.data(), ao.data(), x.data(), x.size());
    cap(cname(li, "resid_attn"), x, H);
    const Buf x_mid = x;
    rmsnorm_fwd(kn_, x.data(), w_.at(lname(li, "post_attention_layernorm.weight")).data.data(), eps, a2.data(),
                rstd2.data(), T, 1, H);
    cap(cname(li, "post_norm"), a2, H);
    // The MLP by its stages (bit-identical to mlp_fwd / moe_layer_fwd, which are
    // these chains), so that the intermediate outputs can be captured.
    if (cfg_.is_moe_layer(li)) {
      const int E = static_cast<int>(cfg_.num_experts), K = static_cast<int>(cfg_.num_experts_per_tok);
      const int I = static_cast<int>(cfg_.moe_intermediate_size);
      const ExpertWeights ew{eg_[l].data(), eu_[l].data(), ed_[l].data()};
      Buf rl(static_cast<size_t>(T) * E), tw(static_cast<size_t>(T) * K), cs(static_cast<size_t>(T) * K * H);
      std::vector<int> ids(static_cast<size_t>(T) * K), off(static_cast<size_t>(E) + 1), ptok(ids.size()),
          pslot(ids.size());
      router_fwd(kn_, a2.data(), w_.at(lname(li, "mlp.gate.weight")).data.data(), rl.data(), ids.data(), tw.data(), T,
                 H, E, K, cfg_.norm_topk_prob);
      cap(cname(li, "router_logits"), rl, E);
      cap(cname(li, "router_weights"), tw, K);
      moe_dispatch(ids.data(), T, K, E, off.data(), ptok.data(), pslot.data());
      const MoeDispatch plan{E, off.data(), ptok.data(), pslot.data()};
      moe_experts_fwd(kn_, plan, 0, E, a2.data(), tw.data(), ew, cs.data(), K, H, I);
      cap(cname(li, "expert_out"), cs, K * H);
      moe_combine_fwd(cs.data(), mo.data(), T, K, H);
    } else {
      const int I = static_cast<int>(cfg_.intermediate_size);
      Buf g(static_cast<size_t>(T) * I), u(g.size()), hm(g.size());
      mlp_hidden_fwd(kn_, a2.data(), w_.at(lname(li, "mlp.gate_proj.weight")).data.data(),
                     w_.at(lname(li, "mlp.up_proj.weight")).data.data(), g.data(), u.data(), hm.data(), T, H, I);
      cap(cname(li, "mlp_gate"), g, I);
      cap(cname(li, "mlp_up"), u, I);
      cap(cname(li, "mlp_act"), hm, I);
      linear_fwd(kn_, hm.data(), w_.at(lname(li, "mlp.down_proj.weight")).data.data(), mo.data(), T, I, H, C);
    }
    cap(cname(li, "mlp_out"), mo, H);
    residual_fwd(kn_, x.data(), mo.data(), x.data(), x.size());
    cap(cname(li, "resid_mlp"), x, H);
    if (saved) {
      Saved::Layer& s = saved->layers[l];
      s.x_in = x_in;
      s.a1 = a;
      s.q_pre = q;
      s.k_pre = k;
      s.qn = qn;
      s.kn = kn;
      s.q = qr;
      s.k = kr;
      s.v = v;
      s.o = o;
      s.x_mid = x_mid;
      s.a2 = a2;
      s.rstd1 = rstd1;
      s.rstd_q = rstd_q;
      s.rstd_k = rstd_k;
      s.m = ms;
      s.l = ls;
      s.rstd2 = rstd2;
    }
  }

  Buf hn(x.size());
  FBuf rstd_f(T);
  rmsnorm_fwd(kn_, x.data(), w_.at("model.norm.weight").data.data(), eps, hn.data(), rstd_f.data(), T, 1, H);
  cap("final_norm", hn, H);
  Buf logits(static_cast<size_t>(T) * V);
  linear_fwd(kn_, hn.data(), w_.lm_head(cfg_).data.data(), logits.data(), T, H, V, 1);
  cap("logits", logits, V);
  if (saved) {
    saved->x_final = x;
    saved->hn = hn;
    saved->logits = logits;
    saved->rstd_f = rstd_f;
  }

  // Teacher forcing: rows whose position has a next token, gathered in packed order.
  Buf lg;
  std::vector<int32_t> tgt;
  std::vector<std::pair<int, int>> where;
  {
    int t = 0;
    for (const Piece& p : pieces)
      for (int i = 0; i < p.len; ++i, ++t) {
        const int ps = p.start + i;
        if (ps + 1 >= static_cast<int>(seqs[p.seq].size())) continue;
        lg.insert(lg.end(), logits.begin() + static_cast<ptrdiff_t>(t) * V,
                  logits.begin() + static_cast<ptrdiff_t>(t + 1) * V);
        tgt.push_back(seqs[p.seq][ps + 1]);
        where.emplace_back(p.seq, ps);
      }
  }
  const int R = static_cast<int>(tgt.size());
  if (R == 0) return;
  FBuf lp(R), M(R), S(R), ent(R);
  logprob_fwd(kn_, lg.data(), tgt.data(), R, V, opt.temperature, lp.data(), M.data(), S.data(),
              opt.entropy ? ent.data() : nullptr);
  for (int r = 0; r < R; ++r) {
    st.logprob[where[r].first][where[r].second] = lp[r];
    if (opt.entropy) st.entropy[where[r].first][where[r].second] = ent[r];
  }
}

std::vector<std::vector<SchedulePiece>> schedule_steps(const std::vector<std::vector<int32_t>>& seqs,
                                                       const Schedule& sched, int64_t max_positions) {
  const size_t B = seqs.size();
  for (size_t s = 0; s < B; ++s) {
    if (seqs[s].empty()) throw std::invalid_argument("model: empty sequence " + std::to_string(s));
    if (static_cast<int64_t>(seqs[s].size()) > max_positions)
      throw std::invalid_argument("model: sequence " + std::to_string(s) + " longer than max_position_embeddings");
  }
  auto len = [&](size_t s) { return static_cast<int>(seqs[s].size()); };
  std::vector<std::vector<SchedulePiece>> steps;
  switch (sched.kind) {
    case Schedule::Kind::Extend:
      for (size_t s = 0; s < B; ++s) steps.push_back({{static_cast<int>(s), 0, len(s)}});
      break;
    case Schedule::Kind::Ragged: {
      std::vector<SchedulePiece> ps;
      for (size_t s = 0; s < B; ++s) ps.push_back({static_cast<int>(s), 0, len(s)});
      steps.push_back(std::move(ps));
      break;
    }
    case Schedule::Kind::Chunked: {
      if (sched.chunks.empty()) throw std::invalid_argument("model: chunked schedule without chunks");
      for (int c : sched.chunks)
        if (c < 1) throw std::invalid_argument("model: chunk size < 1");
      for (size_t s = 0; s < B; ++s)
        for (int p = 0, j = 0; p < len(s); j = (j + 1) % static_cast<int>(sched.chunks.size())) {
          const int n = std::min(sched.chunks[static_cast<size_t>(j)], len(s) - p);
          steps.push_back({{static_cast<int>(s), p, n}});
          p += n;
        }
      break;
    }
    case Schedule::Kind::Decode: {
      int longest = 0;
      for (size_t s = 0; s < B; ++s) longest = std::max(longest, len(s));
      for (int p = 0; p < longest; ++p) {
        std::vector<SchedulePiece> ps;
        for (size_t s = 0; s < B; ++s)
          if (p < len(s)) ps.push_back({static_cast<int>(s), p, 1});
        steps.push_back(std::move(ps));
      }
      break;
    }
  }
  return steps;
}

ForwardResult Model::forward(const std::vector<std::vector<int32_t>>& seqs, const Schedule& sched,
                             const ForwardOptions& opt) const {
  const auto steps = schedule_steps(seqs, sched, cfg_.max_position_embeddings);
  State st;
  const size_t B = seqs.size(), L = static_cast<size_t>(cfg_.num_hidden_layers);
  st.kc.assign(B, std::vector<Buf>(L));
  st.vc.assign(B, std::vector<Buf>(L));
  for (size_t s = 0; s < B; ++s) {
    st.seq_off.push_back(st.total);
    st.total += static_cast<int64_t>(seqs[s].size());
    st.logprob.emplace_back(seqs[s].size() - 1, 0.0f);
    if (opt.entropy) st.entropy.emplace_back(seqs[s].size() - 1, 0.0f);
  }
  for (const auto& pieces : steps) step(seqs, pieces, st, opt, nullptr);
  ForwardResult r;
  r.logprob = std::move(st.logprob);
  r.entropy = std::move(st.entropy);
  r.captures = std::move(st.caps);
  return r;
}

BackwardResult Model::backward(const std::vector<std::vector<int32_t>>& seqs, uint64_t coef_seed,
                               float temperature) const {
  const int H = static_cast<int>(cfg_.hidden_size), D = static_cast<int>(cfg_.head_dim);
  const int Hq = static_cast<int>(cfg_.num_attention_heads), Hkv = static_cast<int>(cfg_.num_key_value_heads);
  const int QD = Hq * D, KD = Hkv * D, V = static_cast<int>(cfg_.vocab_size), C = kn_.tp_tree_width;
  const RopeTable rt{rope_cos_.data(), rope_sin_.data(), rope_max_pos_, D};

  // The packed forward (bit-identical to extend), keeping its activations.
  State st;
  const size_t B = seqs.size(), L = static_cast<size_t>(cfg_.num_hidden_layers);
  st.kc.assign(B, std::vector<Buf>(L));
  st.vc.assign(B, std::vector<Buf>(L));
  const std::vector<Piece> ps = schedule_steps(seqs, Schedule::ragged(), cfg_.max_position_embeddings).at(0);
  for (size_t s = 0; s < B; ++s) {
    st.seq_off.push_back(st.total);
    st.total += static_cast<int64_t>(seqs[s].size());
    st.logprob.emplace_back(seqs[s].size() - 1, 0.0f);
  }
  Saved sv;
  ForwardOptions fo;
  fo.temperature = temperature;
  step(seqs, ps, st, fo, &sv);
  const int T = static_cast<int>(sv.tokens.size());

  BackwardResult res;
  res.logprob = st.logprob;

  // Loss coefficients and dlogits: target rows (t < len−1) get logprob_bwd, the
  // last position of each sequence gets +0 (it has no target).
  std::vector<int32_t> tgt;
  std::vector<int> row_of;  // packed token of each target row
  FBuf coef;
  {
    int t = 0;
    uint64_t r = 0;
    for (size_t s = 0; s < B; ++s) {
      res.coef.emplace_back();
      for (size_t i = 0; i < seqs[s].size(); ++i, ++t) {
        if (i + 1 >= seqs[s].size()) continue;
        const float c = loss_coef(coef_seed, r++);
        res.coef.back().push_back(c);
        coef.push_back(c);
        tgt.push_back(seqs[s][i + 1]);
        row_of.push_back(t);
      }
    }
  }
  const int R = static_cast<int>(tgt.size());
  Buf dlogits(static_cast<size_t>(T) * V, bf16{0});
  if (R > 0) {
    Buf lg(static_cast<size_t>(R) * V), dl(lg.size());
    FBuf lp(R), M(R), S(R);
    for (int r = 0; r < R; ++r)
      std::copy_n(sv.logits.begin() + static_cast<ptrdiff_t>(row_of[r]) * V, V,
                  lg.begin() + static_cast<ptrdiff_t>(r) * V);
    logprob_fwd(kn_, lg.data(), tgt.data(), R, V, temperature, lp.data(), M.data(), S.data(), nullptr);
    logprob_bwd(kn_, lg.data(), tgt.data(), coef.data(), M.data(), S.data(), R, V, temperature, dl.data());
    for (int r = 0; r < R; ++r)
      std::copy_n(dl.begin() + static_cast<ptrdiff_t>(r) * V, V,
                  dlogits.begin() + static_cast<ptrdiff_t>(row_of[r]) * V);
  }

  auto& G = res.grads;
  auto grad = [&](const std::string& name) -> FBuf& {
    FBuf& g = G[name];
    g.assign(static_cast<size_t>(w_.at(name).numel()), 0.0f);
    return g;
  };

  // lm_head (vocab-parallel: its input gradient reduces over V in C chunks).
  Buf dh(static_cast<size_t>(T) * H), dx(dh.size()), db(dh.size());
  FBuf dlm(static_cast<size_t>(V) * H);
  linear_dgrad(kn_, dlogits.data(), w_.lm_head(cfg_).data.data(), dh.data(), T, H, V, C);
  linear_wgrad(kn_, dlogits.data(), sv.hn.data(), dlm.data(), T, H, V);
  rmsnorm_bwd(kn_, sv.x_final.data(), w_.at("model.norm.weight").data.data(), sv.rstd_f.data(), dh.data(), dx.data(),
              grad("model.norm.weight").data(), T, 1, H);

  Buf dq(static_cast<size_t>(T) * QD), dk(static_cast<size_t>(T) * KD), dv(dk.size()), dqn(dq.size()),
      dkn(dk.size()), dqp(dq.size()), dkp(dk.size()), da(dh.size());
  FBuf accv(static_cast<size_t>(T) * H), tmpq(accv.size()), tmpk(accv.size());
  for (int64_t li = cfg_.num_hidden_layers - 1; li >= 0; --li) {
    const Saved::Layer& s = sv.layers[static_cast<size_t>(li)];
    // dx is the gradient of the layer's output x_out = R(x_mid + mlp_out).
    // MLP branch: its output gradient is dx.
    if (cfg_.is_moe_layer(li)) {
      const size_t l = static_cast<size_t>(li);
      const int E = static_cast<int>(cfg_.num_experts);
      std::vector<float*> pg, pu, pd;
      for (int e = 0; e < E; ++e) {
        const std::string p = lname(li, "mlp.experts.") + std::to_string(e) + ".";
        pg.push_back(grad(p + "gate_proj.weight").data());
        pu.push_back(grad(p + "up_proj.weight").data());
        pd.push_back(grad(p + "down_proj.weight").data());
      }
      const ExpertWeights ew{eg_[l].data(), eu_[l].data(), ed_[l].data()};
      const ExpertGrads eg{pg.data(), pu.data(), pd.data()};
      moe_layer_bwd(kn_, s.a2.data(), w_.at(lname(li, "mlp.gate.weight")).data.data(), ew, dx.data(), da.data(),
                    grad(lname(li, "mlp.gate.weight")).data(), eg, T, H, E,
                    static_cast<int>(cfg_.num_experts_per_tok), static_cast<int>(cfg_.moe_intermediate_size),
                    cfg_.norm_topk_prob);
    } else {
      mlp_bwd(kn_, s.a2.data(), w_.at(lname(li, "mlp.gate_proj.weight")).data.data(),
              w_.at(lname(li, "mlp.up_proj.weight")).data.data(), w_.at(lname(li, "mlp.down_proj.weight")).data.data(),
              dx.data(), da.data(), grad(lname(li, "mlp.gate_proj.weight")).data(),
              grad(lname(li, "mlp.up_proj.weight")).data(), grad(lname(li, "mlp.down_proj.weight")).data(), T, H,
              static_cast<int>(cfg_.intermediate_size));
    }
    rmsnorm_bwd(kn_, s.x_mid.data(), w_.at(lname(li, "post_attention_layernorm.weight")).data.data(), s.rstd2.data(),
                da.data(), db.data(), grad(lname(li, "post_attention_layernorm.weight")).data(), T, 1, H);
    // x_mid feeds the skip and the post-attention norm: the residual op adds them.
    residual_fwd(kn_, dx.data(), db.data(), dx.data(), dx.size());
    // Attention branch: o_proj is row-parallel; its input gradient reduces over H (one chain).
    Buf dO(static_cast<size_t>(T) * QD);
    linear_dgrad(kn_, dx.data(), w_.at(lname(li, "self_attn.o_proj.weight")).data.data(), dO.data(), T, QD, H, 1);
    linear_wgrad(kn_, dx.data(), s.o.data(), grad(lname(li, "self_attn.o_proj.weight")).data(), T, QD, H);
    attention_bwd(kn_, {Hq, Hkv, D}, sv.aseqs.data(), static_cast<int>(sv.aseqs.size()), s.q.data(), s.k.data(),
                  s.v.data(), s.o.data(), s.m.data(), s.l.data(), dO.data(), dq.data(), dk.data(), dv.data());
    {
      std::vector<int32_t> pos(static_cast<size_t>(T));
      for (const AttnSeq& a : sv.aseqs)
        for (int i = 0; i < a.q_len; ++i) pos[static_cast<size_t>(a.q_begin + i)] = a.past_len + i;
      rope_bwd(kn_, rt, pos.data(), dq.data(), dqn.data(), T, Hq);
      rope_bwd(kn_, rt, pos.data(), dk.data(), dkn.data(), T, Hkv);
    }
    rmsnorm_bwd(kn_, s.q_pre.data(), w_.at(lname(li, "self_attn.q_norm.weight")).data.data(), s.rstd_q.data(),
                dqn.data(), dqp.data(), grad(lname(li, "self_attn.q_norm.weight")).data(), T, Hq, D);
    rmsnorm_bwd(kn_, s.k_pre.data(), w_.at(lname(li, "self_attn.k_norm.weight")).data.data(), s.rstd_k.data(),
                dkn.data(), dkp.data(), grad(lname(li, "self_attn.k_norm.weight")).data(), T, Hkv, D);
    // a1 feeds q, k and v (column-parallel: each input gradient in C chunks over its
    // output features); one rounding of the fp32 sum ((0 + q) + k) + v.
    const bf16* wq = w_.at(lname(li, "self_attn.q_proj.weight")).data.data();
    const bf16* wk = w_.at(lname(li, "self_attn.k_proj.weight")).data.data();
    const bf16* wvv = w_.at(lname(li, "self_attn.v_proj.weight")).data.data();
    linear_dgrad_acc(kn_, dqp.data(), wq, tmpq.data(), T, H, QD, C);
    linear_dgrad_acc(kn_, dkp.data(), wk, tmpk.data(), T, H, KD, C);
    linear_dgrad_acc(kn_, dv.data(), wvv, accv.data(), T, H, KD, C);
    const float* qkv_parts[3] = {tmpq.data(), tmpk.data(), accv.data()};
    sum_round(qkv_parts, 3, da.data(), accv.size());
    linear_wgrad(kn_, dqp.data(), s.a1.data(), grad(lname(li, "self_attn.q_proj.weight")).data(), T, H, QD);
    linear_wgrad(kn_, dkp.data(), s.a1.data(), grad(lname(li, "self_attn.k_proj.weight")).data(), T, H, KD);
    linear_wgrad(kn_, dv.data(), s.a1.data(), grad(lname(li, "self_attn.v_proj.weight")).data(), T, H, KD);
    rmsnorm_bwd(kn_, s.x_in.data(), w_.at(lname(li, "input_layernorm.weight")).data.data(), s.rstd1.data(), da.data(),
                db.data(), grad(lname(li, "input_layernorm.weight")).data(), T, 1, H);
    residual_fwd(kn_, dx.data(), db.data(), dx.data(), dx.size());
  }

  // Embedding; tied: dE = embedding_bwd + lm_head wgrad, one fp32 addition per element.
  FBuf& demb = grad("model.embed_tokens.weight");
  embedding_bwd(kn_, sv.tokens.data(), dx.data(), demb.data(), T, V, H);
  if (cfg_.tie_word_embeddings) {
    for (size_t i = 0; i < demb.size(); ++i) demb[i] = add_rn(demb[i], dlm[i]);
  } else {
    G["lm_head.weight"] = std::move(dlm);
  }
  return res;
}

}  // namespace bp::ref
