// Real ranks: the rank program's Comm (program/layouts/comm.h) over an NCCL
// communicator, one process per GPU. NCCL moves bytes and nothing else (SPEC.md
// §7): all-gathers, all-to-alls as grouped send/recv, a broadcast; every
// reduction stays the contract's tree, computed by the ranks after a gather. The
// one exception is all_reduce_bf16_sum, the negative control's reduction.
//
// Every call returns only when its transfer is complete: it polls the stream, the
// communicator's asynchronous error, the process's abort request (a failed peer
// reported by the launcher, rank_launch.h) and a deadline, so a lost peer ends in
// RankFailure within bounded time, never in a hang, and no NCCL kernel is ever
// left queued behind the compute backend's blocking copies. Communicators are
// NCCL's default (blocking) kind; a rank stuck inside an NCCL call has them
// aborted from another thread a few seconds after the stop request.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "program/layouts/comm.h"
#include "reference/numerics/bf16.h"

namespace bp::nccl {

using layouts::Bytes;

// A rank cannot go on: a peer failed or vanished, NCCL reported an error, or a
// collective passed its deadline. The message names the rank when it is known.
class RankFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bytes and calls per collective kind ("all_gather", "all_to_all", "broadcast",
// "all_reduce"), as this rank sent them.
struct Traffic {
  uint64_t calls = 0, bytes = 0;
};
using TrafficByKind = std::map<std::string, Traffic>;

// A request that this rank stop, from another thread (the launcher's relay of a
// peer's failure, rank_launch.h): every wait below polls it and throws
// RankFailure(why). The first request's reason is kept.
void request_abort(const std::string& why);
std::optional<std::string> abort_requested();

// How long a collective may wait for its peers before the rank gives up on them
// (BP_RANK_TIMEOUT_S, default 300 s); waits for the leader's next command have no
// deadline (it may compute a reference for minutes). Throws std::invalid_argument,
// naming the value, where BP_RANK_TIMEOUT_S is not a positive finite number of
// seconds (0, -1, "abc", "1e400"): a rank must never wait forever, or not at all.
std::chrono::milliseconds collective_timeout();

class NcclComm final : public layouts::Comm {
 public:
  // Takes ownership of `comm` (this process's rank `rank` of `size`); its
  // transfers run on `stream`, the rank's compute stream, so they are ordered
  // after the kernels that wrote what they send.
  NcclComm(ncclComm_t comm, int rank, int size, cudaStream_t stream);
  // The world: rank `rank` of `size` processes that share `id` (ncclCommInitRank).
  static std::unique_ptr<NcclComm> init_world(const ncclUniqueId& id, int rank, int size, cudaStream_t stream);
  ~NcclComm() override;  // ncclCommDestroy, or ncclCommAbort once broken
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<Bytes> all_gather(std::span<const std::byte> send) override;
  std::vector<Bytes> all_to_all(const std::vector<Bytes>& send) override;

  // Every rank's count, in rank order (an all-gather of one uint64 each).
  std::vector<uint64_t> all_gather_count(uint64_t mine);
  // to_each[r]: my count for rank r; returns rank r's count for me, for every r.
  std::vector<uint64_t> exchange_counts(const std::vector<uint64_t>& to_each);

  // Device memory. recv gets every rank's piece in rank order, piece r at
  // offset[r] bytes (offset: size()+1 entries, from the pieces' byte counts).
  void all_gather_device(const void* send, const std::vector<size_t>& offset, void* recv);
  // send_offset[r]..send_offset[r+1]: my bytes for rank r; recv_offset likewise
  // for what rank r sends me.
  void all_to_all_device(const void* send, const std::vector<size_t>& send_offset, void* recv,
                         const std::vector<size_t>& recv_offset);
  // The negative control (layout suffix +nccl-bf16sum): NCCL's own bf16 sum.
  void all_reduce_bf16_sum(const bf16* send, bf16* recv, size_t n);
  // Host bytes from `root` to every rank; waits without a deadline when told
  // (the followers' wait for the leader's next command).
  Bytes broadcast(const Bytes& from_root, int root, bool no_deadline = false);
  // Every rank's `send` to `root` (the others get an empty vector).
  std::vector<Bytes> gather(std::span<const std::byte> send, int root);

  // A new communicator of the ranks that pass the same colour, ordered by key;
  // nullptr for a rank that passes colour -1 (it takes part in the call only).
  std::unique_ptr<NcclComm> split(int colour, int key);

  // Stops every transfer in flight and makes the communicator unusable (called on
  // failure; safe to call twice).
  void abort();
  bool broken() const { return broken_; }

  // Frees the device buffer the host collectives stage through: it grows to the
  // largest transfer (a case's gathered results: gigabytes for a 30B-shaped model)
  // and would otherwise stay with the communicator for the whole sweep.
  void release_staging();

  const TrafficByKind& traffic() const { return traffic_; }
  void clear_traffic() { traffic_.clear(); }

 private:
  void count(const char* kind, uint64_t bytes);
  // Throws RankFailure naming `what` on an NCCL error or a stop request.
  void check(ncclResult_t r, const char* what);
  void stop_if_asked();
  // Until the stream has run everything queued (the transfers just issued).
  void wait(const char* what, bool no_deadline = false);
  void* staging(size_t bytes);  // a device buffer of at least `bytes`, reused
  void copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);  // on the stream; 0 bytes: nothing

  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_;
  bool broken_ = false;
  TrafficByKind traffic_;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

// {0, c0, c0+c1, ...}: where each of the pieces of these sizes starts, and the total.
std::vector<size_t> offsets_of(const std::vector<uint64_t>& counts);

// The NCCL library's version, "2.28.9" (for the report's environment).
std::string nccl_version_text();

}  // namespace bp::nccl
