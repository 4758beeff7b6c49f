// `bitparity diff` end to end: files written by the safetensors writer, the REAL
// binary run through the shell, exit codes 0/1/2 checked, reports validated
// against the schema, and an earlier report left untouched by a bad-input run.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "harness/io/safetensors.h"
#include "support/cli_run.h"
#include "support/json_schema.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class CliDiff : public test::CliTest {
 protected:
  // Writes a dump: F32 "logprobs" [4], BF16 "w" [2,2], F32 "bias" [3], with hooks to vary.
  std::string dump(const std::string& leaf, std::vector<float> lp = {-1.0f, -2.5f, -0.125f, -7.0f},
                   std::vector<uint16_t> w = {0x3f80, 0x0000, 0x8000, 0x7fc0}, const std::string& bias_name = "bias",
                   bool with_bias = true) {
    static const std::vector<float> bias = {0.5f, 1e-40f, -3.0f};
    std::vector<io::WriteTensor> t;
    t.push_back({"logprobs", io::DType::F32, {4}, {reinterpret_cast<const uint8_t*>(lp.data()), 16}});
    t.push_back({"w", io::DType::BF16, {2, 2}, {reinterpret_cast<const uint8_t*>(w.data()), 8}});
    if (with_bias) t.push_back({bias_name, io::DType::F32, {3}, {reinterpret_cast<const uint8_t*>(bias.data()), 12}});
    const std::string p = path(leaf);
    io::write_safetensors(p, std::move(t));
    return p;
  }
};

TEST_F(CliDiff, IdenticalDumpsExitZeroAndReportsValidate) {
  const std::string a = dump("a.safetensors"), b = dump("b.safetensors");
  ASSERT_EQ(run("diff " + a + " " + b + " --json " + path("r.json") + " --csv " + path("r.csv") + " --junit " +
                path("r.xml")),
            0)
      << out_ << err_;
  EXPECT_NE(out_.find("all identical"), std::string::npos) << out_;
  const json j = test::valid_report(read(path("r.json")));
  EXPECT_EQ(j["verdict"], "exact");
  EXPECT_EQ(j["cases"][0]["tensors"].size(), 3u);
  EXPECT_EQ(j["cases"][0]["tensors"][0]["name"], "bias");  // file order of A (the writer sorts by name)
  EXPECT_TRUE(j["cases"][0]["tensors"][1]["metrics"].contains("train_rollout_logprob_abs_diff"));
  EXPECT_EQ(read(path("r.csv")).rfind("case_id,case_verdict,", 0), 0u);
  // diff runs no model: no time, no device.
  EXPECT_EQ(j["cases"][0]["seconds"], 0);
  EXPECT_EQ(j["cases"][0]["peak_device_bytes"], nullptr);
  EXPECT_NE(read(path("r.xml")).find("<testcase classname=\"bitparity.diff\" name=\"diff\" time=\"0.000000\"/>"),
            std::string::npos);
  EXPECT_EQ(run("diff -q " + a + " " + b), 0);
  EXPECT_EQ(out_, "");
}

TEST_F(CliDiff, OneDifferingElementExitsOneAndNamesIt) {
  const std::string a = dump("a.safetensors");
  const std::string b = dump("b.safetensors", {-1.0f, -2.5f, -0.125f, -7.0f}, {0x3f80, 0x0000, 0x0000, 0x7fc1});
  ASSERT_EQ(run("diff " + a + " " + b + " --json " + path("r.json") + " --junit " + path("r.xml")), 1) << out_ << err_;
  EXPECT_NE(out_.find("first differing tensor (file order of A): w, element 2: A 0x8000"), std::string::npos) << out_;
  EXPECT_NE(out_.find("MISMATCH"), std::string::npos);
  const json j = json::parse(read(path("r.json")));
  EXPECT_TRUE(test::schema_errors(test::report_schema(), j).empty());
  const json& w = j["cases"][0]["tensors"][2];
  EXPECT_EQ(w["name"], "w");
  EXPECT_EQ(w["metrics"]["mismatches"], 1);  // -0 vs +0; the NaNs are equal
  EXPECT_EQ(w["metrics"]["max_ulp_diff"], 1);
  EXPECT_EQ(w["metrics"]["first_mismatch"], 2);
  EXPECT_NE(read(path("r.xml")).find("<failure type=\"mismatch\" message=\"tensor &apos;w&apos;"), std::string::npos);
}

TEST_F(CliDiff, MissingTensorsAndRenames) {
  const std::string a = dump("a.safetensors");
  const std::string b = dump("b.safetensors", {-1.0f, -2.5f, -0.125f, -7.0f}, {0x3f80, 0x0000, 0x8000, 0x7fc0},
                             "model.bias");
  EXPECT_EQ(run("diff " + a + " " + b), 1);
  EXPECT_NE(out_.find("only in A: bias"), std::string::npos) << out_;
  EXPECT_NE(out_.find("only in B: model.bias"), std::string::npos) << out_;
  EXPECT_EQ(run("diff " + a + " " + b + " --map bias=model.bias"), 0) << out_ << err_;
  EXPECT_NE(out_.find("bias -> model.bias"), std::string::npos) << out_;
  const std::string c = dump("c.safetensors", {-1.0f, -2.5f, -0.125f, -7.0f}, {0x3f80, 0x0000, 0x8000, 0x7fc0},
                             "bias", false);
  EXPECT_EQ(run("diff " + c + " " + a), 1);
  EXPECT_NE(out_.find("only in B: bias"), std::string::npos) << out_;
  // Bad maps are bad usage.
  EXPECT_EQ(run("diff " + a + " " + b + " --map bias"), 2);
  EXPECT_EQ(run("diff " + a + " " + b + " --map nothere=model.bias"), 2);
  EXPECT_NE(err_.find("nothere"), std::string::npos) << err_;
  // B's "w" would be matched twice: by --map and by name.
  EXPECT_EQ(run("diff " + a + " " + b + " --map bias=w"), 2);
  EXPECT_NE(err_.find("matched twice"), std::string::npos) << err_;
  EXPECT_EQ(run("diff " + a + " " + b + " --map bias=model.bias --map w=model.bias"), 2);
}

TEST_F(CliDiff, BadInputExitsTwoAndLeavesEarlierReportsUntouched) {
  const std::string a = dump("a.safetensors"), b = dump("b.safetensors");
  const std::string report = path("r.json"), csv = path("r.csv");
  ASSERT_EQ(run("diff " + a + " " + b + " --json " + report + " --csv " + csv), 0);
  const std::string before = read(report), before_csv = read(csv);
  ASSERT_FALSE(before.empty());

  // Truncated file.
  const std::string full = read(b);
  const std::string trunc = path("trunc.safetensors");
  std::ofstream(trunc, std::ios::binary) << full.substr(0, full.size() - 3);
  EXPECT_EQ(run("diff " + a + " " + trunc + " --json " + report + " --csv " + csv), 2);
  EXPECT_NE(err_.find("trunc.safetensors"), std::string::npos) << err_;
  EXPECT_EQ(err_.find('\n'), err_.size() - 1) << "one message line: " << err_;
  // Header that is not JSON.
  const std::string junk = path("junk.safetensors");
  {
    std::ofstream f(junk, std::ios::binary);
    const uint64_t n = 4;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{{{{";
  }
  EXPECT_EQ(run("diff " + junk + " " + b + " --json " + report), 2);
  EXPECT_NE(err_.find("junk.safetensors"), std::string::npos) << err_;
  // Missing file, and a dtype bitparity does not compare.
  EXPECT_EQ(run("diff " + a + " " + path("none.safetensors") + " --json " + report), 2);
  EXPECT_NE(err_.find("none.safetensors"), std::string::npos) << err_;
  const int32_t ints[2] = {1, 2};
  const std::string i1 = path("i1.safetensors"), i2 = path("i2.safetensors");
  io::write_safetensors(i1, {{"ids", io::DType::I32, {2}, {reinterpret_cast<const uint8_t*>(ints), 8}}});
  io::write_safetensors(i2, {{"ids", io::DType::I32, {2}, {reinterpret_cast<const uint8_t*>(ints), 8}}});
  EXPECT_EQ(run("diff " + i1 + " " + i2 + " --json " + report), 2);
  EXPECT_NE(err_.find("ids"), std::string::npos) << err_;
  // Bad usage.
  EXPECT_EQ(run("diff " + a), 2);
  EXPECT_EQ(run("diff " + a + " " + b + " --frobnicate"), 2);
  // An unwritable report path is refused without touching anything else.
  EXPECT_EQ(run("diff " + a + " " + b + " --json " + path("nodir/r.json")), 2);
  EXPECT_NE(err_.find("nodir"), std::string::npos) << err_;
  // ... also when it comes after a good one: no report of the set is written.
  EXPECT_EQ(run("diff " + a + " " + b + " --json " + report + " --csv " + path("nodir/r.csv")), 2);
  EXPECT_EQ(run("diff " + a + " " + b + " --json " + report + " --junit " + dir_.string()), 2);

  EXPECT_EQ(read(report), before);
  EXPECT_EQ(read(csv), before_csv);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST_F(CliDiff, ShapeAndDtypeDifferencesAreMismatches) {
  const std::string a = dump("a.safetensors");
  const float lp3[3] = {1, 2, 3};
  const uint16_t lpb[4] = {0, 0, 0, 0};
  std::vector<uint16_t> w = {0x3f80, 0x0000, 0x8000, 0x7fc0};
  const std::string b = path("b.safetensors");
  io::write_safetensors(b, {{"logprobs", io::DType::F32, {3}, {reinterpret_cast<const uint8_t*>(lp3), 12}},
                            {"w", io::DType::BF16, {2, 2}, {reinterpret_cast<const uint8_t*>(w.data()), 8}}});
  EXPECT_EQ(run("diff " + a + " " + b + " --json " + path("r.json")), 1);
  EXPECT_NE(out_.find("shape-diff"), std::string::npos) << out_;
  const std::string c = path("c.safetensors");
  io::write_safetensors(c, {{"logprobs", io::DType::BF16, {4}, {reinterpret_cast<const uint8_t*>(lpb), 8}}});
  EXPECT_EQ(run("diff " + a + " " + c), 1);
  EXPECT_NE(out_.find("dtype-diff"), std::string::npos) << out_;
  EXPECT_TRUE(test::schema_errors(test::report_schema(), json::parse(read(path("r.json")))).empty());
}

// NaN matching NaN proves nothing: one NaN logprob, or a tensor all NaN/Inf on both
// sides, is the verdict "nonfinite" (a warning and exit 0; exit 1 under --strict),
// never "all identical"; `report` reads it back with the same exit codes. The
// default dump's BF16 "w" holds one NaN among finite values: that stays identical.
TEST_F(CliDiff, NonFiniteMatchesAreAVisibleVerdict) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::string a = dump("a.safetensors", {-1.0f, nan, -0.125f, -7.0f});
  const std::string b = dump("b.safetensors", {-1.0f, nan, -0.125f, -7.0f});
  ASSERT_EQ(run("diff " + a + " " + b + " --json " + path("r.json") + " --junit " + path("r.xml")), 0) << out_ << err_;
  EXPECT_NE(out_.find("identical, but NON-FINITE"), std::string::npos) << out_;
  EXPECT_EQ(out_.find("all identical"), std::string::npos) << out_;
  EXPECT_NE(out_.find("1 nonfinite"), std::string::npos) << out_;
  EXPECT_NE(err_.find("warning: diff: logprobs is NaN/Inf in 1 of 4 elements"), std::string::npos) << err_;
  const json j = test::valid_report(read(path("r.json")));
  EXPECT_EQ(j["verdict"], "nonfinite");
  EXPECT_EQ(j["summary"]["nonfinite"], 1);
  EXPECT_NE(read(path("r.xml")).find("<system-err>WARNING: nonfinite: logprobs"), std::string::npos);
  EXPECT_EQ(run("diff --strict " + a + " " + b), 1) << out_ << err_;
  EXPECT_NE(err_.find("error: diff: logprobs"), std::string::npos) << err_;
  EXPECT_EQ(run("report " + path("r.json")), 0) << out_ << err_;
  EXPECT_NE(out_.find("1 nonfinite"), std::string::npos) << out_;
  EXPECT_EQ(run("report --strict " + path("r.json")), 1) << out_ << err_;

  // A non-logprob tensor all NaN on both sides.
  const std::vector<uint16_t> all_nan_w = {0x7fc0, 0xffc0, 0x7f80, 0x7fc0};
  const std::string c = dump("c.safetensors", {-1.0f, -2.5f, -0.125f, -7.0f}, all_nan_w);
  const std::string d = dump("d.safetensors", {-1.0f, -2.5f, -0.125f, -7.0f}, all_nan_w);
  EXPECT_EQ(run("diff --strict " + c + " " + d), 1) << out_ << err_;
  EXPECT_NE(out_.find("NONFINITE"), std::string::npos) << out_;
  EXPECT_NE(err_.find("w is NaN/Inf in 4 of 4 elements"), std::string::npos) << err_;
}

// Issue 53 item 1: bisect counts a tensor on one side only as a difference, as diff
// does: an engine that drops an op's output, or a truncated dump, never bisects as
// equal. The first difference is the first such tensor in execution order.
TEST_F(CliDiff, BisectCountsATensorOnOneSideAsADifference) {
  const std::vector<uint16_t> v = {0x3f80, 0x4000};
  auto ops_dump = [&](const std::string& leaf, const std::vector<std::string>& names) {
    std::vector<io::WriteTensor> t;
    for (const std::string& n : names) t.push_back({n, io::DType::BF16, {1, 2}, {reinterpret_cast<const uint8_t*>(v.data()), 4}});
    io::write_safetensors(path(leaf), std::move(t));
    return path(leaf);
  };
  const std::vector<std::string> all = {"ops.embed", "ops.layers.0.attn", "ops.layers.0.attn_out", "ops.final_norm"};
  const std::string full = ops_dump("full.safetensors", all);
  // One op dropped (or renamed away): B lacks layers.0.attn_out.
  const std::string dropped = ops_dump("dropped.safetensors", {"ops.embed", "ops.layers.0.attn", "ops.final_norm"});
  ASSERT_EQ(run("bisect " + full + " " + dropped + " --json " + path("r.json")), 1) << out_ << err_;
  EXPECT_NE(out_.find("1 only in A, 0 only in B: differences"), std::string::npos) << out_;
  EXPECT_NE(out_.find("first difference: ops.layers.0.attn_out (layer 0, op attn_out)\n  only in A: B lacks it"),
            std::string::npos)
      << out_;
  const json j = test::valid_report(read(path("r.json")));
  EXPECT_EQ(j["verdict"], "mismatch");
  EXPECT_EQ(j["cases"][0]["first_divergent_op"], "layers.0.attn_out");
  const std::string renamed =
      ops_dump("renamed.safetensors", {"ops.embed", "ops.layers.0.attn", "ops.layers.0.attn_out2", "ops.final_norm"});
  EXPECT_EQ(run("bisect " + renamed + " " + full), 1) << out_ << err_;
  EXPECT_NE(out_.find("first difference at ops.layers.0.attn_out: only in B"), std::string::npos) << out_;
  // An empty dump against a full one, and two dumps with no name in common: exit 1, said.
  const std::string empty = ops_dump("empty.safetensors", {});
  EXPECT_EQ(run("bisect " + empty + " " + full), 1) << out_ << err_;
  EXPECT_NE(out_.find("A and B have no tensor in common (A 0, B 4)"), std::string::npos) << out_;
  EXPECT_NE(out_.find("first difference at ops.embed: only in B"), std::string::npos) << out_;
  const std::string other = ops_dump("other.safetensors", {"x", "y"});
  EXPECT_EQ(run("bisect -q " + full + " " + other), 1) << out_ << err_;
  EXPECT_EQ(out_, "");
  // Nothing on either side is nothing to bisect: bad input, never "no difference".
  EXPECT_EQ(run("bisect " + empty + " " + empty), 2) << out_ << err_;
  EXPECT_NE(err_.find("A and B hold no tensor: nothing to bisect"), std::string::npos) << err_;
  EXPECT_EQ(run("bisect " + full + " " + full), 0) << out_ << err_;
}

// An engine capture whose name map cannot take some ops says so (bitparity.not_captured,
// issue 54: Hugging Face's MoE block computes router_weights in no module of its own):
// the other side's such tensors are left out and said, not a difference; without the
// metadata the same pair is a difference (the negative control).
TEST_F(CliDiff, BisectLeavesOutWhatACaptureSaysItCannotTake) {
  const std::vector<uint16_t> v = {0x3f80, 0x4000};
  auto dump = [&](const std::string& leaf, const std::vector<std::string>& names,
                  const std::map<std::string, std::string>& meta) {
    std::vector<io::WriteTensor> t;
    for (const std::string& n : names) t.push_back({n, io::DType::BF16, {1, 2}, {reinterpret_cast<const uint8_t*>(v.data()), 4}});
    io::write_safetensors(path(leaf), std::move(t), meta);
    return path(leaf);
  };
  const std::string oracle =
      dump("oracle.safetensors", {"ops.embed", "ops.layers.1.router_logits", "ops.layers.1.router_weights", "ops.logits"}, {});
  const std::vector<std::string> captured = {"ops.embed", "ops.layers.1.router_logits", "ops.logits"};
  const std::string engine = dump("engine.safetensors", captured, {{"bitparity.not_captured", R"(["router_weights"])"}});
  EXPECT_EQ(run("bisect " + engine + " " + oracle), 0) << out_ << err_;
  EXPECT_NE(out_.find("not compared: 1 op tensor(s) of one side only: the other side's capture says its name map "
                      "cannot take them"),
            std::string::npos)
      << out_;
  // A flat-token engine computes the logits of its sampled rows only: without them,
  // the logprobs and entropy a capture computes from them are left out too.
  const std::string with_logprobs = dump("oracle-lp.safetensors", {"ops.embed", "ops.logits", "logprobs.0", "entropy.0"}, {});
  EXPECT_EQ(run("bisect " + dump("sampled.safetensors", {"ops.embed"}, {{"bitparity.not_captured", R"(["logits"])"}}) +
                " " + with_logprobs), 0) << out_ << err_;
  EXPECT_NE(out_.find("not compared: 3 op tensor(s) of one side only"), std::string::npos) << out_;
  EXPECT_EQ(run("bisect " + dump("silent.safetensors", captured, {}) + " " + oracle), 1) << out_ << err_;
  EXPECT_EQ(run("bisect " + dump("bad.safetensors", captured, {{"bitparity.not_captured", "router_weights"}}) + " " +
                oracle),
            2);
  EXPECT_NE(err_.find("bitparity.not_captured"), std::string::npos) << err_;
}

TEST_F(CliDiff, HelpListsTheExitCodes) {
  EXPECT_EQ(run("--help"), 0);
  EXPECT_NE(out_.find("125 cannot test here"), std::string::npos) << out_;
  EXPECT_EQ(run("diff --help"), 0);
  EXPECT_NE(out_.find("--map"), std::string::npos) << out_;
}

}  // namespace
}  // namespace bp
