// Expert parallelism (SPEC.md §7): the (token, slot) rows of a plane's tokens go
// to the rank holding their expert and come back to the token's home rank. The
// experts are dealt to the e axis in contiguous blocks of E/ep and live on the
// plane rank (e, c = 0), which therefore receives every row of its experts in the
// batch — the rows an expert's weight gradient reduces over, in global order.
#pragma once
#include <cstdint>
#include <vector>

#include "reference/layouts/comm.h"
#include "reference/layouts/layout.h"
#include "reference/ops/moe_experts.h"

namespace bp::layouts {

class ExpertExchange {
 public:
  // ids [T][k] of my tokens, whose global rows are my_rows.
  ExpertExchange(Comm& plane, const Layout& layout, int num_experts, int k, const std::vector<int>& ids,
                 const std::vector<int64_t>& my_rows);

  // The experts this rank runs: [e_begin, e_end) (empty unless c == 0).
  int e_begin() const { return e_begin_; }
  int e_end() const { return e_end_; }
  // Received tokens, in global row order: per_token rows [U][width] from my
  // tokens' rows [T][width]; per_slot [U][k][width] from [T][k][width] (slots
  // not routed here are zero).
  int received_tokens() const { return static_cast<int>(recv_rows_.size()); }
  template <class T>
  std::vector<T> send_tokens(const T* mine, int64_t width) const;
  template <class T>
  std::vector<T> send_slots(const T* mine, int64_t width) const;
  // The plan over the received tokens (moe_experts_fwd / _bwd).
  ref::MoeDispatch plan() const { return {num_experts_, offset_.data(), token_.data(), slot_.data()}; }
  // Results per received (token, slot) [U][k][width] back to the home ranks: [T][k][width].
  template <class T>
  std::vector<T> return_slots(const T* theirs, int64_t width) const;

 private:
  Comm& plane_;
  int num_experts_, k_, e_begin_ = 0, e_end_ = 0;
  int64_t my_tokens_;
  std::vector<std::vector<int>> sent_;                    // per destination: my (t·k + slot) entries
  std::vector<std::vector<std::pair<int, int>>> placed_;  // per source: (received token, slot) of each entry
  std::vector<int64_t> recv_rows_;
  std::vector<int> offset_, token_, slot_;
};

template <class T>
std::vector<T> ExpertExchange::send_slots(const T* mine, int64_t width) const {
  std::vector<std::vector<T>> send(sent_.size());
  for (size_t d = 0; d < sent_.size(); ++d)
    for (int entry : sent_[d]) send[d].insert(send[d].end(), mine + entry * width, mine + (entry + 1) * width);
  const auto recv = all_to_all(plane_, send);
  std::vector<T> out(static_cast<size_t>(recv_rows_.size()) * k_ * width, T{});
  for (size_t src = 0; src < placed_.size(); ++src)
    for (size_t i = 0; i < placed_[src].size(); ++i) {
      const auto [u, slot] = placed_[src][i];
      std::copy_n(recv[src].begin() + static_cast<int64_t>(i) * width, width,
                  out.begin() + (static_cast<int64_t>(u) * k_ + slot) * width);
    }
  return out;
}

template <class T>
std::vector<T> ExpertExchange::send_tokens(const T* mine, int64_t width) const {
  // Each entry carries its token's row; a token routed here twice writes the same bits twice.
  std::vector<T> per_entry(static_cast<size_t>(my_tokens_) * k_ * width);
  for (int64_t t = 0; t < my_tokens_; ++t)
    for (int j = 0; j < k_; ++j) std::copy_n(mine + t * width, width, per_entry.begin() + (t * k_ + j) * width);
  const std::vector<T> slots = send_slots(per_entry.data(), width);
  std::vector<T> out(recv_rows_.size() * static_cast<size_t>(width), T{});
  for (size_t d = 0; d < placed_.size(); ++d)
    for (const auto& [u, slot] : placed_[d])
      std::copy_n(slots.begin() + (static_cast<int64_t>(u) * k_ + slot) * width, width,
                  out.begin() + static_cast<int64_t>(u) * width);
  return out;
}

template <class T>
std::vector<T> ExpertExchange::return_slots(const T* theirs, int64_t width) const {
  std::vector<std::vector<T>> send(placed_.size());
  for (size_t src = 0; src < placed_.size(); ++src)
    for (const auto& [u, slot] : placed_[src])
      send[src].insert(send[src].end(), theirs + (static_cast<int64_t>(u) * k_ + slot) * width,
                       theirs + (static_cast<int64_t>(u) * k_ + slot + 1) * width);
  const auto recv = all_to_all(plane_, send);
  std::vector<T> out(static_cast<size_t>(my_tokens_) * k_ * width, T{});
  for (size_t d = 0; d < sent_.size(); ++d)
    for (size_t i = 0; i < sent_[d].size(); ++i)
      std::copy_n(recv[d].begin() + static_cast<int64_t>(i) * width, width,
                  out.begin() + static_cast<int64_t>(sent_[d][i]) * width);
  return out;
}

}  // namespace bp::layouts
