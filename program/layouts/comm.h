// Ranks and collectives, as the layouts' rank program sees them (SPEC.md §7).
// Collectives move bytes and nothing else: every reduction is the contract's own
// fixed tree, computed by the ranks after a gather, so that an implementation with
// NCCL underneath (all-gather, all-to-all via send/recv) gives the same bits.
// Every rank of a group calls the same collectives in the same order.
#pragma once
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace bp::layouts {

using Bytes = std::vector<std::byte>;

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `send` (any length), in rank order.
  virtual std::vector<Bytes> all_gather(std::span<const std::byte> send) = 0;
  // send[r] goes to rank r (send.size() == size()); what each rank sent here, in rank order.
  virtual std::vector<Bytes> all_to_all(const std::vector<Bytes>& send) = 0;
};

// The groups a rank of the (e, c, t) grid belongs to (layout.h).
struct RankComms {
  Comm& tp;     // same (e, c): the tensor-parallel ranks, holding the same tokens
  Comm& cp;     // same (e, t): the context-parallel ranks of a batch share
  Comm& plane;  // same t, rank e·cp + c: ranks holding disjoint tokens (MoE dispatch,
                // weight-gradient token splits)
};

// A collective's result in a backend's memory (host/backend.h, gpu/cuda_backend.h):
// the ranks' pieces concatenated in rank order; rank r's piece is elements
// [offset[r], offset[r+1]) of data.
template <class Buf>
struct Gathered {
  Buf data;
  std::vector<size_t> offset;
  size_t count(int r) const { return offset[static_cast<size_t>(r) + 1] - offset[static_cast<size_t>(r)]; }
};

// ---- Typed helpers over the byte interface ----

template <class T>
Bytes to_bytes(std::span<const T> v) {
  Bytes b(v.size_bytes());
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <class T>
std::vector<T> from_bytes(const Bytes& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

// Every rank's vector, in rank order.
template <class T>
std::vector<std::vector<T>> all_gather(Comm& c, std::span<const T> mine) {
  std::vector<std::vector<T>> out;
  for (const Bytes& b : c.all_gather(std::as_bytes(mine))) out.push_back(from_bytes<T>(b));
  return out;
}

// send[r] to rank r; what each rank sent here, in rank order.
template <class T>
std::vector<std::vector<T>> all_to_all(Comm& c, const std::vector<std::vector<T>>& send) {
  std::vector<Bytes> raw;
  for (const std::vector<T>& v : send) raw.push_back(to_bytes(std::span<const T>(v)));
  std::vector<std::vector<T>> out;
  for (const Bytes& b : c.all_to_all(raw)) out.push_back(from_bytes<T>(b));
  return out;
}

}  // namespace bp::layouts
