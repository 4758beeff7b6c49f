// The rank program's vocabulary-parallel log-softmax (SPEC.md §5.10, §7): each
// rank's vocabulary slice of the logits, its chunk statistics gathered and
// combined by the contract's tree (v1's two-pass stages or v2's chunk states),
// so the logprobs equal the unsharded ones.
// Part of rank_program.h; the class is declared in rank_program_class.h.
#pragma once
#include "program/layouts/rank_program_class.h"

namespace bp::layouts {

// The TP rank whose vocabulary slice holds token v: the holder of v's chunk.
template <class B>
int RankProgram<B>::vocab_holder(int32_t v) const {
  return v / fixed_chunk_len(d_.V, d_.C) / (d_.C / d_.tp);
}

// [R][n_local] chunk partials per rank → [R][C] for v1's logprob combine tree.
// Under Ring (the control): each rank adds its chunks in order, NCCL's ring adds
// the ranks, and the sum sits in chunk 0 with +0 in the others, which the tree
// passes through unchanged.
template <class B>
typename RankProgram<B>::FBuf RankProgram<B>::gather_chunks(const FBuf& mine, int R) const {
  const int n_local = d_.C / d_.tp;
  if (layout_.reduction == Reduction::Tree) return gather_heads(mine.data(), R, n_local, all_tp_ranks());
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

// v1 (two-pass, SPEC.md §7): chunk maxima, gathered, the row max; chunk sums
// against it, gathered, and the target's x from its holder; the combine.
template <class B>
typename RankProgram<B>::RowStats RankProgram<B>::two_pass_logprobs(const Buf& lg, const std::vector<int32_t>& targets,
                                                                    const int32_t* targets_dev, float temp,
                                                                    bool entropy) const {
  const int R = static_cast<int>(targets.size()), n_local = d_.C / d_.tp,
            chunk_len = fixed_chunk_len(d_.V, d_.C);
  RowStats st{fzeros(R), fzeros(R), fzeros(R), fzeros(R)};
  FBuf part = fzeros(int64_t{R} * n_local), tpart = fzeros(int64_t{R} * n_local);
  be_.logprob_chunk_max(kn_, lg.data(), d_.Vl, R, d_.Vl, chunk_len, n_local, temp, part.data(), n_local);
  be_.logprob_row_max(kn_, gather_heads(part.data(), R, n_local, all_tp_ranks()).data(), R, st.row_max.data());
  be_.logprob_chunk_sums(kn_, lg.data(), d_.Vl, R, d_.Vl, chunk_len, n_local, temp, st.row_max.data(), part.data(),
                         entropy ? tpart.data() : nullptr, n_local);
  const FBuf sums = gather_chunks(part, R), tsums = entropy ? gather_chunks(tpart, R) : FBuf{};
  FBuf x_target = fzeros(R);
  be_.logprob_target_logit(kn_, lg.data(), d_.Vl, R, d_.V0, d_.Vl, targets_dev, temp, x_target.data());
  const auto all_x = be_.all_gather(comms_.tp, x_target.data(), x_target.size());
  std::vector<int> holder;
  for (int r = 0; r < R; ++r) holder.push_back(static_cast<int>(all_x.offset[sz(vocab_holder(targets[sz(r)]))]) + r);
  be_.gather_rows(all_x.data.data(), 1, holder, x_target.data());
  be_.logprob_combine(kn_, sums.data(), entropy ? tsums.data() : nullptr, x_target.data(), st.row_max.data(), R,
                      st.row_sum.data(), st.logprob.data(), entropy ? st.entropy.data() : nullptr);
  return st;
}

// v2 (one-pass, SPEC.md §7): my chunks' states (m, s, w) and my rows' target x
// packed in one row of 3·n_local + 1 floats per target row, ONE all-gather, the
// C states unpacked in chunk order and merged by the op's own tree.
template <class B>
typename RankProgram<B>::RowStats RankProgram<B>::one_pass_logprobs(const Buf& lg, const std::vector<int32_t>& targets,
                                                                    const int32_t* targets_dev, float temp,
                                                                    bool entropy) const {
  const int R = static_cast<int>(targets.size()), n_local = d_.C / d_.tp,
            chunk_len = fixed_chunk_len(d_.V, d_.C);
  const int width = 3 * n_local + 1, x_col = 3 * n_local;
  FBuf mine = fzeros(int64_t{R} * width), x_mine = fzeros(R);
  float* m = mine.data();
  be_.logprob_chunk_states(kn_, lg.data(), d_.Vl, R, d_.Vl, chunk_len, n_local, temp, m, m + n_local,
                           entropy ? m + 2 * n_local : nullptr, width);
  be_.logprob_target_logit(kn_, lg.data(), d_.Vl, R, d_.V0, d_.Vl, targets_dev, temp, x_mine.data());
  std::vector<int> x_at;
  for (int r = 0; r < R; ++r) x_at.push_back(r * width + x_col);
  be_.scatter_rows(x_mine.data(), 1, x_at, m);
  const auto all = be_.all_gather(comms_.tp, m, mine.size());
  // Element indices into the gathered rows: field f (0 m, 1 s, 2 w) of chunk
  // t·n_local + j of row r, and the x of the rank holding row r's target.
  auto chunk_field = [&](int f) {
    std::vector<int> at;
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < d_.tp; ++t)
        for (int j = 0; j < n_local; ++j) at.push_back(static_cast<int>(all.offset[sz(t)]) + r * width + f * n_local + j);
    return at;
  };
  std::vector<int> x_holder;
  for (int r = 0; r < R; ++r)
    x_holder.push_back(static_cast<int>(all.offset[sz(vocab_holder(targets[sz(r)]))]) + r * width + x_col);
  const int64_t states = int64_t{R} * d_.C;
  FBuf cmax = fzeros(states), csum = fzeros(states), ctsum = fzeros(entropy ? states : 0), x_target = fzeros(R);
  be_.gather_rows(all.data.data(), 1, chunk_field(0), cmax.data());
  be_.gather_rows(all.data.data(), 1, chunk_field(1), csum.data());
  if (entropy) be_.gather_rows(all.data.data(), 1, chunk_field(2), ctsum.data());
  be_.gather_rows(all.data.data(), 1, x_holder, x_target.data());
  RowStats st{fzeros(R), fzeros(R), fzeros(R), fzeros(R)};
  be_.logprob_merge_states(kn_, cmax.data(), csum.data(), entropy ? ctsum.data() : nullptr, x_target.data(), R,
                           st.row_max.data(), st.row_sum.data(), st.logprob.data(),
                           entropy ? st.entropy.data() : nullptr);
  return st;
}

// Vocabulary-parallel log-softmax of the rows that have a target: each TP rank
// runs the contract's stages on its C/tp chunks, the combines after gathers.
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
  const int R = static_cast<int>(rows.size());
  Buf lg = zeros(int64_t{R} * d.Vl);
  be_.gather_rows(logits.data(), sz(d.Vl), rows, lg.data());
  const auto targets_dev = be_.resident(targets);
  const float temp = run.opt.temperature;
  const bool entropy = run.opt.entropy;
  RowStats st = kn_.log_softmax == LogSoftmax::kOnePass
                    ? one_pass_logprobs(lg, targets, targets_dev.data(), temp, entropy)
                    : two_pass_logprobs(lg, targets, targets_dev.data(), temp, entropy);
  if (at_.t == 0) {
    const std::vector<float> lp_host = be_.to_host(st.logprob.data(), st.logprob.size());
    const std::vector<float> ent_host = be_.to_host(st.entropy.data(), st.entropy.size());
    for (int r = 0; r < R; ++r) {
      const int i = rows[sz(r)];
      run.result.values.push_back({tk.seq[sz(i)], tk.pos[sz(i)], lp_host[sz(r)], ent_host[sz(r)]});
    }
  }
  if (saved) {
    saved->target_rows = rows;
    saved->row_max = std::move(st.row_max);
    saved->row_sum = std::move(st.row_sum);
  }
}

}  // namespace bp::layouts
