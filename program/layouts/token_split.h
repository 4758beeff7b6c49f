// Weight gradients over tokens held by several ranks (SPEC.md §7, token splits).
// Every weight gradient is a reduction over the batch's tokens in chunks of
// grad_token_chunk global rows (canonical order: sequence by sequence, positions
// increasing), chunk partials combined by pairwise_tree. The ranks of a plane
// hold disjoint tokens; chunk j is computed by plane rank j mod P, which first
// receives the chunk's rows from whoever holds them. The partials are then
// all-gathered and every rank runs the tree over the chunks in order. The plan is
// made on the host; the rows and partials live in a backend's memory
// (host/backend.h, gpu/cuda_backend.h).
#pragma once
#include <cstdint>
#include <vector>

#include "program/layouts/comm.h"
#include "reference/numerics/reduce.h"

namespace bp::layouts {

class TokenSplit {
 public:
  // my_rows: the global rows this rank holds, in its local order; total: all rows.
  TokenSplit(Comm& plane, const std::vector<int64_t>& my_rows, int64_t total, int chunk);

  // The owned chunks' rows of a per-row array (width elements per row, in my local
  // order), one after the other: owned chunk i's rows, in global order, start at
  // row chunk_row0(i).
  template <class B, class T>
  typename B::template Buf<T> route(const B& be, const T* data, int64_t width) const;

  const std::vector<int>& owned() const { return owned_; }
  int rows_in(size_t owned_index) const { return chunk_row0_[owned_index + 1] - chunk_row0_[owned_index]; }
  int chunk_row0(size_t owned_index) const { return chunk_row0_[owned_index]; }

  // partial(k, out) writes owned chunk k's partial gradient (numel floats at the
  // backend pointer out); returns the full gradient: pairwise_tree over all
  // chunks, elementwise.
  template <class B, class Partial>
  typename B::template Buf<float> reduce(const B& be, size_t numel, Partial&& partial) const;

 private:
  Comm& plane_;
  int chunks_;
  std::vector<int> send_rows_;     // my rows grouped by owner, in rank order
  std::vector<size_t> send_count_;  // rows per owner
  std::vector<int> owned_;         // my chunks, increasing
  std::vector<int> recv_pick_;     // rows of the received concatenation, owned chunks' rows in order
  std::vector<int> chunk_row0_;    // per owned chunk (and one past the last): its first row
};

template <class B, class T>
typename B::template Buf<T> TokenSplit::route(const B& be, const T* data, int64_t width) const {
  const size_t w = static_cast<size_t>(width);
  auto packed = be.template zeros<T>(send_rows_.size() * w);
  be.gather_rows(data, w, send_rows_, packed.data());
  std::vector<size_t> elements;
  for (size_t c : send_count_) elements.push_back(c * w);
  const auto recv = be.all_to_all(plane_, packed.data(), elements);
  auto out = be.template zeros<T>(recv_pick_.size() * w);
  be.gather_rows(recv.data.data(), w, recv_pick_, out.data());
  return out;
}

template <class B, class Partial>
typename B::template Buf<float> TokenSplit::reduce(const B& be, size_t numel, Partial&& partial) const {
  auto mine = be.template zeros<float>(owned_.size() * numel);
  for (size_t k = 0; k < owned_.size(); ++k) partial(k, mine.data() + k * numel);
  const auto all = be.all_gather(plane_, mine.data(), mine.size());
  const int P = plane_.size();
  std::vector<size_t> parts;  // chunk j: rank j mod P's partial number j / P
  for (int j = 0; j < chunks_; ++j)
    parts.push_back(all.offset[static_cast<size_t>(j % P)] + static_cast<size_t>(j / P) * numel);
  auto out = be.template zeros<float>(numel);
  be.reduce_partials(all.data.data(), parts, numel, PartialSum::Tree, out.data());
  return out;
}

}  // namespace bp::layouts
