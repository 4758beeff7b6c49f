// How a batch of sequences goes through the model (SPEC.md §6.2): a path (the
// CLI's --path) is a list of model calls, each call a list of pieces packed together.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace bp::program {

// How a batch of sequences goes through the model.
//   Extend:  each sequence alone, in one call, whole.
//   Chunked: each sequence alone, cut into chunks of sizes chunks[0], chunks[1], …
//            (the list is cycled until the sequence ends; the last chunk may be
//            shorter), each chunk one call extending the sequence's KV cache.
//   Decode:  token by token with the KV cache; every step packs the next token of
//            every unfinished sequence into one call (ragged decode).
//   Ragged:  every sequence, whole, packed into one call.
struct Path {
  enum class Kind { Extend, Chunked, Decode, Ragged };
  Kind kind = Kind::Extend;
  std::vector<int> chunks;  // Chunked only; every size >= 1
  static Path extend() { return {Kind::Extend, {}}; }
  static Path ragged() { return {Kind::Ragged, {}}; }
  static Path decode() { return {Kind::Decode, {}}; }
  static Path chunked(std::vector<int> c) { return {Kind::Chunked, std::move(c)}; }
};

// One piece of a model call: `len` tokens of sequence `seq` (its index in the
// batch) at absolute positions start .. start+len−1, extending its KV cache.
struct PathPiece {
  int seq;
  int start;
  int len;
};

// The calls a path makes, in order, each a list of pieces packed into one call.
// Throws std::invalid_argument for an empty sequence, one longer than
// max_positions, or a chunked path without chunks or with a size < 1.
std::vector<std::vector<PathPiece>> path_steps(const std::vector<std::vector<int32_t>>& seqs,
                                                       const Path& path, int64_t max_positions);

}  // namespace bp::program
