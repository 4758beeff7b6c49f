#include "linear.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "dot_tiles.h"
#include "reference/numerics/chunked.h"

namespace bp::ref {
namespace {

// Row-major [rows][cols] -> [cols][rows]; moves bits only, so reads along the
// reduction dimension become contiguous without changing any result.
std::vector<bf16> transpose(const bf16* m, int rows, int cols) {
  std::vector<bf16> t(static_cast<size_t>(rows) * cols);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[static_cast<size_t>(c) * rows + r] = m[static_cast<size_t>(r) * cols + c];
  return t;
}

// y = R(acc), element by element.
void round_all(const std::vector<float>& acc, bf16* y) {
  const auto n = static_cast<ptrdiff_t>(acc.size());
#pragma omp parallel for schedule(static)
  for (ptrdiff_t i = 0; i < n; ++i) y[i] = round_bf16(acc[i]);
}

}  // namespace

void linear_acc(const Knobs& kn, const bf16* x, const bf16* w, float* acc, int T, int K, int N, int k_chunks,
                int chunk_len) {
  check_chunks(K, k_chunks, chunk_len, "linear", "K");
  dot_rows(kn.dot, x, T, w, N, K, chunk_len, k_chunks, acc);
}

void linear_fwd(const Knobs& kn, const bf16* x, const bf16* w, bf16* y, int T, int K, int N, int k_chunks) {
  std::vector<float> acc(static_cast<size_t>(T) * N);
  linear_acc(kn, x, w, acc.data(), T, K, N, k_chunks, whole_chunk_len(K, k_chunks, "linear", "K"));
  round_all(acc, y);
}

void linear_dgrad_acc(const Knobs& kn, const bf16* dy, const bf16* w, float* acc, int T, int K, int N, int n_chunks,
                      int chunk_len) {
  check_chunks(N, n_chunks, chunk_len, "linear", "N");
  const std::vector<bf16> wt = transpose(w, N, K);  // [K][N]
  dot_rows(kn.dot, dy, T, wt.data(), K, N, chunk_len, n_chunks, acc);
}

void linear_dgrad(const Knobs& kn, const bf16* dy, const bf16* w, bf16* dx, int T, int K, int N, int n_chunks) {
  std::vector<float> acc(static_cast<size_t>(T) * K);
  linear_dgrad_acc(kn, dy, w, acc.data(), T, K, N, n_chunks, whole_chunk_len(N, n_chunks, "linear", "N"));
  round_all(acc, dx);
}

void linear_wgrad(const Knobs& kn, const bf16* dy, const bf16* x, float* dw, int T, int K, int N) {
  const std::vector<bf16> dyt = transpose(dy, T, N), xt = transpose(x, T, K);  // [N][T], [K][T]
  const int chunk = kn.grad_token_chunk;
  dot_rows(kn.dot, dyt.data(), N, xt.data(), K, T, chunk, (T + chunk - 1) / chunk, dw);
}

}  // namespace bp::ref
