// bitparity._C: the contract's ops on torch tensors (docs/torch-ops.md). Each
// function checks its tensors (contiguous, on one device, the dtypes SPEC.md §4 gives
// the op) and runs the op where they are: the reference itself on the CPU, so a CPU
// tensor's result is the oracle's bits; optimized/cuda's twin (same arguments, device
// pointers, the same bits) on a CUDA tensor, on torch's current stream, where the
// package was built with it (setup.py).
// The autograd wiring is bitparity/ops.py's; here every forward returns what its
// backward needs, and every backward is a function of its own.
#include <torch/extension.h>

#include <array>
#include <string>
#include <tuple>
#include <vector>

#include "reference/contract/contract.h"
#include "reference/numerics/chunked.h"
#include "reference/numerics/reduce.h"
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

#ifdef BITPARITY_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "optimized/cuda/attention.h"
#include "optimized/cuda/embedding.h"
#include "optimized/cuda/linear.h"
#include "optimized/cuda/logprob.h"
#include "optimized/cuda/moe_experts.h"
#include "optimized/cuda/moe_router.h"
#include "optimized/cuda/residual.h"
#include "optimized/cuda/rmsnorm.h"
#include "optimized/cuda/rope.h"
#include "optimized/cuda/rows.h"
#include "optimized/cuda/swiglu.h"
// The op where `on` runs: the CUDA twin on torch's current stream, or the reference.
#define BP_OP(on, op, ...) \
  ((on).is_cuda() ? bp::cuda::op(__VA_ARGS__, (on).stream()) : bp::ref::op(__VA_ARGS__))
#else
#define BP_OP(on, op, ...) bp::ref::op(__VA_ARGS__)
#endif

namespace {

using torch::Tensor;

const bp::Knobs& knobs(const std::string& contract) {
  const bp::Contract* c = bp::find_contract(contract);
  TORCH_CHECK(c, "bitparity: no contract \"", contract, "\" (bitparity list names them)");
  return c->knobs;
}

bool built_with_cuda() {
#ifdef BITPARITY_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// Where an op runs: its first tensor's device, which every other tensor of the call
// shares and its outputs are allocated on; that device is current for the call.
class On {
 public:
  explicit On(const Tensor& first) : device_(first.device()), guard_(device_) {
    TORCH_CHECK(device_.is_cpu() || (device_.is_cuda() && built_with_cuda()), "bitparity: a tensor is on ",
                device_.str(),
                built_with_cuda() ? ": the ops run on CPU and CUDA tensors"
                                  : ": this build of bitparity._C has the CPU reference only (docs/torch-ops.md)");
  }

  bool is_cuda() const { return device_.is_cuda(); }
#ifdef BITPARITY_WITH_CUDA
  cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(device_.index()).stream(); }
#endif

  // A tensor the op reads: here, contiguous, of the op's dtype, `dims` dimensions.
  void check(const Tensor& t, const char* name, at::ScalarType dtype, int64_t dims) const {
    TORCH_CHECK(t.device() == device_, "bitparity: ", name, " is on ", t.device().str(), ", the op's other tensors on ",
                device_.str());
    TORCH_CHECK(t.scalar_type() == dtype, "bitparity: ", name, " is ", t.scalar_type(), ", the contract's op takes ",
                dtype);
    TORCH_CHECK(t.dim() == dims, "bitparity: ", name, " has ", t.dim(), " dimensions, not ", dims);
    TORCH_CHECK(t.is_contiguous(), "bitparity: ", name, " is not contiguous");
  }

  Tensor bf16(at::IntArrayRef shape) const { return torch::empty(shape, opts(torch::kBFloat16)); }
  Tensor f32(at::IntArrayRef shape) const { return torch::empty(shape, opts(torch::kFloat32)); }

 private:
  at::TensorOptions opts(at::ScalarType dtype) const { return torch::dtype(dtype).device(device_); }

  at::Device device_;
  at::DeviceGuard guard_;
};

int as_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= 0 && v <= INT32_MAX, "bitparity: ", what, " ", v, " is out of range");
  return static_cast<int>(v);
}

const bp::bf16* bf(const Tensor& t) { return reinterpret_cast<const bp::bf16*>(t.data_ptr<at::BFloat16>()); }
bp::bf16* bf_out(Tensor& t) { return reinterpret_cast<bp::bf16*>(t.data_ptr<at::BFloat16>()); }

// ---- embedding (SPEC.md §5.1) ----

Tensor embedding_fwd(const Tensor& tokens, const Tensor& table, const std::string& contract) {
  const On on(tokens);
  on.check(tokens, "tokens", torch::kInt32, 1);
  on.check(table, "table", torch::kBFloat16, 2);
  const int T = as_int(tokens.size(0), "tokens"), V = as_int(table.size(0), "vocab"), H = as_int(table.size(1), "hidden");
  Tensor out = on.bf16({T, H});
  BP_OP(on, embedding_fwd, knobs(contract), tokens.data_ptr<int32_t>(), bf(table), bf_out(out), T, V, H);
  return out;
}

Tensor embedding_bwd(const Tensor& tokens, const Tensor& dout, int64_t vocab, const std::string& contract) {
  const On on(tokens);
  on.check(tokens, "tokens", torch::kInt32, 1);
  on.check(dout, "grad", torch::kBFloat16, 2);
  const int T = as_int(tokens.size(0), "tokens"), V = as_int(vocab, "vocab"), H = as_int(dout.size(1), "hidden");
  TORCH_CHECK(dout.size(0) == T, "bitparity: the gradient has ", dout.size(0), " rows for ", T, " tokens");
  Tensor dtable = on.f32({V, H});
  BP_OP(on, embedding_bwd, knobs(contract), tokens.data_ptr<int32_t>(), bf(dout), dtable.data_ptr<float>(), T, V, H);
  return dtable;
}

// ---- rmsnorm (§5.2): x [T][heads·n], w [n] ----

std::vector<Tensor> rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, int64_t heads,
                                const std::string& contract) {
  const On on(x);
  on.check(x, "x", torch::kBFloat16, 2);
  on.check(w, "weight", torch::kBFloat16, 1);
  const int T = as_int(x.size(0), "tokens"), n = as_int(w.size(0), "width"), H = as_int(heads, "heads");
  TORCH_CHECK(H > 0 && x.size(1) == static_cast<int64_t>(H) * n, "bitparity: x has ", x.size(1), " features, not ",
              heads, " heads x ", n);
  Tensor out = on.bf16({T, x.size(1)}), rstd = on.f32({static_cast<int64_t>(T) * H});
  BP_OP(on, rmsnorm_fwd, knobs(contract), bf(x), bf(w), static_cast<float>(eps), bf_out(out), rstd.data_ptr<float>(),
        T, H, n);
  return {out, rstd};
}

std::vector<Tensor> rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, int64_t heads,
                                const std::string& contract) {
  const On on(x);
  on.check(x, "x", torch::kBFloat16, 2);
  on.check(w, "weight", torch::kBFloat16, 1);
  on.check(rstd, "rstd", torch::kFloat32, 1);
  on.check(dy, "grad", torch::kBFloat16, 2);
  TORCH_CHECK(dy.sizes() == x.sizes(), "bitparity: the gradient's shape is not x's");
  const int T = as_int(x.size(0), "tokens"), n = as_int(w.size(0), "width"), H = as_int(heads, "heads");
  Tensor dx = on.bf16({T, x.size(1)}), dw = on.f32({n});
  BP_OP(on, rmsnorm_bwd, knobs(contract), bf(x), bf(w), rstd.data_ptr<float>(), bf(dy), bf_out(dx),
        dw.data_ptr<float>(), T, H, n);
  return {dx, dw};
}

// ---- linear (§5.4): x [T][K], w [N][K] ----

Tensor linear_fwd(const Tensor& x, const Tensor& w, int64_t k_chunks, const std::string& contract) {
  const On on(x);
  on.check(x, "x", torch::kBFloat16, 2);
  on.check(w, "weight", torch::kBFloat16, 2);
  TORCH_CHECK(x.size(1) == w.size(1), "bitparity: x has ", x.size(1), " features, the weight takes ", w.size(1));
  const int T = as_int(x.size(0), "tokens"), K = as_int(x.size(1), "K"), N = as_int(w.size(0), "N");
  Tensor y = on.bf16({T, N});
  BP_OP(on, linear_fwd, knobs(contract), bf(x), bf(w), bf_out(y), T, K, N, as_int(k_chunks, "k_chunks"));
  return y;
}

// dw[n][k]: the weight's gradient alone, token-chunked, fp32 (for a layer whose input
// gradient is reduced elsewhere: a column-parallel rank's).
Tensor linear_wgrad(const Tensor& x, const Tensor& dy, const std::string& contract) {
  const On on(x);
  on.check(x, "x", torch::kBFloat16, 2);
  on.check(dy, "grad", torch::kBFloat16, 2);
  TORCH_CHECK(dy.size(0) == x.size(0), "bitparity: the gradient has ", dy.size(0), " rows for ", x.size(0), " tokens");
  const int T = as_int(x.size(0), "tokens"), K = as_int(x.size(1), "K"), N = as_int(dy.size(1), "N");
  Tensor dw = on.f32({N, K});
  BP_OP(on, linear_wgrad, knobs(contract), bf(dy), bf(x), dw.data_ptr<float>(), T, K, N);
  return dw;
}

std::vector<Tensor> linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t n_chunks,
                               const std::string& contract) {
  const On on(x);
  on.check(x, "x", torch::kBFloat16, 2);
  on.check(w, "weight", torch::kBFloat16, 2);
  on.check(dy, "grad", torch::kBFloat16, 2);
  const int T = as_int(x.size(0), "tokens"), K = as_int(x.size(1), "K"), N = as_int(w.size(0), "N");
  TORCH_CHECK(dy.size(0) == T && dy.size(1) == N, "bitparity: the gradient is not [tokens, N]");
  Tensor dx = on.bf16({T, K}), dw = on.f32({N, K});
  const bp::Knobs& kn = knobs(contract);
  BP_OP(on, linear_dgrad, kn, bf(dy), bf(w), bf_out(dx), T, K, N, as_int(n_chunks, "n_chunks"));
  BP_OP(on, linear_wgrad, kn, bf(dy), bf(x), dw.data_ptr<float>(), T, K, N);
  return {dx, dw};
}

// R(((+0 + parts[0]) + parts[1]) + ...) of fp32 accumulators of one shape, into `out`.
void sum_round_into(const On& on, const std::vector<Tensor>& parts, Tensor& out) {
  std::vector<const float*> p;
  for (const Tensor& t : parts) {
    on.check(t, "an accumulator", torch::kFloat32, parts[0].dim());
    TORCH_CHECK(t.sizes() == parts[0].sizes(), "bitparity: the accumulators disagree on their shapes");
    p.push_back(t.data_ptr<float>());
  }
  BP_OP(on, sum_round, p.data(), static_cast<int>(p.size()), bf_out(out), static_cast<size_t>(parts[0].numel()));
}

// ---- q, k, v (§6.5 step 3): one input a feeds three column-parallel projections ----

// The backward of q, k, v = a·Wq, a·Wk, a·Wv: da = R(((0 + acc_q) + acc_k) + acc_v),
// each accumulator an input-gradient dot in tp_tree_width chunks over its projection's
// output features; the weights' gradients token-chunked, fp32.
std::vector<Tensor> qkv_bwd(const Tensor& a, const std::vector<Tensor>& w, const std::vector<Tensor>& dy,
                            const std::string& contract) {
  const On on(a);
  on.check(a, "a", torch::kBFloat16, 2);
  TORCH_CHECK(w.size() == 3 && dy.size() == 3, "bitparity: qkv takes three weights and three gradients");
  const bp::Knobs& kn = knobs(contract);
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden"), C = kn.tp_tree_width;
  std::vector<Tensor> acc, out;
  for (size_t i = 0; i < 3; ++i) {
    on.check(w[i], "weight", torch::kBFloat16, 2);
    on.check(dy[i], "grad", torch::kBFloat16, 2);
    const int N = as_int(w[i].size(0), "N");
    TORCH_CHECK(w[i].size(1) == H && dy[i].size(0) == T && dy[i].size(1) == N, "bitparity: qkv's shapes disagree");
    acc.push_back(on.f32({T, H}));
    BP_OP(on, linear_dgrad_acc, kn, bf(dy[i]), bf(w[i]), acc.back().data_ptr<float>(), T, H, N, C,
          bp::fixed_chunk_len(N, C));
  }
  out.push_back(on.bf16({T, H}));
  sum_round_into(on, acc, out.back());
  for (size_t i = 0; i < 3; ++i) {
    const int N = as_int(w[i].size(0), "N");
    out.push_back(on.f32({N, H}));
    BP_OP(on, linear_wgrad, kn, bf(dy[i]), bf(a), out.back().data_ptr<float>(), T, H, N);
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

bp::ref::AttnDims dims_of(const On& on, const Tensor& q, const Tensor& k, int64_t head_dim) {
  const int D = as_int(head_dim, "head_dim");
  TORCH_CHECK(D > 0 && q.size(1) % D == 0 && k.size(1) % D == 0, "bitparity: q and k are not whole heads of ", D);
#ifdef BITPARITY_WITH_CUDA
  TORCH_CHECK(!on.is_cuda() || bp::cuda::attention_takes_head_dim(D), "bitparity: the CUDA attention takes head_dim ",
              bp::cuda::attention_head_dims_text(), ", not ", D);
#endif
  return {as_int(q.size(1) / D, "heads"), as_int(k.size(1) / D, "kv heads"), D};
}

std::vector<Tensor> attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& lengths,
                                  int64_t head_dim, const std::string& contract) {
  const On on(q);
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) on.check(*t, name, torch::kBFloat16, 2);
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0), "bitparity: q, k and v disagree on their shapes");
  const bp::ref::AttnDims d = dims_of(on, q, k, head_dim);
  const auto seqs = packed(lengths, q.size(0));
  Tensor o = on.bf16({q.size(0), q.size(1)}), m = on.f32({q.size(0) * d.Hq}), l = on.f32({q.size(0) * d.Hq});
  BP_OP(on, attention_fwd, knobs(contract), d, seqs.data(), static_cast<int>(seqs.size()), bf(q), bf(k), bf(v),
        bf_out(o), m.data_ptr<float>(), l.data_ptr<float>());
  return {o, m, l};
}

// Queries of each sequence after its cached keys (chunked prefill, decoding, a
// context-parallel rank's runs of positions): seqs are (q_begin, q_len, past_len,
// kv_begin), k and v every sequence's keys 0 .. past_len + q_len - 1 from its kv_begin.
// (o, m, l); no backward of its own: the backward runs whole sequences (§6.5).
std::vector<Tensor> attention_cached_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const std::vector<std::vector<int64_t>>& seqs, int64_t head_dim,
                                         const std::string& contract) {
  const On on(q);
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) on.check(*t, name, torch::kBFloat16, 2);
  TORCH_CHECK(k.sizes() == v.sizes(), "bitparity: k and v disagree on their shapes");
  const bp::ref::AttnDims d = dims_of(on, q, k, head_dim);
  std::vector<bp::ref::AttnSeq> s;
  for (const auto& x : seqs) {
    TORCH_CHECK(x.size() == 4, "bitparity: a sequence is (q_begin, q_len, past_len, kv_begin)");
    const bp::ref::AttnSeq a{as_int(x[0], "q_begin"), as_int(x[1], "q_len"), as_int(x[2], "past_len"),
                             as_int(x[3], "kv_begin")};
    TORCH_CHECK(a.q_begin + a.q_len <= q.size(0) && a.kv_begin + a.past_len + a.q_len <= k.size(0),
                "bitparity: a sequence reaches past the queries or the keys given");
    s.push_back(a);
  }
  Tensor o = on.bf16({q.size(0), q.size(1)}), m = on.f32({q.size(0) * d.Hq}), l = on.f32({q.size(0) * d.Hq});
  BP_OP(on, attention_fwd, knobs(contract), d, s.data(), static_cast<int>(s.size()), bf(q), bf(k), bf(v), bf_out(o),
        m.data_ptr<float>(), l.data_ptr<float>());
  return {o, m, l};
}

std::vector<Tensor> attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& m,
                                  const Tensor& l, const Tensor& dout, const std::vector<int64_t>& lengths,
                                  int64_t head_dim, const std::string& contract) {
  const On on(q);
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}, {&dout, "grad"}})
    on.check(*t, name, torch::kBFloat16, 2);
  on.check(m, "m", torch::kFloat32, 1);
  on.check(l, "l", torch::kFloat32, 1);
  TORCH_CHECK(dout.sizes() == o.sizes(), "bitparity: the gradient's shape is not the output's");
  const bp::ref::AttnDims d = dims_of(on, q, k, head_dim);
  const auto seqs = packed(lengths, q.size(0));
  Tensor dq = on.bf16({q.size(0), q.size(1)}), dk = on.bf16({k.size(0), k.size(1)}), dv = on.bf16({v.size(0), v.size(1)});
  BP_OP(on, attention_bwd, knobs(contract), d, seqs.data(), static_cast<int>(seqs.size()), bf(q), bf(k), bf(v), bf(o),
        m.data_ptr<float>(), l.data_ptr<float>(), bf(dout), bf_out(dq), bf_out(dk), bf_out(dv));
  return {dq, dk, dv};
}

// ---- swiglu (§5.7): m = R(silu(g)·u), elementwise ----

Tensor swiglu_fwd(const Tensor& g, const Tensor& u) {
  const On on(g);
  on.check(g, "gate", torch::kBFloat16, 2);
  on.check(u, "up", torch::kBFloat16, 2);
  TORCH_CHECK(g.sizes() == u.sizes(), "bitparity: gate and up disagree on their shapes");
  Tensor m = on.bf16(g.sizes());
  BP_OP(on, swiglu_fwd, bf(g), bf(u), bf_out(m), as_int(g.numel(), "elements"));
  return m;
}

std::vector<Tensor> swiglu_bwd(const Tensor& g, const Tensor& u, const Tensor& dm) {
  const On on(g);
  for (const auto& [t, name] : {std::pair{&g, "gate"}, {&u, "up"}, {&dm, "grad"}})
    on.check(*t, name, torch::kBFloat16, 2);
  TORCH_CHECK(g.sizes() == u.sizes() && dm.sizes() == g.sizes(), "bitparity: swiglu's shapes disagree");
  Tensor dg = on.bf16(g.sizes()), du = on.bf16(g.sizes());
  BP_OP(on, swiglu_bwd, bf(g), bf(u), bf(dm), bf_out(dg), bf_out(du), as_int(g.numel(), "elements"));
  return {dg, du};
}

// ---- the dense MLP (§5.7): a [T][H], gate and up [I][H], down [H][I] ----

// The MLP's sizes (T, H, I), its tensors checked.
std::array<int, 3> mlp_sizes(const On& on, const Tensor& a, const Tensor& wg, const Tensor& wu, const Tensor& wd) {
  on.check(a, "a", torch::kBFloat16, 2);
  for (const auto& [t, name] : {std::pair{&wg, "gate"}, {&wu, "up"}, {&wd, "down"}})
    on.check(*t, name, torch::kBFloat16, 2);
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden"), I = as_int(wg.size(0), "intermediate");
  TORCH_CHECK(wg.size(1) == H && wu.sizes() == wg.sizes() && wd.size(0) == H && wd.size(1) == I,
              "bitparity: the MLP's weights are not [I, H], [I, H], [H, I]");
  return {T, H, I};
}

Tensor mlp_fwd(const Tensor& a, const Tensor& wg, const Tensor& wu, const Tensor& wd, const std::string& contract) {
  const On on(a);
  const auto [T, H, I] = mlp_sizes(on, a, wg, wu, wd);
  Tensor d = on.bf16({T, H});
  BP_OP(on, mlp_fwd, knobs(contract), bf(a), bf(wg), bf(wu), bf(wd), bf_out(d), T, H, I);
  return d;
}

std::vector<Tensor> mlp_bwd(const Tensor& a, const Tensor& wg, const Tensor& wu, const Tensor& wd, const Tensor& dd,
                            const std::string& contract) {
  const On on(a);
  const auto [T, H, I] = mlp_sizes(on, a, wg, wu, wd);
  on.check(dd, "grad", torch::kBFloat16, 2);
  TORCH_CHECK(dd.sizes() == a.sizes(), "bitparity: the gradient's shape is not the MLP's output's");
  Tensor da = on.bf16({T, H}), dwg = on.f32({I, H}), dwu = on.f32({I, H}), dwd = on.f32({H, I});
  BP_OP(on, mlp_bwd, knobs(contract), bf(a), bf(wg), bf(wu), bf(wd), bf(dd), bf_out(da), dwg.data_ptr<float>(),
        dwu.data_ptr<float>(), dwd.data_ptr<float>(), T, H, I);
  return {da, dwg, dwu, dwd};
}

// ---- the MoE block (§5.8, §5.9): router [E][H], each expert's gate and up [I][H], down [H][I] ----

struct Experts {
  std::vector<const bp::bf16*> gate, up, down;  // one an expert of the model, null where not held
  int E = 0, I = 0;
  bp::ref::ExpertWeights view() const { return {gate.data(), up.data(), down.data()}; }
};

// Experts first .. first + gate.size() − 1 of the model's E, each [I, H], [I, H], [H, I].
Experts held_experts(const On& on, int64_t H, int64_t E, int64_t first, const std::vector<Tensor>& gate,
                     const std::vector<Tensor>& up, const std::vector<Tensor>& down) {
  Experts x;
  x.E = as_int(E, "experts");
  const int held = as_int(static_cast<int64_t>(gate.size()), "experts held");
  TORCH_CHECK(up.size() == gate.size() && down.size() == gate.size(), "bitparity: ", gate.size(), " gate, ",
              up.size(), " up and ", down.size(), " down weights given");
  TORCH_CHECK(first >= 0 && first + held <= x.E, "bitparity: experts ", first, " .. ", first + held - 1,
              " are not experts of the model's ", x.E);
  x.I = held ? as_int(gate[0].size(0), "intermediate") : 0;
  x.gate.assign(x.E, nullptr);
  x.up.assign(x.E, nullptr);
  x.down.assign(x.E, nullptr);
  for (int j = 0; j < held; ++j) {
    for (const auto& [t, name] : {std::pair{&gate[j], "gate"}, {&up[j], "up"}, {&down[j], "down"}})
      on.check(*t, name, torch::kBFloat16, 2);
    TORCH_CHECK(gate[j].size(0) == x.I && gate[j].size(1) == H && up[j].sizes() == gate[j].sizes() &&
                    down[j].size(0) == H && down[j].size(1) == x.I,
                "bitparity: expert ", first + j, "'s weights are not [I, H], [I, H], [H, I]");
    x.gate[first + j] = bf(gate[j]);
    x.up[first + j] = bf(up[j]);
    x.down[first + j] = bf(down[j]);
  }
  return x;
}

// The block's input a [T][H] and router wr [E][H].
void check_router(const On& on, const Tensor& a, const Tensor& wr) {
  on.check(a, "a", torch::kBFloat16, 2);
  on.check(wr, "router", torch::kBFloat16, 2);
  TORCH_CHECK(wr.size(1) == a.size(1), "bitparity: the router takes ", wr.size(1), " features, a has ", a.size(1));
}

Experts experts_of(const On& on, const Tensor& a, const Tensor& wr, const std::vector<Tensor>& gate,
                   const std::vector<Tensor>& up, const std::vector<Tensor>& down) {
  check_router(on, a, wr);
  TORCH_CHECK(gate.size() == static_cast<size_t>(wr.size(0)), "bitparity: ", wr.size(0),
              " experts in the router, ", gate.size(), " given");
  return held_experts(on, a.size(1), wr.size(0), 0, gate, up, down);
}

Tensor moe_fwd(const Tensor& a, const Tensor& wr, const std::vector<Tensor>& gate, const std::vector<Tensor>& up,
               const std::vector<Tensor>& down, int64_t k, bool norm_topk_prob, const std::string& contract) {
  const On on(a);
  const Experts x = experts_of(on, a, wr, gate, up, down);
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden");
  Tensor out = on.bf16({T, H});
  BP_OP(on, moe_layer_fwd, knobs(contract), bf(a), bf(wr), x.view(), bf_out(out), T, H, x.E, as_int(k, "top-k"), x.I,
        norm_topk_prob);
  return out;
}

// The block's backward into da, dwr and the experts' gradients at dg, du, dd (one pointer an expert).
void moe_bwd_into(const On& on, const Experts& x, const Tensor& a, const Tensor& wr, const Tensor& dout, Tensor& da,
                  Tensor& dwr, std::vector<float*>& dg, std::vector<float*>& du, std::vector<float*>& dd, int64_t k,
                  bool norm_topk_prob, const std::string& contract) {
  on.check(dout, "grad", torch::kBFloat16, 2);
  TORCH_CHECK(dout.sizes() == a.sizes(), "bitparity: the gradient's shape is not the block's output's");
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden");
  BP_OP(on, moe_layer_bwd, knobs(contract), bf(a), bf(wr), x.view(), bf(dout), bf_out(da), dwr.data_ptr<float>(),
        bp::ref::ExpertGrads{dg.data(), du.data(), dd.data()}, T, H, x.E, as_int(k, "top-k"), x.I, norm_topk_prob);
}

// (da, dwr, then every expert's gate, up and down gradients, expert by expert).
std::vector<Tensor> moe_bwd(const Tensor& a, const Tensor& wr, const std::vector<Tensor>& gate,
                            const std::vector<Tensor>& up, const std::vector<Tensor>& down, const Tensor& dout, int64_t k,
                            bool norm_topk_prob, const std::string& contract) {
  const On on(a);
  const Experts x = experts_of(on, a, wr, gate, up, down);
  const int64_t H = a.size(1);
  std::vector<Tensor> out = {on.bf16(a.sizes()), on.f32({x.E, H})};
  std::vector<float*> dg, du, dd;
  for (int e = 0; e < x.E; ++e) {
    for (auto [grads, rows, cols] : {std::tuple{&dg, int64_t{x.I}, H}, {&du, x.I, H}, {&dd, H, x.I}}) {
      out.push_back(on.f32({rows, cols}));
      grads->push_back(out.back().data_ptr<float>());
    }
  }
  moe_bwd_into(on, x, a, wr, dout, out[0], out[1], dg, du, dd, k, norm_topk_prob, contract);
  return out;
}

// ---- the MoE block's stages, for expert parallelism (SPEC.md §7: route, exchange, experts, combine) ----

// (logits [T][E] bf16, ids [T][k] int32, topk_w [T][k] bf16) of the rows of a.
std::vector<Tensor> router_fwd(const Tensor& a, const Tensor& wr, int64_t k, bool norm_topk_prob,
                               const std::string& contract) {
  const On on(a);
  check_router(on, a, wr);
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden"), E = as_int(wr.size(0), "experts");
  const int K = as_int(k, "top-k");
  Tensor logits = on.bf16({T, E}), topk_w = on.bf16({T, K});
  Tensor ids = torch::empty({T, K}, torch::dtype(torch::kInt32).device(a.device()));
  BP_OP(on, router_fwd, knobs(contract), bf(a), bf(wr), bf_out(logits), ids.data_ptr<int32_t>(), bf_out(topk_w), T, H,
        E, K, norm_topk_prob);
  return {logits, ids, topk_w};
}

// (dlogits [T][E] bf16, da_acc [T][H] fp32, dwr [E][H] fp32 over these rows alone).
std::vector<Tensor> router_bwd(const Tensor& a, const Tensor& wr, const Tensor& logits, const Tensor& ids,
                               const Tensor& dtopk_w, bool norm_topk_prob, const std::string& contract) {
  const On on(a);
  check_router(on, a, wr);
  on.check(logits, "logits", torch::kBFloat16, 2);
  on.check(ids, "ids", torch::kInt32, 2);
  on.check(dtopk_w, "the routing weights' gradient", torch::kBFloat16, 2);
  const int T = as_int(a.size(0), "tokens"), H = as_int(a.size(1), "hidden"), E = as_int(wr.size(0), "experts");
  const int K = as_int(ids.size(1), "top-k");
  TORCH_CHECK(logits.size(0) == T && logits.size(1) == E && ids.size(0) == T && dtopk_w.sizes() == ids.sizes(),
              "bitparity: the router's logits, ids and gradient do not match its rows");
  Tensor dlogits = on.bf16({T, E}), da_acc = on.f32({T, H}), dwr = on.f32({E, H});
  BP_OP(on, router_bwd, knobs(contract), bf(a), bf(wr), bf(logits), ids.data_ptr<int32_t>(), bf(dtopk_w),
        bf_out(dlogits), da_acc.data_ptr<float>(), dwr.data_ptr<float>(), T, H, E, K, norm_topk_prob);
  return {dlogits, da_acc, dwr};
}

// A range of experts' stage over rows a [T][H] routed by ids and topk_w [T][k]: the
// held experts, the dispatch plan (host memory: the CUDA experts plan their gathers on
// the host) and the sizes.
struct ExpertStage {
  Experts x;
  std::vector<int> offset, token, slot;
  int T, K, H, first, last;
  bp::ref::MoeDispatch plan() const { return {x.E, offset.data(), token.data(), slot.data()}; }
};

ExpertStage expert_stage(const On& on, const Tensor& a, const Tensor& topk_w, const Tensor& ids, int64_t num_experts,
                         int64_t first, const std::vector<Tensor>& gate, const std::vector<Tensor>& up,
                         const std::vector<Tensor>& down) {
  on.check(a, "a", torch::kBFloat16, 2);
  on.check(topk_w, "topk_w", torch::kBFloat16, 2);
  on.check(ids, "ids", torch::kInt32, 2);
  TORCH_CHECK(topk_w.sizes() == ids.sizes() && ids.size(0) == a.size(0), "bitparity: ids and topk_w are not [T, k]");
  ExpertStage s{held_experts(on, a.size(1), num_experts, first, gate, up, down), {}, {}, {},
                as_int(a.size(0), "tokens"), as_int(ids.size(1), "top-k"), as_int(a.size(1), "hidden"),
                as_int(first, "first"), as_int(first + static_cast<int64_t>(gate.size()), "last")};
  s.offset.resize(s.x.E + 1);
  s.token.resize(static_cast<size_t>(s.T) * s.K);
  s.slot.resize(s.token.size());
  const Tensor host = ids.cpu();
  bp::ref::moe_dispatch(host.data_ptr<int32_t>(), s.T, s.K, s.x.E, s.offset.data(), s.token.data(), s.slot.data());
  return s;
}

// c [T][k][H]: the rows (t, j) routed to experts first .. first + held − 1 of E; +0 elsewhere.
Tensor moe_experts_fwd(const Tensor& a, const Tensor& topk_w, const Tensor& ids, int64_t num_experts, int64_t first,
                       const std::vector<Tensor>& gate, const std::vector<Tensor>& up, const std::vector<Tensor>& down,
                       const std::string& contract) {
  const On on(a);
  const ExpertStage s = expert_stage(on, a, topk_w, ids, num_experts, first, gate, up, down);
  Tensor c = torch::zeros({s.T, s.K, s.H}, torch::dtype(torch::kBFloat16).device(a.device()));
  BP_OP(on, moe_experts_fwd, knobs(contract), s.plan(), s.first, s.last, bf(a), bf(topk_w), s.x.view(), bf_out(c),
        s.K, s.H, s.x.I);
  return c;
}

// (da_slot [T][k][H] fp32, dtopk_w [T][k] bf16: +0 on rows of experts not held; then
// each held expert's gate, up and down gradients), for dout [T][H].
std::vector<Tensor> moe_experts_bwd(const Tensor& a, const Tensor& topk_w, const Tensor& ids, int64_t num_experts,
                                    int64_t first, const std::vector<Tensor>& gate, const std::vector<Tensor>& up,
                                    const std::vector<Tensor>& down, const Tensor& dout, const std::string& contract) {
  const On on(a);
  const ExpertStage s = expert_stage(on, a, topk_w, ids, num_experts, first, gate, up, down);
  on.check(dout, "grad", torch::kBFloat16, 2);
  TORCH_CHECK(dout.sizes() == a.sizes(), "bitparity: the gradient's shape is not a's");
  std::vector<Tensor> out = {torch::zeros({s.T, s.K, s.H}, torch::dtype(torch::kFloat32).device(a.device())),
                             torch::zeros({s.T, s.K}, torch::dtype(torch::kBFloat16).device(a.device()))};
  std::vector<float*> dg(s.x.E, nullptr), du(s.x.E, nullptr), dd(s.x.E, nullptr);
  for (int e = s.first; e < s.last; ++e) {
    for (auto [grads, rows, cols] : {std::tuple{&dg, int64_t{s.x.I}, int64_t{s.H}}, {&du, s.x.I, s.H},
                                     {&dd, s.H, s.x.I}}) {
      out.push_back(on.f32({rows, cols}));
      (*grads)[e] = out.back().data_ptr<float>();
    }
  }
  BP_OP(on, moe_experts_bwd, knobs(contract), s.plan(), s.first, s.last, bf(a), bf(topk_w), s.x.view(), bf(dout),
        out[0].data_ptr<float>(), bf_out(out[1]), bp::ref::ExpertGrads{dg.data(), du.data(), dd.data()}, s.K, s.H,
        s.x.I);
  return out;
}

// out [T][H] = R(Σ_j c[t][j]), slots in order.
Tensor moe_combine_fwd(const Tensor& c) {
  const On on(c);
  on.check(c, "c", torch::kBFloat16, 3);
  const int T = as_int(c.size(0), "tokens"), K = as_int(c.size(1), "top-k"), H = as_int(c.size(2), "hidden");
  Tensor out = on.bf16({T, H});
  BP_OP(on, moe_combine_fwd, bf(c), bf_out(out), T, K, H);
  return out;
}

// da [T][H] = R(Σ_j da_slot[t][j] + router_da_acc[t]).
Tensor moe_combine_bwd(const Tensor& da_slot, const Tensor& router_da_acc) {
  const On on(da_slot);
  on.check(da_slot, "da_slot", torch::kFloat32, 3);
  on.check(router_da_acc, "the router's accumulator", torch::kFloat32, 2);
  const int T = as_int(da_slot.size(0), "tokens"), K = as_int(da_slot.size(1), "top-k");
  const int H = as_int(da_slot.size(2), "hidden");
  TORCH_CHECK(router_da_acc.size(0) == T && router_da_acc.size(1) == H,
              "bitparity: the router's accumulator is not [T, H]");
  Tensor da = on.bf16({T, H});
  BP_OP(on, moe_combine_bwd, da_slot.data_ptr<float>(), router_da_acc.data_ptr<float>(), bf_out(da), T, K, H);
  return da;
}

// transformers 5's stacked experts: gate_up [E][2I][H] (an expert's gate rows, then its up
// rows) and down [E][H][I], as each expert's own weights (views, no copy).
struct Unstacked {
  std::vector<Tensor> gate, up, down;
};

Unstacked unstack(const Tensor& gate_up, const Tensor& down) {
  TORCH_CHECK(gate_up.dim() == 3 && down.dim() == 3 && gate_up.size(0) == down.size(0) && gate_up.size(1) % 2 == 0,
              "bitparity: stacked experts are gate_up [E, 2I, H] and down [E, H, I]");
  const int64_t I = gate_up.size(1) / 2;
  Unstacked u;
  for (int64_t e = 0; e < gate_up.size(0); ++e) {
    u.gate.push_back(gate_up[e].narrow(0, 0, I));
    u.up.push_back(gate_up[e].narrow(0, I, I));
    u.down.push_back(down[e]);
  }
  return u;
}

Tensor moe_stacked_fwd(const Tensor& a, const Tensor& wr, const Tensor& gate_up, const Tensor& down, int64_t k,
                       bool norm_topk_prob, const std::string& contract) {
  const Unstacked u = unstack(gate_up, down);
  return moe_fwd(a, wr, u.gate, u.up, u.down, k, norm_topk_prob, contract);
}

// (da, dwr, dgate_up [E][2I][H], ddown [E][H][I]): the experts' gradients stacked as their weights.
std::vector<Tensor> moe_stacked_bwd(const Tensor& a, const Tensor& wr, const Tensor& gate_up, const Tensor& down,
                                    const Tensor& dout, int64_t k, bool norm_topk_prob, const std::string& contract) {
  const On on(a);
  const Unstacked u = unstack(gate_up, down);
  const Experts x = experts_of(on, a, wr, u.gate, u.up, u.down);
  std::vector<Tensor> out = {on.bf16(a.sizes()), on.f32({x.E, a.size(1)}), on.f32(gate_up.sizes()),
                             on.f32(down.sizes())};
  std::vector<float*> dg, du, dd;
  for (int e = 0; e < x.E; ++e) {
    dg.push_back(out[2][e].data_ptr<float>());
    du.push_back(out[2][e][x.I].data_ptr<float>());
    dd.push_back(out[3][e].data_ptr<float>());
  }
  moe_bwd_into(on, x, a, wr, dout, out[0], out[1], dg, du, dd, k, norm_topk_prob, contract);
  return out;
}

// ---- tensor-parallel pieces (SPEC.md §7): subtrees of a C-chunk reduction, the tree over ranks ----

// acc[t][n]: x's K slice against w's, cut into k_chunks chunks of chunk_len (a rank's
// whole aligned subtree of the unsharded C chunks of ⌈K/C⌉), fp32, unrounded.
Tensor linear_acc(const Tensor& x, const Tensor& w, int64_t k_chunks, int64_t chunk_len, const std::string& contract) {
  const On on(x);
  on.check(x, "x", torch::kBFloat16, 2);
  on.check(w, "weight", torch::kBFloat16, 2);
  TORCH_CHECK(x.size(1) == w.size(1), "bitparity: x has ", x.size(1), " features, the weight takes ", w.size(1));
  const int T = as_int(x.size(0), "tokens"), K = as_int(x.size(1), "K"), N = as_int(w.size(0), "N");
  Tensor acc = on.f32({T, N});
  BP_OP(on, linear_acc, knobs(contract), bf(x), bf(w), acc.data_ptr<float>(), T, K, N, as_int(k_chunks, "k_chunks"),
        as_int(chunk_len, "chunk_len"));
  return acc;
}

// The input-gradient accumulator of a column-parallel weight's N slice, likewise.
Tensor linear_dgrad_acc(const Tensor& dy, const Tensor& w, int64_t n_chunks, int64_t chunk_len,
                        const std::string& contract) {
  const On on(dy);
  on.check(dy, "grad", torch::kBFloat16, 2);
  on.check(w, "weight", torch::kBFloat16, 2);
  TORCH_CHECK(dy.size(1) == w.size(0), "bitparity: the gradient has ", dy.size(1), " features, the weight ", w.size(0));
  const int T = as_int(dy.size(0), "tokens"), K = as_int(w.size(1), "K"), N = as_int(w.size(0), "N");
  Tensor acc = on.f32({T, K});
  BP_OP(on, linear_dgrad_acc, knobs(contract), bf(dy), bf(w), acc.data_ptr<float>(), T, K, N,
        as_int(n_chunks, "n_chunks"), as_int(chunk_len, "chunk_len"));
  return acc;
}

// pairwise_tree over dim 0 of parts [P, ...] (the ranks' subtrees in rank order), fp32.
Tensor rank_tree(const Tensor& parts) {
  const On on(parts);
  TORCH_CHECK(parts.dim() >= 1, "bitparity: the ranks' partials are [ranks, ...]");
  on.check(parts, "the ranks' partials", torch::kFloat32, parts.dim());
  const int64_t P = parts.size(0), n = P ? parts.numel() / P : 0;
  Tensor out = on.f32(parts.sizes().slice(1));
  const float* in = parts.data_ptr<float>();
#ifdef BITPARITY_WITH_CUDA
  if (on.is_cuda()) {
    std::vector<size_t> offsets;
    for (int64_t p = 0; p < P; ++p) offsets.push_back(static_cast<size_t>(p * n));
    bp::cuda::reduce_partials(in, offsets, static_cast<size_t>(n), bp::PartialSum::Tree, out.data_ptr<float>(),
                              on.stream());
    return out;
  }
#endif
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i)
    o[i] = bp::sum_partials(bp::PartialSum::Tree, static_cast<int>(P), static_cast<size_t>(i), static_cast<size_t>(n),
                            [&](int p) { return in[p * n + i]; });
  return out;
}

// R(((+0 + parts[0]) + parts[1]) + ...), elementwise: accumulators of one input added, rounded once.
Tensor sum_round(const std::vector<Tensor>& parts) {
  TORCH_CHECK(!parts.empty(), "bitparity: nothing to sum");
  const On on(parts[0]);
  Tensor out = on.bf16(parts[0].sizes());
  sum_round_into(on, parts, out);
  return out;
}

// ---- rope (§5.5): x [T][H·D], the tables of max_pos positions ----

// Computed on the CPU (the reference's own table); ops.py moves them to the activations' device.
std::vector<Tensor> rope_tables(double theta, int64_t head_dim, int64_t max_pos) {
  const int D = as_int(head_dim, "head_dim"), P = as_int(max_pos, "positions");
  Tensor c = torch::empty({P, D / 2}, torch::kBFloat16), s = torch::empty({P, D / 2}, torch::kBFloat16);
  bp::ref::rope_tables(static_cast<float>(theta), D, P, bf_out(c), bf_out(s));
  return {c, s};
}

Tensor rope_apply(const Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin, bool backward,
                  const std::string& contract) {
  const On on(x);
  on.check(x, "x", torch::kBFloat16, 2);
  on.check(positions, "positions", torch::kInt32, 1);
  on.check(cos, "cos table", torch::kBFloat16, 2);
  on.check(sin, "sin table", torch::kBFloat16, 2);
  const int T = as_int(x.size(0), "tokens"), D = as_int(cos.size(1) * 2, "head_dim");
  TORCH_CHECK(positions.size(0) == T, "bitparity: ", positions.size(0), " positions for ", T, " tokens");
  TORCH_CHECK(x.size(1) % D == 0, "bitparity: x has ", x.size(1), " features, not whole heads of ", D);
  const bp::ref::RopeTable table{bf(cos), bf(sin), as_int(cos.size(0), "positions"), D};
  Tensor out = on.bf16({T, x.size(1)});
  const int H = as_int(x.size(1) / D, "heads");
  if (backward)
    BP_OP(on, rope_bwd, knobs(contract), table, positions.data_ptr<int32_t>(), bf(x), bf_out(out), T, H);
  else
    BP_OP(on, rope_fwd, knobs(contract), table, positions.data_ptr<int32_t>(), bf(x), bf_out(out), T, H);
  return out;
}

// ---- logprob (§5.10): logits [R][V] of the target rows ----

std::vector<Tensor> logprob_fwd(const Tensor& logits, const Tensor& targets, double temperature,
                                const std::string& contract) {
  const On on(logits);
  on.check(logits, "logits", torch::kBFloat16, 2);
  on.check(targets, "targets", torch::kInt32, 1);
  const int R = as_int(logits.size(0), "rows"), V = as_int(logits.size(1), "vocab");
  TORCH_CHECK(targets.size(0) == R, "bitparity: ", targets.size(0), " targets for ", R, " rows");
  Tensor lp = on.f32({R}), row_max = on.f32({R}), row_sum = on.f32({R}), entropy = on.f32({R});
  BP_OP(on, logprob_fwd, knobs(contract), bf(logits), targets.data_ptr<int32_t>(), R, V,
        static_cast<float>(temperature), lp.data_ptr<float>(), row_max.data_ptr<float>(), row_sum.data_ptr<float>(),
        entropy.data_ptr<float>());
  return {lp, entropy, row_max, row_sum};
}

// The backward's tensors: bf16 logits, their targets, and per row the loss's coefficient
// and the forward's saved M and S.
void check_logprob_bwd_args(const On& on, const Tensor& logits, const Tensor& targets, const Tensor& coef,
                            const Tensor& row_max, const Tensor& row_sum) {
  on.check(logits, "logits", torch::kBFloat16, 2);
  on.check(targets, "targets", torch::kInt32, 1);
  for (const auto& [t, name] : {std::pair{&coef, "grad"}, {&row_max, "row_max"}, {&row_sum, "row_sum"}}) {
    on.check(*t, name, torch::kFloat32, 1);
    TORCH_CHECK(t->size(0) == logits.size(0), "bitparity: ", name, " is not one value a row");
  }
}

Tensor logprob_bwd(const Tensor& logits, const Tensor& targets, const Tensor& coef, const Tensor& row_max,
                   const Tensor& row_sum, double temperature, const std::string& contract) {
  const On on(logits);
  check_logprob_bwd_args(on, logits, targets, coef, row_max, row_sum);
  const int R = as_int(logits.size(0), "rows"), V = as_int(logits.size(1), "vocab");
  Tensor dlogits = on.bf16({R, V});
  BP_OP(on, logprob_bwd, knobs(contract), bf(logits), targets.data_ptr<int32_t>(), coef.data_ptr<float>(),
        row_max.data_ptr<float>(), row_sum.data_ptr<float>(), R, V, static_cast<float>(temperature),
        bf_out(dlogits));
  return dlogits;
}

// ---- the vocabulary-parallel logprob (§7): a rank's slice of whole chunks ----
// logits [T][vocab_len], this rank's n_chunks chunks of chunk_len from vocab_begin (the
// last ones shorter or absent past V); the partials are [T][n_chunks], gathered by the
// caller into the [T][C] of every chunk in order.

// v2's stage: each chunk's state (max, sum, tsum) and the target's scaled logit where
// this slice holds it (+0 elsewhere).
std::vector<Tensor> logprob_slice_states(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                                         int64_t n_chunks, int64_t chunk_len, double temperature,
                                         const std::string& contract) {
  const On on(logits);
  on.check(logits, "logits", torch::kBFloat16, 2);
  on.check(targets, "targets", torch::kInt32, 1);
  const int T = as_int(logits.size(0), "rows"), n = as_int(n_chunks, "n_chunks"), L = as_int(chunk_len, "chunk_len");
  const int len = as_int(logits.size(1), "vocab slice");
  TORCH_CHECK(targets.size(0) == T && len <= static_cast<int64_t>(n) * L, "bitparity: the slice's shapes disagree");
  const bp::Knobs& kn = knobs(contract);
  const float temp = static_cast<float>(temperature);
  Tensor m = on.f32({T, n}), s = on.f32({T, n}), w = on.f32({T, n}), x = on.f32({T}).zero_();
  BP_OP(on, logprob_chunk_states, kn, bf(logits), len, T, len, L, n, temp, m.data_ptr<float>(), s.data_ptr<float>(),
        w.data_ptr<float>(), n);
  BP_OP(on, logprob_target_logit, kn, bf(logits), len, T, as_int(vocab_begin, "vocab_begin"), len,
        targets.data_ptr<int32_t>(), temp, x.data_ptr<float>());
  return {m, s, w, x};
}

// v2's combine over the gathered [T][C] states and the holder's x: (logprob, entropy, M, S).
std::vector<Tensor> logprob_merge(const Tensor& m, const Tensor& s, const Tensor& w, const Tensor& x,
                                  const std::string& contract) {
  const On on(m);
  const bp::Knobs& kn = knobs(contract);
  for (const auto& [t, name] : {std::pair{&m, "chunk maxima"}, {&s, "chunk sums"}, {&w, "chunk tsums"}}) {
    on.check(*t, name, torch::kFloat32, 2);
    TORCH_CHECK(t->size(1) == kn.tp_tree_width && t->size(0) == m.size(0), "bitparity: ", name, " are not [rows, ",
                kn.tp_tree_width, "]");
  }
  on.check(x, "target logits", torch::kFloat32, 1);
  const int T = as_int(m.size(0), "rows");
  Tensor lp = on.f32({T}), entropy = on.f32({T}), M = on.f32({T}), S = on.f32({T});
  BP_OP(on, logprob_merge_states, kn, m.data_ptr<float>(), s.data_ptr<float>(), w.data_ptr<float>(),
        x.data_ptr<float>(), T, M.data_ptr<float>(), S.data_ptr<float>(), lp.data_ptr<float>(),
        entropy.data_ptr<float>());
  return {lp, entropy, M, S};
}

// v1's first stage: each chunk's maximum.
Tensor logprob_slice_max(const Tensor& logits, int64_t n_chunks, int64_t chunk_len, double temperature,
                         const std::string& contract) {
  const On on(logits);
  on.check(logits, "logits", torch::kBFloat16, 2);
  const int T = as_int(logits.size(0), "rows"), n = as_int(n_chunks, "n_chunks"), L = as_int(chunk_len, "chunk_len");
  const int len = as_int(logits.size(1), "vocab slice");
  Tensor m = on.f32({T, n});
  BP_OP(on, logprob_chunk_max, knobs(contract), bf(logits), len, T, len, L, n, static_cast<float>(temperature),
        m.data_ptr<float>(), n);
  return m;
}

// v1's row maximum over the gathered [T][C] chunk maxima.
Tensor logprob_row_max(const Tensor& chunk_max, const std::string& contract) {
  const On on(chunk_max);
  on.check(chunk_max, "chunk maxima", torch::kFloat32, 2);
  const bp::Knobs& kn = knobs(contract);
  TORCH_CHECK(chunk_max.size(1) == kn.tp_tree_width, "bitparity: the chunk maxima are not [rows, ", kn.tp_tree_width,
              "]");
  Tensor M = on.f32({chunk_max.size(0)});
  BP_OP(on, logprob_row_max, kn, chunk_max.data_ptr<float>(), as_int(chunk_max.size(0), "rows"), M.data_ptr<float>());
  return M;
}

// v1's second stage against the row maximum M: each chunk's (sum, tsum), the target's x.
std::vector<Tensor> logprob_slice_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                                       const Tensor& row_max, int64_t n_chunks, int64_t chunk_len, double temperature,
                                       const std::string& contract) {
  const On on(logits);
  on.check(logits, "logits", torch::kBFloat16, 2);
  on.check(targets, "targets", torch::kInt32, 1);
  on.check(row_max, "row maxima", torch::kFloat32, 1);
  const int T = as_int(logits.size(0), "rows"), n = as_int(n_chunks, "n_chunks"), L = as_int(chunk_len, "chunk_len");
  const int len = as_int(logits.size(1), "vocab slice");
  TORCH_CHECK(targets.size(0) == T && row_max.size(0) == T, "bitparity: the slice's shapes disagree");
  const bp::Knobs& kn = knobs(contract);
  const float temp = static_cast<float>(temperature);
  Tensor s = on.f32({T, n}), w = on.f32({T, n}), x = on.f32({T}).zero_();
  BP_OP(on, logprob_chunk_sums, kn, bf(logits), len, T, len, L, n, temp, row_max.data_ptr<float>(),
        s.data_ptr<float>(), w.data_ptr<float>(), n);
  BP_OP(on, logprob_target_logit, kn, bf(logits), len, T, as_int(vocab_begin, "vocab_begin"), len,
        targets.data_ptr<int32_t>(), temp, x.data_ptr<float>());
  return {s, w, x};
}

// v1's combine over the gathered [T][C] sums: (logprob, entropy, S).
std::vector<Tensor> logprob_combine(const Tensor& s, const Tensor& w, const Tensor& x, const Tensor& row_max,
                                    const std::string& contract) {
  const On on(s);
  const bp::Knobs& kn = knobs(contract);
  for (const auto& [t, name] : {std::pair{&s, "chunk sums"}, {&w, "chunk tsums"}}) {
    on.check(*t, name, torch::kFloat32, 2);
    TORCH_CHECK(t->size(1) == kn.tp_tree_width && t->size(0) == s.size(0), "bitparity: ", name, " are not [rows, ",
                kn.tp_tree_width, "]");
  }
  on.check(x, "target logits", torch::kFloat32, 1);
  on.check(row_max, "row maxima", torch::kFloat32, 1);
  const int T = as_int(s.size(0), "rows");
  Tensor lp = on.f32({T}), entropy = on.f32({T}), S = on.f32({T});
  BP_OP(on, logprob_combine, kn, s.data_ptr<float>(), w.data_ptr<float>(), x.data_ptr<float>(),
        row_max.data_ptr<float>(), T, S.data_ptr<float>(), lp.data_ptr<float>(), entropy.data_ptr<float>());
  return {lp, entropy, S};
}

// dlogits of this slice (either contract), given the whole rows' M and S.
Tensor logprob_bwd_slice(const Tensor& logits, const Tensor& targets, int64_t vocab_begin, const Tensor& coef,
                         const Tensor& row_max, const Tensor& row_sum, double temperature,
                         const std::string& contract) {
  const On on(logits);
  check_logprob_bwd_args(on, logits, targets, coef, row_max, row_sum);
  const int T = as_int(logits.size(0), "rows"), len = as_int(logits.size(1), "vocab slice");
  Tensor d = on.bf16({T, len});
  BP_OP(on, logprob_bwd_slice, knobs(contract), bf(logits), len, T, as_int(vocab_begin, "vocab_begin"), len,
        targets.data_ptr<int32_t>(), coef.data_ptr<float>(), row_max.data_ptr<float>(), row_sum.data_ptr<float>(),
        static_cast<float>(temperature), bf_out(d));
  return d;
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

// Tokens per weight-gradient chunk: the canonical order's chunks every weight gradient
// reduces by the pairwise tree (SPEC.md §4), which a token split (§7) moves between ranks.
int64_t grad_token_chunk(const std::string& contract) { return knobs(contract).grad_token_chunk; }

// Whether the contract's log-softmax is one-pass (v2's chunk states) or two-pass (v1).
bool log_softmax_one_pass(const std::string& contract) {
  return knobs(contract).log_softmax == bp::LogSoftmax::kOnePass;
}

// The chunks of a shardable reduction (a row-parallel layer's K, the LM head's input
// gradient's N): what linear's k_chunks and n_chunks take there.
int64_t tp_tree_width(const std::string& contract) { return knobs(contract).tp_tree_width; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "bitparity's contract ops: the reference on CPU tensors, optimized/cuda on CUDA ones; docs/torch-ops.md";
  m.def("built_with_cuda", &built_with_cuda);
  m.def("contract_names", &contract_names);
  m.def("knob_hash", &knob_hash);
  m.def("tp_tree_width", &tp_tree_width);
  m.def("log_softmax_one_pass", &log_softmax_one_pass);
  m.def("grad_token_chunk", &grad_token_chunk);
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
  m.def("moe_stacked_fwd", &moe_stacked_fwd);
  m.def("moe_stacked_bwd", &moe_stacked_bwd);
  m.def("router_fwd", &router_fwd);
  m.def("router_bwd", &router_bwd);
  m.def("moe_experts_fwd", &moe_experts_fwd);
  m.def("moe_experts_bwd", &moe_experts_bwd);
  m.def("moe_combine_fwd", &moe_combine_fwd);
  m.def("moe_combine_bwd", &moe_combine_bwd);
  m.def("linear_acc", &linear_acc);
  m.def("linear_dgrad_acc", &linear_dgrad_acc);
  m.def("rank_tree", &rank_tree);
  m.def("sum_round", &sum_round);
  m.def("rope_tables", &rope_tables);
  m.def("rope_apply", &rope_apply);
  m.def("logprob_fwd", &logprob_fwd);
  m.def("logprob_bwd", &logprob_bwd);
  m.def("logprob_slice_states", &logprob_slice_states);
  m.def("logprob_merge", &logprob_merge);
  m.def("logprob_slice_max", &logprob_slice_max);
  m.def("logprob_row_max", &logprob_row_max);
  m.def("logprob_slice_sums", &logprob_slice_sums);
  m.def("logprob_combine", &logprob_combine);
  m.def("logprob_bwd_slice", &logprob_bwd_slice);
}
