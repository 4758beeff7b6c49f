// The programs' compute backend on a GPU (the interface: program/backend.h):
// tensors in device memory (DeviceBuffer, from
// the stream-ordered pool), the bp::cuda twins of the ops, all on one stream.
// Host-side arguments (attention runs, MoE plans, expert pointer tables) are
// what those twins take on the host, as the reference does. Collectives are
// device copies between ranks that share the GPU (below).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "optimized/cuda/attention.h"
#include "optimized/cuda/common.h"
#include "optimized/cuda/embedding.h"
#include "optimized/cuda/linear.h"
#include "optimized/cuda/logprob.h"
#include "optimized/cuda/moe_experts.h"
#include "optimized/cuda/moe_router.h"
#include "optimized/cuda/residual.h"
#include "optimized/cuda/rmsnorm.h"
#include "optimized/cuda/rope.h"
#include "optimized/cuda/rows.h"
#include "optimized/cuda/swiglu.h"
#include "program/backend.h"
#include "program/layouts/comm.h"

namespace bp::gpu {

class CudaBackend {
 public:
  template <class T>
  using Buf = cuda::DeviceBuffer<T>;
  template <class T>
  using Resident = cuda::DeviceBuffer<T>;
  using Comm = layouts::Comm;
  template <class T>
  using Gathered = layouts::Gathered<Buf<T>>;

  // The per-thread default stream unless told otherwise: ranks on their own
  // threads do not serialise on one another.
  CudaBackend() = default;
  explicit CudaBackend(cudaStream_t stream) : stream_(stream) {}
  cudaStream_t stream() const { return stream_; }

  template <class T>
  Buf<T> zeros(size_t n) const {
    Buf<T> b(n, stream_);
    if (n > 0) BP_CUDA_CHECK(cudaMemsetAsync(b.get(), 0, n * sizeof(T), stream_));
    return b;
  }
  // For an output the next op writes in full (the logits: a memset of 1.2 GB at 4096 tokens).
  template <class T>
  Buf<T> unset(size_t n) const {
    return Buf<T>(n, stream_);
  }
  template <class T>
  Buf<T> clone(const Buf<T>& b) const {
    Buf<T> c(b.size(), stream_);
    copy(c.get(), b.get(), b.size());
    return c;
  }
  template <class T>
  Resident<T> resident(const std::vector<T>& host) const {
    return Resident<T>(host, stream_);
  }
  template <class T>
  Resident<T> resident(std::span<const T> host) const {
    Resident<T> r(host.size(), stream_);
    if (!host.empty())
      BP_CUDA_CHECK(cudaMemcpyAsync(r.get(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream_));
    return r;
  }
  template <class T>
  std::vector<T> to_host(const T* p, size_t n) const {
    return cuda::copy_to_host(p, n, stream_);
  }
  template <class T>
  std::vector<T> take(Buf<T>&& b) const {
    return cuda::copy_to_host(b.get(), b.size(), stream_);
  }
  template <class T>
  void copy(T* dst, const T* src, size_t n) const {
    if (n > 0) BP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
  }
  template <class T>
  void gather_rows(const T* src, size_t width, const std::vector<int>& rows, T* dst) const {
    cuda::gather_rows(src, width, rows, dst, stream_);
  }
  template <class T>
  void scatter_rows(const T* src, size_t width, const std::vector<int>& rows, T* dst) const {
    cuda::scatter_rows(src, width, rows, dst, stream_);
  }
  template <class T>
  void copy_rows(const T* src, size_t width, const std::vector<int>& src_rows, T* dst,
                 const std::vector<int>& dst_rows) const {
    cuda::copy_rows(src, width, src_rows, dst, dst_rows, stream_);
  }
  void add_f32(float* acc, const float* x, size_t n) const { cuda::add_f32(acc, x, n, stream_); }
  void round_to_bf16(const float* x, bf16* out, size_t n) const { cuda::round_to_bf16(x, out, n, stream_); }
  void reduce_partials(const float* base, const std::vector<size_t>& offsets, size_t n, PartialSum how,
                       float* out) const {
    cuda::reduce_partials(base, offsets, n, how, out, stream_);
  }

  // Collectives as device copies, for ranks whose buffers share one GPU (virtual
  // ranks, gpu/virtual_ranks.h); the semantics of the host
  // backend's. Each rank publishes {device pointer, the piece for every peer}
  // through the byte Comm and copies its pieces from the peers' buffers on its
  // own stream.
  template <class T>
  Gathered<T> all_gather(Comm& comm, const T* mine, size_t n) const {
    return fetch(comm, mine, std::vector<Piece>(static_cast<size_t>(comm.size()), Piece{0, n}));
  }
  template <class T>
  Gathered<T> all_to_all(Comm& comm, const T* send, const std::vector<size_t>& counts) const {
    std::vector<Piece> pieces;
    for (size_t r = 0, at = 0; r < counts.size(); at += counts[r++]) pieces.push_back({at, counts[r]});
    return fetch(comm, send, pieces);
  }

#define BP_CUDA_OP(op)                                       \
  template <class... A>                                      \
  decltype(auto) op(A&&... a) const {                        \
    return ::bp::cuda::op(std::forward<A>(a)..., stream_);   \
  }
  BP_PROGRAM_OPS(BP_CUDA_OP)
#undef BP_CUDA_OP

 private:
  struct Piece {
    uint64_t offset, count;  // elements of the published buffer meant for one peer
  };

  // Peer r's piece for me, for every r, concatenated in rank order. My stream is
  // synchronised before I publish (my buffer is written) and again before the
  // closing exchange (my copies are done); after that exchange every peer's copies
  // are done too, so each may free or overwrite what it published.
  template <class T>
  Gathered<T> fetch(Comm& comm, const T* base, const std::vector<Piece>& for_peer) const {
    BP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<uint64_t> mine{reinterpret_cast<uintptr_t>(base)};
    for (const Piece& p : for_peer) mine.insert(mine.end(), {p.offset, p.count});
    const auto all = layouts::all_gather(comm, std::span<const uint64_t>(mine));
    const size_t me = static_cast<size_t>(comm.rank());
    Gathered<T> g;
    g.offset.push_back(0);
    for (const std::vector<uint64_t>& peer : all) {
      if (peer.size() != 1 + 2 * all.size()) throw std::logic_error("CudaBackend: malformed collective descriptor");
      g.offset.push_back(g.offset.back() + peer[2 + 2 * me]);
    }
    g.data = Buf<T>(g.offset.back(), stream_);
    for (size_t r = 0; r < all.size(); ++r) {
      const T* from = reinterpret_cast<const T*>(all[r][0]) + all[r][1 + 2 * me];
      copy(g.data.get() + g.offset[r], from, g.count(static_cast<int>(r)));
    }
    BP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    comm.all_gather({});
    return g;
  }

  cudaStream_t stream_ = cudaStreamPerThread;
};

}  // namespace bp::gpu
