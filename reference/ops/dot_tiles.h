// Many independent dots at once: every bf16 GEMM of the reference goes through here
// (linear's forward and both gradients, hence the MLP, the MoE experts and the router).
// Each output keeps its own sequence of operations (SPEC.md §2.3, §2.4.1); the
// vectorised path only computes several outputs side by side, so both paths give
// the same bits.
#pragma once
#include "reference/numerics/dot.h"

namespace bp::ref {

// out[i * rows_b + j] = token_chunked_dot of a's row i and b's row j (both rows of
// length k, row-major): K cut into chunks of chunk_len (the last may be shorter),
// each chunk's chain from +0, the partials by pairwise_tree. chunk_len = k / C is
// chunked_dot's C equal chunks; k = 0 gives +0.
void dot_rows(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len, float* out);

// The definition, one output after another; dot_rows takes it where the host lacks
// AVX2 and FMA.
void dot_rows_scalar(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len,
                     float* out);

// Whether this host runs dot_rows_simd: x86-64 with AVX2 and FMA.
bool dot_rows_simd_available();

// Cache-blocked tiles of outputs in AVX2 lanes; requires dot_rows_simd_available().
void dot_rows_simd(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len,
                   float* out);

}  // namespace bp::ref
