// Model::each_op: every captured op in float64 from the values that flow into it
// (qwen3.h). The ops are the same functions as Model::run's; only their inputs differ.
#include <cmath>
#include <stdexcept>

#include "attention.h"
#include "embedding.h"
#include "logprob.h"
#include "moe_router.h"
#include "qwen3.h"
#include "reference/model/model_graph.h"
#include "residual.h"
#include "rmsnorm.h"
#include "rope.h"

namespace bp::truth {

namespace {

using graph::Op;
using graph::Param;
using graph::capture_name;
using graph::param_name;

// The values flowing between ops: a given capture, else the op's own exact value
// (an op reading an uncaptured one is judged as the two composed).
class Flow {
 public:
  Flow(const std::map<std::string, std::vector<bf16>>& given, EachOp& out, int tokens)
      : given_(given), out_(out), tokens_(tokens) {}

  // Records op `name`'s float64 value.
  void set(const std::string& name, MatD value) { out_.ops[name] = std::move(value); }

  // What the ops reading capture `name` read: [tokens][features]; a given capture is
  // widened once, at its first read.
  const MatD& in(const std::string& name) {
    const MatD& own = out_.ops.at(name);
    const auto it = given_.find(name);
    if (it == given_.end()) return own;
    if (const auto w = widened_.find(name); w != widened_.end()) return w->second;
    if (it->second.size() != static_cast<size_t>(own.size()))
      throw std::invalid_argument("each_op: " + name + " has " + std::to_string(it->second.size()) + " values, not " +
                                  std::to_string(tokens_) + " tokens x " + std::to_string(own.cols()));
    return widened_.emplace(name, widen(it->second, tokens_, static_cast<int>(own.cols()))).first->second;
  }

 private:
  const std::map<std::string, std::vector<bf16>>& given_;
  EachOp& out_;
  int tokens_;
  std::map<std::string, MatD> widened_;
};

}  // namespace

EachOp Model::each_op(const std::vector<std::vector<int32_t>>& seqs,
                      const std::map<std::string, std::vector<bf16>>& given, double temperature) const {
  const int D = static_cast<int>(cfg_.head_dim), Hq = static_cast<int>(cfg_.num_attention_heads),
            Hkv = static_cast<int>(cfg_.num_key_value_heads);
  const double eps = cfg_.rms_norm_eps;
  std::vector<int32_t> tokens, positions;
  std::vector<int> starts;
  for (const auto& s : seqs) {
    if (s.empty()) throw std::invalid_argument("truth model: empty sequence");
    starts.push_back(static_cast<int>(tokens.size()));
    tokens.insert(tokens.end(), s.begin(), s.end());
    for (size_t t = 0; t < s.size(); ++t) positions.push_back(static_cast<int32_t>(t));
  }
  const int N = static_cast<int>(tokens.size());
  MatD cos, sin;
  rope_angles(rope_inv_freq(cfg_.rope_theta, D), positions, cos, sin);

  EachOp out;
  Flow f(given, out, N);
  f.set(capture_name(Op::Embed), embedding_fwd(tokens.data(), N, w(param_name(Param::Embed))));
  for (int64_t li = 0; li < cfg_.num_hidden_layers; ++li) {
    auto name = [&](Op op) { return capture_name(li, op); };
    auto linear = [&](Op op, Op input, Param p) { f.set(name(op), linear_fwd(f.in(name(input)), w(param_name(li, p)))); };
    const std::string x = graph::layer_input_name(li);
    f.set(name(Op::InputNorm), rmsnorm_fwd(f.in(x), vec(w(param_name(li, Param::InputNorm))), eps));
    linear(Op::QProj, Op::InputNorm, Param::QProj);
    linear(Op::KProj, Op::InputNorm, Param::KProj);
    linear(Op::VProj, Op::InputNorm, Param::VProj);
    f.set(name(Op::QNorm), unheads(rmsnorm_fwd(heads(f.in(name(Op::QProj)), D), vec(w(param_name(li, Param::QNorm))), eps), N));
    f.set(name(Op::KNorm), unheads(rmsnorm_fwd(heads(f.in(name(Op::KProj)), D), vec(w(param_name(li, Param::KNorm))), eps), N));
    f.set(name(Op::QRope), rope_fwd(f.in(name(Op::QNorm)), cos, sin, Hq, D));
    f.set(name(Op::KRope), rope_fwd(f.in(name(Op::KNorm)), cos, sin, Hkv, D));
    const MatD q = f.in(name(Op::QRope)), k = f.in(name(Op::KRope)), v = f.in(name(Op::VProj));
    MatD o(N, Hq * D);
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int first = starts[s], n = static_cast<int>(seqs[s].size());
      o.middleRows(first, n) =
          attention_fwd(q.middleRows(first, n), k.middleRows(first, n), v.middleRows(first, n), {Hq, Hkv, D, 0}).o;
    }
    f.set(name(Op::Attn), o);
    linear(Op::AttnOut, Op::Attn, Param::OProj);
    f.set(name(Op::ResidAttn), residual_fwd(f.in(x), f.in(name(Op::AttnOut))));
    f.set(name(Op::PostNorm), rmsnorm_fwd(f.in(name(Op::ResidAttn)), vec(w(param_name(li, Param::PostNorm))), eps));
    if (cfg_.is_moe_layer(li)) {
      const int K = static_cast<int>(cfg_.num_experts_per_tok);
      linear(Op::RouterLogits, Op::PostNorm, Param::Router);
      const MatD logits = f.in(name(Op::RouterLogits));
      const std::vector<int> ids = topk_ids(softmax_rows(logits), K);
      f.set(name(Op::RouterWeights), router_weights(logits, ids, K, cfg_.norm_topk_prob));
      const MatD a = f.in(name(Op::PostNorm)), tw = f.in(name(Op::RouterWeights));
      const Experts ex = experts(li);
      const int H = static_cast<int>(a.cols());
      MatD slots(N, K * H);  // slot j of token t: its weight times expert ids[t][j]'s output
      for (int t = 0; t < N; ++t)
        for (int j = 0; j < K; ++j)
          slots.block(t, j * H, 1, H) = tw(t, j) * expert_out(ex, ids[static_cast<size_t>(t) * K + j], a.row(t));
      f.set(name(Op::ExpertOut), slots);
      const MatD c = f.in(name(Op::ExpertOut));
      MatD sum = MatD::Zero(N, H);
      for (int j = 0; j < K; ++j) sum += c.middleCols(j * H, H);
      f.set(name(Op::MlpOut), sum);
    } else {
      linear(Op::MlpGate, Op::PostNorm, Param::MlpGate);
      linear(Op::MlpUp, Op::PostNorm, Param::MlpUp);
      f.set(name(Op::MlpAct), swiglu_fwd(f.in(name(Op::MlpGate)), f.in(name(Op::MlpUp))));
      linear(Op::MlpOut, Op::MlpAct, Param::MlpDown);
    }
    f.set(name(Op::ResidMlp), residual_fwd(f.in(name(Op::ResidAttn)), f.in(name(Op::MlpOut))));
  }
  const std::string last = graph::layer_input_name(cfg_.num_hidden_layers);
  f.set(capture_name(Op::FinalNorm), rmsnorm_fwd(f.in(last), vec(w(param_name(Param::FinalNorm))), eps));
  f.set(capture_name(Op::Logits), linear_fwd(f.in(capture_name(Op::FinalNorm)), lm_head()));
  const MatD logits = f.in(capture_name(Op::Logits));
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int n = static_cast<int>(seqs[s].size()) - 1;
    const MatD lg = logits.middleRows(starts[s], n);
    out.logprob.push_back(logprob_fwd(lg, std::vector<int32_t>(seqs[s].begin() + 1, seqs[s].end()), temperature));
    out.entropy.push_back(entropy(lg, temperature));
  }
  return out;
}

}  // namespace bp::truth
