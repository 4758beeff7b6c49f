#include "residual.h"

namespace bp::ref {

void residual_fwd(const Knobs&, const bf16* h, const bf16* o, bf16* out, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = round_bf16(add_rn(widen(h[i]), widen(o[i])));
}

void sum_round(const float* const* parts, int count, bf16* out, size_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
    float acc = 0.0f;
    for (int p = 0; p < count; ++p) acc = add_rn(acc, parts[p][i]);
    out[i] = round_bf16(acc);
  }
}

}  // namespace bp::ref
