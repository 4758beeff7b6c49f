// CUDA twin of reference/ops/logprob.h (SPEC.md §5.10): the vocab-parallel stages,
// the whole forward and the backward. Device pointers, same layouts; `stream` last.
// Calls that check targets (logprob_fwd, logprob_bwd) copy them to pinned host memory
// behind `stream`'s work and refuse bad arguments with the reference's
// std::invalid_argument without writing any output, so they wait for that work:
// logprob_fwd after launching its first pass (which writes only its own scratch),
// logprob_bwd after launching its gradient kernel, which obeys a device-side copy of
// the same check (and writes nothing where it fails). The others are asynchronous.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "reference/contract/contract.h"

namespace bp::cuda {

// Largest tp_tree_width logprob_combine takes (its tree lives in registers).
constexpr int kMaxLogprobChunks = 64;

void logprob_chunk_max(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                       int n_chunks, float temp,
                       float* chunk_max, int out_ld, cudaStream_t stream = 0);

void logprob_row_max(const Knobs& kn, const float* chunk_max, int T, float* row_max, cudaStream_t stream = 0);

void logprob_chunk_sums(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                       int n_chunks, float temp,
                        const float* row_max, float* chunk_sum, float* chunk_tsum, int out_ld, cudaStream_t stream = 0);

void logprob_target_logit(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                          const int32_t* targets, float temp, float* x_target, cudaStream_t stream = 0);

void logprob_combine(const Knobs& kn, const float* chunk_sum, const float* chunk_tsum, const float* x_target,
                     const float* row_max, int T, float* row_sum, float* logprob, float* entropy,
                     cudaStream_t stream = 0);
// Contract v2's one-pass stages (ref::logprob_chunk_states, ref::logprob_merge_states).
void logprob_chunk_states(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_len, int chunk_len,
                       int n_chunks,
                          float temp, float* chunk_max, float* chunk_sum, float* chunk_tsum, int out_ld,
                          cudaStream_t stream = 0);
void logprob_merge_states(const Knobs& kn, const float* chunk_max, const float* chunk_sum, const float* chunk_tsum,
                          const float* x_target, int T, float* row_max, float* row_sum, float* logprob, float* entropy,
                          cudaStream_t stream = 0);

void logprob_fwd(const Knobs& kn, const bf16* logits, const int32_t* targets, int T, int V, float temp, float* logprob,
                 float* row_max, float* row_sum, float* entropy, cudaStream_t stream = 0);

void logprob_bwd_slice(const Knobs& kn, const bf16* logits, int64_t ld, int T, int vocab_begin, int vocab_len,
                       const int32_t* targets, const float* coef, const float* row_max, const float* row_sum,
                       float temp, bf16* dlogits, cudaStream_t stream = 0);

void logprob_bwd(const Knobs& kn, const bf16* logits, const int32_t* targets, const float* coef, const float* row_max,
                 const float* row_sum, int T, int V, float temp, bf16* dlogits, cudaStream_t stream = 0);

}  // namespace bp::cuda
