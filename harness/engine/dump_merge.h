// The merge of a tensor-parallel engine's per-rank captures into the unsharded dump
// (`bitparity merge`, cli/merge.cpp), so that a TP 4 engine's capture compares with a
// TP 1 trainer's. Each rank's dump says who it is and how its tensors are sharded
// (the Python capture writes these, docs/python.md "Sharded engines"):
//   bitparity.rank    its rank in the tensor-parallel group, 0..world−1
//   bitparity.world   the group's size: one dump per rank, each rank once
//   bitparity.shards  JSON {"<tensor>": dim, ...}: the tensors of which rank r holds
//                     the r-th consecutive slice along dim; every other tensor is
//                     replicated and must be bit-identical on every rank
// Every rank holds the same tensor names with the same dtypes, the same shapes but
// along its shard dim, the same bitparity.shards and the same other metadata, but
// bitparity.weights (where its own shard came from), which the merged dump lists rank
// by rank.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/io/safetensors.h"

namespace bp::harness {

struct MergedDump {
  std::vector<io::WriteTensor> tensors;        // their bytes live in `storage`
  std::vector<std::vector<uint8_t>> storage;
  std::map<std::string, std::string> metadata;  // rank 0's, less rank, world and shards; every rank's
                                                // weights; plus bitparity.merged
};

// Throws bp::io::BadInput naming the file and the tensor or metadata key at fault,
// bp::io::IoError when a file cannot be opened.
MergedDump merge_rank_dumps(const std::vector<std::string>& paths);

}  // namespace bp::harness
