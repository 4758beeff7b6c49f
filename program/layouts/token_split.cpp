#include "program/layouts/token_split.h"

#include <algorithm>
#include <tuple>

namespace bp::layouts {

TokenSplit::TokenSplit(Comm& plane, const std::vector<int64_t>& my_rows, int64_t total, int chunk)
    : plane_(plane), chunks_(static_cast<int>((total + chunk - 1) / chunk)) {
  const int P = plane.size();
  std::vector<std::vector<int64_t>> send(static_cast<size_t>(P));
  std::vector<std::vector<int>> local(static_cast<size_t>(P));
  for (size_t i = 0; i < my_rows.size(); ++i) {
    const size_t dest = static_cast<size_t>((my_rows[i] / chunk) % P);
    send[dest].push_back(my_rows[i]);
    local[dest].push_back(static_cast<int>(i));
  }
  for (const std::vector<int>& d : local) {
    send_count_.push_back(d.size());
    send_rows_.insert(send_rows_.end(), d.begin(), d.end());
  }
  for (int j = plane.rank(); j < chunks_; j += P) owned_.push_back(j);
  const auto recv = all_to_all(plane, send);
  std::vector<std::pair<int64_t, int>> rows;  // (global row, its row in the received concatenation)
  for (size_t src = 0, at = 0; src < recv.size(); at += recv[src++].size())
    for (size_t i = 0; i < recv[src].size(); ++i) rows.emplace_back(recv[src][i], static_cast<int>(at + i));
  std::sort(rows.begin(), rows.end());
  // Owned chunk k holds the global rows of chunk owned_[k]; sorted rows come chunk by chunk.
  chunk_row0_.assign(owned_.size() + 1, 0);
  for (const auto& [row, at] : rows) {
    ++chunk_row0_[static_cast<size_t>(row / chunk / P) + 1];
    recv_pick_.push_back(at);
  }
  for (size_t k = 0; k < owned_.size(); ++k) chunk_row0_[k + 1] += chunk_row0_[k];
}

}  // namespace bp::layouts
