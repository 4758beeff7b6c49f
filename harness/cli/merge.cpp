// `bitparity merge --out DUMP RANK_DUMP...`: a tensor-parallel engine's per-rank
// captures as one unsharded dump (engine/dump_merge.h).
#include <cstdio>

#include "harness/cli/common.h"
#include "harness/engine/dump_merge.h"
#include "harness/exit_codes.h"
#include "harness/io/files.h"

namespace bp::harness {

namespace {

struct MergeOptions {
  std::vector<std::string> dumps;
  std::string out;
  bool quiet = false;
};

int merge(const MergeOptions& o) {
  io::check_outputs({{"--out", o.out}}, o.dumps);
  MergedDump m = merge_rank_dumps(o.dumps);
  const size_t n = m.tensors.size();
  io::write_safetensors(o.out, std::move(m.tensors), m.metadata);
  if (!o.quiet)
    std::fprintf(text_stream({o.out}), "merge: %zu ranks, %zu tensors -> %s\n", o.dumps.size(), n, o.out.c_str());
  return kExitExact;
}

}  // namespace

Subcommand add_merge_command(CLI::App& app) {
  auto o = std::make_shared<MergeOptions>();
  CLI::App* sub = app.add_subcommand(
      "merge",
      "assemble a tensor-parallel engine's per-rank captures (bitparity.capture under torch.distributed: metadata "
      "bitparity.rank, bitparity.world, bitparity.shards) into the unsharded dump: sharded tensors concatenated "
      "along their shard dimension in rank order, the others checked bit-identical on every rank. Exit 0 written, "
      "2 bad usage or input (a missing or repeated rank, ranks of different cases, a replicated tensor that differs)");
  sub->add_option("dumps", o->dumps, "one capture per rank (.safetensors), in any order")->required();
  sub->add_option("--out,-o", o->out, "the merged dump to write (.safetensors, written atomically; '-': stdout)")
      ->required();
  sub->add_flag("--quiet,-q", o->quiet, "print nothing but errors");
  return guarded_subcommand(sub, [o] { return merge(*o); });
}

}  // namespace bp::harness
