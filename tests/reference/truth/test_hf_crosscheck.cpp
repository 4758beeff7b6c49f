// Cross-check against Hugging Face transformers (SPEC.md §8): checkpoints written by
// transformers' save_pretrained and its outputs (fixtures/hf/, generate.py) are
// loaded through the users' loader (load_hf_config, load_weights) and compared with
// bitparity's float64 truth (reference/truth/qwen3.h) and the bit-defined model.
//
// Semantics: HF float32 (eager attention, eager experts, no TF32) vs float64 truth,
//   within a bound derived from float32 rounding (SPEC.md §8.1). The truth's float32
//   storage model (every op output rounded to float32, the ops exact) measures the
//   network's response to one rounding per value: Δ_s = max_t |lp_s − lp_truth|. A
//   float32 implementation adds to each stored value its dot products' accumulation
//   error — about √K roundings for a length-K sum whose rounding errors are
//   independent (Higham & Mary 2019), K ≤ K_max = max(hidden, intermediate,
//   heads·head_dim, vocab, tokens) — and its elementary functions' (≤ 2 ulp), so
//     max_t |lp_hf32 − lp_truth| ≤ F·Δ_s,  F = 2·(1 + √K_max + 2),
//   the leading 2 a margin for correlated errors. Gradients: per parameter tensor,
//   ‖g_hf32 − g_truth‖₂ / ‖g_truth‖₂ ≤ F·ρ_s, ρ_s the largest such error of the
//   storage model's gradients (its backward exact) over the config's tensors. The
//   truth takes HF's coefficients (hf_outputs' coef.s) explicitly, as given.
//   A semantic slip (a RoPE half, the norm order, the GQA map, a routing rule) moves
//   logprobs by 1e-3 or more, far above these bounds (~1e-5).
// Accuracy: per named contract (v1, v2), the bit-defined logprobs are no less accurate than HF
//   bf16 eager against the truth: with d_t = |lp_c − lp_truth| − |lp_hf16 − lp_truth|,
//   mean(d) ≤ 2 standard errors of it, and the worst token's error is within twice HF's. Both errors are dominated by the same bf16
//   activation roundings, so "no worse" is a paired test (SPEC.md §8.3); the ratios
//   of mean and max errors are printed.
// Generations: each v2 contract's logprob error (max and mean over the tokens, against
//   HF float32 and against the truth) is at most twice its v1 twin's (same dot model;
//   issue 19, SPEC.md §8.3). v2 changes only the softmax exponential (exp2_poly,
//   ≤ 1.232 ulp) and the log-softmax's order (one pass): a few fp32 ulp per op (the op
//   suites' bounds). Through the network that is another draw of the bf16 activation
//   roundings that set both generations' errors (a flipped rounding moves one token by
//   up to 0.064 nats here), so no tighter relation is derived and the factor 2 is
//   issue 19's margin. Negative controls: three times v1's error, and one token moved
//   by twice v1's worst, fail it.
// Loader: the sharded checkpoint reads through its index, equal to its shards read one
//   by one; tied checkpoints hold no lm_head and use the embedding.
// Truth: central finite differences of L in double agree with its backward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "harness/io/checkpoint.h"
#include "harness/io/hf_config.h"
#include "harness/io/safetensors.h"
#include "host/model.h"
#include "reference/truth/qwen3.h"
#include "support/golden.h"

namespace {

using Seqs = std::vector<std::vector<int32_t>>;
using RowsD = std::vector<std::vector<double>>;

const std::vector<std::string> kConfigs = {"qwen3-dense-tiny",           "qwen3-moe-tiny",
                                           "dense-gqa1-untied-sharded",  "dense-gqa4-tied",
                                           "moe-gqa4-step2-nonorm-tied", "moe-gqa1-top3-nonorm",
                                           "dense-mqa8-oddsize-tied",    "moe-oddsize-untied"};

// One fixture directory: the checkpoint through the users' loader, the token
// sequences and every tensor of hf_outputs.safetensors (as fp32).
struct HfCase {
  std::string dir;
  bp::ModelConfig cfg;
  bp::Weights w;
  Seqs seqs;
  uint64_t coef_seed = 0;
  std::map<std::string, std::vector<float>> out;
  std::map<std::string, std::vector<uint64_t>> shape;

  // The loss coefficients HF's gradients were computed with (its coef.s tensors),
  // given to the truth explicitly, as a trainer's would be.
  bp::ref::LossCoefficients hf_coefs() const {
    std::vector<std::vector<float>> c;
    for (size_t s = 0; s < seqs.size(); ++s) c.push_back(out.at("coef." + std::to_string(s)));
    return bp::ref::LossCoefficients::explicit_values(std::move(c), dir + "/hf_outputs.safetensors coef.*");
  }

  RowsD rows(const std::string& prefix) const {
    RowsD r;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto& v = out.at(prefix + "." + std::to_string(s));
      r.emplace_back(v.begin(), v.end());
    }
    return r;
  }
};

const HfCase& hf_case(const std::string& name) {
  static std::map<std::string, HfCase> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  HfCase c;
  c.dir = bp::test::source_path("fixtures/hf/" + name);
  c.cfg = bp::io::load_hf_config(c.dir);
  c.w = bp::io::load_weights(c.dir, c.cfg);
  std::ifstream f(c.dir + "/hf_outputs.json");
  const nlohmann::json meta = nlohmann::json::parse(f);
  c.seqs = meta.at("tokens").get<Seqs>();
  c.coef_seed = meta.at("coef_seed").get<uint64_t>();
  const auto st = bp::io::SafetensorsFile::open(c.dir + "/hf_outputs.safetensors");
  for (const auto& t : st.tensors()) {
    c.out[t.name] = st.read_f32(t);
    c.shape[t.name] = t.shape;
  }
  return cache.emplace(name, std::move(c)).first->second;
}

// Truth results are shared by the tests of one config.
struct TruthRun {
  bp::truth::ForwardResult fwd, fwd_s;  // exact; float32 storage model
  bp::truth::BackwardResult bwd, bwd_s;
  double F = 0;  // SPEC.md §8.1
};
const TruthRun& truth_run(const std::string& name) {
  static std::map<std::string, TruthRun> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const HfCase& c = hf_case(name);
  const bp::truth::Model m(c.cfg, c.w);
  bp::truth::ForwardOptions st;
  st.fp32_storage = true;
  const bp::ref::LossCoefficients coefs = c.hf_coefs();
  TruthRun r{m.forward(c.seqs), m.forward(c.seqs, st), m.backward(c.seqs, coefs), m.backward(c.seqs, coefs, 1.0, true)};
  int64_t kmax = std::max({c.cfg.hidden_size, c.cfg.intermediate_size, c.cfg.moe_intermediate_size, c.cfg.q_dim(),
                           c.cfg.vocab_size});
  for (const auto& s : c.seqs) kmax = std::max<int64_t>(kmax, static_cast<int64_t>(s.size()));
  r.F = 2 * (1 + std::sqrt(static_cast<double>(kmax)) + 2);
  return cache.emplace(name, std::move(r)).first->second;
}

struct ErrStats {
  double max_abs = 0, mean_abs = 0;
};
ErrStats err_stats(const RowsD& a, const RowsD& truth) {
  ErrStats e;
  size_t n = 0;
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t t = 0; t < a[s].size(); ++t, ++n) {
      const double d = std::fabs(a[s][t] - truth[s][t]);
      e.max_abs = std::max(e.max_abs, d);
      e.mean_abs += d;
    }
  e.mean_abs /= static_cast<double>(n);
  return e;
}

template <class F>
RowsD widen_rows(const std::vector<std::vector<F>>& r) {
  RowsD o;
  for (const auto& v : r) o.emplace_back(v.begin(), v.end());
  return o;
}

// The bit-defined model's logprobs (extend path) under a named contract, widened.
const RowsD& contract_logprob(const std::string& config, const std::string& contract) {
  static std::map<std::pair<std::string, std::string>, RowsD> cache;
  const auto key = std::make_pair(config, contract);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const HfCase& c = hf_case(config);
  const bp::Contract* k = bp::find_contract(contract);
  if (k == nullptr) throw std::invalid_argument("no contract " + contract);
  const bp::host::Model m(c.cfg, c.w, k->knobs);
  return cache.emplace(key, widen_rows(m.forward(c.seqs, bp::program::Path::extend()).logprob)).first->second;
}

// ‖a − b‖₂ / ‖b‖₂.
template <class A>
double rel_err(const A& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

class HfCrossCheck : public ::testing::TestWithParam<std::string> {};

// The generator's Python port of counter_uniform gives loss_coef's exact bits.
TEST_P(HfCrossCheck, CoefficientsAreLossCoef) {
  const HfCase& c = hf_case(GetParam());
  uint64_t row = 0;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const auto& v = c.out.at("coef." + std::to_string(s));
    ASSERT_EQ(v.size(), c.seqs[s].size() - 1);
    for (float x : v) {
      const float want = bp::ref::loss_coef(c.coef_seed, row++);
      ASSERT_EQ(std::memcmp(&x, &want, sizeof x), 0) << "row " << row - 1;
    }
  }
}

// The truth's gradients under HF's coefficients given explicitly (which the
// gradient cross-check below uses) are the generated ones' bit for bit, the values
// being the same; one coefficient changed changes them (negative control).
TEST(Truth, ExplicitCoefficientsAreTheGeneratedOnesBits) {
  const HfCase& c = hf_case("dense-gqa4-tied");
  const TruthRun& tr = truth_run("dense-gqa4-tied");
  const bp::truth::Model m(c.cfg, c.w);
  const auto gen = m.backward(c.seqs, bp::ref::LossCoefficients::generated(c.coef_seed));
  for (const auto& [name, g] : gen.grads)
    EXPECT_EQ(std::memcmp(g.data(), tr.bwd.grads.at(name).data(), g.size() * sizeof(double)), 0) << name;
  std::vector<std::vector<float>> v = c.hf_coefs().for_batch(c.seqs);
  v[0][3] = -v[0][3];
  const auto other = m.backward(c.seqs, bp::ref::LossCoefficients::explicit_values(v));
  const auto& g = other.grads.at("model.norm.weight");
  EXPECT_NE(std::memcmp(g.data(), gen.grads.at("model.norm.weight").data(), g.size() * sizeof(double)), 0);
}

TEST_P(HfCrossCheck, SemanticsLogprobWithinFp32Bound) {
  const HfCase& c = hf_case(GetParam());
  const TruthRun& tr = truth_run(GetParam());
  const ErrStats e = err_stats(c.rows("logprob_fp32"), tr.fwd.logprob);
  const double ds = err_stats(tr.fwd_s.logprob, tr.fwd.logprob).max_abs;
  EXPECT_LE(e.max_abs, tr.F * ds);
  std::printf("[hf] %-28s fp32 vs truth: logprob max|d| %.3g mean|d| %.3g; storage model %.3g; bound %.1f x = %.3g "
              "(ratio %.3f)\n",
              GetParam().c_str(), e.max_abs, e.mean_abs, ds, tr.F, tr.F * ds, e.max_abs / (tr.F * ds));
}

TEST_P(HfCrossCheck, SemanticsGradientsWithinFp32Bound) {
  const HfCase& c = hf_case(GetParam());
  const TruthRun& tr = truth_run(GetParam());
  double rho_s = 0;
  for (const auto& [name, g] : tr.bwd.grads) rho_s = std::max(rho_s, rel_err(tr.bwd_s.grads.at(name), g));
  double worst = 0;
  std::string worst_name;
  size_t n = 0;
  for (const auto& [name, g] : tr.bwd.grads) {
    const auto it = c.out.find("grad." + name);
    ASSERT_NE(it, c.out.end()) << "no HF gradient for " << name;
    ASSERT_EQ(it->second.size(), g.size()) << name;
    const double r = rel_err(it->second, g);
    EXPECT_LE(r, tr.F * rho_s) << name;
    if (r > worst) worst = r, worst_name = name;
    ++n;
  }
  // hf_outputs holds 4 rows per sequence (logprob_fp32, _bf16, _bf16_default, coef), the rest gradients.
  EXPECT_EQ(n, c.out.size() - 4 * c.seqs.size()) << "every HF gradient is compared";
  std::printf("[hf] %-28s fp32 vs truth: gradients (%zu tensors) max rel err %.3g (%s); storage model %.3g; "
              "bound %.3g (ratio %.3f)\n",
              GetParam().c_str(), n, worst, worst_name.c_str(), rho_s, tr.F * rho_s, worst / (tr.F * rho_s));
}

// Per named contract: the bit-defined model's logprob error against the truth is no
// worse than HF bf16 eager's (mean |error| ratio ≤ 1).
TEST_P(HfCrossCheck, AccuracyNoWorseThanHfBf16Eager) {
  const HfCase& c = hf_case(GetParam());
  const TruthRun& tr = truth_run(GetParam());
  const ErrStats hf16 = err_stats(c.rows("logprob_bf16"), tr.fwd.logprob);
  const ErrStats hfdef = err_stats(c.rows("logprob_bf16_default"), tr.fwd.logprob);
  std::printf("[hf] %-28s bf16 vs truth: HF eager max %.3g mean %.3g; HF default kernels max %.3g mean %.3g\n",
              GetParam().c_str(), hf16.max_abs, hf16.mean_abs, hfdef.max_abs, hfdef.mean_abs);
  for (const bp::Contract& k : bp::contracts()) {
    const char* name = k.name.c_str();
    const RowsD& lp = contract_logprob(GetParam(), k.name);
    const ErrStats e = err_stats(lp, tr.fwd.logprob);
    const RowsD hf = c.rows("logprob_bf16");
    double sum = 0, sum2 = 0, n = 0;  // paired differences of the absolute errors
    for (size_t s = 0; s < lp.size(); ++s)
      for (size_t t = 0; t < lp[s].size(); ++t, ++n) {
        const double d = std::fabs(lp[s][t] - tr.fwd.logprob[s][t]) - std::fabs(hf[s][t] - tr.fwd.logprob[s][t]);
        sum += d;
        sum2 += d * d;
      }
    const double mean = sum / n, se = std::sqrt((sum2 / n - mean * mean) / (n - 1));
    const ErrStats vs_hf = err_stats(lp, hf);
    std::printf("[hf] %-28s %-15s vs truth: max %.3g mean %.3g; ratio to HF eager: max %.3f mean %.3f; "
                "paired mean diff %+.2g (%.2f SE); vs HF eager itself: max %.3g mean %.3g\n",
                GetParam().c_str(), name, e.max_abs, e.mean_abs, e.max_abs / hf16.max_abs,
                e.mean_abs / hf16.mean_abs, mean, mean / se, vs_hf.max_abs, vs_hf.mean_abs);
    EXPECT_LE(mean, 2 * se) << name;
    EXPECT_LE(e.max_abs, 2 * hf16.max_abs) << name << ": worst token within twice HF eager's";
  }
}

// A contract generation's criterion: its error against a reference is at most
// `factor` times its predecessor's, in the worst token and on average (issue 19:
// v2 within twice v1; issue 56: v3 no worse than v2).
bool within(const ErrStats& newer, const ErrStats& older, double factor) {
  return newer.max_abs <= factor * older.max_abs && newer.mean_abs <= factor * older.mean_abs;
}

struct Generation {
  std::string older, newer;
  double factor;
};
const std::vector<Generation> kGenerations = {{"bf16-sm90tc-v1", "bf16-sm90tc-v2", 2.0},
                                              {"bf16-fmaseq-v1", "bf16-fmaseq-v2", 2.0},
                                              {"bf16-sm90tc-v2", "bf16-sm90tc-v3", 1.0},
                                              {"bf16-fmaseq-v2", "bf16-fmaseq-v3", 1.0}};

TEST_P(HfCrossCheck, AccuracyEachGenerationWithinItsBound) {
  const HfCase& c = hf_case(GetParam());
  const TruthRun& tr = truth_run(GetParam());
  const RowsD hf32 = c.rows("logprob_fp32");
  for (const auto& [older, newer, factor] : kGenerations) {
    const RowsD& lp1 = contract_logprob(GetParam(), older);
    const RowsD& lp2 = contract_logprob(GetParam(), newer);
    size_t moved_tokens = 0, tokens = 0;
    for (size_t s = 0; s < lp1.size(); ++s)
      for (size_t t = 0; t < lp1[s].size(); ++t, ++tokens) moved_tokens += lp1[s][t] != lp2[s][t];
    std::printf("[hf] %-28s %-15s vs %s itself: max |d| %.3g, %zu of %zu tokens differ\n", GetParam().c_str(),
                newer.c_str(), older.c_str(), err_stats(lp2, lp1).max_abs, moved_tokens, tokens);
    for (const auto& [ref_name, ref] : {std::pair<const char*, const RowsD*>{"HF fp32", &hf32}, {"truth", &tr.fwd.logprob}}) {
      const ErrStats e1 = err_stats(lp1, *ref), e2 = err_stats(lp2, *ref);
      std::printf("[hf] %-28s %-15s vs %-7s: max %.4g mean %.4g; %s max %.4g mean %.4g; ratio max %.3f mean %.3f\n",
                  GetParam().c_str(), newer.c_str(), ref_name, e2.max_abs, e2.mean_abs, older.c_str(), e1.max_abs,
                  e1.mean_abs, e2.max_abs / e1.max_abs, e2.mean_abs / e1.mean_abs);
      EXPECT_TRUE(within(e2, e1, factor)) << newer << " vs " << ref_name;
    }
    // Negative controls: the older one's error tripled token by token, and the newer
    // one with one token moved away from HF by twice the older one's worst error.
    const ErrStats e1 = err_stats(lp1, hf32);
    RowsD tripled = lp1, moved = lp2;
    for (size_t s = 0; s < tripled.size(); ++s)
      for (size_t t = 0; t < tripled[s].size(); ++t) tripled[s][t] = hf32[s][t] + 3 * (lp1[s][t] - hf32[s][t]);
    moved[0][0] = hf32[0][0] - 2 * e1.max_abs - 1e-6;
    EXPECT_FALSE(within(err_stats(tripled, hf32), e1, factor)) << "tripled " << older;
    EXPECT_FALSE(within(err_stats(moved, hf32), e1, factor)) << "moved " << newer;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, HfCrossCheck, ::testing::ValuesIn(kConfigs),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The index names several shards; loading through it equals reading each shard.
TEST(HfLoader, ShardedCheckpoint) {
  const HfCase& c = hf_case("dense-gqa1-untied-sharded");
  const auto ck = bp::io::Checkpoint::open(c.dir);
  EXPECT_GT(ck.num_files(), 1u);
  EXPECT_EQ(std::filesystem::path(ck.path()).filename(), "model.safetensors.index.json");
  size_t seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(c.dir)) {
    const std::string f = entry.path().filename().string();
    if (f.rfind("model-", 0) != 0) continue;
    const auto shard = bp::io::SafetensorsFile::open(entry.path().string());
    for (const auto& t : shard.tensors()) {
      const std::vector<bp::bf16> v = shard.read_bf16(t);
      EXPECT_TRUE(std::memcmp(v.data(), c.w.at(t.name).data.data(), v.size() * sizeof(bp::bf16)) == 0) << t.name;
      ++seen;
    }
  }
  EXPECT_EQ(seen, c.w.size());
  EXPECT_FALSE(c.cfg.tie_word_embeddings);
  EXPECT_TRUE(c.w.contains("lm_head.weight"));
}

// Tied checkpoints (transformers omits lm_head) load, and the logits use the embedding.
TEST(HfLoader, TiedEmbeddings) {
  for (const char* name : {"qwen3-dense-tiny", "dense-gqa4-tied", "moe-gqa4-step2-nonorm-tied"}) {
    const HfCase& c = hf_case(name);
    EXPECT_TRUE(c.cfg.tie_word_embeddings) << name;
    const auto ck = bp::io::Checkpoint::open(c.dir);
    EXPECT_EQ(ck.find("lm_head.weight"), nullptr) << name;
    EXPECT_FALSE(c.w.contains("lm_head.weight")) << name;
    EXPECT_EQ(&c.w.lm_head(c.cfg), &c.w.at("model.embed_tokens.weight")) << name;
  }
}

// Fourth-order central differences of L in double, h = 2^-10·max(|θ|, 2^-6), at a
// few entries of several parameters agree with the truth's backward:
// |fd − g| ≤ 1e-7·(|g| + 1e-3). Cancellation (≈ 2^-52·|L|/h ≈ 1e-11) is negligible;
// the h⁴ truncation term reaches 3e-8 relative on tied-embedding entries (they feed
// every logit), measured on these configs.
TEST(Truth, FiniteDifferences) {
  for (const char* name : {"dense-gqa4-tied", "moe-gqa4-step2-nonorm-tied"}) {
    const HfCase& c = hf_case(name);
    const bp::truth::Model m(c.cfg, c.w);
    const auto g = m.backward(c.seqs, bp::ref::LossCoefficients::generated(c.coef_seed)).grads;
    auto loss = [&](const bp::truth::Model& mm) {
      const auto lp = mm.forward(c.seqs).logprob;
      double L = 0;
      uint64_t row = 0;
      for (const auto& r : lp)
        for (double x : r) L += bp::ref::loss_coef(c.coef_seed, row++) * x;
      return L;
    };
    double worst = 0;
    for (const char* p : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                          "model.layers.0.self_attn.k_norm.weight", "model.layers.1.mlp.gate.weight",
                          "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"}) {
      if (!m.weights().count(p)) continue;
      const auto& gp = g.at(p);
      for (size_t k : {size_t{0}, gp.size() / 3, gp.size() - 1}) {
        const double theta = m.weights().at(p).data()[k];
        const double h = std::ldexp(std::max(std::fabs(theta), 0x1p-6), -10);
        auto shifted = [&](double d) {
          bp::truth::WeightsD w = m.weights();
          w.at(p).data()[k] += d;
          return loss(bp::truth::Model(c.cfg, std::move(w)));
        };
        const double fd = (8 * (shifted(h) - shifted(-h)) - (shifted(2 * h) - shifted(-2 * h))) / (12 * h);
        const double err = std::fabs(fd - gp[k]);
        EXPECT_LE(err, 1e-7 * (std::fabs(gp[k]) + 1e-3)) << name << " " << p << "[" << k << "] fd " << fd << " g "
                                                          << gp[k];
        worst = std::max(worst, err / (std::fabs(gp[k]) + 1e-3));
      }
    }
    std::printf("[hf] %-28s truth finite differences: max |fd - g| / (|g| + 1e-3) = %.3g\n", name, worst);
  }
}

}  // namespace
