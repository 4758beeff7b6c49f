// linear: accuracy against float64 truth (derived bound), batch invariance,
// chunked-K semantics with negative controls, golden digests, edge inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "reference/common/rng.h"
#include "reference/numerics/chunked.h"
#include "reference/numerics/reduce.h"
#include "reference/ops/linear.h"
#include "reference/truth/linear.h"
#include "support/bounds.h"
#include "support/golden.h"

namespace bp {
namespace {

using truth::MatD;

struct Shape {
  int T, K, N, chunks;
};

class LinearTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
};

// Checks every element of a bf16 result against truth with the bound of a dot
// over k terms: |y - t| <= u16|t| + (1+u16)·gamma·sum|a b|, sum|a b| from |A|·|B|.
void expect_within_dot_bound(const std::vector<bf16>& y, const MatD& truth, const MatD& abs_sum, DotModel model,
                             int k, int chunks) {
  const double gamma = test::dot_gamma(model, k, chunks);
  int bad = 0;
  for (int r = 0; r < truth.rows(); ++r)
    for (int c = 0; c < truth.cols(); ++c) {
      const double got = widen(y[static_cast<size_t>(r) * truth.cols() + c]);
      const double bound = test::bf16_output_bound(truth(r, c), gamma * abs_sum(r, c));
      if (std::fabs(got - truth(r, c)) > bound && ++bad < 5)
        ADD_FAILURE() << "(" << r << "," << c << ") got " << got << " truth " << truth(r, c) << " bound " << bound;
    }
  EXPECT_EQ(bad, 0);
}

TEST_P(LinearTest, ForwardWithinDerivedBound) {
  for (const Shape s : {Shape{5, 64, 24, 1}, Shape{3, 2048, 16, 1}, Shape{2, 4096, 8, 8}, Shape{4, 768, 12, 8},
                        Shape{3, 300, 12, 8}, Shape{4, 9, 10, 8}, Shape{2, 1001, 8, 8}}) {  // odd K: fixed chunks
    const auto x = random_bf16(size_t(s.T) * s.K, 1, 1.0f), w = random_bf16(size_t(s.N) * s.K, 2, 0.05f);
    std::vector<bf16> y(size_t(s.T) * s.N);
    ref::linear_fwd(knobs(), x.data(), w.data(), y.data(), s.T, s.K, s.N, s.chunks);
    const MatD X = truth::widen(x, s.T, s.K), W = truth::widen(w, s.N, s.K);
    expect_within_dot_bound(y, truth::linear_fwd(X, W), truth::linear_fwd(X.cwiseAbs(), W.cwiseAbs()), knobs().dot,
                            s.K, s.chunks);
  }
}

TEST_P(LinearTest, GradientsWithinDerivedBound) {
  const int T = 37, K = 48, N = 40;  // T over several token chunks of a small contract variant
  Knobs kn = knobs();
  kn.grad_token_chunk = 16;
  const auto x = random_bf16(size_t(T) * K, 3, 1.0f), w = random_bf16(size_t(N) * K, 4, 0.1f),
             dy = random_bf16(size_t(T) * N, 5, 1.0f);
  std::vector<bf16> dx(size_t(T) * K);
  std::vector<float> dw(size_t(N) * K);
  ref::linear_dgrad(kn, dy.data(), w.data(), dx.data(), T, K, N, 8);
  ref::linear_wgrad(kn, dy.data(), x.data(), dw.data(), T, K, N);
  const MatD X = truth::widen(x, T, K), W = truth::widen(w, N, K), DY = truth::widen(dy, T, N);
  expect_within_dot_bound(dx, truth::linear_dgrad(DY, W), truth::linear_dgrad(DY.cwiseAbs(), W.cwiseAbs()), kn.dot,
                          N, 8);
  // wgrad stays fp32: chunks of 16 tokens each from +0, then the tree over 3 chunks.
  const MatD tw = truth::linear_wgrad(DY, X), aw = truth::linear_wgrad(DY.cwiseAbs(), X.cwiseAbs());
  const double gamma = test::dot_gamma(kn.dot, 16) + 2 * test::kU32 * (1 + test::dot_gamma(kn.dot, 16));
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) ASSERT_LE(std::fabs(dw[size_t(n) * K + k] - tw(n, k)), gamma * aw(n, k));
}

// Truth's gradients against central differences of L = sum c·y (exact in
// float64 up to O(h^2) = 0 for a linear map, so only cancellation error remains).
TEST(LinearTruth, GradientsMatchFiniteDifferences) {
  const int T = 3, K = 5, N = 4;
  const MatD X = MatD::Random(T, K), W = MatD::Random(N, K), C = MatD::Random(T, N);
  const double h = 1e-6;
  const MatD dX = truth::linear_dgrad(C, W), dW = truth::linear_wgrad(C, X);
  auto loss = [&](const MatD& x, const MatD& w) { return (truth::linear_fwd(x, w).array() * C.array()).sum(); };
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) {
      MatD xp = X, xm = X;
      xp(t, k) += h;
      xm(t, k) -= h;
      EXPECT_NEAR((loss(xp, W) - loss(xm, W)) / (2 * h), dX(t, k), 1e-8);
    }
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      MatD wp = W, wm = W;
      wp(n, k) += h;
      wm(n, k) -= h;
      EXPECT_NEAR((loss(X, wp) - loss(X, wm)) / (2 * h), dW(n, k), 1e-8);
    }
}

// One row alone equals the same row inside batches of 2..64 other rows.
TEST_P(LinearTest, BatchInvariance) {
  const int K = 256, N = 32;
  const auto w = random_bf16(size_t(N) * K, 7, 0.1f), row = random_bf16(K, 8, 1.0f);
  std::vector<bf16> alone(N);
  ref::linear_fwd(knobs(), row.data(), w.data(), alone.data(), 1, K, N, 8);
  for (int batch : {2, 3, 17, 64}) {
    auto x = random_bf16(size_t(batch) * K, 100 + batch, 1.0f);
    const int at = batch / 2;
    std::copy(row.begin(), row.end(), x.begin() + size_t(at) * K);
    std::vector<bf16> y(size_t(batch) * N);
    ref::linear_fwd(knobs(), x.data(), w.data(), y.data(), batch, K, N, 8);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), y.begin() + size_t(at) * N)) << "batch " << batch;
  }
}

// Negative controls: another chunking of K (split-K) and the other dot model
// give other bits on the same inputs, so the equality checks above can fail.
TEST_P(LinearTest, NegativeControlSplitKAndModelChangeBits) {
  const int T = 16, K = 1024, N = 64;
  const auto x = random_bf16(size_t(T) * K, 9, 1.0f), w = random_bf16(size_t(N) * K, 10, 1.0f);
  std::vector<float> one(size_t(T) * N), split(size_t(T) * N), other(size_t(T) * N);
  ref::linear_acc(knobs(), x.data(), w.data(), one.data(), T, K, N, 1, K);
  ref::linear_acc(knobs(), x.data(), w.data(), split.data(), T, K, N, 2, K / 2);
  Knobs flipped = knobs();
  flipped.dot = knobs().dot == DotModel::Sm90Tc ? DotModel::FmaSeq : DotModel::Sm90Tc;
  ref::linear_acc(flipped, x.data(), w.data(), other.data(), T, K, N, 1, K);
  EXPECT_NE(test::digest(one), test::digest(split));
  EXPECT_NE(test::digest(one), test::digest(other));
}

// ---- Fixed chunks of any K (SPEC.md §2.4.1) ---------------------------------------

// Columns [k0, k1) of a [rows][k] matrix, as its own [rows][k1 - k0] matrix.
std::vector<bf16> columns(const std::vector<bf16>& m, int rows, int k, int k0, int k1) {
  std::vector<bf16> out;
  for (int r = 0; r < rows; ++r) out.insert(out.end(), m.begin() + size_t(r) * k + k0, m.begin() + size_t(r) * k + k1);
  return out;
}

// The C-chunk dot built from its definition: chunk c's chain over [begin(c), begin(c+1))
// from +0 (one-chunk linear_acc on the columns; an empty chunk gives +0), the C
// partials by pairwise_tree.
template <class Begin>
std::vector<float> chunk_tree(const Knobs& kn, const std::vector<bf16>& x, const std::vector<bf16>& w, int T, int K,
                              int N, int C, Begin begin) {
  std::vector<std::vector<float>> part(C, std::vector<float>(size_t(T) * N, 0.0f));
  for (int c = 0; c < C; ++c) {
    const int k0 = begin(c), k1 = begin(c + 1);
    if (k1 > k0)
      ref::linear_acc(kn, columns(x, T, K, k0, k1).data(), columns(w, N, K, k0, k1).data(), part[c].data(), T, k1 - k0,
                      N, 1, k1 - k0);
  }
  std::vector<float> out(size_t(T) * N), leaves(C);
  for (size_t i = 0; i < out.size(); ++i) {
    for (int c = 0; c < C; ++c) leaves[c] = part[c][i];
    out[i] = pairwise_tree(leaves.data(), C);
  }
  return out;
}

// K = 300, 9 and 3 in C = 8 chunks are the chunks of ⌈K/8⌉ (38: seven of 38 and one
// of 34; 2: chunk 4 one element, 5-7 empty; 1: chunks 3-7 empty), each from +0,
// combined by the tree of all 8 partials. Negative control: the balanced split of
// the same K (chunks ⌊cK/8⌋) gives other bits.
TEST_P(LinearTest, OddKIsTheFixedChunks) {
  constexpr int T = 6, N = 40, C = 8;
  for (const int K : {300, 9, 3}) {
    SCOPED_TRACE(K);
    const auto x = random_bf16(size_t(T) * K, 31 + K, 1.0f), w = random_bf16(size_t(N) * K, 32 + K, 1.0f);
    std::vector<float> acc(size_t(T) * N);
    const int n = (K + C - 1) / C;
    ref::linear_acc(knobs(), x.data(), w.data(), acc.data(), T, K, N, C, n);
    const auto fixed = chunk_tree(knobs(), x, w, T, K, N, C, [&](int c) { return std::min(c * n, K); });
    EXPECT_EQ(test::digest(acc), test::digest(fixed));
    if (K == 300) {
      const auto balanced = chunk_tree(knobs(), x, w, T, K, N, C, [&](int c) { return c * K / C; });
      EXPECT_NE(test::digest(acc), test::digest(balanced));
    }
  }
  std::vector<bf16> x(10), w(10), y(1);
  EXPECT_THROW(ref::linear_fwd(knobs(), x.data(), w.data(), y.data(), 1, 10, 1, 0), std::invalid_argument);
  std::vector<float> acc(1);
  EXPECT_THROW(ref::linear_acc(knobs(), x.data(), w.data(), acc.data(), 1, 10, 1, 4, 2), std::invalid_argument)
      << "4 chunks of 2 do not cover K = 10";
}

// A TP rank's slice of K = 300 (C = 8: chunks of 38) holds its C/tp chunks'
// elements, the tail rank fewer (tp 2: [0, 152) and [152, 300)); linear_acc on the
// slice with the whole's chunk length computes the rank's subtree, and the tree of
// the ranks' subtrees is the whole reduction (SPEC.md §2.4.1 "A rank's chunks").
// Negative control: the tail slice cut by its own length (148 in 4: chunks of 37).
TEST_P(LinearTest, RankSlicesOfOddKAreSubtrees) {
  constexpr int T = 5, K = 300, N = 24, C = 8, n = 38;
  const auto x = random_bf16(size_t(T) * K, 51, 1.0f), w = random_bf16(size_t(N) * K, 52, 1.0f);
  std::vector<float> whole(size_t(T) * N);
  ref::linear_acc(knobs(), x.data(), w.data(), whole.data(), T, K, N, C, n);
  for (const int tp : {2, 4, 8}) {
    SCOPED_TRACE(tp);
    std::vector<std::vector<float>> sub(tp, std::vector<float>(size_t(T) * N));
    for (int t = 0; t < tp; ++t) {
      const int k0 = std::min(t * (C / tp) * n, K), k1 = std::min((t + 1) * (C / tp) * n, K);
      ref::linear_acc(knobs(), columns(x, T, K, k0, k1).data(), columns(w, N, K, k0, k1).data(), sub[t].data(), T,
                      k1 - k0, N, C / tp, n);
      if (t == tp - 1 && tp < C) {
        std::vector<float> own(size_t(T) * N);
        ref::linear_acc(knobs(), columns(x, T, K, k0, k1).data(), columns(w, N, K, k0, k1).data(), own.data(), T,
                        k1 - k0, N, C / tp, (k1 - k0 + C / tp - 1) / (C / tp));
        EXPECT_NE(test::digest(own), test::digest(sub[t])) << "the tail slice's own chunk length";
      }
    }
    std::vector<float> tree(size_t(T) * N), leaves(tp);
    for (size_t i = 0; i < tree.size(); ++i) {
      for (int t = 0; t < tp; ++t) leaves[t] = sub[t][i];
      tree[i] = pairwise_tree(leaves.data(), tp);
    }
    EXPECT_EQ(test::digest(whole), test::digest(tree));
  }
}

// The input gradient's fixed chunks over an odd N are the forward's over K = N:
// dgrad(dy, w) is linear_acc(dy, wᵀ) bit for bit.
TEST_P(LinearTest, OddNInputGradientIsTheFixedChunks) {
  constexpr int T = 5, K = 24, N = 300, C = 8;
  const auto dy = random_bf16(size_t(T) * N, 41, 1.0f), w = random_bf16(size_t(N) * K, 42, 0.1f);
  std::vector<bf16> wt(w.size());
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) wt[size_t(k) * N + n] = w[size_t(n) * K + k];
  std::vector<float> dx(size_t(T) * K), want(size_t(T) * K);
  ref::linear_dgrad_acc(knobs(), dy.data(), w.data(), dx.data(), T, K, N, C, fixed_chunk_len(N, C));
  ref::linear_acc(knobs(), dy.data(), wt.data(), want.data(), T, N, K, C, fixed_chunk_len(N, C));
  EXPECT_EQ(test::digest(dx), test::digest(want));
}

// Zero padding to the next multiple of C (SPEC.md §2.4.1): under sm90-tc zero
// products take no part, so it always gives the fixed chunks' bits; under fma-seq
// it differs exactly where a short chunk's chain is −0 (an underflowed negative
// product): fma(+0, +0, −0) = +0. Here every product is −2^-266, which underflows
// to −0: the fixed chunks keep −0, the padded K = 16 gives +0.
TEST_P(LinearTest, ZeroPaddingCoincidesExceptFmaSeqNegativeZero) {
  constexpr int T = 4, N = 12, K = 15, C = 8, Kp = 16;
  auto padded = [&](const std::vector<bf16>& m, int rows) {
    std::vector<bf16> out(size_t(rows) * Kp, bf16{0});
    for (int r = 0; r < rows; ++r) std::copy_n(m.begin() + size_t(r) * K, K, out.begin() + size_t(r) * Kp);
    return out;
  };
  auto both = [&](const std::vector<bf16>& x, const std::vector<bf16>& w) {
    std::vector<float> fixed(size_t(T) * N), pad(size_t(T) * N);
    ref::linear_acc(knobs(), x.data(), w.data(), fixed.data(), T, K, N, C, fixed_chunk_len(K, C));
    ref::linear_acc(knobs(), padded(x, T).data(), padded(w, N).data(), pad.data(), T, Kp, N, C, fixed_chunk_len(Kp, C));
    return std::pair{fixed, pad};
  };
  const auto [fixed, pad] = both(random_bf16(size_t(T) * K, 51, 1.0f), random_bf16(size_t(N) * K, 52, 1.0f));
  EXPECT_EQ(test::digest(fixed), test::digest(pad)) << "ordinary inputs: no chunk ends at −0";
  const auto [tiny_fixed, tiny_pad] =
      both(std::vector<bf16>(size_t(T) * K, bf16{0x0001}), std::vector<bf16>(size_t(N) * K, bf16{0x8001}));
  const bool sm90 = knobs().dot == DotModel::Sm90Tc;
  EXPECT_EQ(bits_of(tiny_fixed[0]), sm90 ? 0x00000000u : 0x80000000u) << "sm90-tc: a zero result is +0";
  EXPECT_EQ(bits_of(tiny_pad[0]), 0x00000000u);
}

TEST_P(LinearTest, EdgeInputs) {
  const int K = 32, N = 2;
  std::vector<bf16> w(size_t(N) * K, round_bf16(1.0f));
  std::vector<bf16> x(K, round_bf16(-0.0f)), y(N);
  ref::linear_fwd(knobs(), x.data(), w.data(), y.data(), 1, K, N, 1);
  EXPECT_EQ(y[0].bits, 0x0000) << "a sum of -0 products is +0 under both models";
  x[3] = round_bf16(INFINITY);
  ref::linear_fwd(knobs(), x.data(), w.data(), y.data(), 1, K, N, 1);
  EXPECT_EQ(y[0].bits, 0x7f80);
  x[4] = round_bf16(-INFINITY);
  ref::linear_fwd(knobs(), x.data(), w.data(), y.data(), 1, K, N, 1);
  EXPECT_EQ(y[0].bits, kCanonicalNanBf16);
  x.assign(K, bf16{0x0001});  // smallest bf16 subnormal: products underflow fp32
  ref::linear_fwd(knobs(), x.data(), w.data(), y.data(), 1, K, N, 1);
  EXPECT_EQ(y[0].bits, 0x0020) << "32 · 2^-133 = 2^-128, representable as a bf16 subnormal";
}

TEST_P(LinearTest, GoldenDigests) {
  const int T = 9, K = 96, N = 24;
  Knobs kn = knobs();
  const auto x = random_bf16(size_t(T) * K, 11, 1.0f), w = random_bf16(size_t(N) * K, 12, 0.1f),
             dy = random_bf16(size_t(T) * N, 13, 1.0f);
  std::vector<bf16> y(size_t(T) * N), dx(size_t(T) * K);
  std::vector<float> acc(size_t(T) * N), dw(size_t(N) * K);
  ref::linear_acc(kn, x.data(), w.data(), acc.data(), T, K, N, 1, K);  // fp32: where the dot models differ
  ref::linear_fwd(kn, x.data(), w.data(), y.data(), T, K, N, 8);
  ref::linear_dgrad(kn, dy.data(), w.data(), dx.data(), T, K, N, 8);
  ref::linear_wgrad(kn, dy.data(), x.data(), dw.data(), T, K, N);
  const std::string c = contract().name;
  test::expect_golden("ops/linear.txt", c + ".acc", test::digest(acc));
  test::expect_golden("ops/linear.txt", c + ".fwd", test::digest(y));
  test::expect_golden("ops/linear.txt", c + ".dgrad", test::digest(dx));
  test::expect_golden("ops/linear.txt", c + ".wgrad", test::digest(dw));
}

INSTANTIATE_TEST_SUITE_P(Contracts, LinearTest, ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1"),
                         [](const auto& info) { return std::string(info.param).substr(5, 6); });

}  // namespace
}  // namespace bp
