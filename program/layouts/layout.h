// A sharded layout of the model (SPEC.md §7): tensor-, expert- and context-
// parallel sizes and how a sequence is cut for context parallelism. The ranks of
// a layout form a grid (e, c, t) with e < ep, c < cp, t < tp; rank id
// (e·cp + c)·tp + t. The e axis also splits the batch (attention data
// parallelism, whose ranks the experts are partitioned over).
#pragma once
#include <optional>
#include <string>

#include "reference/contract/contract.h"
#include "reference/model/config.h"

namespace bp::layouts {

enum class CpSplit {
  Contiguous,  // rank c holds positions [c·S/cp, (c+1)·S/cp) of a length-S sequence
  Zigzag,      // 2·cp equal parts; rank c holds parts c and 2·cp−1−c (causal load balance)
};

// How partial sums that cross ranks are reduced. Tree is the contract's fixed
// tree and the only exact one; Ring is what a framework gets from a local GEMM
// and NCCL's ring all-reduce, kept as the negative control that shows a layout
// change is caught. NcclBf16Sum is what inference engines commonly run: each
// rank's row-parallel partial rounded to bf16 and summed by NCCL's own bf16
// all-reduce (real ranks only; elsewhere it reduces as Ring).
enum class Reduction { Tree, Ring, NcclBf16Sum };

struct Layout {
  int tp = 1;
  int ep = 1;
  int cp = 1;
  CpSplit cp_split = CpSplit::Contiguous;
  Reduction reduction = Reduction::Tree;

  int world() const { return tp * ep * cp; }
  // "tp2-ep1-cp2" (contiguous), "tp1-ep2-cp2z" (zigzag), "+ring" appended for Ring,
  // "+nccl-bf16sum" for NcclBf16Sum.
  std::string name() const;
  bool operator==(const Layout&) const = default;
};

// Parses name() back; nullopt (with *why set) for anything else.
std::optional<Layout> parse_layout(const std::string& s, std::string* why = nullptr);

// Empty if the model can run under the layout with these knobs, else why not
// (e.g. "tp 4 does not divide num_attention_heads 6").
std::string shard_check(const Layout& l, const ModelConfig& cfg, const Knobs& kn);

}  // namespace bp::layouts
