// linear: bf16 × bf16 -> fp32 by the contract's dot model -> bf16 (SPEC.md §5.4).
// Weights are [N][K] (Hugging Face nn.Linear layout), activations [T][K], row-major.
#pragma once
#include "reference/contract/contract.h"

namespace bp::ref {

// acc[t][n] = dot over K of x[t][:] · w[n][:], cut into k_chunks chunks of chunk_len
// (1 = one chain; k_chunks·chunk_len >= K, chunks past K empty): fixed_chunk_len(K, C)
// for a whole reduction, the whole's for a TP rank's slice of it (SPEC.md §2.4.1).
void linear_acc(const Knobs& kn, const bf16* x, const bf16* w, float* acc, int T, int K, int N, int k_chunks,
                int chunk_len);

// y = R(acc).
void linear_fwd(const Knobs& kn, const bf16* x, const bf16* w, bf16* y, int T, int K, int N, int k_chunks);

// dx[t][k] = R(dot over N of dy[t][:] · w[:][k]), cut into n_chunks.
void linear_dgrad(const Knobs& kn, const bf16* dy, const bf16* w, bf16* dx, int T, int K, int N, int n_chunks);

// The same dot before rounding, fp32: for inputs that receive gradient from more
// than one path, whose fp32 accumulators are added before one rounding. N is cut
// into n_chunks chunks of chunk_len, as linear_acc's K.
void linear_dgrad_acc(const Knobs& kn, const bf16* dy, const bf16* w, float* acc, int T, int K, int N, int n_chunks,
                      int chunk_len);

// dw[n][k] = token-chunked dot over t of dy[t][n] · x[t][k] (grad_token_chunk), fp32.
void linear_wgrad(const Knobs& kn, const bf16* dy, const bf16* x, float* dw, int T, int K, int N);

}  // namespace bp::ref
