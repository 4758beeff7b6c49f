// Who holds what under a layout (SPEC.md §7): grid coordinates, the batch's
// sequences per e, the positions per c, the TP slices.
#pragma once
#include <algorithm>
#include <cstdint>

#include "program/layouts/layout.h"
#include "reference/numerics/chunked.h"

namespace bp::layouts {

struct GridPos {
  int e, c, t;
  static GridPos of(const Layout& l, int rank) { return {rank / (l.tp * l.cp), (rank / l.tp) % l.cp, rank % l.tp}; }
  int plane_rank(const Layout& l) const { return e * l.cp + c; }
};

// Sequence s of the batch is processed by the ranks with e == s mod ep.
inline int seq_owner_e(const Layout& l, int seq) { return seq % l.ep; }

// The CP rank that holds position p of a length-S sequence. Contiguous: cp equal
// parts in order; zigzag: 2·cp parts, part i on rank i (i < cp) or 2·cp−1−i, so each
// rank holds an early and a late part. Part i is [⌊i·S/n⌋, ⌊(i+1)·S/n⌋).
inline int cp_owner(const Layout& l, int64_t p, int64_t S) {
  const int n = l.cp_split == CpSplit::Zigzag ? 2 * l.cp : l.cp;
  int part = static_cast<int>((p * n) / S);  // the largest i with ⌊i·S/n⌋ <= p
  while (part + 1 < n && ((part + 1) * S) / n <= p) ++part;
  while (part > 0 && (part * S) / n > p) --part;
  return part < l.cp ? part : 2 * l.cp - 1 - part;
}

// The elements of a TP rank's chunks (SPEC.md §2.4.1 "A rank's chunks"): n items
// in C fixed chunks of ⌈n/C⌉, rank `index` of `parts` holding chunks
// [index·C/parts, (index+1)·C/parts) — [index·n/parts, (index+1)·n/parts) when C
// divides n, else the tail ranks' slices are shorter (or empty).
struct Slice {
  int begin, len;
  static Slice of_chunks(int n, int C, int parts, int index) {
    const int64_t span = int64_t{fixed_chunk_len(n, C)} * (C / parts);
    const int64_t b = std::min<int64_t>(n, index * span), e = std::min<int64_t>(n, (index + 1) * span);
    return {static_cast<int>(b), static_cast<int>(e - b)};
  }
};

}  // namespace bp::layouts
