// embedding: exact gather, the token-chunked scatter-add backward against float64
// truth (derived bound) and against its order written out by hand, composition
// invariance, negative controls, golden digests, edge inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "reference/common/rng.h"
#include "reference/numerics/reduce.h"
#include "reference/ops/embedding.h"
#include "reference/truth/embedding.h"
#include "support/bounds.h"
#include "support/golden.h"

namespace bp {
namespace {

using truth::MatD;

class EmbeddingTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
};

// Token ids from the counter hash; a small vocabulary makes repeats certain.
std::vector<int32_t> random_tokens(int T, int V, uint64_t seed) {
  std::vector<int32_t> t(T);
  for (int i = 0; i < T; ++i) t[i] = static_cast<int32_t>(counter_hash(seed, i) % static_cast<uint64_t>(V));
  return t;
}

// Gradients spread over 2^-20 .. 2^20, so fp32 sums of them round and their
// order shows in the bits (uniform [-1, 1) bf16 values mostly add exactly).
std::vector<bf16> wide_range_bf16(size_t n, uint64_t seed) {
  std::vector<bf16> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = round_bf16(counter_uniform(seed, i) * std::ldexp(1.0f, int(counter_hash(seed + 1, i) % 41) - 20));
  return v;
}

std::vector<float> backward(const Knobs& kn, const std::vector<int32_t>& tokens, const std::vector<bf16>& dout, int V,
                            int H) {
  std::vector<float> d(size_t(V) * H);
  ref::embedding_bwd(kn, tokens.data(), dout.data(), d.data(), static_cast<int>(tokens.size()), V, H);
  return d;
}

// At the real vocabulary, forward rows are bit copies; in the backward a row hit
// by one token is f(dout) of that token exactly, and every other row is +0.
TEST_P(EmbeddingTest, ExactAtRealVocab) {
  const int V = 151936, H = 64, T = 33;
  const auto table = random_bf16(size_t(V) * H, 1, 1.0f);
  auto tokens = random_tokens(T, V, 2);
  tokens[0] = 0;
  tokens[T - 1] = V - 1;
  std::vector<bf16> out(size_t(T) * H);
  ref::embedding_fwd(knobs(), tokens.data(), table.data(), out.data(), T, V, H);
  for (int t = 0; t < T; ++t)
    ASSERT_TRUE(
        std::equal(out.begin() + size_t(t) * H, out.begin() + size_t(t + 1) * H, table.begin() + size_t(tokens[t]) * H))
        << "token " << t;
  tokens[1] = tokens[0];  // one repeated id; the others are distinct with near certainty
  const auto dout = random_bf16(size_t(T) * H, 3, 1.0f);
  const std::vector<float> d = backward(knobs(), tokens, dout, V, H);
  std::vector<int> hits(V, 0);
  for (int32_t id : tokens) ++hits[id];
  for (int t = 2; t < T; ++t) {
    if (hits[tokens[t]] != 1) continue;
    for (int h = 0; h < H; ++h) ASSERT_EQ(d[size_t(tokens[t]) * H + h], widen(dout[size_t(t) * H + h]));
  }
  for (int h = 0; h < H; ++h) ASSERT_EQ(d[size_t(tokens[0]) * H + h], widen(dout[h]) + widen(dout[H + h]));
  for (int v = 0; v < V; ++v) {
    if (hits[v] != 0) continue;
    for (int h = 0; h < H; ++h) ASSERT_EQ(bits_of(d[size_t(v) * H + h]), 0u) << "row " << v;
  }
}

TEST_P(EmbeddingTest, OutOfRangeIdThrowsNamingIdAndVocabAndWritesNothing) {
  const int V = 10, H = 4;
  const std::vector<bf16> table(size_t(V) * H, round_bf16(1.0f)), dout(3 * H, round_bf16(1.0f));
  for (int32_t bad : {-1, V, 151936}) {
    const std::vector<int32_t> tokens = {1, bad, 2};
    std::vector<bf16> out(3 * H, bf16{0x1234});
    try {
      ref::embedding_fwd(knobs(), tokens.data(), table.data(), out.data(), 3, V, H);
      ADD_FAILURE() << "no exception for id " << bad;
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::to_string(bad)), std::string::npos) << what;
      EXPECT_NE(what.find(std::to_string(V)), std::string::npos) << what;
    }
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](bf16 v) { return v.bits == 0x1234; }));
    std::vector<float> d(size_t(V) * H, 7.0f);
    EXPECT_THROW(ref::embedding_bwd(knobs(), tokens.data(), dout.data(), d.data(), 3, V, H), std::invalid_argument);
    EXPECT_TRUE(std::all_of(d.begin(), d.end(), [](float v) { return v == 7.0f; }));
  }
}

// Each element of dtable is a sum of the f(dout) of its tokens: inside a chunk at
// most grad_token_chunk − 1 rounding adds (the first add to +0 is exact), then
// ceil(log2 chunks) tree levels. With m = that depth, the classic bound for
// recursive summation applies: |err| <= gamma_m · sum |terms|, gamma_m = m·u/(1 − m·u).
TEST_P(EmbeddingTest, BackwardWithinDerivedBound) {
  const int T = 700, V = 9, H = 40;  // ~78 repeats per id, over 6 chunks of 128
  const auto tokens = random_tokens(T, V, 3);
  const auto dout = wide_range_bf16(size_t(T) * H, 4);
  const std::vector<float> d = backward(knobs(), tokens, dout, V, H);
  const MatD D = truth::widen(dout, T, H);
  const MatD want = truth::embedding_bwd(tokens.data(), T, D, V),
             abs_sum = truth::embedding_bwd(tokens.data(), T, D.cwiseAbs(), V);
  const int chunks = (T + knobs().grad_token_chunk - 1) / knobs().grad_token_chunk;
  const int depth = knobs().grad_token_chunk - 1 + static_cast<int>(std::ceil(std::log2(chunks)));
  const double gamma = test::gamma_n(depth);
  double worst = 0;
  for (int v = 0; v < V; ++v)
    for (int h = 0; h < H; ++h) {
      const double err = std::fabs(d[size_t(v) * H + h] - want(v, h)), bound = gamma * abs_sum(v, h);
      ASSERT_LE(err, bound) << v << "," << h;
      worst = std::max(worst, err / bound);
    }
  RecordProperty("max_err_over_bound", std::to_string(worst));
}

// The order, written out: chunks of 2 tokens, plain adds from +0 in increasing t,
// chunk partials by the pairwise tree (odd last partial moves up).
TEST_P(EmbeddingTest, BackwardOrderByHand) {
  Knobs kn = knobs();
  kn.grad_token_chunk = 2;
  const int V = 4, H = 1;
  const std::vector<int32_t> tokens = {3, 3, 1, 3, 3, 0, 3};
  const std::vector<float> g = {1.0f, 0x1p-24f, 5.0f, 0x1p-24f, 0x1p-24f, 2.0f, -1.0f};
  std::vector<bf16> dout;
  for (float x : g) dout.push_back(round_bf16(x));
  const std::vector<float> d = backward(kn, tokens, dout, V, H);
  const float p0 = (0.0f + g[0]) + g[1], p1 = 0.0f + g[3], p2 = 0.0f + g[4], p3 = 0.0f + g[6];
  EXPECT_EQ(bits_of(d[3]), bits_of((p0 + p1) + (p2 + p3)));
  EXPECT_EQ(d[3], 0x1p-24f);
  EXPECT_EQ((((g[0] + g[1]) + g[3]) + g[4]) + g[6], 0.0f) << "a sequential order gives other bits";
  EXPECT_EQ(bits_of(d[1]), bits_of(g[2]));
  EXPECT_EQ(bits_of(d[0]), bits_of(g[5]));
  EXPECT_EQ(bits_of(d[2]), 0u) << "a row never hit is +0";
}

// The bits of row v depend only on the tokens equal to v and their positions:
// changing every other token leaves them unchanged.
TEST_P(EmbeddingTest, BackwardRowDependsOnlyOnItsOwnTokens) {
  const int T = 600, V = 50, H = 16, v = 7;
  auto tokens = random_tokens(T, V, 5);
  const auto dout = wide_range_bf16(size_t(T) * H, 6);
  const std::vector<float> base = backward(knobs(), tokens, dout, V, H);
  for (int i = 0; i < T; ++i)  // every other token becomes another id, never v
    if (tokens[i] != v) tokens[i] = static_cast<int32_t>((v + 1 + counter_hash(12, i) % (V - 1)) % V);
  const std::vector<float> other = backward(knobs(), tokens, dout, V, H);
  EXPECT_TRUE(std::equal(base.begin() + v * H, base.begin() + (v + 1) * H, other.begin() + v * H));
}

// DP/CP: ranks holding 2^j whole chunks each reduce their subtrees; adding the rank
// results by the last tree levels gives the unsplit bits, for 1, 2 and 4 ranks.
TEST_P(EmbeddingTest, TokenSplitAcrossRanksGivesTheSameBits) {
  const int chunk = knobs().grad_token_chunk, T = 4 * chunk, V = 5, H = 32;
  const auto tokens = random_tokens(T, V, 13);
  const auto dout = wide_range_bf16(size_t(T) * H, 14);
  const std::vector<float> whole = backward(knobs(), tokens, dout, V, H);
  for (int ranks : {2, 4}) {
    const int share = T / ranks;
    std::vector<std::vector<float>> part(ranks);
    for (int r = 0; r < ranks; ++r)
      part[r] = backward(
          knobs(), std::vector<int32_t>(tokens.begin() + r * share, tokens.begin() + (r + 1) * share),
          std::vector<bf16>(dout.begin() + size_t(r) * share * H, dout.begin() + size_t(r + 1) * share * H), V, H);
    for (size_t i = 0; i < whole.size(); ++i) {
      std::vector<float> tops(ranks);
      for (int r = 0; r < ranks; ++r) tops[r] = part[r][i];
      ASSERT_EQ(bits_of(pairwise_tree(tops.data(), ranks)), bits_of(whole[i])) << "ranks " << ranks << " at " << i;
    }
  }
}

// Negative controls: another token chunk and the reversed token order change bits.
TEST_P(EmbeddingTest, NegativeControlChunkAndOrderChangeBits) {
  const int T = 1024, V = 3, H = 64;
  const auto tokens = random_tokens(T, V, 7);
  const auto dout = wide_range_bf16(size_t(T) * H, 8);
  const std::vector<float> base = backward(knobs(), tokens, dout, V, H);
  Knobs half = knobs();
  half.grad_token_chunk /= 2;
  EXPECT_NE(test::digest(base), test::digest(backward(half, tokens, dout, V, H)));
  std::vector<int32_t> rtokens(tokens.rbegin(), tokens.rend());
  std::vector<bf16> rdout(dout.size());
  for (int t = 0; t < T; ++t) std::copy_n(dout.begin() + size_t(t) * H, H, rdout.begin() + size_t(T - 1 - t) * H);
  EXPECT_NE(test::digest(base), test::digest(backward(knobs(), rtokens, rdout, V, H)));
}

TEST_P(EmbeddingTest, EdgeInputs) {
  const int V = 3, H = 4;
  const bf16 neg_zero = round_bf16(-0.0f), inf = round_bf16(INFINITY), ninf = round_bf16(-INFINITY), nan = bf16{0x7fc1};
  // One token (T = 1): its row is f(dout) exactly.
  const std::vector<bf16> one = {round_bf16(1.5f), neg_zero, bf16{0x0001}, ninf};
  std::vector<float> d = backward(knobs(), {2}, one, V, H);
  EXPECT_EQ(bits_of(d[8]), bits_of(1.5f));
  EXPECT_EQ(bits_of(d[9]), 0u) << "-0 becomes +0: the sum starts at +0";
  EXPECT_EQ(bits_of(d[10]), bits_of(widen(bf16{0x0001}))) << "subnormals are kept";
  EXPECT_EQ(bits_of(d[11]), 0xff800000u);
  // Repeated token: Inf + (-Inf) is NaN, NaN propagates (canonical in digests).
  const std::vector<bf16> two = {
      inf, nan, round_bf16(1.0f), round_bf16(1.0f), ninf, round_bf16(2.0f), round_bf16(2.0f), round_bf16(-1.0f)};
  d = backward(knobs(), {0, 0}, two, V, H);
  EXPECT_TRUE(is_nan(d[0]));
  EXPECT_TRUE(is_nan(d[1]));
  EXPECT_EQ(d[2], 3.0f);
  EXPECT_EQ(bits_of(d[3]), 0u) << "exact cancellation is +0";
  // T = 0: every row +0.
  d.assign(size_t(V) * H, 1.0f);
  ref::embedding_bwd(knobs(), nullptr, nullptr, d.data(), 0, V, H);
  EXPECT_TRUE(std::all_of(d.begin(), d.end(), [](float v) { return bits_of(v) == 0u; }));
}

TEST_P(EmbeddingTest, GoldenDigests) {
  const int T = 300, V = 40, H = 32;
  const auto table = random_bf16(size_t(V) * H, 9, 1.0f), dout = wide_range_bf16(size_t(T) * H, 10);
  const auto tokens = random_tokens(T, V, 11);
  std::vector<bf16> out(size_t(T) * H);
  ref::embedding_fwd(knobs(), tokens.data(), table.data(), out.data(), T, V, H);
  const std::string c = contract().name;
  test::expect_golden("ops/embedding.txt", c + ".fwd", test::digest(out));
  test::expect_golden("ops/embedding.txt", c + ".bwd", test::digest(backward(knobs(), tokens, dout, V, H)));
}

// Truth's backward against central differences of L = sum c·out (linear, so only
// float64 cancellation error remains).
TEST(EmbeddingTruth, BackwardMatchesFiniteDifferences) {
  const int V = 4, H = 3;
  const std::vector<int32_t> tokens = {2, 0, 2, 2};
  const int T = static_cast<int>(tokens.size());
  const MatD table = MatD::Random(V, H), C = MatD::Random(T, H);
  const MatD grad = truth::embedding_bwd(tokens.data(), T, C, V);
  auto loss = [&](const MatD& w) { return (truth::embedding_fwd(tokens.data(), T, w).array() * C.array()).sum(); };
  const double h = 1e-6;
  for (int v = 0; v < V; ++v)
    for (int j = 0; j < H; ++j) {
      MatD p = table, m = table;
      p(v, j) += h;
      m(v, j) -= h;
      EXPECT_NEAR((loss(p) - loss(m)) / (2 * h), grad(v, j), 1e-8);
    }
}

INSTANTIATE_TEST_SUITE_P(Contracts, EmbeddingTest, ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1"),
                         [](const auto& info) { return std::string(info.param).substr(5, 6); });

}  // namespace
}  // namespace bp
