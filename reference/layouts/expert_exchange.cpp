#include "reference/layouts/expert_exchange.h"

#include <algorithm>
#include <array>

namespace bp::layouts {

ExpertExchange::ExpertExchange(Comm& plane, const Layout& layout, int num_experts, int k, const std::vector<int>& ids,
                               const std::vector<int64_t>& my_rows)
    : plane_(plane), num_experts_(num_experts), k_(k), my_tokens_(static_cast<int64_t>(my_rows.size())) {
  const int per_rank = num_experts / layout.ep, P = plane.size();
  if (plane.rank() % layout.cp == 0) {
    e_begin_ = plane.rank() / layout.cp * per_rank;
    e_end_ = e_begin_ + per_rank;
  }
  // Each entry (t, slot) goes to its expert's holder with (global row, slot, expert).
  sent_.resize(static_cast<size_t>(P));
  std::vector<std::vector<int64_t>> meta(static_cast<size_t>(P));
  for (int64_t t = 0; t < my_tokens_; ++t)
    for (int j = 0; j < k; ++j) {
      const int expert = ids[static_cast<size_t>(t * k + j)];
      const size_t dest = static_cast<size_t>(expert / per_rank * layout.cp);
      sent_[dest].push_back(static_cast<int>(t * k + j));
      meta[dest].insert(meta[dest].end(), {my_rows[static_cast<size_t>(t)], j, expert});
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
  placed_.resize(static_cast<size_t>(P));
  for (size_t src = 0; src < recv.size(); ++src)
    for (size_t i = 0; i < recv[src].size(); i += 3) {
      const int u = token_of(recv[src][i]), slot = static_cast<int>(recv[src][i + 1]);
      placed_[src].emplace_back(u, slot);
      entries.push_back({static_cast<int>(recv[src][i + 2]), u, slot});
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
