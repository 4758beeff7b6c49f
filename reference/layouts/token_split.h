// Weight gradients over tokens held by several ranks (SPEC.md §7, token splits).
// Every weight gradient is a reduction over the batch's tokens in chunks of
// grad_token_chunk global rows (canonical order: sequence by sequence, positions
// increasing), chunk partials combined by pairwise_tree. The ranks of a plane
// hold disjoint tokens; chunk j is computed by plane rank j mod P, which first
// receives the chunk's rows from whoever holds them. The partials are then
// all-gathered and every rank runs the tree over the chunks in order.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "reference/layouts/comm.h"

namespace bp::layouts {

class TokenSplit {
 public:
  // my_rows: the global rows this rank holds, in its local order; total: all rows.
  TokenSplit(Comm& plane, const std::vector<int64_t>& my_rows, int64_t total, int chunk);

  // The owned chunks' rows of a per-row array (width elements per row, in my local
  // order): out[i] is chunk owned()[i], its rows in global order.
  template <class T>
  std::vector<std::vector<T>> route(const T* data, int64_t width) const {
    std::vector<std::vector<T>> send(static_cast<size_t>(plane_.size()));
    for (size_t i = 0; i < dest_.size(); ++i)
      send[static_cast<size_t>(dest_[i])].insert(send[static_cast<size_t>(dest_[i])].end(), data + i * width,
                                                 data + (i + 1) * width);
    const auto recv = all_to_all(plane_, send);
    std::vector<std::vector<T>> out(owned_.size());
    for (size_t k = 0; k < owned_.size(); ++k)
      for (const auto& [src, idx] : order_[k])
        out[k].insert(out[k].end(), recv[static_cast<size_t>(src)].begin() + idx * width,
                      recv[static_cast<size_t>(src)].begin() + (idx + 1) * width);
    return out;
  }

  const std::vector<int>& owned() const { return owned_; }
  int rows_in(size_t owned_index) const { return static_cast<int>(order_[owned_index].size()); }

  // partial(k, out) writes owned chunk k's partial gradient (numel floats); returns
  // the full gradient: pairwise_tree over all chunks, elementwise.
  std::vector<float> reduce(size_t numel, const std::function<void(size_t k, float* out)>& partial) const;

 private:
  Comm& plane_;
  int chunks_;
  std::vector<int> dest_;   // owner of each of my rows
  std::vector<int> owned_;  // my chunks, increasing
  std::vector<std::vector<std::pair<int, int64_t>>> order_;  // per owned chunk: (source rank, index there)
};

}  // namespace bp::layouts
