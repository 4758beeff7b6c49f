// The rank program's tensor-parallel building blocks (SPEC.md §7): the all-gather
// of partials and the contract's tree over them, row-parallel linears computing
// whole subtrees of the C-chunk reduction, column-parallel input gradients, and
// the gather of heads split over TP.
// Part of rank_program.h, which includes it after the class declaration.
#pragma once
#include "program/layouts/rank_program.h"

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

// [T][n_l·TP][w] from every TP rank's [T][n_l][w] head slice (heads in rank
// order), `slice` = n_l·w elements per token.
template <class B>
template <class T>
typename RankProgram<B>::template BufOf<T> RankProgram<B>::gather_heads(const T* mine, int tokens, int64_t slice) const {
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
typename RankProgram<B>::Buf RankProgram<B>::row_parallel(const bf16* x, const std::string& name, int T, int k_local,
                                                      int n) const {
  FBuf acc = fzeros(int64_t{T} * n);
  be_.linear_acc(kn_, x, w(name), acc.data(), T, k_local, n, d_.local_chunks);
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
                                                       int n_local) const {
  FBuf acc = fzeros(int64_t{T} * k);
  be_.linear_dgrad_acc(kn_, dy, w_slice, acc.data(), T, k, n_local, d_.local_chunks);
  return tp_reduce(acc, tp_sum());
}

}  // namespace bp::layouts
