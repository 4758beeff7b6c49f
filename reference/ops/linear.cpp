#include "linear.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "reference/numerics/chunked.h"

namespace bp::ref {
namespace {

void check_chunks(int k, int chunks, const char* what) {
  if (chunks < 1 || k % chunks != 0)
    throw std::invalid_argument(std::string("linear: ") + what + " = " + std::to_string(k) +
                                " is not divisible into " + std::to_string(chunks) + " chunks");
}

// Row-major [rows][cols] -> [cols][rows]; moves bits only, so reads along the
// reduction dimension become contiguous without changing any result.
std::vector<bf16> transpose(const bf16* m, int rows, int cols) {
  std::vector<bf16> t(static_cast<size_t>(rows) * cols);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[static_cast<size_t>(c) * rows + r] = m[static_cast<size_t>(r) * cols + c];
  return t;
}

// out[i][j] = chunked dot of a[i][:] and b[j][:], both rows of length k.
template <class Store>
void chunked_rows(DotModel model, const bf16* a, const bf16* b, int rows_a, int rows_b, int k, int chunks,
                  Store store) {
  with_dot_model(model, [&](auto m) {
    using Model = decltype(m);
#pragma omp parallel
    {
      std::vector<float> partials(chunks);
#pragma omp for collapse(2) schedule(static)
      for (int i = 0; i < rows_a; ++i)
        for (int j = 0; j < rows_b; ++j)
          store(i, j,
                chunked_dot<Model>(a + static_cast<size_t>(i) * k, 1, b + static_cast<size_t>(j) * k, 1, k, chunks,
                                   partials.data()));
    }
  });
}

}  // namespace

void linear_acc(const Knobs& kn, const bf16* x, const bf16* w, float* acc, int T, int K, int N, int k_chunks) {
  check_chunks(K, k_chunks, "K");
  chunked_rows(kn.dot, x, w, T, N, K, k_chunks,
               [&](int t, int n, float v) { acc[static_cast<size_t>(t) * N + n] = v; });
}

void linear_fwd(const Knobs& kn, const bf16* x, const bf16* w, bf16* y, int T, int K, int N, int k_chunks) {
  check_chunks(K, k_chunks, "K");
  chunked_rows(kn.dot, x, w, T, N, K, k_chunks,
               [&](int t, int n, float v) { y[static_cast<size_t>(t) * N + n] = round_bf16(v); });
}

namespace {

// dx[t][k] = chunked dot over N of dy[t][:] · w[:][k], handed to `store`.
template <class Store>
void dgrad_rows(const Knobs& kn, const bf16* dy, const bf16* w, int T, int K, int N, int n_chunks, Store store) {
  check_chunks(N, n_chunks, "N");
  const std::vector<bf16> wt = transpose(w, N, K);  // [K][N]
  chunked_rows(kn.dot, dy, wt.data(), T, K, N, n_chunks, store);
}

}  // namespace

void linear_dgrad(const Knobs& kn, const bf16* dy, const bf16* w, bf16* dx, int T, int K, int N, int n_chunks) {
  dgrad_rows(kn, dy, w, T, K, N, n_chunks,
             [&](int t, int k, float v) { dx[static_cast<size_t>(t) * K + k] = round_bf16(v); });
}

void linear_dgrad_acc(const Knobs& kn, const bf16* dy, const bf16* w, float* acc, int T, int K, int N, int n_chunks) {
  dgrad_rows(kn, dy, w, T, K, N, n_chunks,
             [&](int t, int k, float v) { acc[static_cast<size_t>(t) * K + k] = v; });
}

void linear_wgrad(const Knobs& kn, const bf16* dy, const bf16* x, float* dw, int T, int K, int N) {
  const std::vector<bf16> dyt = transpose(dy, T, N), xt = transpose(x, T, K);  // [N][T], [K][T]
  const int chunks = (T + kn.grad_token_chunk - 1) / kn.grad_token_chunk;
  with_dot_model(kn.dot, [&](auto m) {
    using Model = decltype(m);
#pragma omp parallel
    {
      std::vector<float> partials(chunks > 0 ? chunks : 1);
#pragma omp for collapse(2) schedule(static)
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k)
          dw[static_cast<size_t>(n) * K + k] =
              token_chunked_dot<Model>(dyt.data() + static_cast<size_t>(n) * T, 1, xt.data() + static_cast<size_t>(k) * T,
                                       1, T, kn.grad_token_chunk, partials.data());
    }
  });
}

}  // namespace bp::ref
