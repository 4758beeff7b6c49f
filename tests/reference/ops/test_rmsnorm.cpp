// rmsnorm: forward (out, rstd) and backward (dx, dw) against float64 truth with
// bounds derived from the rounding points, truth's gradients against finite
// differences, batch invariance, negative controls, golden digests, edge inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "reference/common/rng.h"
#include "reference/numerics/math.h"
#include "reference/ops/rmsnorm.h"
#include "reference/truth/rmsnorm.h"
#include "support/bounds.h"
#include "support/golden.h"

namespace bp {
namespace {

using truth::MatD;
using truth::VecD;

constexpr float kEps = 1e-6f;  // Qwen3 rms_norm_eps

struct Shape {
  int T, heads, n;
  int rows() const { return T * heads; }
};
// Layer norms at hidden 1024 and 2048, q/k norms over head_dim 128 with 32 and 4
// heads, n = 100 (not a multiple of the vector width) and n = 5000 (more than one
// sweep of the 256 × 8 lanes).
constexpr Shape kShapes[] = {{6, 1, 1024}, {3, 1, 2048}, {2, 32, 128}, {3, 4, 128}, {5, 1, 100}, {2, 1, 5000}};

struct Inputs {
  std::vector<bf16> x, w, dy;
};
// Weights near 1 as trained norm weights are; x and dy of mixed magnitudes.
Inputs make_inputs(Shape s, uint64_t seed) {
  Inputs in{random_bf16(size_t(s.rows()) * s.n, seed, 3.0f), std::vector<bf16>(s.n),
            random_bf16(size_t(s.rows()) * s.n, seed + 1, 1.0f)};
  for (int i = 0; i < s.n; ++i) in.w[i] = round_bf16(1.0f + 0.5f * counter_uniform(seed + 2, i));
  return in;
}

struct Forward {
  std::vector<bf16> out;
  std::vector<float> rstd;
};
Forward forward(const Knobs& kn, const Inputs& in, Shape s) {
  Forward f{std::vector<bf16>(in.x.size()), std::vector<float>(s.rows())};
  ref::rmsnorm_fwd(kn, in.x.data(), in.w.data(), kEps, f.out.data(), f.rstd.data(), s.T, s.heads, s.n);
  return f;
}

struct Backward {
  std::vector<bf16> dx;
  std::vector<float> dw;
};
Backward backward(const Knobs& kn, const Inputs& in, const Forward& f, Shape s) {
  Backward b{std::vector<bf16>(in.x.size()), std::vector<float>(s.n)};
  ref::rmsnorm_bwd(kn, in.x.data(), in.w.data(), f.rstd.data(), in.dy.data(), b.dx.data(), b.dw.data(), s.T, s.heads,
                   s.n);
  return b;
}

VecD widen_vec(const std::vector<bf16>& v) { return truth::widen(v, 1, int(v.size())).row(0).transpose(); }

// Relative error of r. The squares are exact (8-bit significands; no underflow
// for these inputs), so ss carries the lane tree's gamma_m; ss/n and + eps each
// round once, both terms positive: var + eps = v(1 + theta) with
// |theta| <= (1 + gamma_m)(1 + u)^2 − 1. Then rsqrt of v(1 + theta) is v^-1/2·(1 + rho)
// with |rho| <= theta / (2 (1 − theta)^(3/2)) (mean value theorem), and math::rsqrt
// adds at most math::kMaxUlpRsqrt ulps, each <= 2^-23 of the result.
double rstd_rel_bound(int n, LaneShape shape) {
  const double theta = (1 + test::lane_sum_gamma(n, shape)) * (1 + test::kU32) * (1 + test::kU32) - 1;
  const double rho = theta / (2 * std::pow(1 - theta, 1.5));
  return (1 + rho) * (1 + math::kMaxUlpRsqrt * 0x1p-23) - 1;
}

class RmsNormTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Contract& contract() const { return *find_contract(GetParam()); }
  const Knobs& knobs() const { return contract().knobs; }
  // Largest |error| / bound per checked quantity, recorded in the test report.
  void check(double err, double bound, const std::string& what, int row, int i) {
    worst_[what] = std::max(worst_[what], err / bound);
    if (!(err <= bound) && ++failures_ <= 5)
      ADD_FAILURE() << what << " row " << row << " i " << i << ": error " << err << " > bound " << bound;
  }
  void TearDown() override {
    for (const auto& [what, ratio] : worst_) RecordProperty("max_err_over_bound." + what, std::to_string(ratio));
  }
  std::map<std::string, double> worst_;
  int failures_ = 0;
};

// y = x·r rounds once (u), t = R(y) once (u16), f(w)·f(t) is exact (8-bit by 8-bit
// significands) and its R rounds once more: a relative bound per element.
TEST_P(RmsNormTest, ForwardWithinDerivedBound) {
  for (const Shape s : kShapes) {
    const Inputs in = make_inputs(s, 1);
    const Forward f = forward(knobs(), in, s);
    const MatD X = truth::widen(in.x, s.rows(), s.n);
    const VecD W = widen_vec(in.w), r = truth::rmsnorm_rstd(X, kEps);
    const MatD want = truth::rmsnorm_fwd(X, W, kEps);
    const double er = rstd_rel_bound(s.n, knobs().row_reduce);
    const double eo = (1 + er) * (1 + test::kU32) * (1 + test::kU16) * (1 + test::kU16) - 1;
    for (int row = 0; row < s.rows(); ++row) {
      check(std::fabs(f.rstd[row] - r(row)), er * r(row), "rstd", row, 0);
      for (int i = 0; i < s.n; ++i)
        check(std::fabs(widen(f.out[size_t(row) * s.n + i]) - want(row, i)), eo * std::fabs(want(row, i)), "out", row,
              i);
    }
  }
  EXPECT_EQ(failures_, 0);
}

// dx = R(r·g − x·c), g = f(dy)·f(w) exact, c = ((r·r)·r)·(s/n), s = lane_sum(g·x)
// with exact terms. With A = |r g|, B = |x| r³ S/n (S = sum |g x|) and e = the
// relative bound of r:
//   r̂·g:            |Â − A| <= A((1 + e)(1 + u) − 1)
//   x·c:             five roundings (r·r, ·r, s/n, r³·m, x·c) and the lane sum:
//                    |B̂ − B| <= B((1 + e)^3 (1 + u)^5 (1 + gamma_m) − 1)
//   the difference:  one more rounding, u·(A + B + both errors)
// and the final R adds u16 (bf16_output_bound). dw = token-chunked dot of dy and
// t̂ = R(x·r̂), where |t̂ − t| <= e_t|t|, e_t = (1 + e)(1 + u)(1 + u16) − 1, so
// |dŵ − dw| <= (e_t + G(1 + e_t))·sum |dy t| with G the chunked dot's gamma.
TEST_P(RmsNormTest, BackwardWithinDerivedBound) {
  Knobs kn = knobs();
  kn.grad_token_chunk = 2;  // several token chunks even for these few tokens
  const double u = test::kU32;
  for (const Shape s : kShapes) {
    const Inputs in = make_inputs(s, 2);
    const Backward b = backward(kn, in, forward(kn, in, s), s);
    const MatD X = truth::widen(in.x, s.rows(), s.n), DY = truth::widen(in.dy, s.rows(), s.n);
    const VecD W = widen_vec(in.w), r = truth::rmsnorm_rstd(X, kEps);
    const truth::RmsNormGrads want = truth::rmsnorm_bwd(X, W, kEps, DY);
    const double e = rstd_rel_bound(s.n, kn.row_reduce), gm = test::lane_sum_gamma(s.n, kn.row_reduce);
    for (int row = 0; row < s.rows(); ++row) {
      const double S = (DY.row(row).cwiseProduct(W.transpose()).cwiseProduct(X.row(row))).cwiseAbs().sum();
      for (int i = 0; i < s.n; ++i) {
        const double A = std::fabs(r(row) * DY(row, i) * W(i)),
                     B = std::fabs(X(row, i)) * std::pow(r(row), 3) * S / s.n;
        const double ea = A * ((1 + e) * (1 + u) - 1),
                     eb = B * ((std::pow(1 + e, 3) * std::pow(1 + u, 5) * (1 + gm)) - 1);
        const double bound = test::bf16_output_bound(want.dx(row, i), ea + eb + u * (A + B + ea + eb));
        check(std::fabs(widen(b.dx[size_t(row) * s.n + i]) - want.dx(row, i)), bound, "dx", row, i);
      }
    }
    const int chunk_rows = kn.grad_token_chunk * s.heads, chunks = (s.rows() + chunk_rows - 1) / chunk_rows;
    const double g1 = test::dot_gamma(kn.dot, chunk_rows);
    const double G = g1 + std::ceil(std::log2(chunks)) * u * (1 + g1), et = (1 + e) * (1 + u) * (1 + test::kU16) - 1;
    const MatD T = r.asDiagonal() * X;
    for (int i = 0; i < s.n; ++i) {
      const double sum_abs = DY.col(i).cwiseProduct(T.col(i)).cwiseAbs().sum();
      check(std::fabs(b.dw[i] - want.dw(i)), (et + G * (1 + et)) * sum_abs, "dw", -1, i);
    }
  }
  EXPECT_EQ(failures_, 0);
}

// Truth's dx and dw against central differences of L = sum c·out.
TEST(RmsNormTruth, GradientsMatchFiniteDifferences) {
  const int rows = 3, n = 6;
  const double eps = 1e-3, h = 1e-6;
  const MatD X = MatD::Random(rows, n), C = MatD::Random(rows, n);
  const VecD W = VecD::Random(n);
  const truth::RmsNormGrads g = truth::rmsnorm_bwd(X, W, eps, C);
  auto loss = [&](const MatD& x, const VecD& w) { return (truth::rmsnorm_fwd(x, w, eps).array() * C.array()).sum(); };
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n; ++i) {
      MatD p = X, m = X;
      p(r, i) += h;
      m(r, i) -= h;
      EXPECT_NEAR((loss(p, W) - loss(m, W)) / (2 * h), g.dx(r, i), 1e-7);
    }
  for (int i = 0; i < n; ++i) {
    VecD p = W, m = W;
    p(i) += h;
    m(i) -= h;
    EXPECT_NEAR((loss(X, p) - loss(X, m)) / (2 * h), g.dw(i), 1e-7);
  }
}

// One token alone equals the same token inside batches of 2..64 other tokens:
// out, rstd and dx bit for bit (dw sums over the batch by definition).
TEST_P(RmsNormTest, BatchInvariance) {
  for (const Shape one : {Shape{1, 1, 2048}, Shape{1, 8, 128}}) {
    const Inputs in = make_inputs(one, 3);
    const Forward fa = forward(knobs(), in, one);
    const Backward ba = backward(knobs(), in, fa, one);
    const size_t len = in.x.size();
    for (int batch : {2, 3, 17, 64}) {
      const Shape s{batch, one.heads, one.n};
      Inputs big = make_inputs(s, 100 + batch);
      big.w = in.w;
      const size_t at = size_t(batch / 2) * len;
      std::copy(in.x.begin(), in.x.end(), big.x.begin() + at);
      std::copy(in.dy.begin(), in.dy.end(), big.dy.begin() + at);
      const Forward f = forward(knobs(), big, s);
      const Backward b = backward(knobs(), big, f, s);
      EXPECT_TRUE(std::equal(fa.out.begin(), fa.out.end(), f.out.begin() + at)) << "batch " << batch;
      EXPECT_TRUE(std::equal(fa.rstd.begin(), fa.rstd.end(), f.rstd.begin() + (batch / 2) * one.heads));
      EXPECT_TRUE(std::equal(ba.dx.begin(), ba.dx.end(), b.dx.begin() + at)) << "batch " << batch;
    }
  }
}

// DP/CP: ranks holding 2^j whole token chunks each compute dw over their tokens;
// the last tree levels over the rank results give the unsplit bits (q/k norm
// shape, so a chunk is grad_token_chunk·heads rows).
TEST_P(RmsNormTest, DwTokenSplitAcrossRanksGivesTheSameBits) {
  Knobs kn = knobs();
  kn.grad_token_chunk = 4;
  const Shape s{16, 4, 128};
  const Inputs in = make_inputs(s, 8);
  const std::vector<float> whole = backward(kn, in, forward(kn, in, s), s).dw;
  for (int ranks : {2, 4}) {
    const Shape share{s.T / ranks, s.heads, s.n};
    const size_t len = size_t(share.rows()) * s.n;
    std::vector<std::vector<float>> part(ranks);
    for (int r = 0; r < ranks; ++r) {
      Inputs mine{std::vector<bf16>(in.x.begin() + r * len, in.x.begin() + (r + 1) * len), in.w,
                  std::vector<bf16>(in.dy.begin() + r * len, in.dy.begin() + (r + 1) * len)};
      part[r] = backward(kn, mine, forward(kn, mine, share), share).dw;
    }
    for (int i = 0; i < s.n; ++i) {
      std::vector<float> tops(ranks);
      for (int r = 0; r < ranks; ++r) tops[r] = part[r][i];
      ASSERT_EQ(bits_of(pairwise_tree(tops.data(), ranks)), bits_of(whole[i])) << "ranks " << ranks << " i " << i;
    }
  }
}

// Negative controls: another lane shape changes rstd's bits, and the other dot
// model and another token chunk change dw's bits, on the same inputs.
TEST_P(RmsNormTest, NegativeControlLaneShapeDotModelAndChunkChangeBits) {
  const Shape s{256, 1, 2048};
  const Inputs in = make_inputs(s, 4);
  const Forward f = forward(knobs(), in, s);
  Knobs lanes = knobs();
  lanes.row_reduce = LaneShape{32, 8};
  EXPECT_NE(test::digest(f.rstd), test::digest(forward(lanes, in, s).rstd));
  const Backward b = backward(knobs(), in, f, s);
  Knobs model = knobs();
  model.dot = knobs().dot == DotModel::Sm90Tc ? DotModel::FmaSeq : DotModel::Sm90Tc;
  EXPECT_NE(test::digest(b.dw), test::digest(backward(model, in, f, s).dw));
  Knobs chunk = knobs();
  chunk.grad_token_chunk = 16;
  EXPECT_NE(test::digest(b.dw), test::digest(backward(chunk, in, f, s).dw));
}

TEST_P(RmsNormTest, EdgeInputs) {
  const int n = 128;
  const Shape s{1, 1, n};
  Inputs in = make_inputs(s, 5);
  auto run = [&] { return forward(knobs(), in, s); };
  // A zero row: var = 0, r = rsqrt(eps); outputs are zeros with the sign of x·w.
  std::fill(in.x.begin(), in.x.end(), bf16{0x0000});
  in.x[3] = bf16{0x8000};
  Forward f = run();
  EXPECT_EQ(bits_of(f.rstd[0]), bits_of(math::rsqrt(kEps)));
  EXPECT_EQ(f.out[0].bits, 0x0000);
  EXPECT_EQ(f.out[3].bits, 0x8000);
  // Subnormal inputs: their squares underflow to 0, nothing is flushed, and a
  // subnormal output is kept (here x = 2^-133 in a row of ones, w = 1).
  std::fill(in.x.begin(), in.x.end(), round_bf16(1.0f));
  std::fill(in.w.begin(), in.w.end(), round_bf16(1.0f));
  in.x[7] = bf16{0x0001};
  f = run();
  EXPECT_EQ(f.out[7].bits, 0x0001);
  std::fill(in.x.begin(), in.x.end(), bf16{0x0001});
  f = run();
  EXPECT_EQ(bits_of(f.rstd[0]), bits_of(math::rsqrt(kEps))) << "all squares underflow: var = 0";
  EXPECT_EQ(f.out[0], round_bf16(mul_rn(1.0f, through_bf16(mul_rn(widen(bf16{0x0001}), f.rstd[0])))));
  // ±Inf in a row: ss = Inf, r = rsqrt(Inf) = +0; the Inf element gives Inf·0 =
  // NaN, every finite one ±0. A finite overflow of ss (|x| >= 2^64) does the same.
  in = make_inputs(s, 6);
  in.x[5] = bf16{0xff80};
  f = run();
  EXPECT_EQ(bits_of(f.rstd[0]), 0u);
  EXPECT_TRUE(is_nan(f.out[5]));
  EXPECT_TRUE(std::all_of(f.out.begin(), f.out.end(), [](bf16 v) { return is_nan(v) || (v.bits & 0x7fffu) == 0; }));
  in.x[5] = round_bf16(0x1p70f);
  f = run();
  EXPECT_EQ(bits_of(f.rstd[0]), 0u);
  // NaN anywhere in a row: the whole row is NaN.
  in.x[5] = bf16{0x7fc1};
  f = run();
  EXPECT_TRUE(is_nan(f.rstd[0]));
  EXPECT_TRUE(std::all_of(f.out.begin(), f.out.end(), [](bf16 v) { return v == bf16{kCanonicalNanBf16}; }));
}

TEST_P(RmsNormTest, GoldenDigests) {
  const std::string c = contract().name;
  for (const Shape s : {Shape{3, 1, 2048}, Shape{7, 4, 128}}) {
    const Inputs in = make_inputs(s, 7);
    const Forward f = forward(knobs(), in, s);
    const Backward b = backward(knobs(), in, f, s);
    const std::string name = c + (s.heads == 1 ? ".layer" : ".qk");
    test::expect_golden("ops/rmsnorm.txt", name + ".fwd", test::digest(f.out));
    test::expect_golden("ops/rmsnorm.txt", name + ".rstd", test::digest(f.rstd));
    test::expect_golden("ops/rmsnorm.txt", name + ".dx", test::digest(b.dx));
    test::expect_golden("ops/rmsnorm.txt", name + ".dw", test::digest(b.dw));
  }
}

INSTANTIATE_TEST_SUITE_P(Contracts, RmsNormTest, ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1"),
                         [](const auto& info) { return std::string(info.param).substr(5, 6); });

}  // namespace
}  // namespace bp
