#include "rmsnorm.h"

#include <vector>

#include "reference/numerics/chunked.h"
#include "reference/numerics/math.h"

namespace bp::ref {
namespace {

// r = rsqrt(ss/n + eps), ss = lane_sum of the squares (each square exact in fp32
// unless it underflows: 8-bit significands).
float row_rstd(const bf16* x, int n, float eps, LaneShape shape, float* lanes) {
  const float ss = lane_sum(n, shape, lanes, [&](int i) { return mul_rn(widen(x[i]), widen(x[i])); });
  return math::rsqrt(add_rn(div_rn(ss, static_cast<float>(n)), eps));
}

// t = R(f(x)·r): the normalised row before the weight, shared by forward and backward.
bf16 normed(bf16 x, float r) { return round_bf16(mul_rn(widen(x), r)); }

// g = f(dy)·f(w), the gradient with respect to t (straight-through R): a bf16
// product, exact in fp32 unless it underflows; so is g·f(x) (16 + 8 bits).
float grad_t(bf16 dy, bf16 w) { return mul_rn(widen(dy), widen(w)); }

// The per-row coefficient of x in dx: r³·mean(g·f(x)).
float row_x_coef(const bf16* x, const bf16* w, const bf16* dy, float r, int n, LaneShape shape, float* lanes) {
  const float s = lane_sum(n, shape, lanes, [&](int i) { return mul_rn(grad_t(dy[i], w[i]), widen(x[i])); });
  return mul_rn(mul_rn(mul_rn(r, r), r), div_rn(s, static_cast<float>(n)));
}

}  // namespace

void rmsnorm_fwd(const Knobs& kn, const bf16* x, const bf16* w, float eps, bf16* out, float* rstd, int T, int heads,
                 int n) {
  const int rows = T * heads;
#pragma omp parallel
  {
    std::vector<float> lanes(kn.row_reduce.lanes);
#pragma omp for schedule(static)
    for (int row = 0; row < rows; ++row) {
      const bf16* xr = x + static_cast<size_t>(row) * n;
      bf16* yr = out + static_cast<size_t>(row) * n;
      const float r = row_rstd(xr, n, eps, kn.row_reduce, lanes.data());
      rstd[row] = r;
      for (int i = 0; i < n; ++i) yr[i] = round_bf16(mul_rn(widen(w[i]), widen(normed(xr[i], r))));
    }
  }
}

void rmsnorm_bwd(const Knobs& kn, const bf16* x, const bf16* w, const float* rstd, const bf16* dy, bf16* dx, float* dw,
                 int T, int heads, int n) {
  const int rows = T * heads;
  std::vector<bf16> t(static_cast<size_t>(rows) * n);  // the forward's R(x·r), for dw
#pragma omp parallel
  {
    std::vector<float> lanes(kn.row_reduce.lanes);
#pragma omp for schedule(static)
    for (int row = 0; row < rows; ++row) {
      const size_t at = static_cast<size_t>(row) * n;
      const float r = rstd[row];
      const float coef = row_x_coef(x + at, w, dy + at, r, n, kn.row_reduce, lanes.data());
      for (int i = 0; i < n; ++i) {
        dx[at + i] = round_bf16(sub_rn(mul_rn(r, grad_t(dy[at + i], w[i])), mul_rn(widen(x[at + i]), coef)));
        t[at + i] = normed(x[at + i], r);
      }
    }
  }
  const int chunk_rows = kn.grad_token_chunk * heads;
  with_dot_model(kn.dot, [&](auto m) {
    using Model = decltype(m);
#pragma omp parallel
    {
      std::vector<float> partials(rows > 0 ? (rows + chunk_rows - 1) / chunk_rows : 1);
#pragma omp for schedule(static)
      for (int i = 0; i < n; ++i)
        dw[i] = token_chunked_dot<Model>(dy + i, n, t.data() + i, n, rows, chunk_rows, partials.data());
    }
  });
}

}  // namespace bp::ref
