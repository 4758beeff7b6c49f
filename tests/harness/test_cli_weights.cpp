// The weights the user meant (issue #18), end to end through the REAL binary: a
// folder holding weight files bitparity cannot take as its checkpoint is refused,
// never replaced by generated weights; every run says where its weights came from
// (the seed, or the files and their SHA-256) on stderr once per model and records it
// in dumps and reports; a NaN or Inf weight is refused naming tensor and element; an
// fp32 checkpoint is rounded to bf16 for the contracts (said once) while the float64
// truth model computes with the checkpoint's own fp32 values. WeightsLoad: the loader
// under both (io::load_weights, io::load_weights_fp32) on fused and per-expert MoE files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/io/checkpoint.h"
#include "harness/io/hf_config.h"
#include "harness/io/safetensors.h"
#include "reference/common/rng.h"
#include "reference/common/sha256.h"
#include "reference/model/weights.h"
#include "reference/truth/qwen3.h"
#include "support/cli_run.h"
#include "support/golden.h"
#include "support/json_schema.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kDenseConfig = "fixtures/models/qwen3-dense-tiny/config.json";
const std::string kQuery = "model.layers.0.self_attn.q_proj.weight";

size_t count_of(const std::string& s, const std::string& sub) {
  size_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + 1)) ++n;
  return n;
}

// Weights as float per tensor, in weight_specs order: what an fp32 checkpoint stores.
using FloatWeights = std::vector<std::pair<WeightSpec, std::vector<float>>>;

// Values that bf16 cannot hold: each generated weight nudged by a few fp32 ulps.
FloatWeights fp32_weights(const ModelConfig& cfg) {
  FloatWeights out;
  for (const WeightSpec& s : weight_specs(cfg)) {
    const Tensor t = generate_tensor(s, 41);
    std::vector<float> v(t.data.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = widen(t.data[i]) * (1.0f + 0x1p-10f * (counter_uniform(9, i) + 1.0f));
    out.emplace_back(s, std::move(v));
  }
  return out;
}

class CliWeights : public test::CliTest {
 protected:
  // A model directory `leaf` holding the dense fixture's config.json; returns its path.
  std::string model_dir(const std::string& leaf) {
    fs::create_directories(path(leaf));
    fs::copy_file(test::source_path(kDenseConfig), path(leaf + "/config.json"));
    return path(leaf);
  }
  static ModelConfig dense_config() { return io::load_hf_config(test::source_path(kDenseConfig)); }

  // Writes `w` as model.safetensors in `dir`, as F32, or rounded to BF16.
  static void write_checkpoint(const std::string& dir, const FloatWeights& w, bool as_f32) {
    std::vector<std::vector<bf16>> rounded;
    std::vector<io::WriteTensor> ts;
    for (const auto& [s, v] : w) {
      const std::vector<uint64_t> shape(s.shape.begin(), s.shape.end());
      if (as_f32) {
        ts.push_back({s.name, io::DType::F32, shape, {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4}});
        continue;
      }
      std::vector<bf16>& r = rounded.emplace_back(v.size());
      for (size_t i = 0; i < v.size(); ++i) r[i] = round_bf16(v[i]);
      ts.push_back({s.name, io::DType::BF16, shape, {reinterpret_cast<const uint8_t*>(r.data()), r.size() * 2}});
    }
    io::write_safetensors(dir + "/model.safetensors", std::move(ts));
  }

  static std::map<std::string, std::string> dump_metadata(const std::string& p) {
    return io::SafetensorsFile::open(p).metadata();
  }
  static std::string file_sha256(const std::string& p) { return sha256_hex(read(p)); }
  // The JSON report at `p`, checked against the schema.
  static json valid_report(const std::string& p) { return test::valid_report(read(p)); }
};

TEST_F(CliWeights, FolderWithWeightsButNoCheckpointIsRefused) {
  const std::string keep = write("keep.safetensors", "an earlier dump");
  struct Found {
    std::string file;  // what the folder holds besides config.json
    bool broken_link;
  };
  const std::vector<Found> cases = {{"model-00001-of-00002.safetensors", false},
                                    {"pytorch_model.bin", false},
                                    {"pytorch_model.bin.index.json", false},
                                    {"consolidated.pth", false},
                                    {"model.gguf", false},
                                    {"flax_model.msgpack", false},
                                    {"model.safetensors", true},  // a Hugging Face cache snapshot missing its blob
                                    {"tokenizer.json", true}};
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].file);
    const std::string dir = model_dir("m" + std::to_string(i));
    if (cases[i].broken_link) fs::create_symlink("../../blobs/0123abcd", dir + "/" + cases[i].file);
    else write("m" + std::to_string(i) + "/" + cases[i].file, "weights of some kind");
    for (const std::string& cmd : {"run --out " + keep, std::string("sweep --implementation reference --contract bf16-fmaseq-v1 --path extend --lengths 5")}) {
      EXPECT_EQ(run(cmd + " --model " + dir), 2) << out_ << err_;
      EXPECT_NE(err_.find(dir), std::string::npos) << err_;
      EXPECT_NE(err_.find(cases[i].file), std::string::npos) << err_;
      if (cases[i].broken_link) {
        EXPECT_NE(err_.find("broken link"), std::string::npos) << err_;
      }
      EXPECT_EQ(err_.find("generated weights"), std::string::npos) << err_;
      EXPECT_EQ(err_.find('\n'), err_.size() - 1) << "one message line: " << err_;
    }
  }
  // A sharded snapshot missing one shard's blob: the index names it, the link is broken.
  const ModelConfig cfg = dense_config();
  const std::string snapshot = model_dir("snapshot");
  io::save_weights(snapshot, generate_weights(cfg, 5), cfg, {2, false});
  const std::string shard = snapshot + "/model-00002-of-00002.safetensors";
  fs::remove(shard);
  fs::create_symlink("../../blobs/4567cdef", shard);
  EXPECT_EQ(run("run --model " + snapshot + " --out " + keep), 2) << err_;
  EXPECT_NE(err_.find("shard file model-00002-of-00002.safetensors is a broken link to ../../blobs/4567cdef"),
            std::string::npos)
      << err_;
  EXPECT_EQ(read(keep), "an earlier dump");
  // Nothing but the config (and files that are no weights): generated weights, said so.
  const std::string config_only = model_dir("config_only");
  write("config_only/README.md", "a model card");
  ASSERT_EQ(run("run --out " + path("c.safetensors") + " --weight-seed 5 --model " + config_only), 0) << err_;
  EXPECT_NE(err_.find("generated weights (seed 5)"), std::string::npos) << err_;
}

TEST_F(CliWeights, GeneratedWeightsAreSaidOnceAndRecorded) {
  const std::string a = path("a.safetensors");
  ASSERT_EQ(run("run --lengths 5,9 --out " + a), 0) << err_;
  EXPECT_EQ(count_of(err_, "qwen3-dense-tiny: generated weights (seed 20261122)"), 1u) << err_;
  EXPECT_EQ(dump_metadata(a).at("bitparity.weights"), "generated weights (seed 20261122)");
  ASSERT_EQ(run("run --lengths 5,9 --quiet --out " + a), 0) << err_;
  EXPECT_EQ(err_, "");
  // A sweep of two models and several cases: one line per model.
  ASSERT_EQ(run("sweep --model qwen3-dense-tiny --model qwen3-moe-tiny --contract bf16-fmaseq-v1 --lengths 5,9 "
                "--implementation reference --path extend --path decode --weight-seed 3 --json " + path("r.json")),
            0)
      << out_ << err_;
  EXPECT_EQ(count_of(err_, "generated weights (seed 3)"), 2u) << err_;
  EXPECT_EQ(count_of(err_, "qwen3-moe-tiny: generated weights (seed 3)"), 1u) << err_;
  const json env = valid_report(path("r.json"))["environment"];
  ASSERT_EQ(env["weights"].size(), 2u) << env.dump();
  EXPECT_EQ(env["weights"][0]["model"], "qwen3-dense-tiny");
  EXPECT_EQ(env["weights"][0]["seed"], 3);
  EXPECT_EQ(env["weights"][0]["files"], json::array());
  EXPECT_EQ(run("report " + path("r.json")), 0) << out_ << err_;  // read back, strictly
  // bisect: both sides one model, one line.
  ASSERT_EQ(run("bisect --contract bf16-fmaseq-v1 --lengths 5,9 --no-grads --a path=decode --b path=extend"), 0)
      << out_ << err_;
  EXPECT_EQ(count_of(err_, "generated weights"), 1u) << err_;
}

TEST_F(CliWeights, CheckpointFilesAndTheirDigestsAreRecorded) {
  const ModelConfig cfg = dense_config();
  const std::string dir = model_dir("ck");
  io::save_weights(dir, generate_weights(cfg, 5), cfg, {2, false});
  const std::vector<std::string> files = {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors"};
  const std::string a = path("a.safetensors");
  ASSERT_EQ(run("run --lengths 5,9 --model " + dir + " --out " + a), 0) << err_;
  EXPECT_EQ(count_of(err_, dir + ": weights from 3 files"), 1u) << err_;
  EXPECT_EQ(err_.find("generated"), std::string::npos) << err_;
  const auto meta = dump_metadata(a);
  EXPECT_EQ(meta.count("bitparity.weight_seed"), 0u) << "no seed made these weights";
  for (const std::string& f : files)
    EXPECT_NE(meta.at("bitparity.weights").find(f + " sha256 " + file_sha256(dir + "/" + f)), std::string::npos)
        << meta.at("bitparity.weights");
  ASSERT_EQ(run("sweep --contract bf16-fmaseq-v1 --lengths 5,9 --implementation reference --path extend --model " +
                dir + " --json " + path("r.json") + " --html " + path("r.html")),
            0)
      << out_ << err_;
  EXPECT_NE(read(path("r.html")).find("<tr><th>weights of " + dir + "</th><td>weights from 3 files: " + dir + "/" +
                                      files[0] + " sha256 " + file_sha256(dir + "/" + files[0])),
            std::string::npos);
  const json w = valid_report(path("r.json"))["environment"]["weights"];
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0]["seed"], nullptr);
  ASSERT_EQ(w[0]["files"].size(), 3u) << w.dump();
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(w[0]["files"][i]["path"], dir + "/" + files[i]);
    EXPECT_EQ(w[0]["files"][i]["sha256"], file_sha256(dir + "/" + files[i]));
  }
}

TEST_F(CliWeights, NonFiniteWeightsAreRefusedNamingTensorAndElement) {
  const ModelConfig cfg = dense_config();
  FloatWeights w = fp32_weights(cfg);
  std::vector<float>& q = std::find_if(w.begin(), w.end(), [](const auto& p) { return p.first.name == kQuery; })->second;
  struct Bad {
    float value;
    bool as_f32;
    const char* says;
  };
  for (const Bad& bad : {Bad{NAN, false, "NaN"}, Bad{-INFINITY, false, "-inf"}, Bad{INFINITY, true, "inf"},
                         Bad{3.4e38f, true, "beyond bf16's range"}}) {
    SCOPED_TRACE(bad.says);
    const std::string dir = model_dir(std::string("bad_") + (bad.as_f32 ? "f32_" : "bf16_") + std::to_string(bad.value));
    const float saved = q[77];
    q[77] = bad.value;
    write_checkpoint(dir, w, bad.as_f32);
    q[77] = saved;
    EXPECT_EQ(run("run --lengths 5,9 --model " + dir + " --out " + path("x.safetensors")), 2) << err_;
    EXPECT_NE(err_.find(dir + "/model.safetensors: " + kQuery + ": element 77 "), std::string::npos) << err_;
    EXPECT_NE(err_.find(bad.says), std::string::npos) << err_;
    EXPECT_NE(err_.find("--allow-nonfinite-weights"), std::string::npos) << err_;
    EXPECT_EQ(err_.find('\n'), err_.size() - 1) << "one message line: " << err_;
    // On purpose: loaded, and the outputs are what they are.
    EXPECT_EQ(run("run --lengths 5,9 --allow-nonfinite-weights --model " + dir + " --out " + path("x.safetensors")), 0)
        << err_;
  }
}

// One NaN weight loaded on purpose makes every logprob NaN on both sides of the
// sweep's compare: bit-identical, and never "ALL EXACT" -- the nonfinite verdict,
// a warning and exit 0, exit 1 under --strict (issue #18 item 2, second half).
TEST_F(CliWeights, NanWeightsNeverSweepAsExact) {
  const ModelConfig cfg = dense_config();
  FloatWeights w = fp32_weights(cfg);
  std::find_if(w.begin(), w.end(), [](const auto& p) { return p.first.name == kQuery; })->second[77] = NAN;
  const std::string dir = model_dir("nan_model");
  write_checkpoint(dir, w, false);
  const std::string sweep = "sweep --allow-nonfinite-weights --model " + dir +
                            " --contract bf16-fmaseq-v1 --layout tp1-ep1-cp1 --path extend --lengths 5,9 --no-grads ";
  ASSERT_EQ(run(sweep + "--json " + path("nan.json")), 0) << out_ << err_;
  EXPECT_EQ(out_.find("ALL EXACT"), std::string::npos) << out_;
  EXPECT_NE(out_.find("NON-FINITE"), std::string::npos) << out_;
  EXPECT_NE(err_.find("warning"), std::string::npos) << err_;
  const json j = json::parse(read(path("nan.json")));
  EXPECT_EQ(j["verdict"], "nonfinite");
  EXPECT_EQ(j["summary"]["exact"], 0);
  EXPECT_GT(j["summary"]["nonfinite"], 0);
  EXPECT_EQ(run(sweep + "--strict"), 1) << out_ << err_;
  EXPECT_EQ(run("sweep --model " + dir + " --contract bf16-fmaseq-v1 --lengths 5,9 --no-grads"), 2)
      << "without the flag the NaN weight is refused: " << err_;
}

TEST_F(CliWeights, Fp32CheckpointIsRoundedForContractsAndExactForTheTruth) {
  const ModelConfig cfg = dense_config();
  const FloatWeights w = fp32_weights(cfg);
  const std::string f32 = model_dir("f32"), rounded = model_dir("bf16_copy");
  write_checkpoint(f32, w, true);
  write_checkpoint(rounded, w, false);

  // The contracts compute with the weights rounded to bf16, and say so once per model.
  ASSERT_EQ(run("sweep --contract bf16-fmaseq-v1 --lengths 5,9 --tp 1,2 --path extend --path decode --model " + f32 +
                " --json " + path("r.json")),
            0)
      << out_ << err_;
  EXPECT_EQ(count_of(err_, "rounded fp32 -> bf16"), 1u) << err_;
  const json conversion = valid_report(path("r.json"))["environment"]["weights"][0]["conversion"];
  EXPECT_TRUE(conversion.is_string() && conversion.get<std::string>().find("rounded fp32 -> bf16") != std::string::npos)
      << conversion;
  ASSERT_EQ(run("bisect --contract bf16-fmaseq-v1 --lengths 5,9 --no-grads --model " + f32 +
                " --a path=decode --b path=extend"),
            0)
      << out_ << err_;
  EXPECT_EQ(count_of(err_, "rounded fp32 -> bf16"), 1u) << err_;
  const std::string c32 = path("c32.safetensors"), c16 = path("c16.safetensors");
  ASSERT_EQ(run("run --lengths 5,9 --model " + f32 + " --out " + c32), 0) << err_;
  ASSERT_EQ(run("run --lengths 5,9 --model " + rounded + " --out " + c16), 0) << err_;
  EXPECT_EQ(err_.find("rounded"), std::string::npos) << "a bf16 checkpoint is used as stored: " << err_;
  EXPECT_EQ(run("diff -q " + c32 + " " + c16), 0) << out_ << err_;
  EXPECT_NE(dump_metadata(c32)["bitparity.weights"].find("rounded fp32 -> bf16"), std::string::npos);

  // The float64 truth computes with the fp32 values themselves: exactly truth::Model on them
  // (rounded to F32 in the dump), where the bf16-rounded checkpoint gives other values.
  const std::vector<std::vector<int32_t>> seqs = {{1, 5, 9, 200, 3}, {7, 7, 100, 2, 300, 44, 5, 8, 9}};
  const std::string tokens = write("tokens.json", R"({"sequences": [[1, 5, 9, 200, 3], [7, 7, 100, 2, 300, 44, 5, 8, 9]]})");
  const std::string t32 = path("t32.safetensors"), t16 = path("t16.safetensors");
  ASSERT_EQ(run("run --implementation float64 --tokens " + tokens + " --model " + f32 + " --out " + t32), 0) << err_;
  EXPECT_EQ(err_.find("rounded"), std::string::npos) << err_;
  ASSERT_EQ(run("run --implementation float64 --tokens " + tokens + " --model " + rounded + " --out " + t16), 0) << err_;
  truth::WeightsD wd;
  for (const auto& [s, v] : w) {
    const int rows = s.shape.size() == 1 ? 1 : static_cast<int>(s.shape[0]);
    truth::MatD m(rows, static_cast<int>(v.size()) / rows);
    for (size_t i = 0; i < v.size(); ++i) m.data()[i] = v[i];
    wd[s.name] = std::move(m);
  }
  const truth::ForwardResult exact = truth::Model(cfg, std::move(wd)).forward(seqs);
  const io::SafetensorsFile from_f32 = io::SafetensorsFile::open(t32), from_bf16 = io::SafetensorsFile::open(t16);
  size_t differ = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const std::string name = "logprobs." + std::to_string(s);
    const std::vector<float> a = from_f32.read_f32(from_f32.at(name)), b = from_bf16.read_f32(from_bf16.at(name));
    ASSERT_EQ(a.size(), exact.logprob[s].size());
    for (size_t t = 0; t < a.size(); ++t) {
      EXPECT_EQ(a[t], static_cast<float>(exact.logprob[s][t])) << name << "[" << t << "]";
      differ += b[t] != a[t];
    }
  }
  EXPECT_GT(differ, 0u) << "the bf16-rounded weights should move some logprob";
}

// The loader itself: the fp32 load is the stored values, per expert also from a fused
// tensor, and a non-finite value is named by its element in the checkpoint's tensor.
TEST(WeightsLoad, Fp32LoadIsTheStoredValuesAndRefusalsNameTheStoredElement) {
  const ModelConfig moe = io::load_hf_config(test::source_path("fixtures/models/qwen3-moe-tiny/config.json"));
  int64_t layer = 0;
  while (!moe.is_moe_layer(layer)) ++layer;
  const std::string where = "model.layers." + std::to_string(layer) + ".mlp.experts.";
  const fs::path dir = fs::temp_directory_path() / ("bp_weights_load_" + std::to_string(::getpid()));
  Weights w = generate_weights(moe, 4);
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused experts" : "per expert");
    fs::remove_all(dir);
    io::save_weights(dir.string(), w, moe, {2, fused});
    const std::map<std::string, io::Fp32Tensor> f32 = io::load_weights_fp32(dir.string(), moe);
    ASSERT_EQ(f32.size(), w.size());
    for (const auto& [name, t] : w.all()) {
      const io::Fp32Tensor& u = f32.at(name);
      ASSERT_EQ(u.shape, t.shape) << name;
      for (size_t i = 0; i < t.data.size(); ++i) ASSERT_EQ(u.data[i], widen(t.data[i])) << name << " " << i;
    }
  }
  // A NaN in expert 2's up_proj, element 5: in the fused gate_up_proj [E][2I][H] it is
  // element (2·2I + I)·H + 5.
  const int64_t I = moe.moe_intermediate_size, H = moe.hidden_size;
  w.at(where + "2.up_proj.weight").data[5] = bf16{0x7fc0};
  fs::remove_all(dir);
  io::save_weights(dir.string(), w, moe, {1, true});
  for (bool fp32 : {false, true}) {
    try {
      if (fp32) (void)io::load_weights_fp32(dir.string(), moe);
      else (void)io::load_weights(dir.string(), moe);
      ADD_FAILURE() << "the NaN was loaded";
    } catch (const io::BadInput& e) {
      EXPECT_EQ(e.field(), where + "gate_up_proj");
      EXPECT_NE(e.message().find("element " + std::to_string((2 * 2 * I + I) * H + 5) + " is NaN"), std::string::npos)
          << e.what();
    }
  }
  const Weights allowed = io::load_weights(dir.string(), moe, {.allow_nonfinite = true, .progress = {}});
  EXPECT_TRUE(std::isnan(widen(allowed.at(where + "2.up_proj.weight").data[5])));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace bp
