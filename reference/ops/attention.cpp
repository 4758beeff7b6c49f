#include "attention.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/numerics/math.h"
#include "reference/numerics/reduce.h"

namespace bp::ref {
namespace {

const float kNegInf = float_of(0xff800000u);

// The knob- and shape-derived constants every row uses.
struct Geometry {
  int D, Hq, Hkv, group;  // group = Hq / Hkv query heads per kv head
  int block, split_blocks;
  float scale;
  SoftmaxForm form;
  Geometry(const Knobs& kn, AttnDims d)
      : D(d.D),
        Hq(d.Hq),
        Hkv(d.Hkv),
        group(d.Hq / d.Hkv),
        block(kn.attn_kv_block),
        split_blocks(kn.attn_kv_split / kn.attn_kv_block),
        scale(attn_scale(d.D)),
        form(softmax_form(kn, d.D)) {}
  ptrdiff_t kv_stride() const { return static_cast<ptrdiff_t>(Hkv) * D; }
};

// Where one (query, head) reads its operands: its q row, and key/value 0 of its
// sequence at its kv head (key j at k + j · kv_stride).
struct HeadView {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  size_t index;  // t · Hq + h: into the [T][Hq] stats, times D into [T][Hq][D]
  int pos;       // absolute position p: keys 0..p are visible
};

HeadView head_view(const Geometry& g, const AttnSeq& s, int i, int h, const bf16* q, const bf16* k, const bf16* v) {
  const size_t row = static_cast<size_t>(s.q_begin + i) * g.Hq + h;
  const size_t kv0 = (static_cast<size_t>(s.kv_begin) * g.Hkv + h / g.group) * g.D;
  return {q + row * g.D, k + kv0, v + kv0, row, s.past_len + i};
}

// Every (sequence, query) pair of the batch, so rows can be spread over threads.
std::vector<std::pair<int, int>> query_list(const AttnSeq* seqs, int n_seqs) {
  std::vector<std::pair<int, int>> list;
  for (int s = 0; s < n_seqs; ++s)
    for (int i = 0; i < seqs[s].q_len; ++i) list.emplace_back(s, i);
  return list;
}

// The score's state value (v1 s = R(dot · scale), v2 the raw dot): forward and
// backward share it.
template <class Model>
float score(const Geometry& g, const HeadView& row, int j) {
  return g.form.state_value(Model::chain(0.0f, row.q, 1, row.k + j * g.kv_stride(), 1, g.D));
}

// Keys of block b a query at p sees: [b·B, b·B + visible_in_block).
int visible_in_block(const Geometry& g, int b, int p) { return std::min(g.block, p + 1 - b * g.block); }

// ---- forward ----

struct SoftmaxState {
  float m, l;
  float* acc;  // D floats
};

struct ForwardScratch {
  std::vector<float> s, p, tree, acc, merged;
  std::vector<bf16> pb;
  explicit ForwardScratch(const Geometry& g)
      : s(g.block), p(g.block), tree(g.block), acc(g.D), merged(g.D), pb(g.block) {}
};

// One online-softmax step over KV block b (SPEC.md §5.6, online softmax).
template <class Model>
void softmax_block(const Geometry& g, const HeadView& row, int b, SoftmaxState& st, ForwardScratch& sc) {
  const int n = visible_in_block(g, b, row.pos);
  float block_max = kNegInf;
  for (int j = 0; j < n; ++j) {
    sc.s[j] = score<Model>(g, row, b * g.block + j);
    block_max = max_num(block_max, sc.s[j]);
  }
  const float m_new = max_num(st.m, block_max);
  const float mc_new = g.form.scaled_max(m_new);
  const float alpha = g.form.rescale(g.form.scaled_max(st.m), mc_new);
  for (int j = 0; j < g.block; ++j) {
    sc.p[j] = j < n ? g.form.weight(sc.s[j], mc_new) : 0.0f;
    sc.pb[j] = round_bf16(sc.p[j]);
  }
  sc.tree = sc.p;
  st.l = fma_rn(alpha, st.l, pairwise_tree(sc.tree.data(), g.block));
  st.m = m_new;
  const bf16* vb = row.v + b * g.block * g.kv_stride();
  for (int d = 0; d < g.D; ++d)
    st.acc[d] = framed_chain<Model>(mul_rn(st.acc[d], alpha), sc.pb.data(), 1, vb + d, g.kv_stride(), 0, n, g.block);
}

// Folds split st into the merged state (M, L, O), splits taken in increasing order.
void merge_split(const SoftmaxForm& form, float& M, float& L, float* O, const SoftmaxState& st, int D) {
  const float mc_new = form.scaled_max(max_num(M, st.m));
  const float a = form.rescale(form.scaled_max(M), mc_new), b = form.rescale(form.scaled_max(st.m), mc_new);
  L = fma_rn(a, L, mul_rn(b, st.l));
  for (int d = 0; d < D; ++d) O[d] = fma_rn(a, O[d], mul_rn(b, st.acc[d]));
  M = max_num(M, st.m);
}

template <class Model>
void attend_row(const Geometry& g, const HeadView& row, bf16* o, float* m_out, float* l_out, ForwardScratch& sc) {
  const int last_block = row.pos / g.block;
  float M = 0.0f, L = 0.0f;
  float* O = sc.merged.data();
  for (int first = 0; first <= last_block; first += g.split_blocks) {
    SoftmaxState st{kNegInf, 0.0f, sc.acc.data()};
    std::fill(sc.acc.begin(), sc.acc.end(), 0.0f);
    for (int b = first; b <= std::min(last_block, first + g.split_blocks - 1); ++b)
      softmax_block<Model>(g, row, b, st, sc);
    if (first == 0) {  // the first split is the merged state: no arithmetic
      M = st.m;
      L = st.l;
      std::copy(sc.acc.begin(), sc.acc.end(), O);
    } else {
      merge_split(g.form, M, L, O, st, g.D);
    }
  }
  for (int d = 0; d < g.D; ++d) o[d] = round_bf16(div_rn(O[d], L));
  *m_out = M;
  *l_out = L;
}

// ---- backward ----

// Per (sequence, kv head): R(P) and R(dS) for every (query, group head) slot and
// key, slots query-major ([q_len · group][S]); +0 where the key is not visible.
struct GroupProbs {
  int S;
  std::vector<bf16> pb, dsb;
};

template <class Model>
GroupProbs recompute_probs(const Geometry& g, const AttnSeq& s, int kv_head, const bf16* q, const bf16* k,
                           const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout) {
  const int S = s.past_len + s.q_len, slots = s.q_len * g.group;
  GroupProbs gp{S, std::vector<bf16>(static_cast<size_t>(slots) * S),
                std::vector<bf16>(static_cast<size_t>(slots) * S)};
#pragma omp parallel for schedule(dynamic, 1)
  for (int r = 0; r < slots; ++r) {
    const HeadView row = head_view(g, s, r / g.group, kv_head * g.group + r % g.group, q, k, v);
    const bf16* dout_row = dout + row.index * g.D;
    const float delta = Model::chain(0.0f, dout_row, 1, o + row.index * g.D, 1, g.D);
    const float inv_l = div_rn(1.0f, l[row.index]);
    for (int j = 0; j <= row.pos; ++j) {
      const float p = mul_rn(g.form.weight(score<Model>(g, row, j), g.form.scaled_max(m[row.index])), inv_l);
      const float dp = Model::chain(0.0f, dout_row, 1, row.v + j * g.kv_stride(), 1, g.D);
      gp.pb[static_cast<size_t>(r) * S + j] = round_bf16(p);
      gp.dsb[static_cast<size_t>(r) * S + j] = round_bf16(mul_rn(p, sub_rn(dp, delta)));
    }
  }
  return gp;
}

// dq = R(scale · Σ_j R(dS_ij) k_j): one chain over key slots, block by block.
template <class Model>
void query_grads(const Geometry& g, const AttnSeq& s, int kv_head, const GroupProbs& gp, const bf16* q, const bf16* k,
                 const bf16* v, bf16* dq) {
  const int slots = s.q_len * g.group;
#pragma omp parallel for schedule(dynamic, 1)
  for (int r = 0; r < slots; ++r) {
    const HeadView row = head_view(g, s, r / g.group, kv_head * g.group + r % g.group, q, k, v);
    const bf16* ds_row = gp.dsb.data() + static_cast<size_t>(r) * gp.S;
    for (int d = 0; d < g.D; ++d) {
      float acc = 0.0f;
      for (int b = 0; b <= row.pos / g.block; ++b)
        acc = framed_chain<Model>(acc, ds_row + b * g.block, 1, row.k + b * g.block * g.kv_stride() + d, g.kv_stride(),
                                  0, visible_in_block(g, b, row.pos), g.block);
      dq[row.index * g.D + d] = round_bf16(mul_rn(g.scale, acc));
    }
  }
}

// Rows of x ([T][Hq][D]) for one kv head's query heads, slot-major ([q_len·group][D]).
std::vector<bf16> gather_group_rows(const Geometry& g, const AttnSeq& s, int kv_head, const bf16* x) {
  std::vector<bf16> out(static_cast<size_t>(s.q_len) * g.group * g.D);
  for (int i = 0; i < s.q_len; ++i) {
    const bf16* src = x + (static_cast<size_t>(s.q_begin + i) * g.Hq + kv_head * g.group) * g.D;
    std::copy(src, src + g.group * g.D, out.begin() + static_cast<size_t>(i) * g.group * g.D);
  }
  return out;
}

// Chunk partials of dv_j = Σ R(P_ij) dO_i and dk_j = Σ R(dS_ij) q_i over the (query,
// head) slots: positions cut into chunks of grad_token_chunk, each chunk's chain
// from +0 (slots query-major within the chunk). Chunks [c_begin, c_end) of the
// sequence, written [c − c_begin][key j < S][Hkv][D] for this kv head; the
// combine (attention_bwd_kv_combine) trees them.
template <class Model>
void kv_chunk_partials(const Knobs& kn, const Geometry& g, const AttnSeq& s, int kv_head, const GroupProbs& gp,
                       const bf16* q, const bf16* dout, int c_begin, int c_end, float* dk_part, float* dv_part) {
  const int C = kn.grad_token_chunk, S = gp.S, frame = C * g.group;
  const std::vector<bf16> qg = gather_group_rows(g, s, kv_head, q), dog = gather_group_rows(g, s, kv_head, dout);
  const size_t chunk_stride = static_cast<size_t>(S) * g.Hkv * g.D;
#pragma omp parallel for schedule(dynamic, 1)
  for (int j = 0; j < S; ++j) {
    for (int d = 0; d < g.D; ++d) {
      for (int c = c_begin; c < c_end; ++c) {
        const size_t out = (c - c_begin) * chunk_stride + (static_cast<size_t>(j) * g.Hkv + kv_head) * g.D + d;
        const int first = std::max({j, s.past_len, c * C}), end = std::min(S, (c + 1) * C);
        dk_part[out] = dv_part[out] = 0.0f;  // a chunk with no slot that sees key j
        if (first >= end) continue;
        const int lo = (first - c * C) * g.group, hi = (end - c * C) * g.group;
        const size_t r0 = static_cast<size_t>(first - s.past_len) * g.group;
        dv_part[out] =
            framed_chain<Model>(0.0f, gp.pb.data() + r0 * S + j, S, dog.data() + r0 * g.D + d, g.D, lo, hi, frame);
        dk_part[out] =
            framed_chain<Model>(0.0f, gp.dsb.data() + r0 * S + j, S, qg.data() + r0 * g.D + d, g.D, lo, hi, frame);
      }
    }
  }
}

// The query chunks a sequence's queries fall in: [past_len / C, ceil(S / C)).
std::pair<int, int> query_chunks(const Knobs& kn, const AttnSeq& s) {
  const int C = kn.grad_token_chunk, S = s.past_len + s.q_len;
  return {s.past_len / C, (S + C - 1) / C};
}

}  // namespace

void attention_check_args(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs) {
  const std::string bad_knobs = validate(kn);
  if (!bad_knobs.empty()) throw std::invalid_argument("attention: " + bad_knobs);
  if (dims.Hq < 1 || dims.Hkv < 1 || dims.D < 1 || dims.Hq % dims.Hkv != 0)
    throw std::invalid_argument("attention: need Hq, Hkv, D >= 1 and Hkv dividing Hq");
  for (int s = 0; s < n_seqs; ++s)
    if (seqs[s].q_begin < 0 || seqs[s].q_len < 0 || seqs[s].past_len < 0 || seqs[s].kv_begin < 0)
      throw std::invalid_argument("attention: sequence " + std::to_string(s) + " has a negative field");
}

void attention_fwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, bf16* o, float* m, float* l) {
  attention_check_args(kn, dims, seqs, n_seqs);
  const Geometry g(kn, dims);
  const auto queries = query_list(seqs, n_seqs);
  const int tasks = static_cast<int>(queries.size()) * g.Hq;
  with_dot_model(kn.dot, [&](auto model) {
    using Model = decltype(model);
#pragma omp parallel
    {
      ForwardScratch sc(g);
#pragma omp for schedule(dynamic, 1)
      for (int task = 0; task < tasks; ++task) {
        const auto [s, i] = queries[task / g.Hq];
        const HeadView row = head_view(g, seqs[s], i, task % g.Hq, q, k, v);
        attend_row<Model>(g, row, o + row.index * g.D, m + row.index, l + row.index, sc);
      }
    }
  });
}

void attention_bwd_dq(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                      const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq) {
  attention_check_args(kn, dims, seqs, n_seqs);
  const Geometry g(kn, dims);
  with_dot_model(kn.dot, [&](auto model) {
    using Model = decltype(model);
    for (int s = 0; s < n_seqs; ++s)
      for (int kv_head = 0; kv_head < g.Hkv; ++kv_head)
        query_grads<Model>(g, seqs[s], kv_head, recompute_probs<Model>(g, seqs[s], kv_head, q, k, v, o, m, l, dout),
                           q, k, v, dq);
  });
}

int attention_bwd_kv_partials(const Knobs& kn, AttnDims dims, const AttnSeq& seq, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout,
                              float* dk_part, float* dv_part) {
  attention_check_args(kn, dims, &seq, 1);
  const Geometry g(kn, dims);
  const std::pair<int, int> chunks = query_chunks(kn, seq);
  const int c_begin = chunks.first, c_end = chunks.second;  // not a structured binding: clang 14 cannot capture one
  with_dot_model(kn.dot, [&](auto model) {
    using Model = decltype(model);
    for (int kv_head = 0; kv_head < g.Hkv; ++kv_head) {
      const GroupProbs gp = recompute_probs<Model>(g, seq, kv_head, q, k, v, o, m, l, dout);
      kv_chunk_partials<Model>(kn, g, seq, kv_head, gp, q, dout, c_begin, c_end, dk_part, dv_part);
    }
  });
  return c_end - c_begin;
}

void attention_bwd_kv_combine(const Knobs& kn, AttnDims dims, int S, int n_chunks, const float* dk_part,
                              const float* dv_part, bf16* dk, bf16* dv) {
  const Geometry g(kn, dims);
  const size_t row = static_cast<size_t>(g.Hkv) * g.D, chunk_stride = static_cast<size_t>(S) * row;
#pragma omp parallel
  {
    std::vector<float> dk_tree(n_chunks), dv_tree(n_chunks);
#pragma omp for schedule(static)
    for (size_t i = 0; i < chunk_stride; ++i) {
      for (int c = 0; c < n_chunks; ++c) {
        dk_tree[c] = dk_part[c * chunk_stride + i];
        dv_tree[c] = dv_part[c * chunk_stride + i];
      }
      dv[i] = round_bf16(pairwise_tree(dv_tree.data(), n_chunks));
      dk[i] = round_bf16(mul_rn(g.scale, pairwise_tree(dk_tree.data(), n_chunks)));
    }
  }
}

void attention_bwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq, bf16* dk,
                   bf16* dv) {
  attention_bwd_dq(kn, dims, seqs, n_seqs, q, k, v, o, m, l, dout, dq);
  for (int s = 0; s < n_seqs; ++s) {
    // The sequence's keys see only its queries: chunks before past_len are +0.
    const AttnSeq whole = seqs[s];
    const int S = whole.past_len + whole.q_len, n_chunks = query_chunks(kn, {0, S, 0, 0}).second;
    const size_t chunk_size = static_cast<size_t>(S) * dims.Hkv * dims.D;
    std::vector<float> dk_part(n_chunks * chunk_size, 0.0f), dv_part(dk_part.size(), 0.0f);
    const int first = query_chunks(kn, whole).first;
    attention_bwd_kv_partials(kn, dims, whole, q, k, v, o, m, l, dout, dk_part.data() + first * chunk_size,
                              dv_part.data() + first * chunk_size);
    const size_t rows = static_cast<size_t>(whole.kv_begin) * dims.Hkv * dims.D;
    attention_bwd_kv_combine(kn, dims, S, n_chunks, dk_part.data(), dv_part.data(), dk + rows, dv + rows);
  }
}

float attn_exp2_scale(int D) {
  // log2 e to 64 bits; sqrtl is correctly rounded. The test bounds the distance of
  // this value to the nearest fp32 midpoint, so its one conversion is RN of the real.
  constexpr long double kLog2e = 1.44269504088896340735992468100189214L;
  return static_cast<float>(std::sqrt(1.0L / static_cast<long double>(D)) * kLog2e);
}

SoftmaxForm softmax_form(const Knobs& kn, int D) {
  const float scale = attn_scale(D), c = attn_exp2_scale(D);
  return {kn.softmax_exp == SoftmaxExp::kExp2Poly, {scale, c}, {scale, c}};
}

}  // namespace bp::ref
