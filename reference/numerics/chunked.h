// Dot products cut into fixed chunks combined by the pairwise tree (SPEC.md §2.4.1):
// the form every reduction takes that a layout may split across ranks.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "dot.h"
#include "reduce.h"

namespace bp {

// The C fixed chunks of a reduction of length k (SPEC.md §2.4.1): each ⌈k/C⌉ long,
// chunk c covering [c·len, min((c+1)·len, k)), so the last ones may be shorter or
// empty. For k a multiple of C these are the C equal chunks.
BP_HD inline int fixed_chunk_len(int k, int chunks) { return (k + chunks - 1) / chunks; }

// An op's chunks of a reduction over `size` given as a count and a length (a TP
// rank's slice takes the whole reduction's length, §2.4.1): at least one chunk,
// and together they cover it. Throws std::invalid_argument naming op and what.
inline void check_chunks(int size, int chunks, int chunk_len, const char* op, const char* what) {
  if (chunks < 1)
    throw std::invalid_argument(std::string(op) + ": " + what + " needs at least one chunk, got " +
                                std::to_string(chunks));
  if (chunk_len < 0 || int64_t{chunks} * chunk_len < size)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(chunks) + " chunks of " +
                                std::to_string(chunk_len) + " do not cover " + what + " = " + std::to_string(size));
}

// The chunk length of a whole reduction over `size` in `chunks` fixed chunks, checked.
inline int whole_chunk_len(int size, int chunks, const char* op, const char* what) {
  const int len = chunks < 1 ? 0 : fixed_chunk_len(size, chunks);
  check_chunks(size, chunks, len, op, what);
  return len;
}

// The length of chunk c of chunks `len` long over k elements: 0 for a chunk past k.
BP_HD inline int chunk_extent(int k, int len, int c) {
  const int rest = k - c * len;
  return rest <= 0 ? 0 : rest < len ? rest : len;
}

// `chunks` chunks of `len` elements over k (chunks·len >= k; chunks past k empty),
// each chunk's dot from +0 (an empty chunk's partial is that +0), the `chunks`
// partials through pairwise_tree. `partials` holds `chunks` floats.
template <class Model>
BP_HD float split_dot(const bf16* a, ptrdiff_t sa, const bf16* b, ptrdiff_t sb, int k, int len, int chunks,
                      float* partials) {
  for (int c = 0; c < chunks; ++c) {
    const int k0 = c * len < k ? c * len : k;  // an empty chunk reads nothing
    partials[c] = Model::chain(0.0f, a + k0 * sa, sa, b + k0 * sb, sb, chunk_extent(k, len, c));
  }
  return pairwise_tree(partials, chunks);
}

// K cut into the `chunks` fixed chunks (fixed_chunk_len). chunks == 1 is the plain
// chain from +0.
template <class Model>
BP_HD float chunked_dot(const bf16* a, ptrdiff_t sa, const bf16* b, ptrdiff_t sb, int k, int chunks,
                        float* partials) {
  if (chunks == 1) return Model::chain(0.0f, a, sa, b, sb, k);
  return split_dot<Model>(a, sa, b, sb, k, fixed_chunk_len(k, chunks), chunks, partials);
}

// A reduction over tokens in chunks of `chunk` tokens (the last may be shorter),
// each chunk's dot from +0, chunk partials by pairwise_tree. `partials` holds
// ceil(k / chunk) floats. Weight gradients use this with grad_token_chunk.
template <class Model>
BP_HD float token_chunked_dot(const bf16* a, ptrdiff_t sa, const bf16* b, ptrdiff_t sb, int k, int chunk,
                              float* partials) {
  return split_dot<Model>(a, sa, b, sb, k, chunk, (k + chunk - 1) / chunk, partials);
}

}  // namespace bp
