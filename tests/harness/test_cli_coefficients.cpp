// Explicit loss coefficients end to end (SPEC.md §6.4, docs/cli.md "Tokens files"): the
// REAL binary on the dense fixture. A tokens file that carries exactly the
// generated coefficients gives dumps whose gradients equal the generated run's bit
// for bit (reference, emulated layout, float64 truth); one value changed changes
// them (negative control); every dump and sweep report names the coefficients;
// shape errors, non-finite values and a seed beside explicit values exit 2 naming
// the file and the field.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/io/safetensors.h"
#include "reference/common/sha256.h"
#include "reference/model/loss.h"
#include "support/cli_run.h"

namespace bp {
namespace {

using nlohmann::json;

// Two sequences of 5 and 9 tokens (4 and 8 targets).
const std::vector<std::vector<int>> kSeqs = {{3, 17, 250, 9, 41}, {7, 7, 300, 12, 5, 88, 130, 2, 61}};
constexpr uint64_t kSeed = 7;  // the plan's default coef_seed

// {"sequences": ..., "coefficients": c} with each c written to 9 significant digits
// (enough for a float32 to read back to its own bits).
std::string tokens_json(const std::vector<std::vector<float>>& c) {
  std::string s = json{{"sequences", kSeqs}}.dump();
  s.pop_back();
  s += ", \"coefficients\": [";
  for (size_t i = 0; i < c.size(); ++i) {
    s += i ? ", [" : "[";
    for (size_t t = 0; t < c[i].size(); ++t) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.9g", t ? ", " : "", static_cast<double>(c[i][t]));
      s += buf;
    }
    s += "]";
  }
  return s + "]}";
}

std::vector<std::vector<float>> generated() {
  std::vector<std::vector<int32_t>> seqs;
  for (const auto& s : kSeqs) seqs.emplace_back(s.begin(), s.end());
  return ref::LossCoefficients::generated(kSeed).for_batch(seqs);
}

class CliCoefficients : public test::CliTest {
 protected:
  std::string meta(const std::string& dump, const std::string& key) {
    return io::SafetensorsFile::open(dump).metadata().at(key);
  }
};

TEST_F(CliCoefficients, GeneratedValuesGivenExplicitlyGiveTheSameGradients) {
  const std::string plain = write("plain.json", json{{"sequences", kSeqs}}.dump());
  const std::string same = write("same.json", tokens_json(generated()));
  std::vector<std::vector<float>> changed = generated();
  changed[1][3] += 0.5f;
  const std::string other = write("other.json", tokens_json(changed));
  for (const std::string impl : {"--contract bf16-fmaseq-v1 --implementation reference",
                                 "--contract bf16-fmaseq-v1 --implementation emulated --layout tp2-ep1-cp2z",
                                 "--implementation float64"}) {
    const std::string a = path("a.safetensors"), b = path("b.safetensors"), c = path("c.safetensors");
    ASSERT_EQ(run("run " + impl + " --tokens " + plain + " --out " + a), 0) << err_;
    ASSERT_EQ(run("run " + impl + " --tokens " + same + " --out " + b), 0) << err_;
    ASSERT_EQ(run("run " + impl + " --tokens " + other + " --out " + c), 0) << err_;
    EXPECT_EQ(run("diff -q " + a + " " + b), 0) << impl << ": " << out_ << err_;
    EXPECT_EQ(run("diff " + a + " " + c), 1) << impl << ": one coefficient changed";
    EXPECT_NE(out_.find("grads."), std::string::npos) << impl << ": " << out_;
    EXPECT_EQ(meta(a, "bitparity.coefficients"), "seed 7 (reference/model/loss.h loss_coef)");
    EXPECT_EQ(meta(b, "bitparity.coefficients"), "explicit, from " + same + ", sha256 " + sha256_hex(read(same)));
  }
}

TEST_F(CliCoefficients, SweepReportsNameTheCoefficients) {
  const std::string same = write("same.json", tokens_json(generated()));
  const std::string report = path("r.json");
  const std::string small = "sweep --model qwen3-dense-tiny --contract bf16-fmaseq-v1 --path extend ";
  ASSERT_EQ(run(small + "--tp 1,2 --path decode --tokens " + same + " --json " + report), 0)
      << out_ << err_;
  const json j = json::parse(read(report));
  size_t named = 0;
  for (const json& c : j["cases"]) {
    const json& p = c["parameters"];
    if (p["path"] == "extend") {
      EXPECT_EQ(p["coefficients"], "explicit, from " + same + ", sha256 " + sha256_hex(read(same))) << c["id"];
      ++named;
    } else {
      EXPECT_FALSE(p.contains("coefficients")) << "no backward on " << c["id"];
    }
  }
  EXPECT_EQ(named, 3u);  // reference, emulated tp1 and tp2
  ASSERT_EQ(run(small + "--tp 1 --lengths 5,9 --coef-seed 3 --json " + report), 0)
      << err_;
  EXPECT_EQ(json::parse(read(report))["cases"][0]["parameters"]["coefficients"],
            "seed 3 (reference/model/loss.h loss_coef)");
}

TEST_F(CliCoefficients, BadCoefficientsExitTwoNamingFileAndField) {
  struct Bad {
    std::string coefficients, field, says;
  };
  const std::vector<Bad> bad = {
      {"[[1, 2, 3, 4]]", "coefficients", "has 1 lists; \"sequences\" has 2 sequences"},
      {"[[1, 2, 3, 4], [1, 2, 3, 4]]", "coefficients[1]",
       "has 4 values; sequences[1] has 9 tokens, so 8 targets (one coefficient per token after the first)"},
      {"[[1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 0, 0, 0]]", "coefficients[0]", "has 5 values; sequences[0] has 5 tokens"},
      {"[[1, 2, \"x\", 4], [0, 0, 0, 0, 0, 0, 0, 0]]", "coefficients[0][2]", "must be a number"},
      {"[[1, 2, 3, 4], [0, 0, 0, 0, 0, 0, 0, 1e39]]", "coefficients[1][7]", "1e+39 is not a finite float32"},
      {"{\"a\": 1}", "coefficients", "must be a list of lists"},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string text =
        "{\"sequences\": " + json(kSeqs).dump() + ", \"coefficients\": " + bad[i].coefficients + "}";
    const std::string f = write("t" + std::to_string(i) + ".json", text);
    EXPECT_EQ(run("run --tokens " + f + " --out " + path("x.safetensors")), 2) << bad[i].coefficients << err_;
    EXPECT_NE(err_.find(f + ": " + bad[i].field + ": " + bad[i].says), std::string::npos) << err_;
  }
  // A seed beside explicit values would silently not be used.
  const std::string same = write("same.json", tokens_json(generated()));
  EXPECT_EQ(run("run --tokens " + same + " --coef-seed 3 --out " + path("x.safetensors")), 2);
  EXPECT_NE(err_.find("command line: --coef-seed: the tokens file " + same + " gives the loss coefficients"),
            std::string::npos)
      << err_;
  const std::string plan = write("plan.json", "{\"tokens\": {\"file\": \"same.json\"}, \"coef_seed\": 3}");
  EXPECT_EQ(run("sweep --plan " + plan), 2);
  EXPECT_NE(err_.find(plan + ": coef_seed: the tokens file"), std::string::npos) << err_;
}

}  // namespace
}  // namespace bp
