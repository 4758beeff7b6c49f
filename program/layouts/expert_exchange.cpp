#include "program/layouts/expert_exchange.h"

#include <algorithm>
#include <array>
#include <tuple>

namespace bp::layouts {

std::pair<int, int> ExpertExchange::held_experts(const Layout& layout, int num_experts, int plane_rank) {
  if (plane_rank % layout.cp != 0) return {0, 0};
  const int per_rank = num_experts / layout.ep, first = plane_rank / layout.cp * per_rank;
  return {first, first + per_rank};
}

ExpertExchange::ExpertExchange(Comm& plane, const Layout& layout, int num_experts, int k, const std::vector<int>& ids,
                               const std::vector<int64_t>& my_rows)
    : plane_(plane), num_experts_(num_experts), k_(k), my_tokens_(static_cast<int64_t>(my_rows.size())) {
  std::tie(e_begin_, e_end_) = held_experts(layout, num_experts, plane.rank());
  const int per_rank = num_experts / layout.ep, P = plane.size();
  // Each entry (t, slot) goes to its expert's holder with (global row, slot, expert).
  std::vector<std::vector<int>> sent(static_cast<size_t>(P));
  std::vector<std::vector<int64_t>> meta(static_cast<size_t>(P));
  for (int64_t t = 0; t < my_tokens_; ++t)
    for (int j = 0; j < k; ++j) {
      const int expert = ids[static_cast<size_t>(t * k + j)];
      const size_t dest = static_cast<size_t>(expert / per_rank * layout.cp);
      sent[dest].push_back(static_cast<int>(t * k + j));
      meta[dest].insert(meta[dest].end(), {my_rows[static_cast<size_t>(t)], j, expert});
    }
  for (const std::vector<int>& d : sent) {
    sent_count_.push_back(d.size());
    for (int entry : d) {
      sent_entry_.push_back(entry);
      sent_token_.push_back(entry / k);
    }
  }
  const auto recv = all_to_all(plane, meta);

  for (const auto& m : recv)
    for (size_t i = 0; i < m.size(); i += 3) recv_rows_.push_back(m[i]);
  std::sort(recv_rows_.begin(), recv_rows_.end());
  recv_rows_.erase(std::unique(recv_rows_.begin(), recv_rows_.end()), recv_rows_.end());
  auto token_of = [&](int64_t row) {
    return static_cast<int>(std::lower_bound(recv_rows_.begin(), recv_rows_.end(), row) - recv_rows_.begin());
  };

  std::vector<std::array<int, 3>> entries;  // (expert, token, slot): the plan's order once sorted
  first_placed_.assign(recv_rows_.size(), -1);
  for (const auto& m : recv) {
    placed_count_.push_back(m.size() / 3);
    for (size_t i = 0; i < m.size(); i += 3) {
      const int u = token_of(m[i]), slot = static_cast<int>(m[i + 1]);
      int& first = first_placed_[static_cast<size_t>(u)];
      if (first < 0) first = static_cast<int>(placed_slot_.size());
      placed_slot_.push_back(u * k + slot);
      entries.push_back({static_cast<int>(m[i + 2]), u, slot});
    }
  }
  std::sort(entries.begin(), entries.end());
  offset_.assign(static_cast<size_t>(num_experts) + 1, 0);
  for (const auto& [expert, u, slot] : entries) {
    ++offset_[static_cast<size_t>(expert) + 1];
    token_.push_back(u);
    slot_.push_back(slot);
  }
  for (int e = 0; e < num_experts; ++e) offset_[static_cast<size_t>(e) + 1] += offset_[static_cast<size_t>(e)];
}

}  // namespace bp::layouts
