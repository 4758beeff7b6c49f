// linear on the GPU (SPEC.md §5.4), bit-identical to reference/ops/linear.cpp: the
// public functions of linear.h — their argument checks, each op as one GEMM problem
// (linear_gemm.cuh says what a GEMM computes), and the engine that runs it:
//   - linear_wgmma.cu, the warpgroup kernel (wgmma fed by TMA): sm90-tc where TMA
//     can read both operands, chunks are whole k16 groups and M is past decode
//     sizes;
//   - linear_decode.cu: the sm90-tc forward at decode sizes (M <= 16), and in
//     16-row blocks up to M = 128 where the warpgroup kernel declines, where both
//     operands allow 16-byte runs, the weight streamed into mma.sync fragments;
//   - linear_mma.cu, mma.sync on cp.async tiles for the other sm90-tc GEMMs, and
//     the SIMT cores for fma-seq.
#include "optimized/cuda/linear.h"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/linear_gemm.cuh"
#include "optimized/cuda/rows.h"
#include "reference/numerics/chunked.h"

namespace bp::cuda {
namespace {

using gemm::aligned16;
using gemm::Major;
using gemm::Operand;
using gemm::Problem;

// sm90-tc: decode sizes on the decode engine; past them the warpgroup kernel where
// it takes p (run_warpgroup), else the decode engine's 16-row blocks (M <= 128),
// else mma.sync. fma-seq on the SIMT cores.
template <Major MA, Major MB>
void run_gemm(DotModel model, const Problem& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  if (p.chunks == 0) {  // an empty reduction: every output is +0 (all-zero bits)
    const size_t bytes = static_cast<size_t>(p.m) * p.n * (p.out_f32 ? sizeof(float) : sizeof(bf16));
    BP_CUDA_CHECK(cudaMemsetAsync(p.out_f32 ? static_cast<void*>(p.out_f32) : static_cast<void*>(p.out_bf16), 0,
                                  bytes, stream));
    return;
  }
  if (model == DotModel::Sm90Tc) {
    const bool done = p.m <= gemm::kDecodeRows
                          ? gemm::run_decode(MA, MB, p, stream)
                          : gemm::run_wgmma(MA, MB, p, stream) || gemm::run_decode(MA, MB, p, stream);
    if (!done) gemm::run_mma(model, MA, MB, p, stream);
  } else {
    gemm::run_mma(model, MA, MB, p, stream);
  }
}

// A grouped launch: fma-seq on the SIMT tiles; sm90-tc on the warpgroup kernel when
// the whole group fits it, else on the mma.sync tiles.
template <Major MA, Major MB>
void run_grouped(DotModel model, const std::vector<Problem>& problems, cudaStream_t stream) {
  std::vector<Problem> launched;
  for (const Problem& p : problems) {
    if (p.m == 0 || p.n == 0) continue;
    if (p.chunks == 0) run_gemm<MA, MB>(model, p, stream);  // the +0 fill
    else launched.push_back(p);
  }
  if (launched.empty()) return;
  if (model == DotModel::FmaSeq) gemm::run_mma_grouped(model, MA, MB, std::move(launched), stream);
  else if (gemm::warpgroup_group_fits(launched)) gemm::run_wgmma_grouped(MA, MB, std::move(launched), stream);
  else gemm::run_mma_grouped(DotModel::Sm90Tc, MA, MB, std::move(launched), stream);
}

// An operand whose reduction index is contiguous: 16-byte runs stay inside one
// chunk when rows, chunk starts and chunk lengths are multiples of 8 elements.
Operand red_major(const bf16* p, int ld, int rows, int red, int chunk) {
  return Operand{p, ld, rows, aligned16(p) && ld % 8 == 0 && chunk % 8 == 0 && red % 8 == 0};
}
// An operand whose row index is contiguous: 16-byte runs of rows.
Operand row_major(const bf16* p, int ld, int rows) {
  return Operand{p, ld, rows, aligned16(p) && ld % 8 == 0 && rows % 8 == 0};
}

void check_sizes(int T, int K, int N) {
  if (T < 0 || K < 0 || N < 0)
    throw std::invalid_argument("linear: negative size T=" + std::to_string(T) + " K=" + std::to_string(K) +
                                " N=" + std::to_string(N));
}

// out[t][n] over K (forward): x [T][K] and w [N][K], both reduction-contiguous;
// k_chunks chunks of `chunk` (SPEC.md §2.4.1: the kernels' stage_valid ends the
// last ones early or leaves them empty, +0).
Problem forward_problem(const bf16* x, const bf16* w, float* out_f32, bf16* out_bf16, int T, int K, int N, int k_chunks,
                        int chunk) {
  check_sizes(T, K, N);
  check_chunks(K, k_chunks, chunk, "linear", "K");
  return Problem{red_major(x, K, T, K, chunk), red_major(w, K, N, K, chunk), T, N, K, chunk,
                 K == 0 ? 0 : k_chunks, out_f32, out_bf16, nullptr};
}

// out[t][k] over N (input gradient): dy [T][N] reduction-contiguous, w [N][K] read
// as w[n][k] with the output index k contiguous.
Problem dgrad_problem(const bf16* dy, const bf16* w, float* out_f32, bf16* out_bf16, int T, int K, int N, int n_chunks,
                      int chunk) {
  check_sizes(T, K, N);
  check_chunks(N, n_chunks, chunk, "linear", "N");
  return Problem{red_major(dy, N, T, N, chunk), row_major(w, K, K), T, K, N, chunk,
                 N == 0 ? 0 : n_chunks, out_f32, out_bf16, nullptr};
}

// dw[n][k] over tokens: A(n, t) = dy[t][n] and B(k, t) = x[t][k], both with the
// output index contiguous; chunks of grad_token_chunk tokens, the last shorter.
Problem wgrad_problem(const Knobs& kn, const bf16* dy, const bf16* x, float* dw, int T, int K, int N) {
  check_sizes(T, K, N);
  if (kn.grad_token_chunk < 1)
    throw std::invalid_argument("linear_wgrad: grad_token_chunk = " + std::to_string(kn.grad_token_chunk));
  const int chunks = (T + kn.grad_token_chunk - 1) / kn.grad_token_chunk;
  return Problem{row_major(dy, N, N), row_major(x, K, K), N, K, T, kn.grad_token_chunk, chunks, dw, nullptr, nullptr};
}

// The problems of a grouped forward or input gradient (make: a LinearGroup's
// problem), each group with exactly one output.
template <class Make>
std::vector<Problem> group_problems(const char* fn, const LinearGroup* groups, int count, Make make) {
  std::vector<Problem> problems;
  for (int g = 0; g < count; ++g) {
    if ((groups[g].acc == nullptr) == (groups[g].y == nullptr))
      throw std::invalid_argument(std::string(fn) + ": group " + std::to_string(g) + " needs exactly one of acc, y");
    problems.push_back(make(groups[g]));
  }
  return problems;
}

// Whether the two trees' sum is the one tree over both chunk lists (its root's
// halves are the two roots): a power-of-two count of chunks that end exactly at
// the reduction's (non-empty) end, so none straddles the seam.
bool pair_is_one_tree(int N, int n_chunks, int chunk_len) {
  return N > 0 && (n_chunks & (n_chunks - 1)) == 0 && int64_t{n_chunks} * chunk_len == N;
}

// Two grouped input gradients, the second's into a scratch, and the additions: one
// per run of pairs whose outputs follow each other in memory (the experts' rows).
void dgrad_pairs_apart(const Knobs& kn, const DgradPair* pairs, int count, int K, int N, int n_chunks, int chunk_len,
                       cudaStream_t stream) {
  std::vector<size_t> at{0};
  for (int g = 0; g < count; ++g) at.push_back(at.back() + static_cast<size_t>(pairs[g].T) * K);
  DeviceBuffer<float> second_acc(at.back(), stream);
  std::vector<Problem> firsts, seconds;
  for (int g = 0; g < count; ++g) {
    const DgradPair& q = pairs[g];
    firsts.push_back(dgrad_problem(q.dy1, q.w1, q.acc, nullptr, q.T, K, N, n_chunks, chunk_len));
    seconds.push_back(dgrad_problem(q.dy2, q.w2, second_acc.get() + at[g], nullptr, q.T, K, N, n_chunks, chunk_len));
  }
  run_grouped<Major::Red, Major::Row>(kn.dot, firsts, stream);
  run_grouped<Major::Red, Major::Row>(kn.dot, seconds, stream);
  for (int g = 0, end; g < count; g = end) {
    for (end = g + 1; end < count && pairs[end].acc == pairs[end - 1].acc + (at[end] - at[end - 1]); ++end) {}
    if (at[end] > at[g]) add_f32(pairs[g].acc, second_acc.get() + at[g], at[end] - at[g], stream);
  }
}

}  // namespace

void linear_acc(const Knobs& kn, const bf16* x, const bf16* w, float* acc, int T, int K, int N, int k_chunks,
                int chunk_len, cudaStream_t stream) {
  run_gemm<Major::Red, Major::Red>(kn.dot, forward_problem(x, w, acc, nullptr, T, K, N, k_chunks, chunk_len), stream);
}

void linear_fwd(const Knobs& kn, const bf16* x, const bf16* w, bf16* y, int T, int K, int N, int k_chunks,
                cudaStream_t stream) {
  run_gemm<Major::Red, Major::Red>(
      kn.dot, forward_problem(x, w, nullptr, y, T, K, N, k_chunks, whole_chunk_len(K, k_chunks, "linear", "K")),
      stream);
}

void linear_fwd_grouped(const Knobs& kn, const LinearGroup* groups, int count, int K, int N, int k_chunks,
                        cudaStream_t stream) {
  const int chunk = whole_chunk_len(K, k_chunks, "linear", "K");
  const auto problem = [&](const LinearGroup& g) {
    return forward_problem(g.x, g.w, g.acc, g.y, g.T, K, N, k_chunks, chunk);
  };
  run_grouped<Major::Red, Major::Red>(kn.dot, group_problems("linear_fwd_grouped", groups, count, problem), stream);
}

void linear_dgrad(const Knobs& kn, const bf16* dy, const bf16* w, bf16* dx, int T, int K, int N, int n_chunks,
                  cudaStream_t stream) {
  run_gemm<Major::Red, Major::Row>(
      kn.dot, dgrad_problem(dy, w, nullptr, dx, T, K, N, n_chunks, whole_chunk_len(N, n_chunks, "linear", "N")),
      stream);
}

void linear_dgrad_acc(const Knobs& kn, const bf16* dy, const bf16* w, float* acc, int T, int K, int N, int n_chunks,
                      int chunk_len, cudaStream_t stream) {
  run_gemm<Major::Red, Major::Row>(kn.dot, dgrad_problem(dy, w, acc, nullptr, T, K, N, n_chunks, chunk_len), stream);
}

void linear_dgrad_grouped(const Knobs& kn, const LinearGroup* groups, int count, int K, int N, int n_chunks,
                          cudaStream_t stream) {
  const int chunk = whole_chunk_len(N, n_chunks, "linear", "N");
  const auto problem = [&](const LinearGroup& g) {
    return dgrad_problem(g.x, g.w, g.acc, g.y, g.T, K, N, n_chunks, chunk);
  };
  run_grouped<Major::Red, Major::Row>(kn.dot, group_problems("linear_dgrad_grouped", groups, count, problem), stream);
}

void linear_dgrad_pair_grouped(const Knobs& kn, const DgradPair* pairs, int count, int K, int N, int n_chunks,
                               int chunk_len, cudaStream_t stream) {
  check_chunks(N, n_chunks, chunk_len, "linear_dgrad_pair_grouped", "N");
  if (kn.dot == DotModel::Sm90Tc && pair_is_one_tree(N, n_chunks, chunk_len)) {
    std::vector<gemm::ProblemPair> merged;
    for (int g = 0; g < count; ++g) {
      const DgradPair& q = pairs[g];
      const Problem first = dgrad_problem(q.dy1, q.w1, q.acc, nullptr, q.T, K, N, n_chunks, chunk_len);
      const Problem second = dgrad_problem(q.dy2, q.w2, q.acc, nullptr, q.T, K, N, n_chunks, chunk_len);
      if (q.T > 0 && K > 0) merged.push_back({first, second});
    }
    if (merged.empty() || gemm::run_wgmma_pairs(Major::Red, Major::Row, merged, stream)) return;
  }
  dgrad_pairs_apart(kn, pairs, count, K, N, n_chunks, chunk_len, stream);
}

void linear_wgrad(const Knobs& kn, const bf16* dy, const bf16* x, float* dw, int T, int K, int N,
                  cudaStream_t stream) {
  run_gemm<Major::Row, Major::Row>(kn.dot, wgrad_problem(kn, dy, x, dw, T, K, N), stream);
}

void linear_wgrad_grouped(const Knobs& kn, const WgradGroup* groups, int count, int K, int N, cudaStream_t stream) {
  std::vector<Problem> problems;
  for (int g = 0; g < count; ++g)
    problems.push_back(wgrad_problem(kn, groups[g].dy, groups[g].x, groups[g].dw, groups[g].T, K, N));
  run_grouped<Major::Row, Major::Row>(kn.dot, problems, stream);
}

}  // namespace bp::cuda
