// The rank program's tensor-parallel building blocks (SPEC.md §7): the all-gather
// of partials and the contract's tree over them, row-parallel linears computing
// whole subtrees of the C-chunk reduction, column-parallel input gradients, and
// the gather of heads split over TP.
// Part of rank_program.h; the class is declared in rank_program_class.h.
#pragma once
#include "program/layouts/rank_program_class.h"

namespace bp::layouts {

// The contract's reduction of TP rank partials (fp32, elementwise): all-gather,
// then pairwise_tree over the ranks' subtrees; or, for the Ring control, NCCL's
// ring order.
template <class B>
typename RankProgram<B>::FBuf RankProgram<B>::tp_reduce(const FBuf& mine, PartialSum how) const {
  const auto all = be_.all_gather(comms_.tp, mine.data(), mine.size());
  const std::vector<size_t> parts(all.offset.begin(), all.offset.end() - 1);
  FBuf out = fzeros(static_cast<int64_t>(mine.size()));
  be_.reduce_partials(all.data.data(), parts, mine.size(), how, out.data());
  return out;
}

template <class B>
typename RankProgram<B>::Buf RankProgram<B>::round_all(const FBuf& a) const {
  Buf out = zeros(static_cast<int64_t>(a.size()));
  be_.round_to_bf16(a.data(), out.data(), a.size());
  return out;
}

// [T][n_l·|ranks|][w] from the head slices [T][n_l][w] of the TP ranks `ranks`,
// heads in that order; `slice` = n_l·w elements per token. Every TP rank takes
// part in the all-gather, whichever ranks it keeps.
template <class B>
template <class T>
typename RankProgram<B>::template BufOf<T> RankProgram<B>::gather_heads(const T* mine, int tokens, int64_t slice,
                                                                    const std::vector<int>& ranks) const {
  const auto all = be_.all_gather(comms_.tp, mine, sz(tokens * slice));
  std::vector<int> rows;  // output row t·|ranks| + i is rank ranks[i]'s row t
  for (int t = 0; t < tokens; ++t)
    for (const int r : ranks) rows.push_back(static_cast<int>(all.offset[sz(r)] / sz(slice)) + t);
  BufOf<T> out = be_.template zeros<T>(rows.size() * sz(slice));
  be_.gather_rows(all.data.data(), sz(slice), rows, out.data());
  return out;
}

// Whose head slices make up a whole: every TP rank's query heads; one replica
// (the first) of each kv head; the replicas of my kv head, whose query heads
// together are its GQA group.
template <class B>
std::vector<int> RankProgram<B>::all_tp_ranks() const {
  std::vector<int> r(sz(d_.tp));
  for (int t = 0; t < d_.tp; ++t) r[sz(t)] = t;
  return r;
}
template <class B>
std::vector<int> RankProgram<B>::kv_head_ranks() const {
  std::vector<int> r;
  for (int t = 0; t < d_.tp; t += d_.R) r.push_back(t);
  return r;
}
template <class B>
std::vector<int> RankProgram<B>::kv_group_ranks() const {
  std::vector<int> r;
  for (int i = 0; i < d_.R; ++i) r.push_back(kv_slice() * d_.R + i);
  return r;
}

// The length of my local chunks of a reduction over `full` of which I hold
// `local`: the whole reduction's fixed chunk length (a tail rank's slice is
// shorter, SPEC.md §2.4.1), or under Ring my one chain.
template <class B>
int RankProgram<B>::local_chunk_len(int full, int local) const {
  return layout_.reduction == Reduction::Tree ? fixed_chunk_len(full, d_.C) : local;
}

// R(x · W) for a row-parallel W whose K this rank holds a slice of: the local
// chunks' subtree (or local chain under Ring), reduced over TP, rounded once.
template <class B>
typename RankProgram<B>::Buf RankProgram<B>::row_parallel(const bf16* x, const std::string& name, int T, int k_full,
                                                          int k_local, int n) const {
  FBuf acc = fzeros(int64_t{T} * n);
  be_.linear_acc(kn_, x, w(name), acc.data(), T, k_local, n, d_.local_chunks, local_chunk_len(k_full, k_local));
  if (layout_.reduction == Reduction::NcclBf16Sum) {
    if constexpr (requires(const bf16* p, bf16* q) { be_.all_reduce_bf16_sum(comms_.tp, p, q, size_t{}); }) {
      const Buf mine = round_all(acc);
      Buf out = zeros(int64_t{T} * n);
      be_.all_reduce_bf16_sum(comms_.tp, mine.data(), out.data(), out.size());
      return out;
    } else {
      throw std::invalid_argument("layout " + layout_.name() +
                                  ": NCCL's bf16 all-reduce runs on real ranks only (implementation nccl)");
    }
  }
  return round_all(tp_reduce(acc, tp_sum()));
}

// The fp32 input gradient of a column-parallel W (its N sliced over TP): local
// chunks' subtree, reduced over TP (not rounded: callers may add more paths first).
template <class B>
typename RankProgram<B>::FBuf RankProgram<B>::column_dgrad(const bf16* dy, const bf16* w_slice, int T, int k,
                                                           int n_full, int n_local) const {
  FBuf acc = fzeros(int64_t{T} * k);
  be_.linear_dgrad_acc(kn_, dy, w_slice, acc.data(), T, k, n_local, d_.local_chunks, local_chunk_len(n_full, n_local));
  return tp_reduce(acc, tp_sum());
}

// The fp32 input gradient through k_proj or v_proj (`name`) from dy [T][KDl], my
// kv heads' output gradient. Replicas hold the same head, but the C-chunk tree over
// kv dim must see each chunk once: rank t contributes its 1/tp feature slice, at
// offset (t mod R)·D/R in its head — the chunks an unreplicated rank t holds.
template <class B>
typename RankProgram<B>::FBuf RankProgram<B>::kv_dgrad(const Buf& dy, const std::string& name, int T) const {
  const Dims& d = d_;
  if (d.R == 1) return column_dgrad(dy.data(), w(name), T, d.H, d.KD, d.KDl);
  const int n = d.KDl / d.R, part = at_.t % d.R;
  std::vector<int> rows;  // dy as [T·R][n]: token i's part is row i·R + part
  for (int i = 0; i < T; ++i) rows.push_back(i * d.R + part);
  Buf mine = zeros(int64_t{T} * n);
  be_.gather_rows(dy.data(), sz(n), rows, mine.data());
  return column_dgrad(mine.data(), w(name) + int64_t{part} * n * d.H, T, d.H, d.KD, n);
}

}  // namespace bp::layouts
