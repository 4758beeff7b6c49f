// CUDA twin of reference/ops/attention.h (SPEC.md §5.6): the same functions and
// arguments, bit-identical under every contract. Tensors are device pointers
// (16-byte aligned); the AttnSeq arrays and `seq` are HOST memory — the host plans
// the query tiles and key splits from them and uploads a small task list.
// Everything is asynchronous on `stream` (scratch is stream-ordered).
//
// Supported here: head_dim 32, 64 or 128 (attention_takes_head_dim) and attn_kv_block 64 (every contract's); any
// attn_kv_split (a multiple of the block), grad_token_chunk and GQA group. The sm90-tc
// forward at head_dim 64 and 128 under softmax_exp exp2_poly also runs attn_kv_block
// 128 in the merged schedule (the measurement of SPEC.md §1.3). Other shapes throw
// std::invalid_argument, as bad knobs do in the reference.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <iterator>
#include <string>

#include "reference/ops/attention.h"

namespace bp::cuda {

using ref::AttnDims;
using ref::AttnSeq;

// The head_dims the kernels are instantiated for (attention_tile.cuh's with_shape).
inline constexpr int kAttentionHeadDims[] = {32, 64, 128};
inline bool attention_takes_head_dim(int D) {
  return std::find(std::begin(kAttentionHeadDims), std::end(kAttentionHeadDims), D) != std::end(kAttentionHeadDims);
}
inline std::string attention_head_dims_text() {  // "32, 64 or 128"
  std::string s;
  const size_t n = std::size(kAttentionHeadDims);
  for (size_t i = 0; i < n; ++i)
    s += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::to_string(kAttentionHeadDims[i]);
  return s;
}

void attention_fwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, bf16* o, float* m, float* l, cudaStream_t stream = 0);

void attention_bwd(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                   const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq, bf16* dk,
                   bf16* dv, cudaStream_t stream = 0);

void attention_bwd_dq(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q, const bf16* k,
                      const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout, bf16* dq,
                      cudaStream_t stream = 0);

int attention_bwd_kv_partials(const Knobs& kn, AttnDims dims, const AttnSeq& seq, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* o, const float* m, const float* l, const bf16* dout,
                              float* dk_part, float* dv_part, cudaStream_t stream = 0);

void attention_bwd_kv_combine(const Knobs& kn, AttnDims dims, int S, int n_chunks, const float* dk_part,
                              const float* dv_part, bf16* dk, bf16* dv, cudaStream_t stream = 0);

// How the forward spreads a row's key splits over CTAs. Both give the same bits
// (the per-row operation sequence is the reference's either way); attention_fwd
// picks by occupancy (kAuto), tests force each one.
enum class FwdSchedule {
  kAuto,
  kMergedInCta,  // one CTA per (query tile, kv head) walks every split and merges them in order
  kSplitCtas,    // flash-decoding: one CTA per (query tile, kv head, split), then a combine kernel
};

void attention_fwd_scheduled(const Knobs& kn, AttnDims dims, const AttnSeq* seqs, int n_seqs, const bf16* q,
                             const bf16* k, const bf16* v, bf16* o, float* m, float* l, FwdSchedule schedule,
                             cudaStream_t stream = 0);

}  // namespace bp::cuda
