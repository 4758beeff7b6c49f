// CUDA twin of reference/ops/linear.h (SPEC.md §5.4): same arguments, device
// pointers, bit-identical results under every contract. Asynchronous on `stream`.
// sm90-tc runs on the tensor cores (wgmma fed by TMA where the operands allow and
// M > 16, else mma.sync.m16n8k16), fma-seq on the SIMT cores.
// Reductions with more chunks than a tile keeps in registers (tree levels >= 3,
// e.g. wgrad over more than 8 token chunks) allocate a stream-ordered fp32 scratch
// of one [rows][cols] plane per extra level.
#pragma once
#include <cuda_runtime_api.h>

#include "reference/contract/contract.h"

namespace bp::cuda {

// acc[t][n] = dot over K of x[t][:] · w[n][:], cut into k_chunks chunks of chunk_len
// (1 = one chain; k_chunks·chunk_len >= K, chunks past K empty).
void linear_acc(const Knobs& kn, const bf16* x, const bf16* w, float* acc, int T, int K, int N, int k_chunks,
                int chunk_len, cudaStream_t stream = 0);

// y = R(acc).
void linear_fwd(const Knobs& kn, const bf16* x, const bf16* w, bf16* y, int T, int K, int N, int k_chunks,
                cudaStream_t stream = 0);

// One GEMM of a grouped forward: x [T][K] times w [N][K] (K and N shared by the
// launch) into exactly one of acc (fp32, as linear_acc) or y (bf16, as linear_fwd).
struct LinearGroup {
  const bf16* x;
  const bf16* w;
  int T;
  float* acc;
  bf16* y;
};

// Every group's linear_acc / linear_fwd (the same bits) in one launch over a device
// table of all groups' output tiles; `groups` is a host array of `count`.
void linear_fwd_grouped(const Knobs& kn, const LinearGroup* groups, int count, int K, int N, int k_chunks,
                        cudaStream_t stream = 0);

// dx[t][k] = R(dot over N of dy[t][:] · w[:][k]), cut into n_chunks.
void linear_dgrad(const Knobs& kn, const bf16* dy, const bf16* w, bf16* dx, int T, int K, int N, int n_chunks,
                  cudaStream_t stream = 0);

// The same dot before rounding, fp32; N in n_chunks chunks of chunk_len.
void linear_dgrad_acc(const Knobs& kn, const bf16* dy, const bf16* w, float* acc, int T, int K, int N, int n_chunks,
                      int chunk_len, cudaStream_t stream = 0);

// Every group's linear_dgrad / linear_dgrad_acc in one launch, with LinearGroup's
// x read as the group's dy [T][N] and w [N][K] its weight.
void linear_dgrad_grouped(const Knobs& kn, const LinearGroup* groups, int count, int K, int N, int n_chunks,
                          cudaStream_t stream = 0);

// The input gradient of two linears reading the same input (the MLP's gate and up,
// SPEC.md §5.7 step 3): acc = linear_dgrad_acc(dy1, w1) + linear_dgrad_acc(dy2, w2)
// by one fp32 addition, each over N in n_chunks chunks of chunk_len.
struct DgradPair {
  const bf16* dy1;
  const bf16* w1;
  const bf16* dy2;
  const bf16* w2;
  int T;
  float* acc;
};

// Every pair's sum in one grouped launch where it can be one GEMM: with n_chunks a
// power of two and n_chunks · chunk_len = N, the sum is the pairwise tree over the
// 2·n_chunks chunks of [dy1 | dy2]·[w1 ; w2], which the warpgroup kernel reduces
// in one pass; elsewhere two grouped GEMMs and the additions.
void linear_dgrad_pair_grouped(const Knobs& kn, const DgradPair* pairs, int count, int K, int N, int n_chunks,
                               int chunk_len, cudaStream_t stream = 0);

// dw[n][k] = token-chunked dot over t of dy[t][n] · x[t][k] (grad_token_chunk), fp32.
void linear_wgrad(const Knobs& kn, const bf16* dy, const bf16* x, float* dw, int T, int K, int N,
                  cudaStream_t stream = 0);

// One weight gradient of a grouped launch: dy [T][N], x [T][K] into dw [N][K].
struct WgradGroup {
  const bf16* dy;
  const bf16* x;
  int T;
  float* dw;
};

// Every group's linear_wgrad (the same bits) in one launch.
void linear_wgrad_grouped(const Knobs& kn, const WgradGroup* groups, int count, int K, int N,
                          cudaStream_t stream = 0);

}  // namespace bp::cuda
