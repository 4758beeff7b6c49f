// embedding: row gather forward, token-chunked scatter-add backward (SPEC.md §5.1).
// The table is [V][H] (Hugging Face nn.Embedding layout), activations [T][H], row-major.
#pragma once
#include <cstdint>

#include "reference/contract/contract.h"

namespace bp::ref {

// out[t][:] = table[tokens[t]][:], bits copied. Throws std::invalid_argument,
// naming the id and V, if any token is outside [0, V); nothing is written then.
void embedding_fwd(const Knobs& kn, const int32_t* tokens, const bf16* table, bf16* out, int T, int V, int H);

// dtable[v][h] = sum over t with tokens[t] == v of f(dout[t][h]), fp32: tokens cut
// into chunks of grad_token_chunk, plain fp32 adds in increasing t from +0 inside a
// chunk, chunk partials by pairwise_tree. Writes every element (rows never hit are
// +0). Same token check as the forward.
void embedding_bwd(const Knobs& kn, const int32_t* tokens, const bf16* dout, float* dtable, int T, int V, int H);

}  // namespace bp::ref
