// `bitparity conform` (issue 54): each op of a capture judged alone against the
// contract. The reference's own capture conforms at every op; a capture whose engine
// computed one op otherwise (everything after it computed from that op's output, as
// in a real engine) is found at that op alone, while `diff` against the reference
// sees the whole cascade (the negative control); the same capture judged under
// another contract parts at the ops whose reductions the contracts order otherwise;
// a dump without tokens, an op that is not BF16, rows that are not the tokens', a
// dump of another model than --model and a model that is not there are bad input
// (exit 2) naming the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "harness/engine/cases.h"
#include "harness/engine/single_case.h"
#include "harness/io/safetensors.h"
#include "support/cli_run.h"
#include "support/golden.h"

namespace bp {
namespace {

using harness::NamedTensor;
using io::SafetensorsFile;

class CliConform : public test::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    ASSERT_EQ(run("run --model qwen3-dense-tiny --contract bf16-fmaseq-v2 --lengths 5,3 --capture ops --no-grads "
                  "--out " + path("ref.safetensors") + " -q"), 0) << err_;
  }
  static const std::string kModel;
  int conform(const std::string& dump, const std::string& contract = "bf16-fmaseq-v2") {
    return run("conform " + dump + " --model " + kModel + " --contract " + contract);
  }
  // `tensors` written as a dump with ref.safetensors' metadata, `edit`ed.
  std::string write_dump(const std::string& leaf, const std::vector<NamedTensor>& tensors,
                         std::map<std::string, std::string> meta) {
    std::vector<io::WriteTensor> w;
    for (const NamedTensor& t : tensors) {
      const bool b = t.type == harness::CmpType::BF16;
      w.push_back({t.name, b ? io::DType::BF16 : io::DType::F32, t.shape,
                   {b ? reinterpret_cast<const uint8_t*>(t.bf16_values.data())
                      : reinterpret_cast<const uint8_t*>(t.f32_values.data()),
                    b ? t.bf16_values.size() * 2 : t.f32_values.size() * 4}});
    }
    io::write_safetensors(path(leaf), std::move(w), meta);
    return path(leaf);
  }
};
const std::string CliConform::kModel = "qwen3-dense-tiny";

// The reference's own ops, each recomputed from the capture's substitutes.
std::vector<NamedTensor> reference_run(const std::map<std::string, std::vector<bf16>>& substitute,
                                       const std::string& model = "qwen3-dense-tiny") {
  harness::SweepPlan plan = harness::single_case_defaults();
  plan.models = {model};
  plan.contracts = {"bf16-fmaseq-v2"};
  plan.tokens.lengths = {5, 3};
  plan.grads = false;
  plan.capture_ops = true;
  harness::CaseEngine engine(plan);
  return engine.run_substituted(engine.cases().at(0), substitute);
}

TEST_F(CliConform, TheReferencesCaptureConformsAtEveryOp) {
  EXPECT_EQ(conform(path("ref.safetensors")), 0) << out_ << err_;
  EXPECT_NE(out_.find("58 tensors judged alone against bf16-fmaseq-v2: 58 exact, 0 off the contract"),
            std::string::npos) << out_;
}

TEST_F(CliConform, OneOpComputedOtherwiseIsFoundAlone) {
  const std::string op = "layers.1.q_proj";
  const SafetensorsFile ref = SafetensorsFile::open(path("ref.safetensors"));
  std::vector<bf16> off = ref.read_bf16(ref.at("ops." + op));
  off[7].bits ^= 0x0080;  // one element, twice or half its value
  // The engine: that op computed otherwise, every later op from its output.
  std::vector<NamedTensor> engine = reference_run({{op, off}});
  for (NamedTensor& t : engine)
    if (t.name == "ops." + op) t.bf16_values = off;
  const std::string dump = write_dump("engine.safetensors", engine, ref.metadata());
  EXPECT_EQ(conform(dump), 1) << out_ << err_;
  EXPECT_NE(out_.find("57 exact, 1 off the contract, first layers.1.q_proj"), std::string::npos) << out_;
  EXPECT_NE(out_.find("ops.layers.1.q_proj                1 of 2048 elements differ"), std::string::npos) << out_;
  // Beside it, the distance from the float64 truth on the same inputs: the changed
  // element is far from it, so the engine's op is less accurate than the contract's.
  EXPECT_NE(out_.find("(less accurate)\n"), std::string::npos) << out_;
  EXPECT_NE(out_.find("1 of them less accurate than the contract"), std::string::npos) << out_;
  // The page: the heat map with that op's cell outlined, no other off the contract.
  EXPECT_EQ(run("conform " + dump + " --model " + kModel + " --contract bf16-fmaseq-v2 -q --html " + path("c.html")), 1);
  const std::string page = read(path("c.html"));
  EXPECT_NE(page.find("<td class=\"off first\""), std::string::npos);
  EXPECT_NE(page.find("title=\"ops.layers.1.q_proj: 1 of 2048 differ"), std::string::npos);
  EXPECT_EQ(page.find("<td class=\"off\""), std::string::npos) << "only the one op is off the contract";
  // The negative control: diff against the reference sees the cascade (the q norm
  // and RoPE computed from the changed q), not the op that started it.
  EXPECT_EQ(run("diff " + path("ref.safetensors") + " " + dump), 1);
  EXPECT_NE(out_.find("ops.layers.1.q_norm      BF16  [8, 256]       DIFFER"), std::string::npos) << out_;
  EXPECT_NE(out_.find("ops.layers.1.q_rope      BF16  [8, 256]       DIFFER"), std::string::npos) << out_;
  EXPECT_NE(out_.find("first differing tensor (file order of A): ops.layers.1.q_norm"), std::string::npos) << out_;
}

// --contract float64: each op against its float64 truth on the same inputs, rounded.
// The embedding copies bf16 weights (0 ulp); a residual add's fp32 sum of two bf16
// values is exact (their exponents are never 16 apart here), so its one rounding is
// the truth rounded: 0 elements off. One residual element moved by one ulp is the
// negative control: it alone is off, by more than half an ulp.
TEST_F(CliConform, AgainstFloat64EachOpHasItsDistanceFromTheTruth) {
  EXPECT_EQ(conform(path("ref.safetensors"), "float64"), 1) << out_ << err_;
  EXPECT_NE(out_.find("ops.embed                          from float64: max 0 / mean 0 ulp; 0 of 512 elements"),
            std::string::npos) << out_;
  for (const char* op : {"layers.0.resid_attn", "layers.2.resid_mlp"})
    EXPECT_NE(out_.find("ops." + std::string(op)), std::string::npos) << out_;
  EXPECT_NE(out_.find("ulp; 0 of 512 elements not the truth rounded\nops.layers.0.post_norm"), std::string::npos)
      << "resid_attn is the truth rounded: " << out_;
  EXPECT_NE(out_.find("conform: 58 tensors judged alone against the float64 truth:"), std::string::npos) << out_;

  const std::string op = "layers.0.resid_attn";
  const SafetensorsFile ref = SafetensorsFile::open(path("ref.safetensors"));
  std::vector<NamedTensor> engine = reference_run({});
  for (NamedTensor& t : engine)
    if (t.name == "ops." + op) ++t.bf16_values[5].bits;
  EXPECT_EQ(conform(write_dump("moved.safetensors", engine, ref.metadata()), "float64"), 1) << out_ << err_;
  EXPECT_NE(out_.find("ulp; 1 of 512 elements not the truth rounded\nops.layers.0.post_norm"), std::string::npos)
      << out_;
}

// A run from a tokens file records the file's JSON, not only its path: the dump
// conforms after the file is gone (bitparity.run of a capture's tokens writes them to
// a temporary file). Before, conform failed: "tokens.json: no such file".
TEST_F(CliConform, ADumpOfATokensFileHoldsItsTokens) {
  const std::string tokens = path("tokens.json");
  std::ofstream(tokens) << R"({"sequences": [[5, 9, 2, 7], [3, 8, 1]]})";
  ASSERT_EQ(run("run --model " + kModel + " --contract bf16-fmaseq-v2 --tokens " + tokens +
                " --capture ops --no-grads -q --out " + path("filed.safetensors")), 0) << err_;
  std::filesystem::remove(tokens);
  EXPECT_EQ(conform(path("filed.safetensors")), 0) << out_ << err_;
  EXPECT_EQ(SafetensorsFile::open(path("filed.safetensors")).metadata().at("bitparity.tokens_file"), tokens);
}

TEST_F(CliConform, AnotherContractPartsAtItsReductions) {
  EXPECT_EQ(conform(path("ref.safetensors"), "bf16-sm90tc-v2"), 1) << out_ << err_;
  EXPECT_NE(out_.find("off the contract, first layers."), std::string::npos) << out_;
  EXPECT_EQ(out_.find("ops.layers.0.q_norm "), std::string::npos) << "a norm reduces alike under both: " << out_;
}

// The router judged from the engine's own logits: an expert raised above the others
// in one token's logits is that engine's choice, so its routing weights (still the
// old ones here) are off the contract at that token, and so are the experts' outputs
// (the old experts'); mlp_out, computed from the engine's expert outputs, is not.
// Before the routing followed the substituted logits, the weights read exact.
TEST_F(CliConform, TheRouterIsJudgedFromTheEnginesOwnLogits) {
  const std::string moe = "qwen3-moe-tiny", op = "layers.1.router_logits";
  ASSERT_EQ(run("run --model " + moe + " --contract bf16-fmaseq-v2 --lengths 5,3 --capture ops --no-grads --out " +
                path("moe.safetensors") + " -q"), 0) << err_;
  const SafetensorsFile ref = SafetensorsFile::open(path("moe.safetensors"));
  std::vector<NamedTensor> engine = reference_run({}, moe);
  const int E = 8, row = 2;
  for (NamedTensor& t : engine)
    if (t.name == "ops." + op) {
      bf16* logits = &t.bf16_values[row * E];
      int top = 0, low = 0;
      for (int e = 1; e < E; ++e) {
        if (widen(logits[e]) > widen(logits[top])) top = e;
        if (widen(logits[e]) < widen(logits[low])) low = e;
      }
      logits[low] = round_bf16(widen(logits[top]) + 1.0f);  // the least likely expert now the most
    }
  EXPECT_EQ(run("conform " + write_dump("rerouted.safetensors", engine, ref.metadata()) + " --model " + moe +
                " --contract bf16-fmaseq-v2"), 1) << out_ << err_;
  EXPECT_NE(out_.find("3 off the contract, first layers.1.router_logits"), std::string::npos) << out_;
  EXPECT_NE(out_.find("ops.layers.1.router_weights"), std::string::npos) << out_;
  EXPECT_NE(out_.find("ops.layers.1.expert_out"), std::string::npos) << out_;
  EXPECT_EQ(out_.find("ops.layers.1.mlp_out"), std::string::npos) << out_;
}

TEST_F(CliConform, BadCapturesAreRefusedNamingTheField) {
  const SafetensorsFile ref = SafetensorsFile::open(path("ref.safetensors"));
  std::vector<NamedTensor> ops = reference_run({});
  auto meta = ref.metadata();
  meta.erase("bitparity.tokens");
  EXPECT_EQ(conform(write_dump("untokened.safetensors", ops, meta)), 2);
  EXPECT_NE(err_.find("bitparity.tokens: missing"), std::string::npos) << err_;
  meta = ref.metadata();
  meta["bitparity.tokens"] = "seed 1 lengths 5,4";
  EXPECT_EQ(conform(write_dump("retokened.safetensors", ops, meta)), 2);
  EXPECT_NE(err_.find("(the dump's rows are not the tokens of bitparity.tokens?)"), std::string::npos) << err_;
  EXPECT_EQ(run("conform " + path("ref.safetensors") + " --model qwen3-moe-tiny"), 2);
  EXPECT_NE(err_.find("bitparity.model: the dump ran model \"qwen3-dense-tiny\", not --model qwen3-moe-tiny"),
            std::string::npos) << err_;
  meta = ref.metadata();
  meta.erase("bitparity.model");
  meta["bitparity.config"] = R"({"hidden_size": 64, "num_hidden_layers": 4})";
  EXPECT_EQ(conform(write_dump("other-model.safetensors", ops, meta)), 2);
  EXPECT_NE(err_.find("bitparity.config.num_hidden_layers: the engine's model has 4; --model qwen3-dense-tiny has 3"),
            std::string::npos) << err_;
  // One folder, written two ways, is one model.
  std::filesystem::create_directories(path("m"));
  std::filesystem::copy_file(test::source_path("fixtures/models/qwen3-dense-tiny/config.json"), path("m/config.json"));
  meta = ref.metadata();
  meta["bitparity.model"] = path("m") + "/";
  EXPECT_EQ(run("conform " + write_dump("folder.safetensors", ops, meta) + " --model " + path("m") +
                " --contract bf16-fmaseq-v2"), 0) << out_ << err_;
  EXPECT_EQ(run("conform " + path("ref.safetensors") + " --model ./nope"), 2);
  EXPECT_NE(err_.find("command line: --model"), std::string::npos) << err_;
  std::vector<NamedTensor> wide = ops;
  for (NamedTensor& t : wide)
    if (t.name == "ops.embed") {
      t.type = harness::CmpType::F32;
      for (const bf16 v : t.bf16_values) t.f32_values.push_back(widen(v));
      t.bf16_values.clear();
    }
  EXPECT_EQ(conform(write_dump("wide.safetensors", wide, ref.metadata())), 2);
  EXPECT_NE(err_.find("ops.embed: is F32: the contract's ops are BF16"), std::string::npos) << err_;
}

}  // namespace
}  // namespace bp
