// embedding on the GPU (SPEC.md §5.1): a row gather forward; a backward where one
// thread owns each element (v, h) of a row some token hits, walks that id's tokens
// in increasing t, closes a token chunk's partial when the chunk changes and feeds
// it to the chunk tree (sparse_tree.h: chunks without a hit are left out, which
// SPEC.md §5.1 shows gives pairwise_tree's bits).
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/embedding.h"
#include "optimized/cuda/sparse_tree.h"

namespace bp::cuda {
namespace {

// ref::embedding's refusal, message included, on a host copy of the ids.
std::vector<int32_t> checked_tokens(const int32_t* tokens, int T, int V, cudaStream_t stream) {
  std::vector<int32_t> host = copy_to_host(tokens, T, stream);
  for (int t = 0; t < T; ++t)
    if (host[t] < 0 || host[t] >= V)
      throw std::invalid_argument("embedding: token id " + std::to_string(host[t]) + " at position " +
                                  std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  return host;
}

// Rows copied in units of Unit (16 bytes where the rows allow it, else one bf16).
template <class Unit>
__global__ void gather_kernel(const int32_t* __restrict__ tokens, const Unit* __restrict__ table,
                              Unit* __restrict__ out, int T, int units_per_row) {
  for_each_index(static_cast<size_t>(T) * units_per_row, [&](size_t idx) {
    const size_t t = idx / units_per_row, u = idx % units_per_row;
    out[idx] = table[static_cast<size_t>(tokens[t]) * units_per_row + u];
  });
}

// The hit rows: ids[k] for k < count, its token positions (increasing) at
// positions[start[k] .. start[k + 1]).
struct HitRows {
  std::vector<int32_t> ids, start, positions;
};

HitRows group_by_id(const std::vector<int32_t>& tokens) {
  HitRows g;
  g.positions.resize(tokens.size());
  std::iota(g.positions.begin(), g.positions.end(), 0);
  std::stable_sort(g.positions.begin(), g.positions.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
  for (size_t k = 0; k < g.positions.size(); ++k)
    if (k == 0 || tokens[g.positions[k]] != tokens[g.positions[k - 1]]) {
      g.ids.push_back(tokens[g.positions[k]]);
      g.start.push_back(static_cast<int32_t>(k));
    }
  g.start.push_back(static_cast<int32_t>(g.positions.size()));
  return g;
}

// Block (k, tile): hit row k, features tile·blockDim .. +blockDim.
__global__ void scatter_kernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ start,
                               const int32_t* __restrict__ positions, const bf16* __restrict__ dout,
                               float* __restrict__ dtable, int H, int chunk) {
  const int k = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
  if (h >= H) return;
  SparsePairwiseTree tree;
  int chunk_of_acc = positions[start[k]] / chunk;
  float acc = 0.0f;
  for (int i = start[k]; i < start[k + 1]; ++i) {
    const int t = positions[i];
    if (t / chunk != chunk_of_acc) {
      tree.push(chunk_of_acc, acc);
      chunk_of_acc = t / chunk;
      acc = 0.0f;
    }
    acc = add_rn(acc, widen(dout[static_cast<size_t>(t) * H + h]));
  }
  tree.push(chunk_of_acc, acc);
  dtable[static_cast<size_t>(ids[k]) * H + h] = tree.finish();
}

}  // namespace

void embedding_fwd(const Knobs&, const int32_t* tokens, const bf16* table, bf16* out, int T, int V, int H,
                   cudaStream_t stream) {
  checked_tokens(tokens, T, V, stream);
  if (T == 0 || H == 0) return;
  constexpr int kPerUnit = sizeof(uint4) / sizeof(bf16);
  if (H % kPerUnit == 0 && aligned16(table) && aligned16(out)) {
    const int units = H / kPerUnit;
    gather_kernel<<<grid_for(static_cast<size_t>(T) * units), kBlockThreads, 0, stream>>>(
        tokens, reinterpret_cast<const uint4*>(table), reinterpret_cast<uint4*>(out), T, units);
  } else {
    gather_kernel<<<grid_for(static_cast<size_t>(T) * H), kBlockThreads, 0, stream>>>(tokens, table, out, T, H);
  }
  BP_CUDA_CHECK_LAUNCH();
}

void embedding_bwd(const Knobs& kn, const int32_t* tokens, const bf16* dout, float* dtable, int T, int V, int H,
                   cudaStream_t stream) {
  const std::vector<int32_t> host_tokens = checked_tokens(tokens, T, V, stream);
  BP_CUDA_CHECK(cudaMemsetAsync(dtable, 0, sizeof(float) * V * static_cast<size_t>(H), stream));  // +0 bits
  if (T == 0 || H == 0) return;
  const HitRows g = group_by_id(host_tokens);
  const DeviceBuffer<int32_t> ids(g.ids, stream), start(g.start, stream), positions(g.positions, stream);
  const dim3 grid(static_cast<unsigned>(g.ids.size()), static_cast<unsigned>((H + kBlockThreads - 1) / kBlockThreads));
  scatter_kernel<<<grid, kBlockThreads, 0, stream>>>(ids.get(), start.get(), positions.get(), dout, dtable, H,
                                                     kn.grad_token_chunk);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace bp::cuda
