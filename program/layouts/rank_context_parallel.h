// The rank program's context parallelism (SPEC.md §7): which tokens of a call this
// rank holds, the all-gather that gives every query its keys in canonical blocks,
// and attention's dK/dV, whose chunks are reduced where their keys live.
// Part of rank_program.h; the class is declared in rank_program_class.h.
#pragma once
#include "program/layouts/rank_program_class.h"

namespace bp::layouts {

// This rank's tokens of a model call: sequences of its e, positions of its c.
template <class B>
typename RankProgram<B>::Tokens RankProgram<B>::my_tokens(const Run& run,
                                                      const std::vector<program::PathPiece>& pieces) const {
  Tokens tk;
  for (const program::PathPiece& p : pieces) {
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
void RankProgram<B>::share_kv(Run& run, const Tokens& tk, int64_t layer, const Buf& k, const Buf& v,
                            const std::vector<program::PathPiece>& pieces, Buf& kp, Buf& vp,
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
  for (const program::PathPiece& p : pieces) {
    if (seq_owner_e(layout_, p.seq) != at_.e) continue;
    kv_begin[p.seq] = rows;
    rows += p.start + p.len;
  }
  kp = zeros(int64_t{rows} * d_.KDl);
  vp = zeros(int64_t{rows} * d_.KDl);
  for (const program::PathPiece& p : pieces) {
    if (seq_owner_e(layout_, p.seq) != at_.e) continue;
    const size_t from = sz(run.cache_row0.at(p.seq)) * KDl, to = sz(kv_begin.at(p.seq)) * KDl;
    const size_t n = sz(p.start + p.len) * KDl;
    be_.copy(kp.data() + to, run.kc[sz(layer)].data() + from, n);
    be_.copy(vp.data() + to, run.vc[sz(layer)].data() + from, n);
  }
}

// dk, dv of my tokens: with replicated kv heads the replicas first gather their
// query side, so that each holds its kv head's whole GQA group (a chunk's chain runs
// over all the group's heads, SPEC.md §5.6); under CP the CP ranks gather each
// sequence's query side; query chunk c's partials are computed by CP rank c mod cp,
// all-gathered, and every rank combines the chunks in order (attention's own tree).
template <class B>
void RankProgram<B>::attention_kv_bwd(const Run& run, const Tokens& tk, const LayerSaved& s,
                                    const std::map<int, int>& kv_begin, const Buf& dO, Buf& dk, Buf& dv) const {
  const Dims& d = d_;
  const int Hg = d.Hkvl * (d.Hq / d.Hkv), QDg = Hg * d.D;  // my kv heads' query heads (Hql unless replicated)
  const ref::AttnDims ad{Hg, d.Hkvl, d.D};
  Buf group_q, group_o, group_do;
  FBuf group_m, group_l;
  if (d.R > 1) {
    const std::vector<int> group = kv_group_ranks();
    group_q = gather_heads(s.q.data(), tk.size(), d.QDl, group);
    group_o = gather_heads(s.o.data(), tk.size(), d.QDl, group);
    group_do = gather_heads(dO.data(), tk.size(), d.QDl, group);
    group_m = gather_heads(s.m.data(), tk.size(), d.Hql, group);
    group_l = gather_heads(s.l.data(), tk.size(), d.Hql, group);
  }
  const Buf& my_q = d.R > 1 ? group_q : s.q;
  const Buf& my_o = d.R > 1 ? group_o : s.o;
  const Buf& my_do = d.R > 1 ? group_do : dO;
  const FBuf& my_m = d.R > 1 ? group_m : s.m;
  const FBuf& my_l = d.R > 1 ? group_l : s.l;
  const int CP = layout_.cp, chunk = kn_.grad_token_chunk;
  const auto all_where = all_gather(comms_.cp, std::span<const int32_t>(tk.seq_pos()));
  const auto all_q = be_.all_gather(comms_.cp, my_q.data(), my_q.size());
  const auto all_o = be_.all_gather(comms_.cp, my_o.data(), my_o.size());
  const auto all_do = be_.all_gather(comms_.cp, my_do.data(), my_do.size());
  const auto all_m = be_.all_gather(comms_.cp, my_m.data(), my_m.size());
  const auto all_l = be_.all_gather(comms_.cp, my_l.data(), my_l.size());
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
    Buf q = zeros(int64_t{S} * QDg), o = zeros(int64_t{S} * QDg), dout = zeros(int64_t{S} * QDg);
    FBuf m = fzeros(int64_t{S} * Hg), l = fzeros(int64_t{S} * Hg);
    be_.gather_rows(all_q.data.data(), sz(QDg), at_pos, q.data());
    be_.gather_rows(all_o.data.data(), sz(QDg), at_pos, o.data());
    be_.gather_rows(all_do.data.data(), sz(QDg), at_pos, dout.data());
    be_.gather_rows(all_m.data.data(), sz(Hg), at_pos, m.data());
    be_.gather_rows(all_l.data.data(), sz(Hg), at_pos, l.data());
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

}  // namespace bp::layouts
