// Many independent dots at once: every bf16 GEMM of the reference goes through here
// (linear's forward and both gradients, hence the MLP, the MoE experts and the router),
// and every product of attention (framed_chains: scores, P·V, dq, dk, dv).
// Each output keeps its own sequence of operations (SPEC.md §2.3, §2.4.1); the
// vectorised path only computes several outputs side by side, so both paths give
// the same bits.
#pragma once
#include "reference/numerics/dot.h"

namespace bp::ref {

// out[i * rows_b + j] = split_dot of a's row i and b's row j (both rows of length k,
// row-major): `chunks` chunks of chunk_len (chunks·chunk_len >= k; the last ones
// shorter or empty), each chunk's chain from +0, the `chunks` partials by
// pairwise_tree. chunk_len = fixed_chunk_len(k, C), chunks = C is chunked_dot's C
// fixed chunks, ⌈k/chunk_len⌉ chunks the token chunks; k = 0 gives +0.
void dot_rows(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len, int chunks,
              float* out);

// The definition, one output after another; dot_rows takes it where the host lacks
// AVX2 and FMA.
void dot_rows_scalar(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len,
                     int chunks, float* out);

// Whether this host runs dot_rows_simd: x86-64 with AVX2 and FMA.
bool dot_rows_simd_available();

// Cache-blocked tiles of outputs in AVX2 lanes; requires dot_rows_simd_available().
void dot_rows_simd(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len,
                   int chunks, float* out);

// Host code compiled a second time for AVX2 + FMA, every call inlined into it: the
// same IEEE operations (same bits), but fma_rn one instruction instead of a libm call
// and loops in vector registers. Callers take it where dot_simd_enabled().
#if defined(__x86_64__)
#define BP_AVX2_FLATTEN __attribute__((target("avx2,fma"), flatten))
#else
#define BP_AVX2_FLATTEN
#endif

// Whether dot_rows and framed_chains take the SIMD path (available and not switched
// off). Switching it off runs the definition: the bits are the same either way, which
// is what tests and benchmarks compare.
bool dot_simd_enabled();
void set_dot_simd_enabled(bool on);

// One operand of framed_chains: element (row or column i, frame slot s) at
// p[i * outer + (s - first) * step]. Only slots that some output reads are touched.
struct FrameOperand {
  const bf16* p;
  ptrdiff_t outer, step;
};

// c[i * ldc + j] = framed_chain(c[i * ldc + j], a_i, b_j) (attention.h) for i < rows,
// j < cols: the dot model continued from c over a frame of k slots of which row i's
// [lo[i], hi[i]) are present (first <= lo[i], hi[i] <= k; null lo, hi: [first, k));
// absent slots are the product +0·+0 and sm90-tc groups sit at slots 0, 16, ... of the
// frame. a_i is read over [lo[i], hi[i]), b over the union of the rows' ranges. Runs
// on the calling thread: attention parallelises over its own tiles.
void framed_chains(DotModel model, int rows, int cols, int k, int first, FrameOperand a, FrameOperand b,
                   const int* lo, const int* hi, float* c, int ldc);

// The definition, one output after another.
void framed_chains_scalar(DotModel model, int rows, int cols, int k, int first, FrameOperand a, FrameOperand b,
                          const int* lo, const int* hi, float* c, int ldc);

}  // namespace bp::ref
