// Expert parallelism (SPEC.md §7): the (token, slot) rows of a plane's tokens go
// to the rank holding their expert and come back to the token's home rank. The
// experts are dealt to the e axis in contiguous blocks of E/ep and live on the
// plane rank (e, c = 0), which therefore receives every row of its experts in the
// batch — the rows an expert's weight gradient reduces over, in global order.
// The plan is made on the host; the rows move in a backend's memory
// (host/backend.h, gpu/cuda_backend.h) through its all_to_all.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "program/layouts/comm.h"
#include "program/layouts/layout.h"
#include "reference/ops/moe_experts.h"

namespace bp::layouts {

class ExpertExchange {
 public:
  // ids [T][k] of my tokens (host), whose global rows are my_rows.
  ExpertExchange(Comm& plane, const Layout& layout, int num_experts, int k, const std::vector<int>& ids,
                 const std::vector<int64_t>& my_rows);

  // The experts plane rank `plane_rank` runs: [first, second) (empty unless c == 0).
  static std::pair<int, int> held_experts(const Layout& layout, int num_experts, int plane_rank);

  // The experts this rank runs.
  int e_begin() const { return e_begin_; }
  int e_end() const { return e_end_; }
  // Received tokens, in global row order: per_token rows [U][width] from my
  // tokens' rows [T][width]; per_slot [U][k][width] from [T][k][width] (slots
  // not routed here are zero).
  int received_tokens() const { return static_cast<int>(recv_rows_.size()); }
  template <class B, class T>
  typename B::template Buf<T> send_tokens(const B& be, const T* mine, int64_t width) const;
  template <class B, class T>
  typename B::template Buf<T> send_slots(const B& be, const T* mine, int64_t width) const;
  // The plan over the received tokens (moe_experts_fwd / _bwd).
  ref::MoeDispatch plan() const { return {num_experts_, offset_.data(), token_.data(), slot_.data()}; }
  // Results per received (token, slot) [U][k][width] back to the home ranks: [T][k][width].
  template <class B, class T>
  typename B::template Buf<T> return_slots(const B& be, const T* theirs, int64_t width) const;

 private:
  // Rows of `src` (width elements) picked by `rows`, sent in pieces of counts[r] rows to rank r.
  template <class B, class T>
  layouts::Gathered<typename B::template Buf<T>> exchange(const B& be, const T* src, int64_t width,
                                                          const std::vector<int>& rows,
                                                          const std::vector<size_t>& counts) const;

  Comm& plane_;
  int num_experts_, k_, e_begin_ = 0, e_end_ = 0;
  int64_t my_tokens_;
  // Sent entries (t·k + slot), grouped by destination in rank order, and how many per destination.
  std::vector<int> sent_entry_;
  std::vector<size_t> sent_count_;
  // Received entries as (received token u)·k + slot, grouped by source, and how many per source.
  std::vector<int> placed_slot_;
  std::vector<size_t> placed_count_;
  std::vector<int> sent_token_;    // t of each sent entry
  std::vector<int> first_placed_;  // per received token: its first received entry
  std::vector<int64_t> recv_rows_;
  std::vector<int> offset_, token_, slot_;
};

template <class B, class T>
layouts::Gathered<typename B::template Buf<T>> ExpertExchange::exchange(const B& be, const T* src, int64_t width,
                                                                        const std::vector<int>& rows,
                                                                        const std::vector<size_t>& counts) const {
  const size_t w = static_cast<size_t>(width);
  auto packed = be.template zeros<T>(rows.size() * w);
  be.gather_rows(src, w, rows, packed.data());
  std::vector<size_t> elements;
  for (size_t c : counts) elements.push_back(c * w);
  return be.all_to_all(plane_, packed.data(), elements);
}

template <class B, class T>
typename B::template Buf<T> ExpertExchange::send_slots(const B& be, const T* mine, int64_t width) const {
  const auto recv = exchange(be, mine, width, sent_entry_, sent_count_);
  auto out = be.template zeros<T>(recv_rows_.size() * static_cast<size_t>(k_ * width));
  be.scatter_rows(recv.data.data(), static_cast<size_t>(width), placed_slot_, out.data());
  return out;
}

template <class B, class T>
typename B::template Buf<T> ExpertExchange::send_tokens(const B& be, const T* mine, int64_t width) const {
  // Each entry carries its token's row; a token routed here twice gets the same
  // bits twice, and its first copy is kept.
  const auto recv = exchange(be, mine, width, sent_token_, sent_count_);
  auto out = be.template zeros<T>(recv_rows_.size() * static_cast<size_t>(width));
  be.gather_rows(recv.data.data(), static_cast<size_t>(width), first_placed_, out.data());
  return out;
}

template <class B, class T>
typename B::template Buf<T> ExpertExchange::return_slots(const B& be, const T* theirs, int64_t width) const {
  const auto recv = exchange(be, theirs, width, placed_slot_, placed_count_);
  auto out = be.template zeros<T>(static_cast<size_t>(my_tokens_ * k_ * width));
  be.scatter_rows(recv.data.data(), static_cast<size_t>(width), sent_entry_, out.data());
  return out;
}

}  // namespace bp::layouts
