#include "harness/engine/dump_merge.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include <nlohmann/json.hpp>

#include "harness/io/json_strict.h"

namespace bp::harness {

namespace {

using io::BadInput;
using io::SafetensorsFile;
using io::TensorInfo;

constexpr const char* kRank = "bitparity.rank";
constexpr const char* kWorld = "bitparity.world";
constexpr const char* kShards = "bitparity.shards";
constexpr const char* kWeights = "bitparity.weights";  // each rank's own shard

int64_t metadata_integer(const SafetensorsFile& f, const char* key) {
  const auto it = f.metadata().find(key);
  if (it == f.metadata().end())
    throw BadInput(f.path(), key, "missing: a rank's capture says its rank and world (docs/python.md)");
  int64_t v = -1;
  const std::string& s = it->second;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0)
    throw BadInput(f.path(), key, "expected an integer >= 0, found \"" + s + "\"");
  return v;
}

// The dumps in rank order: one world, each of its ranks once.
std::vector<SafetensorsFile> open_in_rank_order(const std::vector<std::string>& paths) {
  std::vector<SafetensorsFile> files;
  for (const std::string& p : paths) files.push_back(SafetensorsFile::open(p));
  const int64_t world = metadata_integer(files[0], kWorld);
  std::map<int64_t, size_t> by_rank;  // rank -> index in files
  for (size_t i = 0; i < files.size(); ++i) {
    const SafetensorsFile& f = files[i];
    if (metadata_integer(f, kWorld) != world)
      throw BadInput(f.path(), kWorld, "differs from " + files[0].path() + "'s (" + std::to_string(world) + ")");
    const int64_t rank = metadata_integer(f, kRank);
    if (rank >= world) throw BadInput(f.path(), kRank, std::to_string(rank) + " is not below the world " + std::to_string(world));
    if (const auto [at, fresh] = by_rank.emplace(rank, i); !fresh)
      throw BadInput(f.path(), kRank, std::to_string(rank) + " is also " + files[at->second].path() + "'s rank");
  }
  if (static_cast<int64_t>(files.size()) != world) {
    std::string missing;
    for (int64_t r = 0, shown = 0; r < world && shown < 8; ++r)
      if (!by_rank.count(r)) missing += (shown++ ? ", " : "") + std::to_string(r);
    throw BadInput(files[0].path(), kWorld, "is " + std::to_string(world) + " but " + std::to_string(files.size()) +
                                                " dumps were given: rank " + missing + (world - static_cast<int64_t>(files.size()) > 8 ? ", ..." : "") +
                                                " missing (give one dump per rank)");
  }
  std::vector<SafetensorsFile> out;
  for (const auto& [rank, i] : by_rank) out.push_back(std::move(files[i]));
  return out;
}

std::map<std::string, int64_t> shard_dims(const SafetensorsFile& f) {
  std::map<std::string, int64_t> dims;
  const auto it = f.metadata().find(kShards);
  if (it == f.metadata().end()) return dims;  // nothing sharded
  const nlohmann::json j = io::parse_json_strict(it->second, f.path() + ": " + kShards);
  if (!j.is_object()) throw BadInput(f.path(), kShards, "expected a JSON object {\"<tensor>\": dim}");
  for (const auto& [name, dim] : j.items()) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0)
      throw BadInput(f.path(), std::string(kShards) + "." + name, "expected a dimension >= 0, found " + dim.dump());
    if (!f.find(name)) throw BadInput(f.path(), std::string(kShards) + "." + name, "names no tensor of the dump");
    dims[name] = dim.get<int64_t>();
  }
  return dims;
}

// The same across ranks: tensor names and dtypes, shards, the other metadata.
void check_alike(const SafetensorsFile& first, const SafetensorsFile& f) {
  for (const auto& [key, value] : first.metadata()) {
    if (key == kRank || key == kWeights) continue;
    const auto it = f.metadata().find(key);
    if (it == f.metadata().end() || it->second != value)
      throw BadInput(f.path(), key, "differs from rank 0's (" + first.path() + "): the ranks must capture one case");
  }
  for (const auto& [key, _] : f.metadata())
    if (!first.metadata().count(key)) throw BadInput(f.path(), key, "is not in rank 0's metadata (" + first.path() + ")");
  for (const TensorInfo& t : first.tensors()) {
    const TensorInfo* u = f.find(t.name);
    if (!u) throw BadInput(f.path(), t.name, "is in rank 0's dump (" + first.path() + ") but not in this one");
    if (u->dtype != t.dtype) throw BadInput(f.path(), t.name, "has another dtype than rank 0's");
  }
  for (const TensorInfo& u : f.tensors())
    if (!first.find(u.name)) throw BadInput(f.path(), u.name, "is not in rank 0's dump (" + first.path() + ")");
}

uint64_t product(const std::vector<uint64_t>& s, size_t from, size_t to) {
  uint64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// Rank r's slice along `dim`, concatenated in rank order.
std::vector<uint8_t> concatenated(const std::vector<SafetensorsFile>& ranks, const std::string& name, size_t dim,
                                  std::vector<uint64_t>& shape) {
  const TensorInfo& t0 = *ranks[0].find(name);
  if (dim >= t0.shape.size())
    throw BadInput(ranks[0].path(), std::string(kShards) + "." + name,
                   "dimension " + std::to_string(dim) + " of a tensor of shape " + io::shape_str(t0.shape));
  shape = t0.shape;
  shape[dim] = 0;
  for (const SafetensorsFile& f : ranks) {
    const TensorInfo& t = *f.find(name);
    for (size_t d = 0; d < t.shape.size(); ++d)
      if (t.shape.size() != t0.shape.size() || (d != dim && t.shape[d] != t0.shape[d]))
        throw BadInput(f.path(), name, "shape " + io::shape_str(t.shape) + " differs from rank 0's " +
                                           io::shape_str(t0.shape) + " off the shard dimension " + std::to_string(dim));
    shape[dim] += t.shape[dim];
  }
  const uint64_t outer = product(t0.shape, 0, dim), width = io::dtype_size(t0.dtype) * product(t0.shape, dim + 1, t0.shape.size());
  std::vector<uint8_t> out;
  out.reserve(outer * shape[dim] * width);
  for (uint64_t o = 0; o < outer; ++o)
    for (const SafetensorsFile& f : ranks) {
      const TensorInfo& t = *f.find(name);
      const uint64_t block = t.shape[dim] * width;
      const auto bytes = f.bytes(t).subspan(o * block, block);
      out.insert(out.end(), bytes.begin(), bytes.end());
    }
  return out;
}

// A replicated tensor: bit-identical on every rank.
std::vector<uint8_t> replicated(const std::vector<SafetensorsFile>& ranks, const std::string& name) {
  const TensorInfo& t0 = *ranks[0].find(name);
  const auto b0 = ranks[0].bytes(t0);
  for (size_t r = 1; r < ranks.size(); ++r) {
    const TensorInfo& t = *ranks[r].find(name);
    const auto b = ranks[r].bytes(t);
    if (t.shape != t0.shape || b.size() != b0.size() || std::memcmp(b.data(), b0.data(), b.size()) != 0)
      throw BadInput(ranks[r].path(), name,
                     "differs from rank 0's, and bitparity.shards does not shard it: a tensor the map does not shard "
                     "must be the same on every rank (is its shard dimension missing from the name map?)");
  }
  return {b0.begin(), b0.end()};
}

}  // namespace

MergedDump merge_rank_dumps(const std::vector<std::string>& paths) {
  if (paths.empty()) throw BadInput("", "dumps", "no rank dumps given");
  const std::vector<SafetensorsFile> ranks = open_in_rank_order(paths);
  const std::map<std::string, int64_t> dims = shard_dims(ranks[0]);
  for (size_t r = 1; r < ranks.size(); ++r) check_alike(ranks[0], ranks[r]);
  MergedDump m;
  m.storage.reserve(ranks[0].tensors().size());
  for (const TensorInfo& t : ranks[0].tensors()) {
    io::WriteTensor w{t.name, t.dtype, t.shape, {}};
    const auto dim = dims.find(t.name);
    m.storage.push_back(dim == dims.end() ? replicated(ranks, t.name)
                                          : concatenated(ranks, t.name, static_cast<size_t>(dim->second), w.shape));
    w.bytes = m.storage.back();
    m.tensors.push_back(std::move(w));
  }
  m.metadata = ranks[0].metadata();
  for (const char* k : {kRank, kWorld, kShards}) m.metadata.erase(k);
  if (m.metadata.count(kWeights)) {
    std::string weights;
    for (size_t r = 0; r < ranks.size(); ++r)
      weights += (r ? "; " : "") + std::string("rank ") + std::to_string(r) + ": " + ranks[r].metadata().at(kWeights);
    m.metadata[kWeights] = weights;
  }
  std::string from;
  for (const SafetensorsFile& f : ranks) from += (from.empty() ? "" : ", ") + f.path();
  m.metadata["bitparity.merged"] = std::to_string(ranks.size()) + " ranks: " + from;
  return m;
}

}  // namespace bp::harness
