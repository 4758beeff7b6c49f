// bp::cuda rmsnorm_fwd / rmsnorm_bwd against the CPU reference, bit for bit.
#include "optimized/cuda/rmsnorm.h"
#include "reference/ops/rmsnorm.h"
#include "tests/optimized/cuda_op_test.h"

namespace bp::test {
namespace {

constexpr float kEps = 1e-6f;  // Qwen3 rms_norm_eps

struct Shape {
  int T, heads, n;
  size_t elems() const { return size_t(T) * heads * n; }
  int rows() const { return T * heads; }
};

struct Inputs {
  std::vector<bf16> x, w, dy;
};

// Weights near 1, x and dy of mixed magnitudes; with `edge_rows`, some rows are
// all +0 or all −0, or hold an Inf, a NaN, subnormals only, or values >= 2^64
// (the sum of squares overflows), and rows whose dy holds one ±Inf, NaN or huge value.
Inputs make_inputs(Shape s, uint64_t seed, bool edge_rows) {
  Inputs in{random_inputs(s.elems(), seed, 3.0f), random_inputs(s.n, seed + 1, 0.5f),
            random_inputs(s.elems(), seed + 2, 1.0f)};
  for (bf16& w : in.w) w = round_bf16(add_rn(1.0f, widen(w)));
  if (!edge_rows) return in;
  FloatGen g(seed);
  for (int row = 0; row < s.rows(); ++row) {
    bf16* x = in.x.data() + size_t(row) * s.n;
    switch (row % 8) {
      case 1:
        for (int i = 0; i < s.n; ++i) x[i].bits = 0x0000;
        break;
      case 2:
        for (int i = 0; i < s.n; ++i) x[i].bits = 0x8000;
        break;
      case 3:
        x[g.range(0, s.n - 1)].bits = g.chance(2) ? 0x7f80 : 0xff80;
        break;
      case 4:
        x[g.range(0, s.n - 1)].bits = 0x7fc0;
        break;
      case 5:
        for (int i = 0; i < s.n; ++i) x[i].bits = g.bf_subnormal();
        break;
      case 6:
        x[g.range(0, s.n - 1)].bits = g.bf(g.range(64, 127));
        break;
      case 7:  // the weight gradient's other operand: dy = ±Inf, NaN or huge beside a finite t
        in.dy[size_t(row) * s.n + g.range(0, s.n - 1)].bits = g.chance(2) ? 0x7fc0 : g.chance(2) ? 0xff80 : 0x7f00;
        break;
      default:
        break;
    }
  }
  return in;
}

struct Outputs {
  std::vector<bf16> out, dx;
  std::vector<float> rstd, dw;
};

// The forward, then the backward from the reference's rstd (so each is checked alone).
Outputs cpu_run(const Knobs& kn, Shape s, const Inputs& in) {
  Outputs o{std::vector<bf16>(s.elems()), std::vector<bf16>(s.elems()), std::vector<float>(s.rows()),
            std::vector<float>(s.n)};
  ref::rmsnorm_fwd(kn, in.x.data(), in.w.data(), kEps, o.out.data(), o.rstd.data(), s.T, s.heads, s.n);
  ref::rmsnorm_bwd(kn, in.x.data(), in.w.data(), o.rstd.data(), in.dy.data(), o.dx.data(), o.dw.data(), s.T, s.heads,
                   s.n);
  return o;
}

Outputs gpu_run(const Knobs& kn, Shape s, const Inputs& in, const std::vector<float>& cpu_rstd) {
  const DeviceBuffer<bf16> x(in.x), w(in.w), dy(in.dy);
  const DeviceBuffer<float> rstd_in(cpu_rstd);
  DeviceBuffer<bf16> out = poisoned<bf16>(s.elems()), dx = poisoned<bf16>(s.elems());
  DeviceBuffer<float> rstd = poisoned<float>(s.rows()), dw = poisoned<float>(s.n);
  cuda::rmsnorm_fwd(kn, x.get(), w.get(), kEps, out.get(), rstd.get(), s.T, s.heads, s.n);
  cuda::rmsnorm_bwd(kn, x.get(), w.get(), rstd_in.get(), dy.get(), dx.get(), dw.get(), s.T, s.heads, s.n);
  return {out.download(), dx.download(), rstd.download(), dw.download()};
}

void expect_matches(const Knobs& kn, Shape s, const Inputs& in, const char* what) {
  const Outputs want = cpu_run(kn, s, in);
  const Outputs got = gpu_run(kn, s, in, want.rstd);
  const std::string where = std::string(what) + " T=" + std::to_string(s.T) + " heads=" + std::to_string(s.heads) +
                            " n=" + std::to_string(s.n);
  EXPECT_TRUE(same_bits(want.out, got.out)) << "out " << where;
  EXPECT_TRUE(same_bits(want.rstd, got.rstd)) << "rstd " << where;
  EXPECT_TRUE(same_bits(want.dx, got.dx)) << "dx " << where;
  EXPECT_TRUE(same_bits(want.dw, got.dw)) << "dw " << where;
}

// Layer norms at hidden 1024 and 2048 and q/k norms (32 and 4 heads of 128: a
// warp per row) at 4096 tokens; n = 100 and 40 (a short last run), n = 5000 (more
// than one sweep of the lanes), n = 4096 (two sweeps of a warp's registers), n = 8192
// (the block kernel's register cache), one token, none; 300 tokens of 3 heads of 72
// (dw: a short last token chunk, 132 rows, and a feature group of 8 past n = 72).
constexpr Shape kShapes[] = {{4096, 1, 1024}, {4096, 1, 2048}, {1024, 32, 128}, {4096, 4, 128},
                             {5, 1, 100},     {3, 1, 40},      {2, 1, 5000},    {3, 1, 4096},
                             {2, 1, 8192},    {1, 1, 2048},    {0, 1, 1024},    {300, 3, 72}};

using RmsnormGpu = ContractTest;

TEST_P(RmsnormGpu, MatchesReference) {
  for (Shape s : kShapes) expect_matches(knobs(), s, make_inputs(s, 100 + s.n + s.heads, false), "random");
}

TEST_P(RmsnormGpu, EdgeRowsMatchReference) {
  for (Shape s : {Shape{64, 1, 2048}, Shape{16, 4, 128}, Shape{24, 1, 100}, Shape{300, 3, 72}})
    expect_matches(knobs(), s, make_inputs(s, 200 + s.n, true), "edge rows");
}

// Lane shapes beyond v1's 256 x 8 (one warp; more runs than lanes; 1024 lanes;
// 16-byte runs on 64, 128 and 512 lanes: a block per row, a warp holding two sweeps,
// a warp holding 8 of 16 lane groups): the kernels follow the knob, not a constant.
TEST_P(RmsnormGpu, OtherLaneShapesMatchReference) {
  for (LaneShape shape : {LaneShape{32, 4}, LaneShape{64, 2}, LaneShape{1024, 1}, LaneShape{64, 8},
                          LaneShape{128, 8}, LaneShape{512, 8}}) {
    Knobs kn = knobs();
    kn.row_reduce = shape;
    for (Shape s : {Shape{7, 1, 2048}, Shape{5, 4, 128}, Shape{3, 1, 300}})
      expect_matches(kn, s, make_inputs(s, 300 + s.n, true), "lanes");
  }
}

TEST_P(RmsnormGpu, RepeatedRunsGiveSameBits) {
  const Shape s{4096, 1, 2048};
  const Inputs in = make_inputs(s, 400, true);
  const std::vector<float> rstd = cpu_run(knobs(), s, in).rstd;
  const Outputs a = gpu_run(knobs(), s, in, rstd), b = gpu_run(knobs(), s, in, rstd);
  EXPECT_TRUE(identical(a.out, b.out) && identical(a.rstd, b.rstd) && identical(a.dx, b.dx) && identical(a.dw, b.dw));
}

INSTANTIATE_TEST_SUITE_P(Contracts, RmsnormGpu, BP_V1_CONTRACTS);

}  // namespace
}  // namespace bp::test
