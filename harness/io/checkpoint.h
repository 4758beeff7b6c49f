// Hugging Face checkpoints: one model.safetensors, or shards named by
// model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: file}}),
// and loading them as bp::Weights for a ModelConfig.
//
// Strictness (all BadInput naming the file and the tensor or field):
//   index: a JSON object with "weight_map" (object of tensor -> shard file name) and
//     optional "metadata" (object, not checked further); no other keys; shard file
//     names are plain names in the same directory (no '/', '.' or '..'); every
//     referenced shard exists and is a valid safetensors file; every tensor in the
//     map is in the shard the map names ("missing"), and every tensor in a shard is
//     in the map under that shard ("extra"); all offenders are listed.
//   directory: model.safetensors.index.json or model.safetensors, not both.
//   load_weights: every tensor weight_specs(cfg) names is present ("missing", all
//     listed), with the exact shape, in BF16, F32 (-> bf16 by RNE) or F16 (exactly
//     widened, then RNE) -- any other dtype is refused; no tensor is left over
//     ("unexpected", all listed). With tie_word_embeddings a stored lm_head.weight is
//     accepted only if bit-identical to model.embed_tokens.weight. A NaN or Inf value,
//     or an F32/F16 value that rounds to Inf in bf16, is refused naming the tensor and
//     the element (one such weight makes every logprob and gradient NaN), unless
//     LoadOptions::allow_nonfinite. load_weights_fp32: the same checks, the values
//     widened exactly to fp32 instead (what the float64 truth model computes with).
//   MoE experts may be stored per expert (mlp.experts.{e}.{gate,up,down}_proj.weight,
//     as Qwen publishes them and as transformers 5.x's save_pretrained writes by
//     default, save_original_format=True) or fused as transformers 5.x holds them in
//     memory (save_original_format=False): mlp.experts.gate_up_proj [E][2*Im][H] whose
//     rows [0, Im) of expert e are gate_proj and rows [Im, 2*Im) are up_proj
//     (torch.cat([gate, up], dim=1); forward does .chunk(2, dim=-1) -> gate, up), and
//     mlp.experts.down_proj [E][H][Im]. Both layouts in one layer is refused.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/io/errors.h"
#include "harness/io/files.h"
#include "harness/io/safetensors.h"
#include "reference/model/config.h"
#include "reference/model/weights.h"

namespace bp::io {

// How far a load has come, for a progress line: the stored bytes of the parameters
// read so far ("reading", tensor by tensor, after every check that needs no values
// has passed), then of the files hashed for the report ("hashing", file by file).
struct LoadProgress {
  const char* stage;
  uint64_t done_bytes, total_bytes;
};

class Checkpoint {
 public:
  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };

  // `path`: a directory (holding model.safetensors.index.json or model.safetensors),
  // an index .json, or a single .safetensors file.
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }  // the index or the single file
  const Entry* find(const std::string& name) const;
  const std::map<std::string, Entry>& entries() const { return entries_; }
  size_t num_files() const { return files_.size(); }

  // Every file the checkpoint was read from: the index (when there is one), then the
  // safetensors files in name order. `progress` hears each file as it is hashed.
  std::vector<FileDigest> digests(const std::function<void(const LoadProgress&)>& progress = {}) const;

 private:
  std::string path_;
  std::string index_sha256_;  // of the index's text, when opened through one
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> entries_;
};

struct LoadOptions {
  bool allow_nonfinite = false;  // load NaN/Inf weights on purpose (tests of NaN handling)
  // Called on the loading thread as the load goes (tens of GB take minutes); may be empty.
  std::function<void(const LoadProgress&)> progress;
};

// What a load did besides copying: the files it read, and how the stored values
// became the model's ("" when used as stored; e.g. "57 F32 tensors rounded fp32 ->
// bf16 (to nearest even): 1234 of 5678 values changed").
struct LoadNotes {
  std::vector<FileDigest> files;
  std::string conversion;
};

// Loads and checks the weights of `cfg` from `path` (see above); `notes` if given.
Weights load_weights(const std::string& path, const ModelConfig& cfg, const LoadOptions& opt = {},
                     LoadNotes* notes = nullptr);

// A parameter's stored values, widened exactly to fp32.
struct Fp32Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major
};
// The checkpoint's own values under the parameters' names (BF16, F16 and F32 alike,
// nothing rounded to bf16), with load_weights' checks.
std::map<std::string, Fp32Tensor> load_weights_fp32(const std::string& path, const ModelConfig& cfg,
                                                    const LoadOptions& opt = {}, LoadNotes* notes = nullptr);

struct SaveOptions {
  int num_shards = 1;          // 1: model.safetensors; n > 1: model-0000k-of-0000n.safetensors + index
  bool fused_experts = false;  // write MoE experts in transformers 5.x's fused layout
  std::map<std::string, std::string> metadata = {{"format", "pt"}};  // what transformers writes
};

// Writes `w` (every tensor weight_specs(cfg) names) as a Hugging Face checkpoint in
// `dir` (created if needed). Each file is written atomically, the index last.
void save_weights(const std::string& dir, const Weights& w, const ModelConfig& cfg, const SaveOptions& opt = {});

}  // namespace bp::io
