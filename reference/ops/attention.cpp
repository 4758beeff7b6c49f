#include "attention.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dot_tiles.h"
#include "reference/numerics/math.h"
#include "reference/numerics/reduce.h"

namespace bp::ref {
namespace {

const float kNegInf = float_of(0xff800000u);

// A task's (query, head) slots: about this many rows, so the products' register
// blocks (2-6 rows × 16 lanes) have rows to run over and a split's scores stay in L2.
constexpr int kTileSlots = 128;
// Keys per scores pass of the backward's recompute (bounds its scratch).
constexpr int kKeyPass = 512;
// Keys per task of the dk/dv partials.
constexpr int kKeyTile = 64;
// Largest R(P), R(dS) store of one pass of kv heads in the dk/dv partials.
constexpr size_t kProbBytes = size_t(1) << 28;

// The knob- and shape-derived constants every row uses.
struct Geometry {
  int D, Hq, Hkv, group;  // group = Hq / Hkv query heads per kv head
  int block, split_blocks;
  float scale;
  SoftmaxForm form;
  DotModel dot;
  Geometry(const Knobs& kn, AttnDims d)
      : D(d.D),
        Hq(d.Hq),
        Hkv(d.Hkv),
        group(d.Hq / d.Hkv),
        block(kn.attn_kv_block),
        split_blocks(kn.attn_kv_split / kn.attn_kv_block),
        scale(attn_scale(d.D)),
        form(softmax_form(kn, d.D)),
        dot(kn.dot) {}
  ptrdiff_t kv_stride() const { return static_cast<ptrdiff_t>(Hkv) * D; }
  int tile_queries() const { return std::max(1, kTileSlots / group); }
};

// Queries [i0, i1) of a sequence at kv head kv: slot r is query i0 + r / G at head
// kv·G + r % G (query-major, as the backward's chunks). Its queries see keys
// [0, keys()); the slots that see key j are a suffix, from first_seeing(j).
struct Tile {
  const Geometry* g;
  const AttnSeq* s;
  int kv, i0, i1;
  int rows() const { return (i1 - i0) * g->group; }
  int pos(int r) const { return s->past_len + i0 + r / g->group; }
  int keys() const { return s->past_len + i1; }
  int first_seeing(int j) const { return std::clamp(j - s->past_len - i0, 0, i1 - i0) * g->group; }
  // Into the [T][Hq] stats; times D into [T][Hq][D].
  size_t index(int r) const {
    return static_cast<size_t>(s->q_begin + i0 + r / g->group) * g->Hq + kv * g->group + r % g->group;
  }
  // Key (or value) 0 of the sequence at this kv head; key j at + j · kv_stride.
  const bf16* kv0(const bf16* x) const { return x + (static_cast<size_t>(s->kv_begin) * g->Hkv + kv) * g->D; }
  double cost() const { return static_cast<double>(rows()) * keys(); }
};

// Every sequence's queries cut into tiles of tile_queries(), at every kv head, the
// largest first (tasks of a dynamic schedule).
std::vector<Tile> make_tiles(const Geometry& g, const AttnSeq* seqs, int n_seqs, int kv_begin, int kv_end) {
  std::vector<Tile> tiles;
  for (int s = 0; s < n_seqs; ++s)
    for (int kv = kv_begin; kv < kv_end; ++kv)
      for (int i0 = 0; i0 < seqs[s].q_len; i0 += g.tile_queries())
        tiles.push_back({&g, &seqs[s], kv, i0, std::min(seqs[s].q_len, i0 + g.tile_queries())});
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) { return a.cost() > b.cost(); });
  return tiles;
}

// The tile's rows of x ([T][Hq][D]), slot-major [rows][D].
std::vector<bf16> gather_rows(const Tile& t, const bf16* x) {
  const Geometry& g = *t.g;
  std::vector<bf16> out(static_cast<size_t>(t.rows()) * g.D);
  for (int i = t.i0; i < t.i1; ++i) {
    const bf16* src = x + (static_cast<size_t>(t.s->q_begin + i) * g.Hq + t.kv * g.group) * g.D;
    std::copy(src, src + g.group * g.D, out.begin() + static_cast<size_t>(i - t.i0) * g.group * g.D);
  }
  return out;
}

// out[r][j − j0] = dot_D(x_r, y_j) from +0 for rows [r0, rows) of x ([rows][D]) and
// keys [j0, j1) of y (from key 0 at the tile's kv head): the scores (y = k) and the
// backward's dP (x = dout, y = v).
void key_dots(const Tile& t, const bf16* x, int r0, const bf16* y0, int j0, int j1, float* out, int ld) {
  const Geometry& g = *t.g;
  for (int r = r0; r < t.rows(); ++r) std::fill(out + static_cast<size_t>(r) * ld, out + static_cast<size_t>(r) * ld + (j1 - j0), 0.0f);
  framed_chains(g.dot, t.rows() - r0, j1 - j0, g.D, 0, {x + static_cast<size_t>(r0) * g.D, g.D, 1},
                {y0 + j0 * g.kv_stride(), g.kv_stride(), 1}, nullptr, nullptr, out + static_cast<size_t>(r0) * ld, ld);
}

// acc[r] (rows [r0, rows), [rows][D]) continued over KV block b with operands
// x[r][slot] (row stride ldx, x at the block's first slot) and y's rows of the block
// (the values, or the keys for dq): the framed chain of the block's B slots, of which
// the row's query sees the first hi[r].
void block_chains(const Tile& t, int b, int r0, const bf16* x, size_t ldx, const bf16* y0, const int* hi, float* acc) {
  const Geometry& g = *t.g;
  const std::vector<int> lo(t.rows() - r0, 0);
  framed_chains(g.dot, t.rows() - r0, g.D, g.block, 0, {x + r0 * ldx, static_cast<ptrdiff_t>(ldx), 1},
                {y0 + b * g.block * g.kv_stride(), 1, g.kv_stride()}, lo.data(), hi + r0, acc + static_cast<size_t>(r0) * g.D,
                g.D);
}

// Keys of block b a query at p sees: [b·B, b·B + visible_in_block).
int visible_in_block(const Geometry& g, int b, int p) { return std::min(g.block, p + 1 - b * g.block); }

// ---- forward ----

struct SoftmaxState {
  float m, l;
  float* acc;  // D floats
};

// One online-softmax step over a KV block (SPEC.md §5.6, online softmax), all but the
// P·V chain: z holds the block's n visible raw dots; p (B floats) is scratch; pb gets
// R(P) for the B slots; acc is rescaled by α for the chain to continue from.
void softmax_step(const Geometry& g, const float* z, int n, SoftmaxState& st, float* p, bf16* pb) {
  float block_max = kNegInf;
  for (int j = 0; j < n; ++j) {
    p[j] = g.form.state_value(z[j]);
    block_max = max_num(block_max, p[j]);
  }
  const float m_new = max_num(st.m, block_max);
  const float mc_new = g.form.scaled_max(m_new);
  const float alpha = g.form.rescale(g.form.scaled_max(st.m), mc_new);
  for (int j = 0; j < g.block; ++j) {
    p[j] = j < n ? g.form.weight(p[j], mc_new) : 0.0f;
    pb[j] = round_bf16(p[j]);
  }
  st.l = fma_rn(alpha, st.l, pairwise_tree(p, g.block));
  st.m = m_new;
  for (int d = 0; d < g.D; ++d) st.acc[d] = mul_rn(st.acc[d], alpha);
}

// The softmax steps of a block's rows [r0, rows) of a tile: z at the block's first
// key (row stride ldz), the rows' split states (m, l, acc), pb ([rows][B]) and the
// visible key counts hi to fill; p is B floats of scratch.
struct BlockRows {
  const Tile& t;
  int b, r0;
  const float* z;
  int ldz;
  float *m, *l, *acc;
  bf16* pb;
  int* hi;
  float* p;
};

inline void softmax_rows(const BlockRows& x) {
  const Geometry& g = *x.t.g;
  for (int r = x.r0; r < x.t.rows(); ++r) {
    x.hi[r] = visible_in_block(g, x.b, x.t.pos(r));
    SoftmaxState st{x.m[r], x.l[r], x.acc + static_cast<size_t>(r) * g.D};
    softmax_step(g, x.z + static_cast<size_t>(r) * x.ldz, x.hi[r], st, x.p, x.pb + static_cast<size_t>(r) * g.block);
    x.m[r] = st.m, x.l[r] = st.l;
  }
}
BP_AVX2_FLATTEN void softmax_rows_avx2(const BlockRows& x) { softmax_rows(x); }

// Folds split st into the merged state (M, L, O), splits taken in increasing order.
void merge_split(const SoftmaxForm& form, float& M, float& L, float* O, const SoftmaxState& st, int D) {
  const float mc_new = form.scaled_max(max_num(M, st.m));
  const float a = form.rescale(form.scaled_max(M), mc_new), b = form.rescale(form.scaled_max(st.m), mc_new);
  L = fma_rn(a, L, mul_rn(b, st.l));
  for (int d = 0; d < D; ++d) O[d] = fma_rn(a, O[d], mul_rn(b, st.acc[d]));
  M = max_num(M, st.m);
}

// The forward of a tile's slots: per split, its scores for the slots that reach it,
// then block by block the softmax steps and one P·V product for every slot that
// sees the block; the split's states merge into the merged ones.
void attend_tile(const Tile& t, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* m_out, float* l_out) {
  const Geometry& g = *t.g;
  const int rows = t.rows(), D = g.D, B = g.block, Sp = B * g.split_blocks;
  const std::vector<bf16> qt = gather_rows(t, q);
  std::vector<float> z(static_cast<size_t>(rows) * Sp), acc(static_cast<size_t>(rows) * D), O(acc.size()), M(rows),
      L(rows), sm(rows), sl(rows), p(B);
  std::vector<bf16> pb(static_cast<size_t>(rows) * B);
  std::vector<int> hi(rows);
  for (int split = 0; split < t.keys(); split += Sp) {
    const int r_split = t.first_seeing(split), split_end = std::min(t.keys(), split + Sp);
    key_dots(t, qt.data(), r_split, t.kv0(k), split, split_end, z.data(), Sp);
    std::fill(acc.begin() + static_cast<size_t>(r_split) * D, acc.end(), 0.0f);
    std::fill(sm.begin() + r_split, sm.end(), kNegInf);
    std::fill(sl.begin() + r_split, sl.end(), 0.0f);
    for (int b = split / B; b * B < split_end; ++b) {
      const int r_block = t.first_seeing(b * B);
      const BlockRows rows_b{t, b, r_block, z.data() + (b * B - split), Sp, sm.data(), sl.data(), acc.data(), pb.data(),
                             hi.data(), p.data()};
      dot_simd_enabled() ? softmax_rows_avx2(rows_b) : softmax_rows(rows_b);
      block_chains(t, b, r_block, pb.data(), B, t.kv0(v), hi.data(), acc.data());
    }
    for (int r = r_split; r < rows; ++r) {
      const SoftmaxState st{sm[r], sl[r], acc.data() + static_cast<size_t>(r) * D};
      if (split == 0) {  // the first split is the merged state: no arithmetic
        M[r] = st.m, L[r] = st.l;
        std::copy(st.acc, st.acc + D, O.begin() + static_cast<size_t>(r) * D);
      } else {
        merge_split(g.form, M[r], L[r], O.data() + static_cast<size_t>(r) * D, st, D);
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    const size_t at = t.index(r);
    for (int d = 0; d < D; ++d) o[at * D + d] = round_bf16(div_rn(O[static_cast<size_t>(r) * D + d], L[r]));
    m_out[at] = M[r];
    l_out[at] = L[r];
  }
}

// ---- backward ----

// The inputs every backward stage reads.
struct BackwardInputs {
  const bf16 *q, *k, *v, *o;
  const float *m, *l;
  const bf16* dout;
};

// R(P) and R(dS) of rows [r0, rows) of a tile for keys [j0, j1): z and dp the rows'
// raw scores and dP from key j0 (row stride kKeyPass), delta, inv_l and mc their
// Δ, 1 ÷ l and scaled maximum; written at key j of pb (may be null) and dsb rows (ld).
struct ProbRows {
  const Tile& t;
  int r0, j0, j1;
  const float *z, *dp, *delta, *inv_l, *mc;
  bf16 *pb, *dsb;
  size_t ld;
};

inline void prob_rows(const ProbRows& x) {
  const Geometry& g = *x.t.g;
  for (int r = x.r0; r < x.t.rows(); ++r)
    for (int j = x.j0; j < std::min(x.j1, x.t.pos(r) + 1); ++j) {
      const size_t at = static_cast<size_t>(r) * kKeyPass + (j - x.j0), to = static_cast<size_t>(r) * x.ld + j;
      const float p = mul_rn(g.form.weight(g.form.state_value(x.z[at]), x.mc[r]), x.inv_l[r]);
      if (x.pb) x.pb[to] = round_bf16(p);
      x.dsb[to] = round_bf16(mul_rn(p, sub_rn(x.dp[at], x.delta[r])));
    }
}
BP_AVX2_FLATTEN void prob_rows_avx2(const ProbRows& x) { prob_rows(x); }

// R(P) and R(dS) of the tile's slots against keys [0, keys()), into rows of pb and
// dsb (row stride ld; pb may be null), which hold +0 where the key is not visible.
void tile_probs(const Tile& t, const BackwardInputs& in, bf16* pb, bf16* dsb, size_t ld) {
  const Geometry& g = *t.g;
  const int rows = t.rows();
  const std::vector<bf16> qt = gather_rows(t, in.q), dt = gather_rows(t, in.dout);
  std::vector<float> delta(rows), inv_l(rows), mc(rows);
  with_dot_model(g.dot, [&](auto model) {
    for (int r = 0; r < rows; ++r) {
      const size_t at = t.index(r);
      delta[r] = decltype(model)::chain(0.0f, in.dout + at * g.D, 1, in.o + at * g.D, 1, g.D);
      inv_l[r] = div_rn(1.0f, in.l[at]);
      mc[r] = g.form.scaled_max(in.m[at]);
    }
  });
  std::vector<float> z(static_cast<size_t>(rows) * kKeyPass), dp(z.size());
  for (int j0 = 0; j0 < t.keys(); j0 += kKeyPass) {
    const int j1 = std::min(t.keys(), j0 + kKeyPass), r0 = t.first_seeing(j0);
    key_dots(t, qt.data(), r0, t.kv0(in.k), j0, j1, z.data(), kKeyPass);
    key_dots(t, dt.data(), r0, t.kv0(in.v), j0, j1, dp.data(), kKeyPass);
    const ProbRows x{t, r0, j0, j1, z.data(), dp.data(), delta.data(), inv_l.data(), mc.data(), pb, dsb, ld};
    dot_simd_enabled() ? prob_rows_avx2(x) : prob_rows(x);
  }
}

// dq = R(scale · Σ_j R(dS_ij) k_j): one chain over key slots, block by block.
void dq_tile(const Tile& t, const BackwardInputs& in, bf16* dq) {
  const Geometry& g = *t.g;
  const int rows = t.rows(), keys = t.keys();
  std::vector<bf16> dsb(static_cast<size_t>(rows) * keys);
  tile_probs(t, in, nullptr, dsb.data(), keys);
  std::vector<float> acc(static_cast<size_t>(rows) * g.D, 0.0f);
  std::vector<int> hi(rows);
  for (int b = 0; b * g.block < keys; ++b) {
    const int r_block = t.first_seeing(b * g.block);
    for (int r = r_block; r < rows; ++r) hi[r] = visible_in_block(g, b, t.pos(r));
    block_chains(t, b, r_block, dsb.data() + b * g.block, keys, t.kv0(in.k), hi.data(), acc.data());
  }
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < g.D; ++d)
      dq[t.index(r) * g.D + d] = round_bf16(mul_rn(g.scale, acc[static_cast<size_t>(r) * g.D + d]));
}

// Per kv head: R(P) and R(dS) of all the sequence's slots, query-major ([q_len · G][S]).
struct GroupProbs {
  std::vector<bf16> pb, dsb;
};

// Chunk c's partials of dv_j = Σ R(P_ij) dO_i and dk_j = Σ R(dS_ij) q_i for keys
// [j0, j1) of kv head kv: positions cut into chunks of grad_token_chunk, each
// chunk's chain from +0 over its C·G slots (query-major), the slots whose position
// does not see key j absent; written at row j of the chunk's [S][Hkv][D] partials
// (+0 where no slot sees the key). qg and dog are the sequence's rows at kv.
void kv_tile_partials(const Knobs& kn, const Tile& seq_rows, const GroupProbs& gp, const bf16* qg, const bf16* dog,
                      int j0, int j1, int c, float* dk_part, float* dv_part) {
  const Geometry& g = *seq_rows.g;
  const AttnSeq& s = *seq_rows.s;
  const int C = kn.grad_token_chunk, S = s.past_len + s.q_len, G = g.group;
  const size_t ld = static_cast<size_t>(g.Hkv) * g.D, row0 = static_cast<size_t>(j0) * ld + seq_rows.kv * g.D;
  for (int j = j0; j < j1; ++j) {
    std::fill(dk_part + row0 + (j - j0) * ld, dk_part + row0 + (j - j0) * ld + g.D, 0.0f);
    std::fill(dv_part + row0 + (j - j0) * ld, dv_part + row0 + (j - j0) * ld + g.D, 0.0f);
  }
  const int p_first = std::max(s.past_len, c * C), p_end = std::min(S, (c + 1) * C);
  const int j_end = std::min(j1, p_end);  // later keys see none of the chunk's slots
  if (p_first >= p_end || j0 >= j_end) return;
  std::vector<int> lo(j_end - j0);
  for (int j = j0; j < j_end; ++j) lo[j - j0] = (std::max(j, p_first) - c * C) * G;
  const std::vector<int> hi(lo.size(), (p_end - c * C) * G);
  const int first = (p_first - c * C) * G;
  const size_t slot0 = static_cast<size_t>(p_first - s.past_len) * G;  // the sequence's row of frame slot `first`
  const int frame = C * G, rows = j_end - j0;
  framed_chains(g.dot, rows, g.D, frame, first, {gp.pb.data() + slot0 * S + j0, 1, S}, {dog + slot0 * g.D, 1, g.D},
                lo.data(), hi.data(), dv_part + row0, static_cast<int>(ld));
  framed_chains(g.dot, rows, g.D, frame, first, {gp.dsb.data() + slot0 * S + j0, 1, S}, {qg + slot0 * g.D, 1, g.D},
                lo.data(), hi.data(), dk_part + row0, static_cast<int>(ld));
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
  const std::vector<Tile> tiles = make_tiles(g, seqs, n_seqs, 0, g.Hkv);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < tiles.size(); ++i) attend_tile(tiles[i], q, k, v, o, m, l);
}

void attention_bwd_dq(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                      const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq) {
  attention_check_args(kn, dims, seqs, n_seqs);
  const Geometry g(kn, dims);
  const BackwardInputs in{q, k, v, o, m, l, dout};
  const std::vector<Tile> tiles = make_tiles(g, seqs, n_seqs, 0, g.Hkv);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < tiles.size(); ++i) dq_tile(tiles[i], in, dq);
}

int attention_bwd_kv_partials(const Knobs& kn, AttnDims dims, const AttnSeq& seq, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout,
                              float* dk_part, float* dv_part) {
  attention_check_args(kn, dims, &seq, 1);
  const Geometry g(kn, dims);
  const BackwardInputs in{q, k, v, o, m, l, dout};
  const std::pair<int, int> chunks = query_chunks(kn, seq);
  const int c_begin = chunks.first, c_end = chunks.second, S = seq.past_len + seq.q_len;
  const size_t chunk_stride = static_cast<size_t>(S) * g.Hkv * g.D, slots = static_cast<size_t>(seq.q_len) * g.group;
  // kv heads in passes whose R(P), R(dS) fit kProbBytes: each pass first recomputes
  // them tile by tile, then computes the partials key tile by key tile and chunk by chunk.
  const int per_pass = static_cast<int>(
      std::clamp<size_t>(kProbBytes / std::max<size_t>(1, 4 * slots * S), 1, static_cast<size_t>(g.Hkv)));
  for (int kv_begin = 0; kv_begin < g.Hkv; kv_begin += per_pass) {
    const int kv_end = std::min(g.Hkv, kv_begin + per_pass);
    std::vector<GroupProbs> gp(kv_end - kv_begin);
    for (GroupProbs& p : gp) p = {std::vector<bf16>(slots * S), std::vector<bf16>(slots * S)};
    const std::vector<Tile> tiles = make_tiles(g, &seq, 1, kv_begin, kv_end);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < tiles.size(); ++i) {
      GroupProbs& p = gp[tiles[i].kv - kv_begin];
      const size_t row = static_cast<size_t>(tiles[i].i0) * g.group * S;
      tile_probs(tiles[i], in, p.pb.data() + row, p.dsb.data() + row, S);
    }
    std::vector<Tile> heads;  // each kv head's whole sequence of slots
    std::vector<std::vector<bf16>> qg, dog;
    for (int kv = kv_begin; kv < kv_end; ++kv) {
      heads.push_back({&g, &seq, kv, 0, seq.q_len});
      qg.push_back(gather_rows(heads.back(), q));
      dog.push_back(gather_rows(heads.back(), dout));
    }
    const int key_tiles = (S + kKeyTile - 1) / kKeyTile, n_chunks = c_end - c_begin;
    const int tasks = (kv_end - kv_begin) * key_tiles * n_chunks;
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int h = task / (key_tiles * n_chunks), jt = task / n_chunks % key_tiles, c = c_begin + task % n_chunks;
      const int j0 = jt * kKeyTile, j1 = std::min(S, j0 + kKeyTile);
      const size_t out = static_cast<size_t>(c - c_begin) * chunk_stride;
      kv_tile_partials(kn, heads[h], gp[h], qg[h].data(), dog[h].data(), j0, j1, c, dk_part + out, dv_part + out);
    }
  }
  return c_end - c_begin;
}

void attention_bwd_kv_combine(const Knobs& kn, AttnDims dims, int S, int n_chunks, const float* dk_part,
                              const float* dv_part, bf16* dk, bf16* dv) {
  attention_check_args(kn, dims, nullptr, 0);
  const Geometry g(kn, dims);
  const size_t row = static_cast<size_t>(g.Hkv) * g.D, chunk_stride = static_cast<size_t>(S) * row;
#pragma omp parallel
  {
    std::vector<float> dk_tree(n_chunks), dv_tree(n_chunks);
#pragma omp for schedule(static)
    for (size_t i = 0; i < chunk_stride; ++i) {
      const int seen_from = static_cast<int>(i / row) / kn.grad_token_chunk;  // chunks before end at or before key j
      for (int c = 0; c < n_chunks; ++c) {
        dk_tree[c] = c < seen_from ? 0.0f : dk_part[c * chunk_stride + i];
        dv_tree[c] = c < seen_from ? 0.0f : dv_part[c * chunk_stride + i];
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
