// The programs' compute backend on real ranks: the GPU backend's ops
// (gpu/cuda_backend.h) on this process's GPU, with the collectives
// over NCCL (nccl_comm.h) instead of copies between ranks sharing a GPU. The rank
// program (program/layouts/rank_program.h) is the same; only its bytes travel
// differently.
#pragma once
#include <stdexcept>
#include <vector>

#include "gpu/nccl/nccl_comm.h"
#include "gpu/cuda_backend.h"

namespace bp::nccl {

class NcclBackend : public gpu::CudaBackend {
 public:
  explicit NcclBackend(cudaStream_t stream) : CudaBackend(stream) {}

  template <class T>
  Gathered<T> all_gather(Comm& comm, const T* mine, size_t n) const {
    NcclComm& c = nccl(comm);
    Gathered<T> g = with_counts<T>(c.all_gather_count(n));
    c.all_gather_device(mine, byte_offsets<T>(g.offset), g.data.get());
    return g;
  }
  template <class T>
  Gathered<T> all_to_all(Comm& comm, const T* send, const std::vector<size_t>& counts) const {
    NcclComm& c = nccl(comm);
    Gathered<T> g = with_counts<T>(c.exchange_counts(std::vector<uint64_t>(counts.begin(), counts.end())));
    const std::vector<size_t> send_offset = offsets_of(std::vector<uint64_t>(counts.begin(), counts.end()));
    c.all_to_all_device(send, byte_offsets<T>(send_offset), g.data.get(), byte_offsets<T>(g.offset));
    return g;
  }
  // The negative control's reduction (+nccl-bf16sum): NCCL's bf16 sum of the
  // ranks' rounded partials, in an order NCCL chooses.
  void all_reduce_bf16_sum(Comm& comm, const bf16* mine, bf16* out, size_t n) const {
    nccl(comm).all_reduce_bf16_sum(mine, out, n);
  }

 private:
  static NcclComm& nccl(Comm& comm) {
    auto* c = dynamic_cast<NcclComm*>(&comm);
    if (!c) throw std::logic_error("NcclBackend: a collective over a communicator that is not NCCL's");
    return *c;
  }
  template <class T>
  Gathered<T> with_counts(const std::vector<uint64_t>& counts) const {
    Gathered<T> g;
    g.offset = offsets_of(counts);
    g.data = Buf<T>(g.offset.back(), stream());
    return g;
  }
  template <class T>
  static std::vector<size_t> byte_offsets(const std::vector<size_t>& elements) {
    std::vector<size_t> bytes;
    for (size_t e : elements) bytes.push_back(e * sizeof(T));
    return bytes;
  }
};

}  // namespace bp::nccl
