#include "harness/io/checkpoint.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "harness/io/files.h"
#include "harness/io/json_strict.h"
#include "reference/common/sha256.h"
#include "reference/model/model_graph.h"

namespace bp::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// "a, b, c and 7 more"
std::string name_list(const std::vector<std::string>& v, size_t shown = 8) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < shown; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > shown) s += " and " + std::to_string(v.size() - shown) + " more";
  return s;
}


bool same_shape(const std::vector<uint64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (b[i] < 0 || a[i] != static_cast<uint64_t>(b[i])) return false;
  return true;
}

}  // namespace

const Checkpoint::Entry* Checkpoint::find(const std::string& name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<FileDigest> Checkpoint::digests(const std::function<void(const LoadProgress&)>& progress) const {
  std::vector<FileDigest> shards(files_.size());
  uint64_t total = 0, done = 0;
  for (const auto& f : files_) total += f->file_bytes().size();
  // One pass over each mapped file; big checkpoints hash their shards in parallel.
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < files_.size(); ++i) {
    const std::span<const uint8_t> bytes = files_[i]->file_bytes();
    shards[i] = FileDigest{files_[i]->path(), Sha256().update(bytes.data(), bytes.size()).hex()};
#pragma omp critical(bp_digest_progress)
    {
      done += bytes.size();
      if (progress) progress({"hashing", done, total});
    }
  }
  std::vector<FileDigest> out;
  if (!index_sha256_.empty()) out.push_back(FileDigest{path_, index_sha256_});
  out.insert(out.end(), shards.begin(), shards.end());
  return out;
}

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint ck;
  std::error_code ec;
  std::string index, single;
  if (fs::is_directory(path, ec)) {
    const fs::path d(path);
    const bool has_index = fs::exists(d / kIndexName, ec), has_single = fs::exists(d / kSingleName, ec);
    if (has_index && has_single)
      throw BadInput(path, "", std::string("holds both ") + kIndexName + " and " + kSingleName +
                                   "; remove one (bitparity will not guess which is the checkpoint)");
    if (has_index) index = (d / kIndexName).string();
    else if (has_single) single = (d / kSingleName).string();
    else throw BadInput(path, "", std::string("no ") + kSingleName + " or " + kIndexName + " in this directory");
  } else if (path.ends_with(".json")) {
    index = path;
  } else {
    single = path;
  }

  if (!single.empty()) {
    ck.path_ = single;
    ck.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(single)));
    const SafetensorsFile* f = ck.files_.back().get();
    for (const TensorInfo& t : f->tensors()) ck.entries_[t.name] = Entry{f, &t};
    return ck;
  }

  ck.path_ = index;
  if (!fs::exists(index, ec)) throw BadInput(index, "", "no such file");
  const std::string index_text = read_text_file(index);
  ck.index_sha256_ = sha256_hex(index_text);
  const json j = parse_json_strict(index_text, index);
  if (!j.is_object()) throw BadInput(index, "", std::string("index is ") + json_type_word(j) + ", not an object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "metadata" && it.key() != "weight_map")
      throw BadInput(index, it.key(), "unknown key in a safetensors index (expected metadata, weight_map)");
  if (j.contains("metadata") && !j["metadata"].is_object() && !j["metadata"].is_null())
    throw BadInput(index, "metadata", std::string("is ") + json_type_word(j["metadata"]) + ", not an object");
  if (!j.contains("weight_map")) throw BadInput(index, "weight_map", "missing");
  const json& wm = j["weight_map"];
  if (!wm.is_object()) throw BadInput(index, "weight_map", std::string("is ") + json_type_word(wm) + ", not an object");

  const fs::path dir = fs::path(index).parent_path();
  std::map<std::string, std::string> tensor_file;  // tensor -> shard name
  std::set<std::string> shard_names;
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    const std::string field = "weight_map." + it.key();
    if (it.key().empty()) throw BadInput(index, "weight_map", "a tensor has an empty name");
    if (!it.value().is_string())
      throw BadInput(index, field, std::string("shard file is ") + json_type_word(it.value()) + ", not a string");
    const std::string f = it.value().get<std::string>();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\\') != std::string::npos ||
        f.find('\0') != std::string::npos)
      throw BadInput(index, field, "shard file \"" + f + "\" is not a plain file name in the index's directory");
    tensor_file[it.key()] = f;
    shard_names.insert(f);
  }

  std::map<std::string, const SafetensorsFile*> shards;
  for (const std::string& s : shard_names) {
    const std::string p = (dir / s).string();
    if (!fs::exists(p, ec)) {
      std::string example;
      for (const auto& [t, f] : tensor_file)
        if (f == s) {
          example = t;
          break;
        }
      // A Hugging Face cache snapshot whose blob is missing holds a link to nothing.
      const fs::path target = fs::read_symlink(p, ec);
      throw BadInput(index, "weight_map." + example,
                     "shard file " + s + (ec ? " does not exist (" + p + ")" : " is a broken link to " + target.string()));
    }
    ck.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(p)));
    shards[s] = ck.files_.back().get();
  }

  std::vector<std::string> missing;
  for (const auto& [t, s] : tensor_file) {
    const SafetensorsFile* f = shards.at(s);
    const TensorInfo* info = f->find(t);
    if (info == nullptr) missing.push_back(t + " (in " + s + ")");
    else ck.entries_[t] = Entry{f, info};
  }
  if (!missing.empty())
    throw BadInput(index, missing.front().substr(0, missing.front().find(' ')),
                   std::to_string(missing.size()) + " tensor(s) named in the weight map are missing from their shard files: " +
                       name_list(missing));
  std::vector<std::string> extra;
  std::string extra_file;
  for (const auto& [s, f] : shards)
    for (const TensorInfo& t : f->tensors()) {
      const auto it = tensor_file.find(t.name);
      if (it == tensor_file.end() || it->second != s) {
        if (extra.empty()) extra_file = f->path();
        extra.push_back(t.name + " (in " + s + (it == tensor_file.end() ? ")" : ", mapped to " + it->second + ")"));
      }
    }
  if (!extra.empty())
    throw BadInput(extra_file, extra.front().substr(0, extra.front().find(' ')),
                   std::to_string(extra.size()) + " tensor(s) in shard files are not listed under that shard in " +
                       std::string(kIndexName) + ": " + name_list(extra));
  return ck;
}

// --- load_weights -------------------------------------------------------------

namespace {

bool float_dtype(DType d) { return d == DType::BF16 || d == DType::F32 || d == DType::F16; }

const Checkpoint::Entry& checked(const Checkpoint::Entry& e, const std::string& name, const std::vector<int64_t>& shape,
                                 const std::string& shape_origin) {
  if (!float_dtype(e.info->dtype))
    throw BadInput(e.file->path(), name,
                   std::string("wrong dtype ") + dtype_name(e.info->dtype) + " for a weight (expected BF16, F32 or F16)");
  if (!same_shape(e.info->shape, shape))
    throw BadInput(e.file->path(), name,
                   "wrong shape " + shape_str(e.info->shape) + "; " + shape_origin + " needs " + shape_str(shape));
  return e;
}

// Where one parameter's values are: elements [first, first + numel(shape)) of a
// checkpoint tensor (all of it, or one expert's part of a fused tensor).
struct Slice {
  const Checkpoint::Entry* entry = nullptr;
  uint64_t first = 0;
  std::vector<int64_t> shape;
  uint64_t count() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
  uint64_t stored_bytes() const { return count() * dtype_size(entry->info->dtype); }
};

// Every parameter of `cfg` found in `ck`, with the checks of checkpoint.h (all but
// the values').
std::map<std::string, Slice> locate_weights(const Checkpoint& ck, const ModelConfig& cfg) {
  const std::string origin = "config.json (" + cfg.model_type + ")";
  std::map<std::string, Slice> slices;
  std::set<std::string> consumed;
  std::vector<std::string> missing;

  // Fused MoE experts (transformers 5.x in-memory layout), split per expert.
  std::set<int64_t> fused_layers;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    if (!cfg.is_moe_layer(i)) continue;
    const std::string p = graph::experts_prefix(i);
    const std::string gu = graph::fused_experts_name(i, graph::FusedExperts::GateUp);
    const std::string dn = graph::fused_experts_name(i, graph::FusedExperts::Down);
    const Checkpoint::Entry* egu = ck.find(gu);
    const Checkpoint::Entry* edn = ck.find(dn);
    if (egu == nullptr && edn == nullptr) continue;
    for (const auto& [name, e] : ck.entries())
      if (name.compare(0, p.size(), p) == 0 && name != gu && name != dn)
        throw BadInput(e.file->path(), name,
                       "layer " + std::to_string(i) + " stores experts both fused (" + (egu ? gu : dn) +
                           ") and per expert; refusing the ambiguous checkpoint");
    if (egu == nullptr || edn == nullptr) {
      missing.push_back(egu == nullptr ? gu : dn);
      fused_layers.insert(i);
      continue;
    }
    const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, H = cfg.hidden_size;
    checked(*egu, gu, {E, 2 * I, H}, origin);
    checked(*edn, dn, {E, H, I}, origin);
    const uint64_t half = static_cast<uint64_t>(I * H);  // one expert's gate (or up, or down) elements
    for (int64_t e = 0; e < E; ++e) {
      const uint64_t ue = static_cast<uint64_t>(e);
      slices[graph::param_name(i, e, graph::Param::ExpertGate)] = Slice{egu, ue * 2 * half, {I, H}};
      slices[graph::param_name(i, e, graph::Param::ExpertUp)] = Slice{egu, ue * 2 * half + half, {I, H}};
      slices[graph::param_name(i, e, graph::Param::ExpertDown)] = Slice{edn, ue * half, {H, I}};
    }
    consumed.insert(gu);
    consumed.insert(dn);
    fused_layers.insert(i);
  }

  for (const WeightSpec& s : weight_specs(cfg)) {
    if (slices.count(s.name)) continue;  // from a fused tensor
    const Checkpoint::Entry* e = ck.find(s.name);
    if (e == nullptr) {
      // A per-expert name of a layer already reported as fused-but-incomplete is not repeated.
      const bool in_fused = s.expert >= 0 && fused_layers.count(s.layer) != 0;
      if (!in_fused) missing.push_back(s.name);
      continue;
    }
    slices[s.name] = Slice{&checked(*e, s.name, s.shape, origin), 0, s.shape};
    consumed.insert(s.name);
  }
  if (!missing.empty())
    throw BadInput(ck.path(), missing.front(),
                   std::to_string(missing.size()) + " tensor(s) that " + origin + " implies are missing: " + name_list(missing));

  if (cfg.tie_word_embeddings) {
    const std::string lm_head = graph::param_name(graph::Param::LmHead);
    if (const Checkpoint::Entry* e = ck.find(lm_head)) {
      const std::string embed = graph::param_name(graph::Param::Embed);
      const Slice& emb = slices.at(embed);
      checked(*e, lm_head, emb.shape, origin);
      const std::vector<bf16> lm = e->file->read_bf16(*e->info);
      const std::vector<bf16> em = emb.entry->file->read_bf16(*emb.entry->info, emb.first, emb.count());
      if (lm.size() != em.size() || std::memcmp(lm.data(), em.data(), lm.size() * sizeof(bf16)) != 0)
        throw BadInput(e->file->path(), lm_head,
                       "present and different from " + embed + " although tie_word_embeddings is true");
      consumed.insert(lm_head);
    }
  }

  std::vector<std::string> extra;
  std::string extra_file;
  for (const auto& [name, e] : ck.entries())
    if (!consumed.count(name)) {
      if (extra.empty()) extra_file = e.file->path();
      extra.push_back(name);
    }
  if (!extra.empty())
    throw BadInput(extra_file, extra.front(),
                   std::to_string(extra.size()) + " unexpected tensor(s) that " + origin +
                       " does not imply (a checkpoint of another model or config?): " + name_list(extra));
  return slices;
}

std::string value_text(float v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// Element i of the slice is non-finite (`what`: its value and why): refused, naming
// its index in the checkpoint tensor.
[[noreturn]] void refuse_nonfinite(const Slice& s, uint64_t i, const std::string& what) {
  throw BadInput(s.entry->file->path(), s.entry->info->name,
                 "element " + std::to_string(s.first + i) + " is " + what +
                     "; a non-finite weight makes every logprob and gradient NaN (--allow-nonfinite-weights loads it "
                     "on purpose)");
}

// The first i < n whose value(i) is NaN or Inf, or n.
template <class Value>
uint64_t first_nonfinite(uint64_t n, Value value) {
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(value(i))) return i;
  return n;
}

// How the F32 and F16 values of a load were rounded to bf16, for LoadNotes::conversion.
class RoundingTally {
 public:
  void add(const Slice& s, std::span<const float> stored, std::span<const bf16> rounded) {
    Count& c = counts_[s.entry->info->dtype];
    c.tensors.insert(s.entry->info);
    c.values += stored.size();
    for (size_t i = 0; i < stored.size(); ++i)
      c.changed += std::bit_cast<uint32_t>(widen(rounded[i])) != std::bit_cast<uint32_t>(stored[i]);
  }
  std::string text() const {
    std::string r;
    for (const auto& [dtype, c] : counts_)
      r += (r.empty() ? "" : "; ") + std::to_string(c.tensors.size()) + " " + dtype_name(dtype) +
           " tensor(s) rounded " + (dtype == DType::F32 ? "fp32" : "fp16") +
           " -> bf16 (to nearest even): " + std::to_string(c.changed) + " of " + std::to_string(c.values) +
           " values changed";
    return r;
  }

 private:
  struct Count {
    std::set<const TensorInfo*> tensors;
    uint64_t values = 0, changed = 0;
  };
  std::map<DType, Count> counts_;
};

// A slice's values in bf16 (the conversion of read_bf16), non-finite ones refused
// unless allowed, F32/F16 roundings tallied.
std::vector<bf16> read_checked_bf16(const Slice& s, const LoadOptions& opt, RoundingTally& tally) {
  const SafetensorsFile& f = *s.entry->file;
  const TensorInfo& t = *s.entry->info;
  const uint64_t n = s.count();
  std::vector<bf16> out = f.read_bf16(t, s.first, n);
  auto rounded = [&](uint64_t i) { return widen(out[i]); };
  if (t.dtype == DType::BF16) {
    if (const uint64_t i = first_nonfinite(n, rounded); i < n && !opt.allow_nonfinite)
      refuse_nonfinite(s, i, value_text(rounded(i)));
    return out;
  }
  const std::vector<float> stored = f.read_f32(t, s.first, n);
  if (!opt.allow_nonfinite) {
    if (const uint64_t i = first_nonfinite(n, [&](uint64_t k) { return stored[k]; }); i < n)
      refuse_nonfinite(s, i, value_text(stored[i]));
    if (const uint64_t i = first_nonfinite(n, rounded); i < n)  // a finite value too large for bf16
      refuse_nonfinite(s, i, value_text(stored[i]) + " in " + dtype_name(t.dtype) +
                                 ", beyond bf16's range (it rounds to " + value_text(rounded(i)) + ")");
  }
  tally.add(s, stored, out);
  return out;
}

// Every parameter's slice to `read`, once every check that needs no values has passed
// for all of them (a wrong shape is told before minutes of reading), with progress.
template <class Read>
void for_each_parameter(const Checkpoint& ck, const ModelConfig& cfg, const LoadOptions& opt, Read&& read) {
  const std::map<std::string, Slice> slices = locate_weights(ck, cfg);
  uint64_t total = 0, done = 0;
  for (const auto& [name, s] : slices) total += s.stored_bytes();
  for (const auto& [name, s] : slices) {
    read(name, s);
    done += s.stored_bytes();
    if (opt.progress) opt.progress({"reading", done, total});
  }
}

}  // namespace

Weights load_weights(const std::string& path, const ModelConfig& cfg, const LoadOptions& opt, LoadNotes* notes) {
  const Checkpoint ck = Checkpoint::open(path);
  RoundingTally tally;
  Weights w;
  for_each_parameter(ck, cfg, opt, [&](const std::string& name, const Slice& s) {
    w.insert(name, Tensor{s.shape, read_checked_bf16(s, opt, tally)});
  });
  if (notes) *notes = LoadNotes{ck.digests(opt.progress), tally.text()};
  return w;
}

std::map<std::string, Fp32Tensor> load_weights_fp32(const std::string& path, const ModelConfig& cfg,
                                                    const LoadOptions& opt, LoadNotes* notes) {
  const Checkpoint ck = Checkpoint::open(path);
  std::map<std::string, Fp32Tensor> w;
  for_each_parameter(ck, cfg, opt, [&](const std::string& name, const Slice& s) {
    std::vector<float> v = s.entry->file->read_f32(*s.entry->info, s.first, s.count());
    const uint64_t i = first_nonfinite(v.size(), [&](uint64_t k) { return v[k]; });
    if (i < v.size() && !opt.allow_nonfinite) refuse_nonfinite(s, i, value_text(v[i]));
    w.emplace(name, Fp32Tensor{s.shape, std::move(v)});
  });
  if (notes) *notes = LoadNotes{ck.digests(opt.progress), ""};  // widened exactly: nothing to say
  return w;
}

// --- save_weights --------------------------------------------------------------

void save_weights(const std::string& dir, const Weights& w, const ModelConfig& cfg, const SaveOptions& opt) {
  if (opt.num_shards < 1) throw std::invalid_argument("save_weights: num_shards must be >= 1");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(dir + ": cannot create directory: " + ec.message());

  struct Item {
    std::string name;
    std::vector<uint64_t> shape;
    std::vector<bf16> owned;         // for fused tensors
    const std::vector<bf16>* data;   // the bytes to write
  };
  std::vector<Item> items;
  auto add = [&](const std::string& name, const Tensor& t) {
    items.push_back(Item{name, std::vector<uint64_t>(t.shape.begin(), t.shape.end()), {}, &t.data});
  };
  for (const WeightSpec& s : weight_specs(cfg)) {
    const Tensor& t = w.at(s.name);
    if (t.shape != s.shape || static_cast<int64_t>(t.data.size()) != s.numel())
      throw std::invalid_argument("save_weights: " + s.name + " has shape " + shape_str(t.shape) + ", expected " +
                                  shape_str(s.shape));
    if (opt.fused_experts && s.expert >= 0) {
      // Emit the fused pair once per layer, at expert 0's first parameter.
      if (s.expert != 0 || s.param != graph::Param::ExpertGate) continue;
      const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, H = cfg.hidden_size, i = s.layer;
      Item gu{graph::fused_experts_name(i, graph::FusedExperts::GateUp),
              {uint64_t(E), uint64_t(2 * I), uint64_t(H)}, {}, nullptr};
      Item dn{graph::fused_experts_name(i, graph::FusedExperts::Down), {uint64_t(E), uint64_t(H), uint64_t(I)}, {}, nullptr};
      for (int64_t e = 0; e < E; ++e) {
        const auto& g = w.at(graph::param_name(i, e, graph::Param::ExpertGate)).data;
        const auto& u = w.at(graph::param_name(i, e, graph::Param::ExpertUp)).data;
        const auto& d = w.at(graph::param_name(i, e, graph::Param::ExpertDown)).data;
        gu.owned.insert(gu.owned.end(), g.begin(), g.end());
        gu.owned.insert(gu.owned.end(), u.begin(), u.end());
        dn.owned.insert(dn.owned.end(), d.begin(), d.end());
      }
      items.push_back(std::move(gu));
      items.push_back(std::move(dn));
      continue;
    }
    add(s.name, t);
  }
  for (Item& it : items)
    if (it.data == nullptr) it.data = &it.owned;

  auto write_tensors = [&](const std::string& file, size_t lo, size_t hi) {
    std::vector<WriteTensor> ts;
    for (size_t k = lo; k < hi; ++k)
      ts.push_back(WriteTensor{items[k].name, DType::BF16, items[k].shape,
                               {reinterpret_cast<const uint8_t*>(items[k].data->data()), items[k].data->size() * 2}});
    write_safetensors((fs::path(dir) / file).string(), std::move(ts), opt.metadata);
  };

  if (opt.num_shards == 1) {
    write_tensors(kSingleName, 0, items.size());
    return;
  }
  // Contiguous runs of roughly equal bytes, in state_dict order.
  uint64_t total = 0;
  for (const Item& it : items) total += it.data->size() * 2;
  const int n = opt.num_shards;
  json wm = json::object();
  size_t lo = 0;
  uint64_t acc = 0;
  for (int s = 0; s < n; ++s) {
    size_t hi = lo;
    const uint64_t target = total * static_cast<uint64_t>(s + 1) / static_cast<uint64_t>(n);
    while (hi < items.size() && (acc < target || s == n - 1)) {
      acc += items[hi].data->size() * 2;
      ++hi;
    }
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n);
    write_tensors(name, lo, hi);
    for (size_t k = lo; k < hi; ++k) wm[items[k].name] = name;
    lo = hi;
  }
  json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
  write_file_atomic((fs::path(dir) / kIndexName).string(), idx.dump(2) + "\n");
}

}  // namespace bp::io
