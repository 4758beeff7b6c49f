// Dot products cut into fixed chunks combined by the pairwise tree (SPEC.md §2.4.1):
// the form every reduction takes that a layout may split across ranks.
#pragma once
#include "dot.h"
#include "reduce.h"

namespace bp {

// K cut into `chunks` equal contiguous chunks (k % chunks == 0, checked by the
// caller); each chunk's dot starts at +0; partials go through pairwise_tree.
// `partials` holds `chunks` floats. chunks == 1 is the plain chain from +0.
template <class Model>
BP_HD float chunked_dot(const bf16* a, ptrdiff_t sa, const bf16* b, ptrdiff_t sb, int k, int chunks,
                        float* partials) {
  if (chunks == 1) return Model::chain(0.0f, a, sa, b, sb, k);
  const int len = k / chunks;
  for (int c = 0; c < chunks; ++c)
    partials[c] = Model::chain(0.0f, a + c * len * sa, sa, b + c * len * sb, sb, len);
  return pairwise_tree(partials, chunks);
}

// A reduction over tokens in chunks of `chunk` tokens (the last may be shorter),
// each chunk's dot from +0, chunk partials by pairwise_tree. `partials` holds
// ceil(k / chunk) floats. Weight gradients use this with grad_token_chunk.
template <class Model>
BP_HD float token_chunked_dot(const bf16* a, ptrdiff_t sa, const bf16* b, ptrdiff_t sb, int k, int chunk,
                              float* partials) {
  const int n = (k + chunk - 1) / chunk;
  for (int c = 0; c < n; ++c) {
    const int len = (c + 1) * chunk <= k ? chunk : k - c * chunk;
    partials[c] = Model::chain(0.0f, a + c * chunk * sa, sa, b + c * chunk * sb, sb, len);
  }
  return pairwise_tree(partials, n);
}

}  // namespace bp
