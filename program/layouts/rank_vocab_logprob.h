// The rank program's vocabulary-parallel log-softmax (SPEC.md §5.10, §7): each
// rank's vocabulary slice of the logits, its chunk statistics gathered and
// combined by the contract's tree, so the logprobs equal the unsharded ones.
// Part of rank_program.h, which includes it after the class declaration.
#pragma once
#include "program/layouts/rank_program.h"

namespace bp::layouts {

// [R][n_local] chunk partials per rank → [R][C] for the logprob combine's tree.
// Under Ring (the control): each rank adds its chunks in order, NCCL's ring adds
// the ranks, and the sum sits in chunk 0 with +0 in the others, which the tree
// passes through unchanged.
template <class B>
typename RankProgram<B>::FBuf RankProgram<B>::gather_chunks(const FBuf& mine, int R) const {
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
void RankProgram<B>::logprobs(Run& run, const Tokens& tk, const Buf& logits, Saved* saved) const {
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

}  // namespace bp::layouts
