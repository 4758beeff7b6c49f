#include "embedding.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/numerics/reduce.h"

namespace bp::ref {
namespace {

void check_tokens(const int32_t* tokens, int T, int V) {
  for (int t = 0; t < T; ++t)
    if (tokens[t] < 0 || tokens[t] >= V)
      throw std::invalid_argument("embedding: token id " + std::to_string(tokens[t]) + " at position " +
                                  std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
}

// The positions t of each id v in increasing t (a stable counting sort):
// positions[start[v] .. start[v+1]).
struct TokensById {
  std::vector<int> start, positions;
};

TokensById group_by_id(const int32_t* tokens, int T, int V) {
  TokensById g{std::vector<int>(static_cast<size_t>(V) + 1, 0), std::vector<int>(T)};
  for (int t = 0; t < T; ++t) ++g.start[tokens[t] + 1];
  for (int v = 0; v < V; ++v) g.start[v + 1] += g.start[v];
  std::vector<int> next(g.start.begin(), g.start.end() - 1);
  for (int t = 0; t < T; ++t) g.positions[next[tokens[t]]++] = t;
  return g;
}

// One element dtable[v][h]: the chunk partials of the tokens `pos[0..n)` (increasing
// t, all equal to v), every other chunk's partial +0, then the tree over all chunks.
float scatter_sum(const bf16* dout, int H, int h, const int* pos, int n, int chunk, float* partials, int chunks) {
  std::fill(partials, partials + chunks, 0.0f);
  for (int i = 0; i < n; ++i) {
    float& acc = partials[pos[i] / chunk];
    acc = add_rn(acc, widen(dout[static_cast<size_t>(pos[i]) * H + h]));
  }
  return pairwise_tree(partials, chunks);
}

}  // namespace

void embedding_fwd(const Knobs&, const int32_t* tokens, const bf16* table, bf16* out, int T, int V, int H) {
  check_tokens(tokens, T, V);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t)
    std::memcpy(out + static_cast<size_t>(t) * H, table + static_cast<size_t>(tokens[t]) * H, sizeof(bf16) * H);
}

void embedding_bwd(const Knobs& kn, const int32_t* tokens, const bf16* dout, float* dtable, int T, int V, int H) {
  check_tokens(tokens, T, V);
  const TokensById g = group_by_id(tokens, T, V);
  const int chunks = std::max(1, (T + kn.grad_token_chunk - 1) / kn.grad_token_chunk);
#pragma omp parallel
  {
    std::vector<float> partials(chunks);
#pragma omp for schedule(dynamic, 64)
    for (int v = 0; v < V; ++v) {
      float* row = dtable + static_cast<size_t>(v) * H;
      const int* pos = g.positions.data() + g.start[v];
      const int n = g.start[v + 1] - g.start[v];
      for (int h = 0; h < H; ++h)
        row[h] = n == 0 ? 0.0f : scatter_sum(dout, H, h, pos, n, kn.grad_token_chunk, partials.data(), chunks);
    }
  }
}

}  // namespace bp::ref
