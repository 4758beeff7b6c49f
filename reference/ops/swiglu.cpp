#include "swiglu.h"

#include <vector>

#include "linear.h"
#include "reference/numerics/chunked.h"

namespace bp::ref {

void swiglu_fwd(const bf16* g, const bf16* u, bf16* m, int n) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) m[i] = swiglu_value(g[i], u[i]);
}

void swiglu_bwd(const bf16* g, const bf16* u, const bf16* dm, bf16* dg, bf16* du, int n) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) swiglu_grads(g[i], u[i], dm[i], dg[i], du[i]);
}

void mlp_hidden_fwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, bf16* g, bf16* u, bf16* m, int T,
                    int H, int I) {
  linear_fwd(kn, a, wg, g, T, H, I, 1);
  linear_fwd(kn, a, wu, u, T, H, I, 1);
  swiglu_fwd(g, u, m, T * I);
}

void mlp_fwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* wd, bf16* d, int T, int H,
             int I) {
  const size_t hidden = static_cast<size_t>(T) * I;
  std::vector<bf16> g(hidden), u(hidden), m(hidden);
  mlp_hidden_fwd(kn, a, wg, wu, g.data(), u.data(), m.data(), T, H, I);
  linear_fwd(kn, m.data(), wd, d, T, I, H, kn.tp_tree_width);
}

void mlp_input_grad_acc(const Knobs& kn, const bf16* dg, const bf16* du, const bf16* wg, const bf16* wu, float* acc,
                        int T, int H, int I) {
  const size_t n = static_cast<size_t>(T) * H;
  std::vector<float> from_up(n);
  const int C = kn.tp_tree_width, chunk = fixed_chunk_len(I, C);
  linear_dgrad_acc(kn, dg, wg, acc, T, H, I, C, chunk);
  linear_dgrad_acc(kn, du, wu, from_up.data(), T, H, I, C, chunk);
  // For C a power of two this equals one pairwise tree over the 2C chunk partials
  // of the merged [dg | du]·[Wg ; Wu] dot (gate's C first), SPEC.md §5.7.
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) acc[i] = add_rn(acc[i], from_up[i]);
}

void mlp_down_bwd(const Knobs& kn, const bf16* dy, const bf16* wd, const bf16* m, bf16* dm, float* dwd, int T, int H,
                  int I) {
  linear_dgrad(kn, dy, wd, dm, T, I, H, 1);
  linear_wgrad(kn, dy, m, dwd, T, I, H);
}

void mlp_hidden_bwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* g, const bf16* u,
                    const bf16* dm, float* da_acc, float* dwg, float* dwu, int T, int H, int I) {
  const size_t hidden = static_cast<size_t>(T) * I;
  std::vector<bf16> dg(hidden), du(hidden);
  swiglu_bwd(g, u, dm, dg.data(), du.data(), T * I);
  mlp_input_grad_acc(kn, dg.data(), du.data(), wg, wu, da_acc, T, H, I);
  linear_wgrad(kn, dg.data(), a, dwg, T, H, I);
  linear_wgrad(kn, du.data(), a, dwu, T, H, I);
}

void mlp_bwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* wd, const bf16* dd, bf16* da,
             float* dwg, float* dwu, float* dwd, int T, int H, int I) {
  const size_t hidden = static_cast<size_t>(T) * I, rows = static_cast<size_t>(T) * H;
  std::vector<bf16> g(hidden), u(hidden), m(hidden), dm(hidden);
  std::vector<float> acc(rows);
  mlp_hidden_fwd(kn, a, wg, wu, g.data(), u.data(), m.data(), T, H, I);
  mlp_down_bwd(kn, dd, wd, m.data(), dm.data(), dwd, T, H, I);
  mlp_hidden_bwd(kn, a, wg, wu, g.data(), u.data(), dm.data(), acc.data(), dwg, dwu, T, H, I);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < rows; ++i) da[i] = round_bf16(acc[i]);
}

}  // namespace bp::ref
