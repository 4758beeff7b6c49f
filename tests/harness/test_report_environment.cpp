// Reports say where they were made (issue 52): a GPU run's JSON, CSV, JUnit and HTML
// name its GPU, driver and CUDA runtime (and, on real ranks, NCCL and every rank's
// GPU); a CPU run leaves them null. The Gpu* suites run the real binary on a GPU
// (CTest labels gpu, multigpu); where the sweep cannot test (exit 125) they skip,
// and main() exits 125 so that CTest reports them skipped, never passed.
#include <gtest/gtest.h>

#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/exit_codes.h"
#include "harness/io/errors.h"
#include "harness/report/html.h"
#include "harness/report/read.h"
#include "harness/report/report.h"
#include "support/cli_run.h"
#include "support/json_schema.h"
#include "support/sample_report.h"

namespace bp {
namespace {

using harness::Environment;
using harness::GpuIdentity;
using harness::Report;

const GpuIdentity kH200{"NVIDIA H200", "570.133.20 (CUDA 12.8)", "13.0"};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// --- the fields from the GPUs of a run ----------------------------------------

TEST(ReportEnvironment, OneGpuOrEveryRanks) {
  Environment none;
  harness::set_gpu_environment(none, {});
  EXPECT_FALSE(none.gpu_name || none.gpu_driver || none.cuda_version || none.nccl_version);

  Environment one;
  harness::set_gpu_environment(one, {kH200});
  EXPECT_EQ(one.gpu_name, "NVIDIA H200");
  EXPECT_EQ(one.gpu_driver, "570.133.20 (CUDA 12.8)");
  EXPECT_EQ(one.cuda_version, "13.0");
  EXPECT_FALSE(one.nccl_version);  // the caller's, for real ranks

  Environment same;
  harness::set_gpu_environment(same, {kH200, kH200});
  EXPECT_EQ(same.gpu_name, "NVIDIA H200 x2");
  EXPECT_EQ(same.gpu_driver, "570.133.20 (CUDA 12.8)");
  EXPECT_EQ(same.cuda_version, "13.0");

  // Ranks on different hosts: each field the ranks disagree on is each rank's.
  GpuIdentity other = kH200;
  other.driver = "575.51.03 (CUDA 12.9)";
  Environment mixed;
  harness::set_gpu_environment(mixed, {kH200, other, kH200});
  EXPECT_EQ(mixed.gpu_name, "NVIDIA H200 x3");
  EXPECT_EQ(mixed.gpu_driver,
            "rank 0: 570.133.20 (CUDA 12.8); rank 1: 575.51.03 (CUDA 12.9); rank 2: 570.133.20 (CUDA 12.8)");
  EXPECT_EQ(mixed.cuda_version, "13.0");
  other.name = "unknown (cudaGetDeviceProperties: no CUDA-capable device is detected)";
  harness::set_gpu_environment(mixed, {kH200, other});
  EXPECT_EQ(mixed.gpu_name, "rank 0: NVIDIA H200; rank 1: " + other.name);
}

// --- every format --------------------------------------------------------------

class ReportFiles : public test::CliTest {};

// A sample report with the GPU fields set as a run on two ranks sets them.
Report gpu_report() {
  Report r = test::sample_sweep_report();
  harness::set_gpu_environment(r.environment, {kH200, kH200});
  r.environment.nccl_version = "2.28.3";
  return r;
}

TEST_F(ReportFiles, EveryFormatCarriesTheGpu) {
  const Report r = gpu_report();
  const nlohmann::json j = test::valid_report(harness::render_json(r));
  EXPECT_EQ(j["environment"]["gpu_name"], "NVIDIA H200 x2");
  EXPECT_EQ(j["environment"]["gpu_driver"], "570.133.20 (CUDA 12.8)");
  EXPECT_EQ(j["environment"]["cuda_version"], "13.0");
  EXPECT_EQ(j["environment"]["nccl_version"], "2.28.3");
  // CSV: the last columns of every row (the header's line aside), after run_status and the
  // (empty) truth errors, and read back.
  harness::write_csv(r, path("r.csv"));
  const std::string csv = read(path("r.csv"));
  EXPECT_EQ(count(csv, ",complete,,,,,NVIDIA H200 x2,570.133.20 (CUDA 12.8),13.0,2.28.3\r\n"), count(csv, "\r\n") - 1)
      << csv;
  const Report back = harness::read_report_csv(path("r.csv"));
  for (const harness::GpuField& g : harness::kGpuFields)
    EXPECT_EQ(back.environment.*g.field, r.environment.*g.field) << g.key;
  const std::string x = harness::render_junit(r);
  EXPECT_NE(x.find("<property name=\"gpu_name\" value=\"NVIDIA H200 x2\"/>"), std::string::npos) << x;
  EXPECT_NE(x.find("<property name=\"gpu_driver\" value=\"570.133.20 (CUDA 12.8)\"/>"), std::string::npos);
  EXPECT_NE(x.find("<property name=\"cuda_version\" value=\"13.0\"/>"), std::string::npos);
  EXPECT_NE(x.find("<property name=\"nccl_version\" value=\"2.28.3\"/>"), std::string::npos);
  const std::string h = harness::render_html(r, "r.json", nullptr);
  EXPECT_NE(h.find("<tr><th>GPU</th><td>NVIDIA H200 x2</td></tr>"), std::string::npos);
  EXPECT_NE(h.find("<tr><th>GPU driver</th><td>570.133.20 (CUDA 12.8)</td></tr>"), std::string::npos);
  EXPECT_NE(h.find("<tr><th>CUDA runtime</th><td>13.0</td></tr>"), std::string::npos);
  EXPECT_NE(h.find("<tr><th>NCCL</th><td>2.28.3</td></tr>"), std::string::npos);
}

// A CSV written before the GPU columns (and the truth errors' after them) reads back as
// made without a GPU; rows that disagree on one are refused.
TEST_F(ReportFiles, CsvGpuColumnsOptionalAndTheSameOnEveryRow) {
  // The sample's truth and GPU columns are empty: every row ends in ",,,,,,,,".
  std::string old = harness::render_csv(test::sample_sweep_report());
  const std::string header_tail = ",truth_max_ulp_a,truth_mean_ulp_a,truth_max_ulp_b,truth_mean_ulp_b,gpu_name,"
                                  "gpu_driver,cuda_version,nccl_version\r\n";
  old.replace(old.find(header_tail), header_tail.size(), "\r\n");
  for (size_t at = old.find(",,,,,,,,\r\n"); at != std::string::npos; at = old.find(",,,,,,,,\r\n", at)) old.erase(at, 8);
  ASSERT_NE(old.find(",run_status\r\n"), std::string::npos) << old.substr(0, 400);
  ASSERT_EQ(count(old, ",complete\r\n"), count(old, "\r\n") - 1) << old;
  write("old.csv", old);
  const Report back = harness::read_report_csv(path("old.csv"));
  EXPECT_EQ(back.cases.size(), test::sample_sweep_report().cases.size());
  EXPECT_FALSE(back.environment.gpu_name || back.environment.gpu_driver || back.environment.cuda_version ||
               back.environment.nccl_version);

  std::string split = harness::render_csv(gpu_report());
  const size_t second_row = split.find("\r\n", split.find("\r\n") + 2) + 2;
  split.replace(split.find("NVIDIA H200 x2", second_row), 14, "NVIDIA H100 x2");
  write("split.csv", split);
  try {
    harness::read_report_csv(path("split.csv"));
    ADD_FAILURE() << "read";
  } catch (const io::BadInput& e) {
    EXPECT_EQ(std::string(e.what()), path("split.csv") + ": line 3, column gpu_name: differs from the first row's");
  }
}

// --- the binary ------------------------------------------------------------------

// The smallest sweep: one model, contract, layout and path, every report format.
class SweepReports : public test::CliTest {
 protected:
  int sweep(const std::string& implementation, const std::string& layout) {
    return run("sweep --implementation " + implementation + " --model qwen3-dense-tiny --contract bf16-sm90tc-v2 "
               "--layout " + layout + " --path extend --quiet --json '" + path("r.json") + "' --csv '" +
               path("r.csv") + "' --junit '" + path("r.xml") + "' --html '" + path("r.html") + "'");
  }
  // Each format's value of the GPU field `key` (JSON key, CSV column, JUnit property;
  // the HTML row `label`): nullopt where the format says there is none.
  std::vector<std::pair<std::string, std::optional<std::string>>> values(const char* key, const char* label) {
    std::vector<std::pair<std::string, std::optional<std::string>>> v;
    const nlohmann::json j = test::valid_report(read(path("r.json")));
    const nlohmann::json& e = j["environment"][key];
    v.emplace_back("JSON", e.is_null() ? std::nullopt : std::optional(e.get<std::string>()));
    const Report csv = harness::read_report_csv(path("r.csv"));  // every row agrees (read.h)
    v.emplace_back("CSV", csv.environment.*field(key));
    v.emplace_back("JUnit", between(read(path("r.xml")), "<property name=\"" + std::string(key) + "\" value=\"", "\""));
    const auto row = between(read(path("r.html")), "<tr><th>" + std::string(label) + "</th><td>", "</td></tr>");
    EXPECT_TRUE(row) << "the HTML has no row " << label;
    v.emplace_back("HTML", row == "<i>n/a</i>" ? std::nullopt : row);
    return v;
  }
  // The text between the first `open` in `s` and the next `close`; nullopt without `open`.
  static std::optional<std::string> between(const std::string& s, const std::string& open, const std::string& close) {
    const size_t at = s.find(open);
    if (at == std::string::npos) return std::nullopt;
    const size_t begin = at + open.size();
    return s.substr(begin, s.find(close, begin) - begin);
  }
  static std::optional<std::string> Environment::*field(const char* key) {
    for (const harness::GpuField& g : harness::kGpuFields)
      if (std::string(key) == g.key) return g.field;
    return nullptr;
  }
  // A GPU run: every format gives `key` a real value (not null, empty, n/a or a failed query).
  void expect_named(const char* key, const char* label) {
    for (const auto& [format, v] : values(key, label)) {
      ASSERT_TRUE(v) << format << " has no " << key;
      EXPECT_FALSE(v->empty() || *v == "n/a" || *v == "null" || v->rfind("unknown", 0) == 0)
          << format << " " << key << ": \"" << *v << "\"";
    }
  }
  void expect_null(const char* key, const char* label) {
    for (const auto& [format, v] : values(key, label)) EXPECT_FALSE(v) << format << " " << key << ": " << *v;
  }
};

TEST_F(SweepReports, ReferenceLeavesTheGpuNull) {
  ASSERT_EQ(sweep("reference", "tp1-ep1-cp1"), 0) << err_;
  expect_null("gpu_name", "GPU");
  expect_null("gpu_driver", "GPU driver");
  expect_null("cuda_version", "CUDA runtime");
  expect_null("nccl_version", "NCCL");
}

// Issue 53 item 4: the report's git_commit is the build's own source tree, never the
// repository a caller's environment names: a git hook (pre-push running the oracle)
// sets GIT_DIR and GIT_WORK_TREE, which git reads before -C.
TEST_F(SweepReports, GitCommitIsTheBuildsNotTheCallersRepository) {
  const std::string src = std::getenv("BP_SOURCE_DIR");
  // A source tree outside git (a copied tree) has no commit: the report says "unknown".
  const std::string own = shell("git -C '" + src + "' rev-parse HEAD") == 0 ? out_.substr(0, 40) : "unknown";
  const std::string other = path("other");
  ASSERT_EQ(shell("git init -q '" + other + "' && cd '" + other + "' && git -c user.name=t -c user.email=t@t "
                  "commit -q --allow-empty -m other && git rev-parse HEAD"),
            0)
      << err_;
  const std::string foreign = out_.substr(0, 40);
  ASSERT_NE(own, foreign);
  ASSERT_EQ(shell("GIT_DIR='" + other + "/.git' GIT_WORK_TREE='" + other + "' GIT_INDEX_FILE='" + other +
                  "/.git/index' '" + BP_BITPARITY_EXE + "' sweep --implementation reference --model qwen3-dense-tiny "
                  "--contract bf16-fmaseq-v1 --path extend --lengths 5 --no-grads --quiet --json '" + path("r.json") +
                  "'"),
            0)
      << err_;
  EXPECT_EQ(test::valid_report(read(path("r.json")))["environment"]["git_commit"], own);
}

// A GPU run's reports: its GPU, driver and CUDA runtime named in every format; the
// JSON environment block, for the checks of each kind.
class GpuSweepReports : public SweepReports {
 protected:
  nlohmann::json gpu_environment() {
    expect_named("gpu_name", "GPU");
    expect_named("gpu_driver", "GPU driver");
    expect_named("cuda_version", "CUDA runtime");
    return nlohmann::json::parse(read(path("r.json")))["environment"];
  }
  // After exit 125 (cannot test here): the reason the case gave in its JSON report, where
  // it is a GPU, CUDA or NCCL this machine or build lacks; empty (no skip) for any other.
  std::string missing_hardware() {
    const nlohmann::json j = nlohmann::json::parse(read(path("r.json")));
    const nlohmann::json& why = j["cases"].at(0)["skip_reason"];
    if (!why.is_string()) return {};
    const std::string reason = why.get<std::string>();
    for (const char* lacking : {"no CUDA", "not a Hopper GPU", "no NCCL", " GPUs; this run has "})
      if (reason.find(lacking) != std::string::npos) return reason;
    return {};
  }
};

TEST_F(GpuSweepReports, CudaNamesItsGpu) {
  const int rc = sweep("cuda", "tp1-ep1-cp1");
  if (rc == kExitCannotTest)
    if (const std::string why = missing_hardware(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(rc, 0) << err_;
  expect_null("nccl_version", "NCCL");
  const nlohmann::json e = gpu_environment();
  if (HasFailure()) return;  // the fields are strings below
  EXPECT_TRUE(std::regex_match(e["gpu_driver"].get<std::string>(), std::regex(R"([0-9.]+ \(CUDA \d+\.\d+\))")))
      << e["gpu_driver"];
  EXPECT_TRUE(std::regex_match(e["cuda_version"].get<std::string>(), std::regex(R"(\d+\.\d+)"))) << e["cuda_version"];
}

// Two real ranks: NCCL's version, and both ranks' GPUs (one name xN where they agree).
TEST_F(GpuSweepReports, NcclNamesEveryRanksGpu) {
  const int rc = sweep("nccl", "tp2-ep1-cp1");
  if (rc == kExitCannotTest)
    if (const std::string why = missing_hardware(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(rc, 0) << err_;
  expect_named("nccl_version", "NCCL");
  const nlohmann::json e = gpu_environment();
  if (HasFailure()) return;  // the fields are strings below
  EXPECT_TRUE(std::regex_match(e["gpu_name"].get<std::string>(), std::regex(R"(.+ x2|rank 0: .+; rank 1: .+)")))
      << e["gpu_name"];
  EXPECT_TRUE(std::regex_match(e["nccl_version"].get<std::string>(), std::regex(R"(\d+\.\d+\.\d+)")))
      << e["nccl_version"];
}

}  // namespace
}  // namespace bp

// Skipped tests (the GPU sweep could not run here) and no failures: 125, which CTest
// reports as skipped (SKIP_RETURN_CODE), never as passed.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  return rc == 0 && u.skipped_test_count() > 0 ? bp::kExitCannotTest : rc;
}
