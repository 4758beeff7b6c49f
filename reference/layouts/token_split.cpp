#include "reference/layouts/token_split.h"

#include <algorithm>
#include <tuple>

#include "reference/numerics/reduce.h"

namespace bp::layouts {

TokenSplit::TokenSplit(Comm& plane, const std::vector<int64_t>& my_rows, int64_t total, int chunk)
    : plane_(plane), chunks_(static_cast<int>((total + chunk - 1) / chunk)) {
  const int P = plane.size();
  std::vector<std::vector<int64_t>> send(static_cast<size_t>(P));
  for (int64_t row : my_rows) {
    dest_.push_back(static_cast<int>((row / chunk) % P));
    send[static_cast<size_t>(dest_.back())].push_back(row);
  }
  for (int j = plane.rank(); j < chunks_; j += P) owned_.push_back(j);
  const auto recv = all_to_all(plane, send);
  std::vector<std::tuple<int64_t, int, int64_t>> rows;  // (global row, source, index there)
  for (int src = 0; src < P; ++src)
    for (size_t i = 0; i < recv[static_cast<size_t>(src)].size(); ++i)
      rows.emplace_back(recv[static_cast<size_t>(src)][i], src, static_cast<int64_t>(i));
  std::sort(rows.begin(), rows.end());
  order_.resize(owned_.size());
  for (const auto& [row, src, idx] : rows)
    order_[static_cast<size_t>(row / chunk / P)].emplace_back(src, idx);
}

std::vector<float> TokenSplit::reduce(size_t numel, const std::function<void(size_t, float*)>& partial) const {
  std::vector<float> mine(owned_.size() * numel);
  for (size_t k = 0; k < owned_.size(); ++k) partial(k, mine.data() + k * numel);
  const auto all = all_gather(plane_, std::span<const float>(mine));
  const int P = plane_.size();
  std::vector<float> out(numel);
#pragma omp parallel
  {
    std::vector<float> tree(static_cast<size_t>(chunks_));
#pragma omp for schedule(static)
    for (size_t i = 0; i < numel; ++i) {
      for (int j = 0; j < chunks_; ++j)
        tree[static_cast<size_t>(j)] = all[static_cast<size_t>(j % P)][static_cast<size_t>(j / P) * numel + i];
      out[i] = pairwise_tree(tree.data(), chunks_);
    }
  }
  return out;
}

}  // namespace bp::layouts
