// `bitparity merge` (issue 54): a reference dump cut into tensor-parallel rank dumps
// the way a TP 2 engine's capture holds them (column-parallel outputs and weights by
// their features, row-parallel weights by their inputs, the rest replicated) merges
// back bit for bit, the ranks given in any order; a wrong shard dimension is caught
// by the diff against the unsharded dump; a missing or repeated rank, ranks of
// different cases, a replicated tensor that differs and a shard dimension past the
// tensor's are bad input (exit 2) naming the file and the field.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/io/safetensors.h"
#include "support/cli_run.h"

namespace bp {
namespace {

using io::SafetensorsFile;
using io::TensorInfo;

// The shard dimension of each tensor a TP engine splits (tests' own list, not the
// Python map's: the merge must not depend on where the dims came from).
std::map<std::string, int64_t> tp_shards(const SafetensorsFile& full) {
  std::map<std::string, int64_t> dims;
  const std::vector<std::string> column_ops = {"q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope",
                                               "k_rope", "attn", "mlp_gate", "mlp_up", "mlp_act"};
  for (const TensorInfo& t : full.tensors()) {
    const std::string& n = t.name;
    auto ends = [&n](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
    for (const std::string& op : column_ops)
      if (n.rfind("ops.layers.", 0) == 0 && ends("." + op)) dims[n] = 1;
    for (const char* w : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight"})
      if (n.rfind("grads.", 0) == 0 && ends(w)) dims[n] = 0;
    for (const char* w : {"o_proj.weight", "down_proj.weight"})
      if (n.rfind("grads.", 0) == 0 && ends(w)) dims[n] = 1;
  }
  return dims;
}

// Rank r's slice of t along dim (of `world` equal slices).
std::vector<uint8_t> slice(const SafetensorsFile& f, const TensorInfo& t, size_t dim, int r, int world,
                           std::vector<uint64_t>& shape) {
  shape = t.shape;
  shape[dim] /= static_cast<uint64_t>(world);
  uint64_t outer = 1, inner = io::dtype_size(t.dtype);
  for (size_t d = 0; d < dim; ++d) outer *= t.shape[d];
  for (size_t d = dim + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  const uint64_t whole = t.shape[dim] * inner, part = shape[dim] * inner;
  std::vector<uint8_t> out;
  const auto bytes = f.bytes(t);
  for (uint64_t o = 0; o < outer; ++o) {
    const auto piece = bytes.subspan(o * whole + static_cast<uint64_t>(r) * part, part);
    out.insert(out.end(), piece.begin(), piece.end());
  }
  return out;
}

class CliMerge : public test::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    ASSERT_EQ(run("run --model qwen3-dense-tiny --contract bf16-fmaseq-v2 --lengths 5,3 --capture ops --out " +
                  path("full.safetensors") + " --quiet"), 0) << err_;
  }
  // Writes rank dumps of full.safetensors cut by `cut` and declaring `declared` as
  // bitparity.shards; `edit(rank, tensors, metadata)` may spoil one.
  std::vector<std::string> ranks(int world, const std::map<std::string, int64_t>& cut,
                                 const std::map<std::string, int64_t>& declared,
                                 const std::function<void(int, std::vector<std::vector<uint8_t>>&,
                                                          std::map<std::string, std::string>&)>& edit = {}) {
    const SafetensorsFile full = SafetensorsFile::open(path("full.safetensors"));
    std::vector<std::string> out;
    for (int r = 0; r < world; ++r) {
      std::vector<std::vector<uint8_t>> storage;
      std::vector<io::WriteTensor> tensors;
      for (const TensorInfo& t : full.tensors()) {
        std::vector<uint64_t> shape = t.shape;
        const auto d = cut.find(t.name);
        if (d != cut.end()) storage.push_back(slice(full, t, static_cast<size_t>(d->second), r, world, shape));
        else storage.emplace_back(full.bytes(t).begin(), full.bytes(t).end());
        tensors.push_back({t.name, t.dtype, shape, {}});
      }
      std::map<std::string, std::string> meta = full.metadata();
      meta["bitparity.rank"] = std::to_string(r);
      meta["bitparity.world"] = std::to_string(world);
      meta["bitparity.shards"] = nlohmann::json(declared).dump();
      if (edit) edit(r, storage, meta);
      for (size_t i = 0; i < tensors.size(); ++i) tensors[i].bytes = storage[i];
      out.push_back(path("rank" + std::to_string(r) + ".safetensors"));
      io::write_safetensors(out.back(), std::move(tensors), meta);
    }
    return out;
  }
  int merge(const std::vector<std::string>& dumps) {
    std::string args = "merge --quiet --out " + path("merged.safetensors");
    for (const std::string& d : dumps) args += " " + d;
    return run(args);
  }
  void expect_bad(const std::vector<std::string>& dumps, const std::string& what) {
    EXPECT_EQ(merge(dumps), 2) << out_ << err_;
    EXPECT_NE(err_.find(what), std::string::npos) << "expected '" << what << "' in: " << err_;
  }
};

TEST_F(CliMerge, RankDumpsMergeBackBitForBit) {
  const auto dims = tp_shards(SafetensorsFile::open(path("full.safetensors")));
  ASSERT_GT(dims.size(), 40u);
  for (const int world : {2, 4}) {
    std::vector<std::string> dumps = ranks(world, dims, dims);
    std::reverse(dumps.begin(), dumps.end());  // any order
    ASSERT_EQ(merge(dumps), 0) << err_;
    EXPECT_EQ(run("diff --quiet " + path("full.safetensors") + " " + path("merged.safetensors")), 0) << out_ << err_;
  }
  const SafetensorsFile merged = SafetensorsFile::open(path("merged.safetensors"));
  EXPECT_EQ(merged.metadata().count("bitparity.rank"), 0u);
  EXPECT_EQ(merged.metadata().at("bitparity.merged").rfind("4 ranks: ", 0), 0u);
  EXPECT_EQ(merged.metadata().at("bitparity.tokens"), "seed 1 lengths 5,3");
}

// The negative control: o_proj's gradient cut along its inputs (dim 1) but declared
// cut along its outputs: the merge cannot know, the diff against the unsharded dump
// names the tensor.
TEST_F(CliMerge, AWrongShardDimensionIsCaught) {
  const auto cut = tp_shards(SafetensorsFile::open(path("full.safetensors")));
  auto declared = cut;
  const std::string o_proj = "grads.model.layers.1.self_attn.o_proj.weight";
  ASSERT_EQ(declared.at(o_proj), 1);
  declared[o_proj] = 0;
  ASSERT_EQ(merge(ranks(2, cut, declared)), 0) << err_;
  EXPECT_EQ(run("diff " + path("full.safetensors") + " " + path("merged.safetensors")), 1);
  EXPECT_NE(out_.find(o_proj), std::string::npos) << out_;
  EXPECT_NE(out_.find("1 differ"), std::string::npos) << out_;
}

TEST_F(CliMerge, BadRankSetsAreRefusedNamingTheField) {
  const auto dims = tp_shards(SafetensorsFile::open(path("full.safetensors")));
  const auto two = ranks(2, dims, dims);
  expect_bad({two[0]}, "bitparity.world: is 2 but 1 dumps were given: rank 1 missing");
  expect_bad({two[0], two[0]}, "bitparity.rank: 0 is also " + two[0] + "'s rank");
  const auto spoiled = ranks(2, dims, dims, [](int r, auto&, auto& meta) {
    if (r == 1) meta["bitparity.tokens"] = "seed 2 lengths 5,3";
  });
  expect_bad(spoiled, "rank1.safetensors: bitparity.tokens: differs from rank 0's");
  const auto flipped = ranks(2, dims, dims, [](int r, auto& storage, auto&) {
    if (r == 1) storage[0][0] ^= 1;  // entropy.0, replicated
  });
  expect_bad(flipped, "rank1.safetensors: entropy.0: differs from rank 0's, and bitparity.shards does not shard it");
  auto past = dims;
  past["entropy.0"] = 3;
  expect_bad(ranks(2, dims, past), "bitparity.shards.entropy.0: dimension 3 of a tensor of shape [4]");
  const auto unranked = ranks(2, dims, dims, [](int, auto&, auto& meta) { meta.erase("bitparity.rank"); });
  expect_bad(unranked, "bitparity.rank: missing");
}

}  // namespace
}  // namespace bp
