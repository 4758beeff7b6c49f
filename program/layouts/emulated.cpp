#include "program/layouts/emulated.h"

#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

namespace bp::layouts {
namespace {

// Thrown out of a collective when another rank has failed, to unwind this one.
struct Aborted {};

// The shared memory of one group: a slot per (sender, receiver) and a barrier
// that another rank's failure can break.
class Exchange {
 public:
  explicit Exchange(int n) : n_(n), slots_(static_cast<size_t>(n) * n) {}
  int size() const { return n_; }
  Bytes& slot(int from, int to) { return slots_[static_cast<size_t>(from) * n_ + to]; }

  void barrier() {
    std::unique_lock lock(mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
    }
    if (aborted_) throw Aborted{};
  }

  void abort() {
    std::lock_guard lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  int n_;
  std::vector<Bytes> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

class EmulatedComm final : public Comm {
 public:
  EmulatedComm(Exchange& ex, int rank) : ex_(ex), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return ex_.size(); }

  std::vector<Bytes> all_gather(std::span<const std::byte> send) override {
    ex_.slot(rank_, 0).assign(send.begin(), send.end());
    ex_.barrier();
    std::vector<Bytes> out;
    for (int r = 0; r < size(); ++r) out.push_back(ex_.slot(r, 0));
    ex_.barrier();  // nobody writes the slots again before everyone has read them
    return out;
  }

  std::vector<Bytes> all_to_all(const std::vector<Bytes>& send) override {
    for (int r = 0; r < size(); ++r) ex_.slot(rank_, r) = send.at(static_cast<size_t>(r));
    ex_.barrier();
    std::vector<Bytes> out;
    for (int r = 0; r < size(); ++r) out.push_back(std::move(ex_.slot(r, rank_)));
    ex_.barrier();
    return out;
  }

 private:
  Exchange& ex_;
  int rank_;
};

}  // namespace

void run_emulated(const Layout& layout, const std::function<void(int rank, RankComms& comms)>& body) {
  const int T = layout.tp, C = layout.cp, E = layout.ep, W = layout.world();
  // Group instances: tp groups by (e, c), cp groups by (e, t), planes by t.
  std::vector<std::unique_ptr<Exchange>> tp_groups, cp_groups, planes;
  for (int i = 0; i < E * C; ++i) tp_groups.push_back(std::make_unique<Exchange>(T));
  for (int i = 0; i < E * T; ++i) cp_groups.push_back(std::make_unique<Exchange>(C));
  for (int i = 0; i < T; ++i) planes.push_back(std::make_unique<Exchange>(E * C));
  auto abort_all = [&] {
    for (auto* groups : {&tp_groups, &cp_groups, &planes})
      for (auto& g : *groups) g->abort();
  };

  std::vector<std::exception_ptr> errors(static_cast<size_t>(W));
  // Bits never depend on the thread count; this only keeps W ranks from
  // oversubscribing the cores.
  const int omp_threads = std::max(1, omp_get_max_threads() / W);
  auto rank_thread = [&](int rank) {
    return std::thread([&, rank] {
      const int t = rank % T, c = (rank / T) % C, e = rank / (T * C);
      EmulatedComm tp(*tp_groups[static_cast<size_t>(e * C + c)], t);
      EmulatedComm cp(*cp_groups[static_cast<size_t>(e * T + t)], c);
      EmulatedComm plane(*planes[static_cast<size_t>(t)], e * C + c);
      RankComms comms{tp, cp, plane};
      omp_set_num_threads(omp_threads);
      try {
        body(rank, comms);
      } catch (const Aborted&) {
        // another rank failed first; its exception is the one reported
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
        abort_all();
      }
    });
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(W));  // push_back never reallocates past a started thread
  try {
    for (int rank = 0; rank < W; ++rank) threads.push_back(rank_thread(rank));
  } catch (const std::system_error& e) {
    // The started ranks wait in their first collective for one that never comes.
    abort_all();
    for (std::thread& th : threads) th.join();
    throw RanksNotStarted("emulated rank " + std::to_string(threads.size()) + " of " + std::to_string(W) +
                          " could not start its thread (" + e.what() +
                          "): the process's thread or address-space limit (ulimit -u, -v) is too low for this layout");
  }
  for (std::thread& th : threads) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace bp::layouts
