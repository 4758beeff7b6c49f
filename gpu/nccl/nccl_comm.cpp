#include "gpu/nccl/nccl_comm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

namespace bp::nccl {
namespace {

std::mutex g_abort_mutex;
std::atomic<bool> g_abort_flag{false};
std::string g_abort_reason;

[[noreturn]] void fail(const std::string& what) { throw RankFailure(what); }

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
}

// Every live communicator of the process, so that a stop request can abort them
// even while the main thread is blocked inside an NCCL call (connection setup
// with a dead peer): NCCL's documented way out of a hang.
std::mutex g_live_mutex;
std::set<ncclComm_t> g_live;

void register_live(ncclComm_t c) {
  const std::lock_guard lock(g_live_mutex);
  g_live.insert(c);
}
// True if it was still live (then the caller aborts or destroys it).
bool unregister_live(ncclComm_t c) {
  const std::lock_guard lock(g_live_mutex);
  return g_live.erase(c) > 0;
}

// ncclCommAbort may wait on work queued behind a kernel that still waits for a
// dead peer: it runs on a thread of its own, and nothing waits for it.
void abort_in_background(ncclComm_t c) {
  std::thread([c] { ncclCommAbort(c); }).detach();
}

// A stop request gives the main thread a moment to abort its communicators
// itself (its waits poll the request); one blocked inside NCCL gets them aborted
// from here.
constexpr auto kAbortGrace = std::chrono::seconds(3);
void abort_live_after_grace() {
  std::thread([] {
    std::this_thread::sleep_for(kAbortGrace);
    const std::lock_guard lock(g_live_mutex);
    for (ncclComm_t c : g_live) abort_in_background(c);
    g_live.clear();
  }).detach();
}

// The pieces of `all` that the offsets delimit.
std::vector<Bytes> pieces(const Bytes& all, const std::vector<size_t>& offset) {
  std::vector<Bytes> out;
  for (size_t r = 0; r + 1 < offset.size(); ++r)
    out.emplace_back(all.begin() + static_cast<int64_t>(offset[r]), all.begin() + static_cast<int64_t>(offset[r + 1]));
  return out;
}

}  // namespace

void request_abort(const std::string& why) {
  const std::lock_guard lock(g_abort_mutex);
  if (g_abort_flag.load()) return;
  g_abort_reason = why;
  g_abort_flag.store(true);
  abort_live_after_grace();
}

std::optional<std::string> abort_requested() {
  if (!g_abort_flag.load(std::memory_order_relaxed)) return std::nullopt;
  const std::lock_guard lock(g_abort_mutex);
  return g_abort_reason;
}

std::chrono::milliseconds collective_timeout() {
  static const std::chrono::milliseconds t = [] {
    const char* s = std::getenv("BP_RANK_TIMEOUT_S");
    if (!s) return std::chrono::milliseconds(300'000);
    char* end = nullptr;
    const double seconds = std::strtod(s, &end);
    // Up to 10^6 s (11 days): a longer wait is a typo, not a plan.
    if (!*s || *end || !std::isfinite(seconds) || seconds < 0.001 || seconds > 1e6)
      throw std::invalid_argument(std::string("BP_RANK_TIMEOUT_S=") + s +
                                  ": not a number of seconds from 0.001 to 1e6 (unset: 300)");
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }();
  return t;
}

std::vector<size_t> offsets_of(const std::vector<uint64_t>& counts) {
  std::vector<size_t> offset{0};
  for (uint64_t c : counts) offset.push_back(offset.back() + c);
  return offset;
}

std::string nccl_version_text() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

NcclComm::NcclComm(ncclComm_t comm, int rank, int size, cudaStream_t stream)
    : comm_(comm), rank_(rank), size_(size), stream_(stream) {
  register_live(comm_);
}

NcclComm::~NcclComm() {
  // After a failure a kernel may still wait on a dead peer, and cudaFree or a
  // collective destroy would wait for it: the process leaves without them
  // (real_ranks.h: a broken session ends with _Exit).
  if (broken_ || abort_requested()) {
    abort();
    return;
  }
  if (staging_) cudaFree(staging_);
  if (comm_ && unregister_live(comm_)) ncclCommDestroy(comm_);
}

std::unique_ptr<NcclComm> NcclComm::init_world(const ncclUniqueId& id, int rank, int size, cudaStream_t stream) {
  ncclComm_t comm = nullptr;
  if (const ncclResult_t r = ncclCommInitRank(&comm, size, id, rank); r != ncclSuccess)
    fail("NCCL initialisation of rank " + std::to_string(rank) + " of " + std::to_string(size) + ": " +
         ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
  return std::make_unique<NcclComm>(comm, rank, size, stream);
}

void NcclComm::abort() {
  broken_ = true;
  if (comm_ && unregister_live(comm_)) abort_in_background(comm_);
  comm_ = nullptr;
}

void NcclComm::count(const char* kind, uint64_t bytes) {
  Traffic& t = traffic_[kind];
  ++t.calls;
  t.bytes += bytes;
}

void NcclComm::stop_if_asked() {
  if (const auto why = abort_requested()) {
    abort();
    fail(*why);
  }
}

void NcclComm::check(ncclResult_t r, const char* what) {
  if (broken_) fail(std::string(what) + ": the communicator was aborted earlier");
  // A call that returned because the communicator was aborted under it: the
  // request says why (and comm_ must not be touched again).
  stop_if_asked();
  if (r != ncclSuccess) {
    const std::string detail = ncclGetLastError(comm_);
    abort();
    fail(std::string(what) + ": NCCL: " + ncclGetErrorString(r) + (detail.empty() ? "" : " (" + detail + ")"));
  }
}

void NcclComm::wait(const char* what, bool no_deadline) {
  const auto deadline = std::chrono::steady_clock::now() + collective_timeout();
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) cuda_ok(q, what);
    stop_if_asked();
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess || state != ncclSuccess) check(r != ncclSuccess ? r : state, what);
    if (!no_deadline && std::chrono::steady_clock::now() > deadline) {
      abort();
      fail(std::string(what) + ": not finished after " + std::to_string(collective_timeout().count() / 1000) +
           " s (BP_RANK_TIMEOUT_S): a peer rank is gone or stuck");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void* NcclComm::staging(size_t bytes) {
  if (bytes > staging_bytes_) {
    release_staging();
    cuda_ok(cudaMalloc(&staging_, bytes), "cudaMalloc (collective staging)");
    staging_bytes_ = bytes;
  }
  return staging_;
}

void NcclComm::release_staging() {
  // Every collective has waited for its stream before returning: nothing uses it.
  if (staging_) cuda_ok(cudaFree(staging_), "cudaFree");
  staging_ = nullptr;
  staging_bytes_ = 0;
}

void NcclComm::copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes) cuda_ok(cudaMemcpyAsync(dst, src, bytes, kind, stream_), "cudaMemcpyAsync");
}

std::vector<uint64_t> NcclComm::all_gather_count(uint64_t mine) {
  auto* dev = static_cast<uint64_t*>(staging(sizeof(uint64_t) * (static_cast<size_t>(size_) + 1)));
  copy_async(dev, &mine, sizeof mine, cudaMemcpyHostToDevice);
  check(ncclAllGather(dev, dev + 1, 1, ncclUint64, comm_, stream_), "all-gather of counts");
  std::vector<uint64_t> all(static_cast<size_t>(size_));
  copy_async(all.data(), dev + 1, sizeof(uint64_t) * all.size(), cudaMemcpyDeviceToHost);
  wait("all-gather of counts");
  count("all_gather", sizeof mine);
  return all;
}

void NcclComm::all_gather_device(const void* send, const std::vector<size_t>& offset, void* recv) {
  const size_t mine = offset[static_cast<size_t>(rank_) + 1] - offset[static_cast<size_t>(rank_)];
  bool equal = true;
  for (int r = 0; r < size_; ++r) equal &= offset[static_cast<size_t>(r) + 1] - offset[static_cast<size_t>(r)] == mine;
  if (equal) {
    check(ncclAllGather(send, recv, mine, ncclUint8, comm_, stream_), "all-gather");
  } else {
    auto* out = static_cast<char*>(recv);
    check(ncclGroupStart(), "all-gather (group start)");
    for (int r = 0; r < size_; ++r) {
      const size_t at = offset[static_cast<size_t>(r)], n = offset[static_cast<size_t>(r) + 1] - at;
      if (r == rank_) {
        copy_async(out + at, send, n, cudaMemcpyDeviceToDevice);
        continue;
      }
      if (mine) check(ncclSend(send, mine, ncclUint8, r, comm_, stream_), "all-gather (send)");
      if (n) check(ncclRecv(out + at, n, ncclUint8, r, comm_, stream_), "all-gather (recv)");
    }
    check(ncclGroupEnd(), "all-gather");
  }
  wait("all-gather");
  count("all_gather", mine);
}

void NcclComm::all_to_all_device(const void* send, const std::vector<size_t>& send_offset, void* recv,
                                 const std::vector<size_t>& recv_offset) {
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  uint64_t sent = 0;
  check(ncclGroupStart(), "all-to-all (group start)");
  for (int r = 0; r < size_; ++r) {
    const size_t s_at = send_offset[static_cast<size_t>(r)], s_n = send_offset[static_cast<size_t>(r) + 1] - s_at;
    const size_t r_at = recv_offset[static_cast<size_t>(r)], r_n = recv_offset[static_cast<size_t>(r) + 1] - r_at;
    if (r == rank_) {
      if (s_n != r_n) fail("all-to-all: this rank's piece for itself changed size");
      copy_async(out + r_at, in + s_at, s_n, cudaMemcpyDeviceToDevice);
      continue;
    }
    if (s_n) check(ncclSend(in + s_at, s_n, ncclUint8, r, comm_, stream_), "all-to-all (send)");
    if (r_n) check(ncclRecv(out + r_at, r_n, ncclUint8, r, comm_, stream_), "all-to-all (recv)");
    sent += s_n;
  }
  check(ncclGroupEnd(), "all-to-all");
  wait("all-to-all");
  count("all_to_all", sent);
}

void NcclComm::all_reduce_bf16_sum(const bf16* send, bf16* recv, size_t n) {
  check(ncclAllReduce(send, recv, n, ncclBfloat16, ncclSum, comm_, stream_), "all-reduce");
  wait("all-reduce");
  count("all_reduce", n * sizeof(bf16));
}

std::vector<Bytes> NcclComm::all_gather(std::span<const std::byte> send) {
  const std::vector<size_t> offset = offsets_of(all_gather_count(send.size()));
  // One buffer: my piece, then everyone's.
  auto* dev = static_cast<char*>(staging(send.size() + offset.back()));
  copy_async(dev, send.data(), send.size(), cudaMemcpyHostToDevice);
  all_gather_device(dev, offset, dev + send.size());
  Bytes all(offset.back());
  copy_async(all.data(), dev + send.size(), all.size(), cudaMemcpyDeviceToHost);
  wait("all-gather");
  return pieces(all, offset);
}

std::vector<uint64_t> NcclComm::exchange_counts(const std::vector<uint64_t>& to_each) {
  if (to_each.size() != static_cast<size_t>(size_)) fail("count exchange: one count per rank expected");
  // Row r of the gathered matrix is what rank r sends to each rank.
  const std::vector<Bytes> rows = all_gather(std::as_bytes(std::span<const uint64_t>(to_each)));
  std::vector<uint64_t> from(static_cast<size_t>(size_));
  for (size_t r = 0; r < from.size(); ++r)
    std::memcpy(&from[r], rows[r].data() + sizeof(uint64_t) * static_cast<size_t>(rank_), sizeof(uint64_t));
  return from;
}

std::vector<Bytes> NcclComm::all_to_all(const std::vector<Bytes>& send) {
  if (send.size() != static_cast<size_t>(size_)) fail("all-to-all: one piece per rank expected");
  std::vector<uint64_t> mine;
  for (const Bytes& b : send) mine.push_back(b.size());
  const std::vector<size_t> send_offset = offsets_of(mine), recv_offset = offsets_of(exchange_counts(mine));
  auto* dev = static_cast<char*>(staging(send_offset.back() + recv_offset.back()));
  for (size_t r = 0; r < send.size(); ++r)
    copy_async(dev + send_offset[r], send[r].data(), send[r].size(), cudaMemcpyHostToDevice);
  char* recv = dev + send_offset.back();
  all_to_all_device(dev, send_offset, recv, recv_offset);
  Bytes all(recv_offset.back());
  copy_async(all.data(), recv, all.size(), cudaMemcpyDeviceToHost);
  wait("all-to-all");
  return pieces(all, recv_offset);
}

Bytes NcclComm::broadcast(const Bytes& from_root, int root, bool no_deadline) {
  // The size first (so that the others can make room), then the bytes.
  uint64_t n = from_root.size();
  auto* dev_n = static_cast<uint64_t*>(staging(sizeof n));
  copy_async(dev_n, &n, sizeof n, cudaMemcpyHostToDevice);
  check(ncclBroadcast(dev_n, dev_n, 1, ncclUint64, root, comm_, stream_), "broadcast");
  copy_async(&n, dev_n, sizeof n, cudaMemcpyDeviceToHost);
  wait("broadcast", no_deadline);
  Bytes out = rank_ == root ? from_root : Bytes(n);
  if (n) {
    auto* dev = static_cast<char*>(staging(n));
    if (rank_ == root) copy_async(dev, out.data(), n, cudaMemcpyHostToDevice);
    check(ncclBroadcast(dev, dev, n, ncclUint8, root, comm_, stream_), "broadcast");
    copy_async(out.data(), dev, n, cudaMemcpyDeviceToHost);
    wait("broadcast");
  }
  if (rank_ == root) count("broadcast", sizeof(uint64_t) + n);
  return out;
}

std::vector<Bytes> NcclComm::gather(std::span<const std::byte> send, int root) {
  const std::vector<size_t> offset = offsets_of(all_gather_count(send.size()));
  auto* dev = static_cast<char*>(staging(send.size() + (rank_ == root ? offset.back() : 0)));
  copy_async(dev, send.data(), send.size(), cudaMemcpyHostToDevice);
  char* recv = dev + send.size();
  check(ncclGroupStart(), "gather (group start)");
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      const size_t at = offset[static_cast<size_t>(r)], n = offset[static_cast<size_t>(r) + 1] - at;
      if (r == rank_) {
        copy_async(recv + at, dev, n, cudaMemcpyDeviceToDevice);
      } else if (n) {
        check(ncclRecv(recv + at, n, ncclUint8, r, comm_, stream_), "gather (recv)");
      }
    }
  } else if (!send.empty()) {
    check(ncclSend(dev, send.size(), ncclUint8, root, comm_, stream_), "gather (send)");
  }
  check(ncclGroupEnd(), "gather");
  std::vector<Bytes> out;
  if (rank_ == root) {
    Bytes all(offset.back());
    copy_async(all.data(), recv, all.size(), cudaMemcpyDeviceToHost);
    wait("gather");
    out = pieces(all, offset);
  } else {
    wait("gather");
  }
  if (rank_ != root) count("gather", send.size());
  return out;
}

std::unique_ptr<NcclComm> NcclComm::split(int colour, int key) {
  ncclComm_t child = nullptr;
  check(ncclCommSplit(comm_, colour < 0 ? NCCL_SPLIT_NOCOLOR : colour, key, &child, nullptr), "communicator split");
  if (colour < 0) return nullptr;
  int rank = 0, size = 0;
  check(ncclCommUserRank(child, &rank), "communicator split");
  check(ncclCommCount(child, &size), "communicator split");
  return std::make_unique<NcclComm>(child, rank, size, stream_);
}

}  // namespace bp::nccl
