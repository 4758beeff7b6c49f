// bitparity._C: the contract's ops on torch tensors (docs/torch-ops.md). Each
// function checks its tensors (CPU, contiguous, the dtypes SPEC.md §4 gives the op)
// and calls the reference op itself, so a CPU tensor's result is the oracle's bits.
// The autograd wiring is bitparity/ops.py's; here every forward returns what its
// backward needs, and every backward is a function of its own.
#include <torch/extension.h>

#include <string>
#include <vector>

#include "reference/contract/contract.h"
#include "reference/numerics/chunked.h"
#include "reference/numerics/reduce.h"
#include "reference/ops/attention.h"
#include "reference/ops/embedding.h"
#include "reference/ops/linear.h"
#include "reference/ops/logprob.h"
#include "reference/ops/moe_experts.h"
#include "reference/ops/residual.h"
#include "reference/ops/rmsnorm.h"
#include "reference/ops/rope.h"
#include "reference/ops/swiglu.h"

namespace {

using torch::Tensor;

const bp::Knobs& knobs(const std::string& contract) {
  const bp::Contract* c = bp::find_contract(contract);
  TORCH_CHECK(c, "bitparity: no contract \"", contract, "\" (bitparity list names them)");
  return c->knobs;
}

// A tensor an op reads: on the CPU, contiguous, of the op's dtype, `dims` dimensions.
void check(const Tensor& t, const char* name, at::ScalarType dtype, int64_t dims) {
  TORCH_CHECK(t.device().is_cpu(), "bitparity: ", name, " is on ", t.device().str(),
              ": this build has the CPU reference only (docs/torch-ops.md)");
  TORCH_CHECK(t.scalar_type() == dtype, "bitparity: ", name, " is ", t.scalar_type(), ", the contract's op takes ",
              dtype);
  TORCH_CHECK(t.dim() == dims, "bitparity: ", name, " has ", t.dim(), " dimensions, not ", dims);
  TORCH_CHECK(t.is_contiguous(), "bitparity: ", name, " is not contiguous");
}

int as_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= INT32_MAX, "bitparity: ", what, " ", v, " is out of range");
  return static_cast<int>(v);
}

const bp::bf16* bf(const Tensor& t) { return reinterpret_cast<const bp::bf16*>(t.data_ptr<at::BFloat16>()); }
bp::bf16* bf_out(Tensor& t) { return reinterpret_cast<bp::bf16*>(t.data_ptr<at::BFloat16>()); }

Tensor bf16_empty(at::IntArrayRef shape) { return torch::empty(shape, torch::dtype(torch::kBFloat16)); }
Tensor f32_empty(at::IntArrayRef shape) { return torch::empty(shape, torch::dtype(torch::kFloat32)); }

// ---- embedding (SPEC.md §5.1) ----

Tensor embedding_fwd(const Tensor& tokens, const Tensor& table, const std::string& contract) {
  check(tokens, "tokens", torch::kInt32, 1);
  check(table, "table", torch::kBFloat16, 2);
  const int T = as_int(tokens.size(0), "tokens"), V = as_int(table.size(0), "vocab"), H = as_int(table.size(1), "hidden");
  Tensor out = bf16_empty({T, H});
  bp::ref::embedding_fwd(knobs(contract), tokens.data_ptr<int32_t>(), bf(table), bf_out(out), T, V, H);
  return out;
}

Tensor embedding_bwd(const Tensor& tokens, const Tensor& dout, int64_t vocab, const std::string& contract) {
  check(tokens, "tokens", torch::kInt32, 1);
  check(dout, "grad", torch::kBFloat16, 2);
  const int T = as_int(tokens.size(0), "tokens"), V = as_int(vocab, "vocab"), H = as_int(dout.size(1), "hidden");
  TORCH_CHECK(dout.size(0) == T, "bitparity: the gradient has ", dout.size(0), " rows for ", T, " tokens");
  Tensor dtable = f32_empty({V, H});
  bp::ref::embedding_bwd(knobs(contract), tokens.data_ptr<int32_t>(), bf(dout), dtable.data_ptr<float>(), T, V, H);
  return dtable;
}

// ---- rmsnorm (§5.2): x [T][heads·n], w [n] ----

std::vector<Tensor> rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, int64_t heads,
                                const std::string& contract) {
  check(x, "x", torch::kBFloat16, 2);
  check(w, "weight", torch::kBFloat16, 1);
  const int T = as_int(x.size(0), "tokens"), n = as_int(w.size(0), "width"), H = as_int(heads, "heads");
  TORCH_CHECK(H > 0 && x.size(1) == static_cast<int64_t>(H) * n, "bitparity: x has ", x.size(1), " features, not ",
              heads, " heads x ", n);
  Tensor out = bf16_empty({T, x.size(1)}), rstd = f32_empty({static_cast<int64_t>(T) * H});
  bp::ref::rmsnorm_fwd(knobs(contract), bf(x), bf(w), static_cast<float>(eps), bf_out(out), rstd.data_ptr<float>(),
                       T, H, n);
  return {out, rstd};
}

std::vector<Tensor> rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, int64_t heads,
                                const std::string& contract) {
  check(x, "x", torch::kBFloat16, 2);
  check(w, "weight", torch::kBFloat16, 1);
  check(rstd, "rstd", torch::kFloat32, 1);
  check(dy, "grad", torch::kBFloat16, 2);
  TORCH_CHECK(dy.sizes() == x.sizes(), "bitparity: the gradient's shape is not x's");
  const int T = as_int(x.size(0), "tokens"), n = as_int(w.size(0), "width"), H = as_int(heads, "heads");
  Tensor dx = bf16_empty({T, x.size(1)}), dw = f32_empty({n});
  bp::ref::rmsnorm_bwd(knobs(contract), bf(x), bf(w), rstd.data_ptr<float>(), bf(dy), bf_out(dx), dw.data_ptr<float>(),
                       T, H, n);
  return {dx, dw};
}

// ---- linear (§5.4): x [T][K], w [N][K] ----

Tensor linear_fwd(const Tensor& x, const Tensor& w, int64_t k_chunks, const std::string& contract) {
  check(x, "x", torch::kBFloat16, 2);
  check(w, "weight", torch::kBFloat16, 2);
  TORCH_CHECK(x.size(1) == w.size(1), "bitparity: x has ", x.size(1), " features, the weight takes ", w.size(1));
  const int T = as_int(x.size(0), "tokens"), K = as_int(x.size(1), "K"), N = as_int(w.size(0), "N");
  Tensor y = bf16_empty({T, N});
  bp::ref::linear_fwd(knobs(contract), bf(x), bf(w), bf_out(y), T, K, N, as_int(k_chunks, "k_chunks"));
  return y;
}

// dw[n][k]: the weight's gradient alone, token-chunked, fp32 (for a layer whose input
// gradient is reduced elsewhere: a column-parallel rank's).
Tensor linear_wgrad(const Tensor& x, const Tensor& dy, const std::string& contract) {
  check(x, "x", torch::kBFloat16, 2);
  check(dy, "grad", torch::kBFloat16, 2);
  TORCH_CHECK(dy.size(0) == x.size(0), "bitparity: the gradient has ", dy.size(0), " rows for ", x.size(0), " tokens");
  const int T = as_int(x.size(0), "tokens"), K = as_int(x.size(1), "K"), N = as_int(dy.size(1), "N");
  Tensor dw = f32_empty({N, K});
  bp::ref::linear_wgrad(knobs(contract), bf(dy), bf(x), dw.data_ptr<float>(), T, K, N);
  return dw;
}

std::vector<Tensor> linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t n_chunks,
                               const std::string& contract) {
  check(x, "x", torch::kBFloat16, 2);
  check(w, "weight", torch::kBFloat16, 2);
  check(dy, "grad", torch::kBFloat16, 2);
  const int T = as_int(x.size(0), "tokens"), K = as_int(x.size(1), "K"), N = as_int(w.size(0), "N");
  TORCH_CHECK(dy.size(0) == T && dy.size(1) == N, "bitparity: the gradient is not [tokens, N]");
  Tensor dx = bf16_empty({T, K}), dw = f32_empty({N, K});
  const bp::Knobs& kn = knobs(contract);
  bp::ref::linear_dgrad(kn, bf(dy), bf(w), bf_out(dx), T, K, N, as_int(n_chunks, "n_chunks"));
  bp::ref::linear_wgrad(kn, bf(dy), bf(x), dw.data_ptr<float>(), T, K, N);
  return {dx, dw};
}

// ---- q, k, v (§6.5 step 3): one input a feeds three column-parallel projections ----

// The backward of q, k, v = a·Wq, a·Wk, a·Wv: da = R(((0 + acc_q) + acc_k) + acc_v),
// each accumulator an input-gradient dot in tp_tree_width chunks over its projection's
// output features; the weights' gradients token-chunked, fp32.
std::vector<Tensor> qkv_bwd(const Tensor& a, const std::vector<Tensor>& w, const std::vector<Tensor>& dy,
                            const std::string& contract) {
  check(a, "a", torch::kBFloat16, 2);
  TORCH_CHECK(w.size() == 3 && dy.size() == 3, "bitparity: qkv takes three weights and three gradients");
  const bp::Knobs& kn = knobs(contract);
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden"), C = kn.tp_tree_width;
  std::vector<Tensor> acc, out;
  for (size_t i = 0; i < 3; ++i) {
    check(w[i], "weight", torch::kBFloat16, 2);
    check(dy[i], "grad", torch::kBFloat16, 2);
    const int N = as_int(w[i].size(0), "N");
    TORCH_CHECK(w[i].size(1) == H && dy[i].size(0) == T && dy[i].size(1) == N, "bitparity: qkv's shapes disagree");
    acc.push_back(f32_empty({T, H}));
    bp::ref::linear_dgrad_acc(kn, bf(dy[i]), bf(w[i]), acc.back().data_ptr<float>(), T, H, N, C,
                              bp::fixed_chunk_len(N, C));
  }
  Tensor da = bf16_empty({T, H});
  const float* parts[3] = {acc[0].data_ptr<float>(), acc[1].data_ptr<float>(), acc[2].data_ptr<float>()};
  bp::ref::sum_round(parts, 3, bf_out(da), static_cast<size_t>(T) * H);
  out.push_back(da);
  for (size_t i = 0; i < 3; ++i) {
    const int N = as_int(w[i].size(0), "N");
    Tensor dw = f32_empty({N, H});
    bp::ref::linear_wgrad(kn, bf(dy[i]), bf(a), dw.data_ptr<float>(), T, H, N);
    out.push_back(dw);
  }
  return out;
}

// ---- attention (§5.6), whole sequences packed: q [T][Hq·D], k and v [T][Hkv·D] ----

std::vector<bp::ref::AttnSeq> packed(const std::vector<int64_t>& lengths, int64_t T) {
  std::vector<bp::ref::AttnSeq> seqs;
  int at = 0;
  for (const int64_t n : lengths) {
    TORCH_CHECK(n > 0, "bitparity: a sequence of ", n, " tokens");
    seqs.push_back({at, as_int(n, "length"), 0, at});
    at += static_cast<int>(n);
  }
  TORCH_CHECK(at == T, "bitparity: the sequences' lengths add up to ", at, ", not the ", T, " tokens");
  return seqs;
}

bp::ref::AttnDims dims_of(const Tensor& q, const Tensor& k, int64_t head_dim) {
  const int D = as_int(head_dim, "head_dim");
  TORCH_CHECK(D > 0 && q.size(1) % D == 0 && k.size(1) % D == 0, "bitparity: q and k are not whole heads of ", D);
  return {as_int(q.size(1) / D, "heads"), as_int(k.size(1) / D, "kv heads"), D};
}

std::vector<Tensor> attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& lengths,
                                  int64_t head_dim, const std::string& contract) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) check(*t, name, torch::kBFloat16, 2);
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0), "bitparity: q, k and v disagree on their shapes");
  const bp::ref::AttnDims d = dims_of(q, k, head_dim);
  const auto seqs = packed(lengths, q.size(0));
  Tensor o = bf16_empty({q.size(0), q.size(1)}), m = f32_empty({q.size(0) * d.Hq}), l = f32_empty({q.size(0) * d.Hq});
  bp::ref::attention_fwd(knobs(contract), d, seqs.data(), static_cast<int>(seqs.size()), bf(q), bf(k), bf(v), bf_out(o),
                         m.data_ptr<float>(), l.data_ptr<float>());
  return {o, m, l};
}

// Queries of each sequence after its cached keys (chunked prefill, decoding): seqs are
// (q_begin, q_len, past_len, kv_begin), k and v every sequence's keys 0 .. past_len +
// q_len - 1 from its kv_begin. Forward only: the backward runs whole sequences (§6.5).
Tensor attention_cached_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                            const std::vector<std::vector<int64_t>>& seqs, int64_t head_dim,
                            const std::string& contract) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) check(*t, name, torch::kBFloat16, 2);
  TORCH_CHECK(k.sizes() == v.sizes(), "bitparity: k and v disagree on their shapes");
  const bp::ref::AttnDims d = dims_of(q, k, head_dim);
  std::vector<bp::ref::AttnSeq> s;
  for (const auto& x : seqs) {
    TORCH_CHECK(x.size() == 4, "bitparity: a sequence is (q_begin, q_len, past_len, kv_begin)");
    const bp::ref::AttnSeq a{as_int(x[0], "q_begin"), as_int(x[1], "q_len"), as_int(x[2], "past_len"),
                             as_int(x[3], "kv_begin")};
    TORCH_CHECK(a.q_begin + a.q_len <= q.size(0) && a.kv_begin + a.past_len + a.q_len <= k.size(0),
                "bitparity: a sequence reaches past the queries or the keys given");
    s.push_back(a);
  }
  Tensor o = bf16_empty({q.size(0), q.size(1)}), m = f32_empty({q.size(0) * d.Hq}), l = f32_empty({q.size(0) * d.Hq});
  bp::ref::attention_fwd(knobs(contract), d, s.data(), static_cast<int>(s.size()), bf(q), bf(k), bf(v), bf_out(o),
                         m.data_ptr<float>(), l.data_ptr<float>());
  return o;
}

std::vector<Tensor> attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& m,
                                  const Tensor& l, const Tensor& dout, const std::vector<int64_t>& lengths,
                                  int64_t head_dim, const std::string& contract) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}, {&dout, "grad"}})
    check(*t, name, torch::kBFloat16, 2);
  TORCH_CHECK(dout.sizes() == o.sizes(), "bitparity: the gradient's shape is not the output's");
  const bp::ref::AttnDims d = dims_of(q, k, head_dim);
  const auto seqs = packed(lengths, q.size(0));
  Tensor dq = bf16_empty({q.size(0), q.size(1)}), dk = bf16_empty({k.size(0), k.size(1)}),
         dv = bf16_empty({v.size(0), v.size(1)});
  bp::ref::attention_bwd(knobs(contract), d, seqs.data(), static_cast<int>(seqs.size()), bf(q), bf(k), bf(v), bf(o),
                         m.data_ptr<float>(), l.data_ptr<float>(), bf(dout), bf_out(dq), bf_out(dk), bf_out(dv));
  return {dq, dk, dv};
}

// ---- swiglu (§5.7): m = R(silu(g)·u), elementwise ----

Tensor swiglu_fwd(const Tensor& g, const Tensor& u) {
  check(g, "gate", torch::kBFloat16, 2);
  check(u, "up", torch::kBFloat16, 2);
  TORCH_CHECK(g.sizes() == u.sizes(), "bitparity: gate and up disagree on their shapes");
  Tensor m = bf16_empty(g.sizes());
  bp::ref::swiglu_fwd(bf(g), bf(u), bf_out(m), as_int(g.numel(), "elements"));
  return m;
}

std::vector<Tensor> swiglu_bwd(const Tensor& g, const Tensor& u, const Tensor& dm) {
  for (const auto& [t, name] : {std::pair{&g, "gate"}, {&u, "up"}, {&dm, "grad"}}) check(*t, name, torch::kBFloat16, 2);
  TORCH_CHECK(g.sizes() == u.sizes() && dm.sizes() == g.sizes(), "bitparity: swiglu's shapes disagree");
  Tensor dg = bf16_empty(g.sizes()), du = bf16_empty(g.sizes());
  bp::ref::swiglu_bwd(bf(g), bf(u), bf(dm), bf_out(dg), bf_out(du), as_int(g.numel(), "elements"));
  return {dg, du};
}

// ---- the dense MLP (§5.7): a [T][H], gate and up [I][H], down [H][I] ----

Tensor mlp_fwd(const Tensor& a, const Tensor& wg, const Tensor& wu, const Tensor& wd, const std::string& contract) {
  check(a, "a", torch::kBFloat16, 2);
  for (const auto& [t, name] : {std::pair{&wg, "gate"}, {&wu, "up"}, {&wd, "down"}}) check(*t, name, torch::kBFloat16, 2);
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden"), I = as_int(wg.size(0), "intermediate");
  TORCH_CHECK(wg.size(1) == H && wu.sizes() == wg.sizes() && wd.size(0) == H && wd.size(1) == I,
              "bitparity: the MLP's weights are not [I, H], [I, H], [H, I]");
  Tensor d = bf16_empty({T, H});
  bp::ref::mlp_fwd(knobs(contract), bf(a), bf(wg), bf(wu), bf(wd), bf_out(d), T, H, I);
  return d;
}

std::vector<Tensor> mlp_bwd(const Tensor& a, const Tensor& wg, const Tensor& wu, const Tensor& wd, const Tensor& dd,
                            const std::string& contract) {
  check(dd, "grad", torch::kBFloat16, 2);
  TORCH_CHECK(dd.sizes() == a.sizes(), "bitparity: the gradient's shape is not the MLP's output's");
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden"), I = as_int(wg.size(0), "intermediate");
  Tensor da = bf16_empty({T, H}), dwg = f32_empty({I, H}), dwu = f32_empty({I, H}), dwd = f32_empty({H, I});
  bp::ref::mlp_bwd(knobs(contract), bf(a), bf(wg), bf(wu), bf(wd), bf(dd), bf_out(da), dwg.data_ptr<float>(),
                   dwu.data_ptr<float>(), dwd.data_ptr<float>(), T, H, I);
  return {da, dwg, dwu, dwd};
}

// ---- the MoE block (§5.8, §5.9): router [E][H], each expert's gate and up [I][H], down [H][I] ----

struct Experts {
  std::vector<const bp::bf16*> gate, up, down;
  int E = 0, I = 0;
  bp::ref::ExpertWeights view() const { return {gate.data(), up.data(), down.data()}; }
};

Experts experts_of(const Tensor& a, const Tensor& wr, const std::vector<Tensor>& gate, const std::vector<Tensor>& up,
                   const std::vector<Tensor>& down) {
  check(a, "a", torch::kBFloat16, 2);
  check(wr, "router", torch::kBFloat16, 2);
  Experts x;
  x.E = as_int(wr.size(0), "experts");
  TORCH_CHECK(wr.size(1) == a.size(1), "bitparity: the router takes ", wr.size(1), " features, a has ", a.size(1));
  TORCH_CHECK(gate.size() == static_cast<size_t>(x.E) && up.size() == gate.size() && down.size() == gate.size(),
              "bitparity: ", x.E, " experts in the router, ", gate.size(), " gate, ", up.size(), " up and ",
              down.size(), " down weights given");
  x.I = x.E ? as_int(gate[0].size(0), "intermediate") : 0;
  for (int e = 0; e < x.E; ++e) {
    for (const auto& [t, name] : {std::pair{&gate[e], "gate"}, {&up[e], "up"}, {&down[e], "down"}})
      check(*t, name, torch::kBFloat16, 2);
    TORCH_CHECK(gate[e].size(0) == x.I && gate[e].size(1) == a.size(1) && up[e].sizes() == gate[e].sizes() &&
                    down[e].size(0) == a.size(1) && down[e].size(1) == x.I,
                "bitparity: expert ", e, "'s weights are not [I, H], [I, H], [H, I]");
    x.gate.push_back(bf(gate[e]));
    x.up.push_back(bf(up[e]));
    x.down.push_back(bf(down[e]));
  }
  return x;
}

Tensor moe_fwd(const Tensor& a, const Tensor& wr, const std::vector<Tensor>& gate, const std::vector<Tensor>& up,
               const std::vector<Tensor>& down, int64_t k, bool norm_topk_prob, const std::string& contract) {
  const Experts x = experts_of(a, wr, gate, up, down);
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden");
  Tensor out = bf16_empty({T, H});
  bp::ref::moe_layer_fwd(knobs(contract), bf(a), bf(wr), x.view(), bf_out(out), T, H, x.E, as_int(k, "top-k"), x.I,
                         norm_topk_prob);
  return out;
}

// (da, dwr, then every expert's gate, up and down gradients, expert by expert).
std::vector<Tensor> moe_bwd(const Tensor& a, const Tensor& wr, const std::vector<Tensor>& gate,
                            const std::vector<Tensor>& up, const std::vector<Tensor>& down, const Tensor& dout, int64_t k,
                            bool norm_topk_prob, const std::string& contract) {
  const Experts x = experts_of(a, wr, gate, up, down);
  check(dout, "grad", torch::kBFloat16, 2);
  TORCH_CHECK(dout.sizes() == a.sizes(), "bitparity: the gradient's shape is not the block's output's");
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden");
  std::vector<Tensor> out = {bf16_empty({T, H}), f32_empty({x.E, H})};
  std::vector<float*> dg, du, dd;
  for (int e = 0; e < x.E; ++e) {
    out.push_back(f32_empty({x.I, H}));
    dg.push_back(out.back().data_ptr<float>());
    out.push_back(f32_empty({x.I, H}));
    du.push_back(out.back().data_ptr<float>());
    out.push_back(f32_empty({H, x.I}));
    dd.push_back(out.back().data_ptr<float>());
  }
  bp::ref::moe_layer_bwd(knobs(contract), bf(a), bf(wr), x.view(), bf(dout), bf_out(out[0]), out[1].data_ptr<float>(),
                         bp::ref::ExpertGrads{dg.data(), du.data(), dd.data()}, T, H, x.E, as_int(k, "top-k"), x.I,
                         norm_topk_prob);
  return out;
}

// ---- tensor-parallel pieces (SPEC.md §7): subtrees of a C-chunk reduction, the tree over ranks ----

// acc[t][n]: x's K slice against w's, cut into k_chunks chunks of chunk_len (a rank's
// whole aligned subtree of the unsharded C chunks of ⌈K/C⌉), fp32, unrounded.
Tensor linear_acc(const Tensor& x, const Tensor& w, int64_t k_chunks, int64_t chunk_len, const std::string& contract) {
  check(x, "x", torch::kBFloat16, 2);
  check(w, "weight", torch::kBFloat16, 2);
  TORCH_CHECK(x.size(1) == w.size(1), "bitparity: x has ", x.size(1), " features, the weight takes ", w.size(1));
  const int T = as_int(x.size(0), "tokens"), K = as_int(x.size(1), "K"), N = as_int(w.size(0), "N");
  Tensor acc = f32_empty({T, N});
  bp::ref::linear_acc(knobs(contract), bf(x), bf(w), acc.data_ptr<float>(), T, K, N, as_int(k_chunks, "k_chunks"),
                      as_int(chunk_len, "chunk_len"));
  return acc;
}

// The input-gradient accumulator of a column-parallel weight's N slice, likewise.
Tensor linear_dgrad_acc(const Tensor& dy, const Tensor& w, int64_t n_chunks, int64_t chunk_len,
                        const std::string& contract) {
  check(dy, "grad", torch::kBFloat16, 2);
  check(w, "weight", torch::kBFloat16, 2);
  TORCH_CHECK(dy.size(1) == w.size(0), "bitparity: the gradient has ", dy.size(1), " features, the weight ", w.size(0));
  const int T = as_int(dy.size(0), "tokens"), K = as_int(w.size(1), "K"), N = as_int(w.size(0), "N");
  Tensor acc = f32_empty({T, K});
  bp::ref::linear_dgrad_acc(knobs(contract), bf(dy), bf(w), acc.data_ptr<float>(), T, K, N,
                            as_int(n_chunks, "n_chunks"), as_int(chunk_len, "chunk_len"));
  return acc;
}

// pairwise_tree over dim 0 of parts [P, ...] (the ranks' subtrees in rank order), fp32.
Tensor rank_tree(const Tensor& parts) {
  TORCH_CHECK(parts.device().is_cpu() && parts.scalar_type() == torch::kFloat32 && parts.is_contiguous() &&
                  parts.dim() >= 1,
              "bitparity: the ranks' partials are a contiguous fp32 CPU tensor [ranks, ...]");
  const int64_t P = parts.size(0), n = P ? parts.numel() / P : 0;
  Tensor out = torch::empty(parts.sizes().slice(1), torch::dtype(torch::kFloat32));
  const float* in = parts.data_ptr<float>();
  float* o = out.data_ptr<float>();
  std::vector<float> v(static_cast<size_t>(P));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < P; ++p) v[static_cast<size_t>(p)] = in[p * n + i];
    o[i] = bp::pairwise_tree(v.data(), static_cast<int>(P));
  }
  return out;
}

// R(((+0 + parts[0]) + parts[1]) + ...), elementwise: accumulators of one input added, rounded once.
Tensor sum_round(const std::vector<Tensor>& parts) {
  TORCH_CHECK(!parts.empty(), "bitparity: nothing to sum");
  std::vector<const float*> p;
  for (const Tensor& t : parts) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() &&
                    t.sizes() == parts[0].sizes(),
                "bitparity: the accumulators are contiguous fp32 CPU tensors of one shape");
    p.push_back(t.data_ptr<float>());
  }
  Tensor out = bf16_empty(parts[0].sizes());
  bp::ref::sum_round(p.data(), static_cast<int>(p.size()), bf_out(out), static_cast<size_t>(parts[0].numel()));
  return out;
}

// ---- rope (§5.5): x [T][H·D], the tables of max_pos positions ----

std::vector<Tensor> rope_tables(double theta, int64_t head_dim, int64_t max_pos) {
  const int D = as_int(head_dim, "head_dim"), P = as_int(max_pos, "positions");
  Tensor c = bf16_empty({P, D / 2}), s = bf16_empty({P, D / 2});
  bp::ref::rope_tables(static_cast<float>(theta), D, P, bf_out(c), bf_out(s));
  return {c, s};
}

Tensor rope_apply(const Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin, bool backward,
                  const std::string& contract) {
  check(x, "x", torch::kBFloat16, 2);
  check(positions, "positions", torch::kInt32, 1);
  check(cos, "cos table", torch::kBFloat16, 2);
  check(sin, "sin table", torch::kBFloat16, 2);
  const int T = as_int(x.size(0), "tokens"), D = as_int(cos.size(1) * 2, "head_dim");
  TORCH_CHECK(positions.size(0) == T, "bitparity: ", positions.size(0), " positions for ", T, " tokens");
  TORCH_CHECK(x.size(1) % D == 0, "bitparity: x has ", x.size(1), " features, not whole heads of ", D);
  const bp::ref::RopeTable table{bf(cos), bf(sin), as_int(cos.size(0), "positions"), D};
  Tensor out = bf16_empty({T, x.size(1)});
  const int H = as_int(x.size(1) / D, "heads");
  if (backward)
    bp::ref::rope_bwd(knobs(contract), table, positions.data_ptr<int32_t>(), bf(x), bf_out(out), T, H);
  else
    bp::ref::rope_fwd(knobs(contract), table, positions.data_ptr<int32_t>(), bf(x), bf_out(out), T, H);
  return out;
}

// ---- logprob (§5.10): logits [R][V] of the target rows ----

std::vector<Tensor> logprob_fwd(const Tensor& logits, const Tensor& targets, double temperature,
                                const std::string& contract) {
  check(logits, "logits", torch::kBFloat16, 2);
  check(targets, "targets", torch::kInt32, 1);
  const int R = as_int(logits.size(0), "rows"), V = as_int(logits.size(1), "vocab");
  TORCH_CHECK(targets.size(0) == R, "bitparity: ", targets.size(0), " targets for ", R, " rows");
  Tensor lp = f32_empty({R}), row_max = f32_empty({R}), row_sum = f32_empty({R}), entropy = f32_empty({R});
  bp::ref::logprob_fwd(knobs(contract), bf(logits), targets.data_ptr<int32_t>(), R, V, static_cast<float>(temperature),
                       lp.data_ptr<float>(), row_max.data_ptr<float>(), row_sum.data_ptr<float>(),
                       entropy.data_ptr<float>());
  return {lp, entropy, row_max, row_sum};
}

Tensor logprob_bwd(const Tensor& logits, const Tensor& targets, const Tensor& coef, const Tensor& row_max,
                   const Tensor& row_sum, double temperature, const std::string& contract) {
  check(logits, "logits", torch::kBFloat16, 2);
  check(targets, "targets", torch::kInt32, 1);
  for (const auto& [t, name] : {std::pair{&coef, "grad"}, {&row_max, "row_max"}, {&row_sum, "row_sum"}}) {
    check(*t, name, torch::kFloat32, 1);
    TORCH_CHECK(t->size(0) == logits.size(0), "bitparity: ", name, " is not one value a row");
  }
  const int R = as_int(logits.size(0), "rows"), V = as_int(logits.size(1), "vocab");
  Tensor dlogits = bf16_empty({R, V});
  bp::ref::logprob_bwd(knobs(contract), bf(logits), targets.data_ptr<int32_t>(), coef.data_ptr<float>(),
                       row_max.data_ptr<float>(), row_sum.data_ptr<float>(), R, V, static_cast<float>(temperature),
                       bf_out(dlogits));
  return dlogits;
}

std::vector<std::string> contract_names() {
  std::vector<std::string> names;
  for (const bp::Contract& c : bp::contracts()) names.push_back(c.name);
  return names;
}

std::string knob_hash(const std::string& contract) {
  knobs(contract);
  return bp::find_contract(contract)->knob_hash();
}

// The chunks of a shardable reduction (a row-parallel layer's K, the LM head's input
// gradient's N): what linear's k_chunks and n_chunks take there.
int64_t tp_tree_width(const std::string& contract) { return knobs(contract).tp_tree_width; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "bitparity's contract ops on CPU tensors (the reference itself); docs/torch-ops.md";
  m.def("contract_names", &contract_names);
  m.def("knob_hash", &knob_hash);
  m.def("tp_tree_width", &tp_tree_width);
  m.def("embedding_fwd", &embedding_fwd);
  m.def("embedding_bwd", &embedding_bwd);
  m.def("rmsnorm_fwd", &rmsnorm_fwd);
  m.def("rmsnorm_bwd", &rmsnorm_bwd);
  m.def("linear_fwd", &linear_fwd);
  m.def("linear_bwd", &linear_bwd);
  m.def("linear_wgrad", &linear_wgrad);
  m.def("qkv_bwd", &qkv_bwd);
  m.def("attention_fwd", &attention_fwd);
  m.def("attention_bwd", &attention_bwd);
  m.def("attention_cached_fwd", &attention_cached_fwd);
  m.def("swiglu_fwd", &swiglu_fwd);
  m.def("swiglu_bwd", &swiglu_bwd);
  m.def("mlp_fwd", &mlp_fwd);
  m.def("mlp_bwd", &mlp_bwd);
  m.def("moe_fwd", &moe_fwd);
  m.def("moe_bwd", &moe_bwd);
  m.def("linear_acc", &linear_acc);
  m.def("linear_dgrad_acc", &linear_dgrad_acc);
  m.def("rank_tree", &rank_tree);
  m.def("sum_round", &sum_round);
  m.def("rope_tables", &rope_tables);
  m.def("rope_apply", &rope_apply);
  m.def("logprob_fwd", &logprob_fwd);
  m.def("logprob_bwd", &logprob_bwd);
}
