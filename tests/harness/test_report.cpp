// Reports (harness/report/): JSON validated against reports/schema/report.schema.json
// by tests/support/json_schema (itself tested here, with negative controls), CSV
// (RFC 4180, stable columns), JUnit XML, atomic writes, environment block, and the
// human units of times and sizes.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/exit_codes.h"
#include "harness/io/errors.h"
#include "support/fccp_csv.h"
#include "harness/report/report.h"
#include "support/json_schema.h"

namespace bp::harness {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("bp_test_report_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string joined(const std::vector<std::string>& e) {
  std::string s;
  for (const auto& x : e) s += x + "\n";
  return s;
}

// A report with every kind of record: exact, mismatching (NaN -> inf metrics,
// logprob), one-sided, dtype/shape mismatch, a skipped case, hostile names.
Report sample_report() {
  Report r = make_report("test");
  Case exact;
  exact.id = "exact";
  exact.parameters = {{"tp", "2"}, {"path", "decode"}};
  TensorRecord t;
  t.name = "w";
  t.dtype_a = t.dtype_b = "F32";
  t.shape_a = t.shape_b = std::vector<uint64_t>{2};
  t.metrics = compare(std::vector<float>{1, 2}, std::vector<float>{1, 2});
  exact.tensors.push_back(t);
  exact.seconds = 1.25;
  exact.settle();

  Case bad;
  bad.id = "mis,match \"<&>\"";
  bad.parameters = {{"note", "a,b\r\nc"}};
  TensorRecord lp;
  lp.name = "logprobs";
  lp.is_logprob = true;
  lp.dtype_a = lp.dtype_b = "F32";
  lp.shape_a = lp.shape_b = std::vector<uint64_t>{3};
  lp.metrics = compare(std::vector<float>{1, NAN, 3}, std::vector<float>{1, 2, 3.5f});
  lp.metrics->is_logprob = true;
  bad.tensors.push_back(lp);
  TensorRecord only;
  only.name = "gone\x01<x>";
  only.status = TensorStatus::kOnlyInA;
  only.dtype_a = "BF16";
  only.shape_a = std::vector<uint64_t>{};
  bad.tensors.push_back(only);
  TensorRecord dt;
  dt.name = "a";
  dt.name_b = "b";
  dt.status = TensorStatus::kDtypeMismatch;
  dt.dtype_a = "F32";
  dt.dtype_b = "BF16";
  dt.shape_a = dt.shape_b = std::vector<uint64_t>{1};
  bad.tensors.push_back(dt);
  bad.first_divergent_op = "layer0.attn.o_proj";
  bad.seconds = 0.5;
  bad.peak_device_bytes = 123456789;
  bad.settle();

  Case skipped;
  skipped.id = "cuda";
  skipped.verdict = Verdict::kSkipped;
  skipped.skip_reason = "no GPU";
  r.cases = {exact, bad, skipped};
  return r;
}

// --- the validator itself ----------------------------------------------------

TEST(JsonSchemaLite, AcceptsValidAndRejectsEachViolation) {
  const json schema = json::parse(R"({
    "type": "object", "required": ["n", "s"], "additionalProperties": false,
    "properties": {
      "n": {"type": "integer", "minimum": 1},
      "s": {"enum": ["x", "y"]},
      "a": {"type": "array", "items": {"$ref": "#/$defs/small"}, "minItems": 1, "maxItems": 2},
      "o": {"anyOf": [{"type": "null"}, {"type": "string"}]},
      "m": {"type": "object", "additionalProperties": {"type": "string"}}
    },
    "$defs": {"small": {"type": "number", "minimum": 0}}})");
  EXPECT_EQ(joined(test::schema_errors(schema, json::parse(R"({"n": 1, "s": "x", "a": [0.5], "o": null, "m": {"k": "v"}})"))), "");
  const char* bad[] = {
      R"({"s": "x"})",                               // required
      R"({"n": 0, "s": "x"})",                       // minimum
      R"({"n": 1.5, "s": "x"})",                     // integer
      R"({"n": 1, "s": "z"})",                       // enum
      R"({"n": 1, "s": "x", "extra": 1})",           // additionalProperties false
      R"({"n": 1, "s": "x", "a": [-1]})",            // items via $ref, minimum
      R"({"n": 1, "s": "x", "a": []})",              // minItems
      R"({"n": 1, "s": "x", "a": [1, 2, 3]})",       // maxItems
      R"({"n": 1, "s": "x", "o": 3})",               // anyOf
      R"({"n": 1, "s": "x", "m": {"k": 1}})",        // additionalProperties schema
      R"([1])",                                      // type
  };
  for (const char* b : bad) EXPECT_FALSE(test::schema_errors(schema, json::parse(b)).empty()) << b;
  // The schema may not use keywords the validator does not implement, nor dangling refs.
  EXPECT_FALSE(test::schema_errors(json::parse(R"({"pattern": "x"})"), json("x")).empty());
  EXPECT_FALSE(test::schema_errors(json::parse(R"({"$ref": "#/$defs/none"})"), json("x")).empty());
}

// --- JSON --------------------------------------------------------------------

TEST(Report, JsonValidatesAgainstTheSchema) {
  const Report r = sample_report();
  const json j = json::parse(render_json(r));
  EXPECT_EQ(joined(test::schema_errors(test::report_schema(), j)), "");
  EXPECT_EQ(j["schema_version"], 6);
  EXPECT_EQ(j["status"], "complete");
  EXPECT_EQ(j["verdict"], "mismatch");
  EXPECT_EQ(j["summary"]["cases"], 3);
  EXPECT_EQ(j["summary"]["mismatch"], 1);
  EXPECT_EQ(j["summary"]["skipped"], 1);
  EXPECT_EQ(j["summary"]["nonfinite"], 0);
  EXPECT_EQ(j["summary"]["error"], 0);
  EXPECT_EQ(j["summary"]["tensors_mismatch"], 3);
  const json& lp = j["cases"][1]["tensors"][0]["metrics"];
  EXPECT_EQ(lp["max_abs_diff"], "inf");
  EXPECT_EQ(lp["max_ulp_diff"], "inf");
  EXPECT_EQ(lp["train_rollout_logprob_abs_diff"], "inf");
  EXPECT_EQ(lp["first_mismatch"], 1);
  EXPECT_EQ(lp["nan_a"], 1);
  EXPECT_FALSE(j["cases"][0]["tensors"][0]["metrics"].contains("train_rollout_logprob_abs_diff"));
  EXPECT_TRUE(j["cases"][1]["tensors"][1]["metrics"].is_null());
  EXPECT_EQ(j["environment"]["gpu_name"], nullptr);
  EXPECT_EQ(j["cases"][2]["skip_reason"], "no GPU");
  EXPECT_EQ(j["cases"][0]["tensors"][0]["metrics"]["ulp_histogram"], json::array());  // bit identical
  json hist = json::array();
  for (size_t k = 0; k < kUlpBins; ++k) hist.push_back(k == 21 || k == kUlpBinNan ? 1 : 0);  // 3 vs 3.5: 2^21 ulp
  EXPECT_EQ(lp["ulp_histogram"], hist);
  EXPECT_EQ(j["cases"][1]["first_divergent_op"], "layer0.attn.o_proj");
  EXPECT_EQ(j["cases"][0]["first_divergent_op"], nullptr);
  EXPECT_EQ(j["cases"][0]["seconds"], 1.25);
  EXPECT_EQ(j["cases"][0]["peak_device_bytes"], nullptr);  // a CPU case
  EXPECT_EQ(j["cases"][1]["seconds"], 0.5);
  EXPECT_EQ(j["cases"][1]["peak_device_bytes"], 123456789);
  EXPECT_EQ(j["cases"][2]["seconds"], 0);
  // Single-process cases: an error of null, and no ranks or communication at all.
  for (const json& c : j["cases"]) {
    EXPECT_EQ(c["error"], nullptr);
    EXPECT_FALSE(c.contains("ranks"));
    EXPECT_FALSE(c.contains("communication"));
  }
}

// A case that failed with an error, and one that ran on two ranks with collectives.
Report with_error_and_ranks() {
  Report r = sample_report();
  Case failed;
  failed.id = "nccl/tp2";
  failed.verdict = Verdict::kError;
  failed.error = "rank 1 was killed by signal 9 during the case";
  failed.seconds = 2.5;
  failed.ranks = 2;
  r.cases.push_back(failed);
  Case& two = r.cases[0];
  two.ranks = 2;
  two.communication = {{"all_gather", 40, 3u << 20}, {"all_to_all", 2, 1000}};
  return r;
}

TEST(Report, ErrorVerdictRanksAndCommunicationInJson) {
  const json j = json::parse(render_json(with_error_and_ranks()));
  EXPECT_EQ(joined(test::schema_errors(test::report_schema(), j)), "");
  EXPECT_EQ(j["verdict"], "error");  // outranks the mismatch
  EXPECT_EQ(j["summary"]["error"], 1);
  EXPECT_EQ(j["summary"]["mismatch"], 1);
  const json& failed = j["cases"][3];
  EXPECT_EQ(failed["verdict"], "error");
  EXPECT_EQ(failed["error"], "rank 1 was killed by signal 9 during the case");
  EXPECT_EQ(failed["skip_reason"], nullptr);
  EXPECT_EQ(failed["seconds"], 2.5);
  EXPECT_EQ(failed["ranks"], 2);
  EXPECT_FALSE(failed.contains("communication"));
  EXPECT_EQ(failed["tensors"], json::array());
  EXPECT_EQ(j["cases"][0]["communication"],
            json::parse(R"([{"collective": "all_gather", "calls": 40, "bytes": 3145728},
                            {"collective": "all_to_all", "calls": 2, "bytes": 1000}])"));
  // Negative controls on the schema's new fields.
  auto broken = [&](auto mutate) {
    json b = j;
    mutate(b);
    return !test::schema_errors(test::report_schema(), b).empty();
  };
  EXPECT_TRUE(broken([](json& b) { b["cases"][0].erase("error"); }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][3]["error"] = 9; }));
  EXPECT_TRUE(broken([](json& b) { b["summary"].erase("error"); }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][3]["verdict"] = "failed"; }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][3]["ranks"] = 0; }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][3]["ranks"] = "2"; }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["communication"] = json::array(); }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["communication"][0].erase("bytes"); }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["communication"][0]["calls"] = -1; }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["communication"][0]["rank"] = 0; }));
}

// The sample with each side's distance from the float64 truth on two tensors: both
// sides on the exact case's, only A (one of them infinite) on the logprobs.
Report with_truth_errors() {
  Report r = sample_report();
  r.cases[0].tensors[0].truth_error_a = TruthError{0.5, 0.25};
  r.cases[0].tensors[0].truth_error_b = TruthError{1, 0.5};
  r.cases[1].tensors[0].truth_error_a = TruthError{INFINITY, 3};
  return r;
}

// Schema 6: a tensor's optional "truth_error", {"a": ..., "b": ...}, each side null or
// its max and mean ulp from the float64 truth ("inf" where infinite); absent where
// neither side was measured.
TEST(Report, TruthErrorsInJson) {
  const json j = json::parse(render_json(with_truth_errors()));
  EXPECT_EQ(joined(test::schema_errors(test::report_schema(), j)), "");
  const json& exact = j["cases"][0]["tensors"][0];
  EXPECT_EQ(exact.at("truth_error"),  // at(): a missing key fails the test, never asserts
            json::parse(R"({"a": {"max_ulp": 0.5, "mean_ulp": 0.25}, "b": {"max_ulp": 1.0, "mean_ulp": 0.5}})"));
  nlohmann::ordered_json in_order = nlohmann::ordered_json::parse(render_json(with_truth_errors()));
  EXPECT_EQ(std::prev(in_order["cases"][0]["tensors"][0].end()).key(), "truth_error");  // after the metrics
  EXPECT_EQ(j["cases"][1]["tensors"][0].at("truth_error"),
            json::parse(R"({"a": {"max_ulp": "inf", "mean_ulp": 3.0}, "b": null})"));
  EXPECT_FALSE(j["cases"][1]["tensors"][1].contains("truth_error"));
  EXPECT_FALSE(json::parse(render_json(sample_report()))["cases"][0]["tensors"][0].contains("truth_error"));
  // Negative controls on the schema's new field.
  auto broken = [&](auto mutate) {
    json b = j;
    mutate(b);
    return !test::schema_errors(test::report_schema(), b).empty();
  };
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["tensors"][0]["truth_error"].erase("b"); }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["tensors"][0]["truth_error"]["c"] = nullptr; }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["tensors"][0]["truth_error"]["a"] = 3; }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["tensors"][0]["truth_error"]["a"].erase("mean_ulp"); }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["tensors"][0]["truth_error"]["a"]["max_ulp"] = -1; }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["tensors"][0]["truth_error"]["a"]["mean_ulp"] = "nan"; }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["tensors"][0]["truth_error"]["b"]["ulp"] = 1; }));
  EXPECT_TRUE(broken([](json& b) { b["cases"][0]["tensors"][0]["truth_error"] = nullptr; }));
}

TEST(Report, ErrorVerdictOutranksEveryOther) {
  Report r = with_error_and_ranks();
  EXPECT_EQ(r.overall(), Verdict::kError);
  EXPECT_EQ(r.counts_text(), "1 exact, 1 mismatch, 0 nonfinite, 1 error, 1 skipped");
  r.cases[3].settle();  // settle() leaves an error alone, as a skip
  EXPECT_EQ(r.cases[3].verdict, Verdict::kError);
  r.cases.pop_back();
  EXPECT_EQ(r.overall(), Verdict::kMismatch);  // negative control: without it, the mismatch
}

// The exit code a report decides by itself: an error is 3 (internal), outranking a
// mismatch; an interrupted run 130, outranking both; the rest is each command's.
TEST(Report, FailureExitCodes) {
  Report r = with_error_and_ranks();
  EXPECT_EQ(failure_exit_code(r), kExitInternal);
  r.interrupted = true;
  EXPECT_EQ(failure_exit_code(r), kExitInterrupted);
  r.interrupted = false;
  r.cases.pop_back();
  EXPECT_EQ(failure_exit_code(r), kExitMismatch);
  r.cases.erase(r.cases.begin() + 1);
  EXPECT_EQ(failure_exit_code(r), std::nullopt);  // exact and skipped
}

TEST(Report, CommunicationText) {
  EXPECT_EQ(communication_text({}), "");
  EXPECT_EQ(communication_text({{"all_gather", 1, 512}}), "512 B moved in 1 collective");
  EXPECT_EQ(communication_text({{"all_gather", 40, 3u << 20}, {"all_to_all", 2, 1u << 19}}),
            "3.5 MiB moved in 42 collectives");
}

TEST(Report, SchemaRejectsBrokenReports) {  // negative controls on the real schema
  const json schema = test::report_schema();
  const json good = json::parse(render_json(sample_report()));
  auto broken = [&](auto mutate) {
    json j = good;
    mutate(j);
    return !test::schema_errors(schema, j).empty();
  };
  EXPECT_TRUE(broken([](json& j) { j["environment"].erase("git_commit"); }));
  EXPECT_TRUE(broken([](json& j) { j["status"] = "partial"; }));
  EXPECT_TRUE(broken([](json& j) { j["schema_version"] = 2; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0]["tensors"][0]["metrics"]["mismatches"] = -1; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0]["tensors"][0]["metrics"]["max_abs_diff"] = "nan"; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][1]["tensors"][0]["metrics"]["ulp_histogram"].erase(0); }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0]["tensors"][0]["metrics"]["ulp_histogram"] = {1}; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0].erase("first_divergent_op"); }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0]["first_divergent_op"] = 3; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0]["surprise"] = true; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0]["parameters"]["tp"] = 2; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0].erase("seconds"); }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0]["seconds"] = -0.5; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0]["seconds"] = "1 s"; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][0]["seconds"] = nullptr; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][1].erase("peak_device_bytes"); }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][1]["peak_device_bytes"] = -1; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][1]["peak_device_bytes"] = 1.5; }));
  EXPECT_TRUE(broken([](json& j) { j["cases"][1]["peak_device_bytes"] = "1 GiB"; }));
}

TEST(Report, InterruptedAndEmpty) {
  Report r = make_report("sweep");
  r.interrupted = true;
  const json j = json::parse(render_json(r));
  EXPECT_EQ(joined(test::schema_errors(test::report_schema(), j)), "");
  EXPECT_EQ(j["status"], "interrupted");
  EXPECT_EQ(j["verdict"], "skipped");
}

TEST(Report, Environment) {
  const Environment e = detect_environment();
  EXPECT_FALSE(e.compiler_id.empty());
  EXPECT_FALSE(e.compiler_version.empty());
  EXPECT_FALSE(e.cpu_model.empty());
  EXPECT_TRUE(e.git_commit == "unknown" || e.git_commit.size() == 40) << e.git_commit;
  EXPECT_FALSE(e.gpu_name.has_value());
}

// --- CSV ---------------------------------------------------------------------

// A strict RFC 4180 reader (CRLF records, quoted fields with doubled quotes).
std::vector<std::vector<std::string>> parse_csv(const std::string& s) {
  std::vector<std::vector<std::string>> rows(1, std::vector<std::string>(1));
  bool quoted = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quoted) {
      if (c == '"' && i + 1 < s.size() && s[i + 1] == '"') rows.back().back() += '"', ++i;
      else if (c == '"') quoted = false;
      else rows.back().back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().emplace_back();
    } else if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') {
      ++i;
      rows.emplace_back(1);
    } else {
      rows.back().back() += c;
    }
  }
  if (rows.back().size() == 1 && rows.back()[0].empty()) rows.pop_back();
  return rows;
}

TEST(Report, CsvRowsColumnsAndQuoting) {
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("l1\nl2"), "\"l1\nl2\"");
  const Report r = sample_report();
  const auto rows = parse_csv(render_csv(r));
  ASSERT_EQ(rows.size(), 1u + 1 + 3 + 1);  // header, exact(1), mismatch(3), skipped(1 empty)
  EXPECT_EQ(rows[0], kCsvColumns);
  for (const auto& row : rows) EXPECT_EQ(row.size(), kCsvColumns.size());
  EXPECT_EQ(rows[2][0], "mis,match \"<&>\"");
  EXPECT_EQ(rows[2][2], "note=a,b\r\nc");
  EXPECT_EQ(rows[2][3], "logprobs");
  EXPECT_EQ(rows[2][14], "inf");  // max_abs_diff
  EXPECT_EQ(rows[2][17], "inf");  // train_rollout_logprob_abs_diff
  EXPECT_EQ(rows[1][8], "[2]");
  EXPECT_EQ(rows[3][8], "[]");
  EXPECT_EQ(rows[5][1], "skipped");
  EXPECT_EQ(rows[2][24], "layer0.attn.o_proj");  // first_divergent_op, on every row of its case
  EXPECT_EQ(rows[4][24], "layer0.attn.o_proj");
  EXPECT_EQ(rows[1][24], "");
  EXPECT_EQ(rows[1][25], "");  // ulp_histogram: empty when bit identical
  EXPECT_EQ(rows[2][25], "[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1,0,0,0,0,0,0,0,0,0,0,1]");
  // seconds and peak_device_bytes, on every row of their case (empty peak: no device).
  EXPECT_EQ(rows[1][26], "1.25");
  EXPECT_EQ(rows[1][27], "");
  for (size_t i = 2; i <= 4; ++i) {
    EXPECT_EQ(rows[i][26], "0.5") << i;
    EXPECT_EQ(rows[i][27], "123456789") << i;
  }
  EXPECT_EQ(rows[5][26], "0");  // the skipped case's single row
  for (size_t i = 1; i <= 5; ++i) {
    EXPECT_EQ(rows[i][28], "") << i;          // error: no case failed
    EXPECT_EQ(rows[i][29], "complete") << i;  // run_status, on every row
  }
  // The column order is stable (readers index by position).
  EXPECT_EQ(kCsvColumns[0], "case_id");
  EXPECT_EQ(kCsvColumns[14], "max_abs_diff");
  EXPECT_EQ(kCsvColumns[23], "nan_policy");
  EXPECT_EQ(kCsvColumns[25], "ulp_histogram");  // version 2 columns, then version 3's
  EXPECT_EQ(kCsvColumns[26], "seconds");
  EXPECT_EQ(kCsvColumns[27], "peak_device_bytes");
  EXPECT_EQ(kCsvColumns[28], "error");  // version 5
  EXPECT_EQ(kCsvColumns[29], "run_status");
  ASSERT_EQ(kCsvColumns.size(), 38u);
  EXPECT_EQ(kCsvColumns[30], "truth_max_ulp_a");  // version 6
  EXPECT_EQ(kCsvColumns[33], "truth_mean_ulp_b");
  EXPECT_EQ(kCsvColumns[34], "gpu_name");
  EXPECT_EQ(kCsvColumns.back(), "nccl_version");  // the GPU columns, the last
  EXPECT_EQ(csv_column("seconds"), 26u);
  EXPECT_THROW(csv_column("nope"), std::logic_error);
}

// fast-cpp-csv-parser (what `report --baseline` will read back) parses every row by
// column name. It reads line by line, so fields holding line breaks are out of its
// reach; the sample's multi-line parameter is dropped here.
TEST(Report, CsvReadableByFastCppCsvParser) {
  Report r = sample_report();
  r.cases[1].parameters = {{"note", "a,b \"q\""}};
  const fs::path d = temp_dir("fccp");
  const std::string p = (d / "r.csv").string();
  write_csv(r, p);
  constexpr size_t kN = 38;
  ASSERT_EQ(kCsvColumns.size(), kN);
  std::array<std::string, kN> names;
  std::copy(kCsvColumns.begin(), kCsvColumns.end(), names.begin());
  ::io::CSVReader<kN, ::io::trim_chars<>, ::io::double_quote_escape<',', '"'>> in(p);
  std::apply([&](const auto&... n) { in.read_header(::io::ignore_no_column, n...); }, names);
  std::array<std::string, kN> f;
  std::vector<std::array<std::string, kN>> rows;
  while (std::apply([&](auto&... x) { return in.read_row(x...); }, f)) rows.push_back(f);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[1][0], "mis,match \"<&>\"");
  EXPECT_EQ(rows[1][2], "note=a,b \"q\"");
  EXPECT_EQ(rows[1][14], "inf");
  EXPECT_EQ(rows[0][15], "0");
  EXPECT_EQ(rows[1][26], "0.5");
  EXPECT_EQ(rows[1][27], "123456789");
  EXPECT_EQ(rows[1][29], "complete");
  fs::remove_all(d);
}

// --- JUnit -------------------------------------------------------------------

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(Report, JunitOneTestcasePerCase) {
  const std::string x = render_junit(sample_report());
  EXPECT_EQ(count(x, "<testcase "), 3u);
  EXPECT_EQ(count(x, "<failure "), 1u);
  EXPECT_EQ(count(x, "<skipped "), 1u);
  EXPECT_NE(x.find("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""), std::string::npos);
  EXPECT_NE(x.find("name=\"mis,match &quot;&lt;&amp;&gt;&quot;\""), std::string::npos);
  EXPECT_NE(x.find("message=\"tensor &apos;logprobs&apos;: 2/3 elements differ"), std::string::npos);
  EXPECT_EQ(x.find('\x01'), std::string::npos);
  EXPECT_EQ(x.find("<x>"), std::string::npos);  // escaped
  // time: each case's seconds, the suite's their sum.
  EXPECT_NE(x.find("name=\"exact\" time=\"1.250000\""), std::string::npos) << x;
  EXPECT_NE(x.find("name=\"cuda\" time=\"0.000000\""), std::string::npos) << x;
  EXPECT_NE(x.find("skipped=\"1\" time=\"1.750000\" timestamp="), std::string::npos) << x;
  EXPECT_EQ(count(x, " time=\""), 4u);
  // A case that failed: an <error> with its message, counted in errors.
  const std::string e = render_junit(with_error_and_ranks());
  EXPECT_NE(e.find("tests=\"4\" failures=\"1\" errors=\"1\" skipped=\"1\""), std::string::npos) << e;
  EXPECT_NE(e.find("name=\"nccl/tp2\" time=\"2.500000\">\n      <error type=\"error\" message=\"rank 1 was killed by "
                   "signal 9 during the case\">rank 1 was killed by signal 9 during the case</error>\n    </testcase>"),
            std::string::npos)
      << e;
  EXPECT_EQ(count(e, "<error "), 1u);
}

TEST(Report, CsvCarriesTheErrorMessage) {
  const auto rows = parse_csv(render_csv(with_error_and_ranks()));
  ASSERT_EQ(rows.size(), 1u + 1 + 3 + 1 + 1);
  EXPECT_EQ(rows[6][0], "nccl/tp2");
  EXPECT_EQ(rows[6][1], "error");
  EXPECT_EQ(rows[6][3], "");  // no tensors
  EXPECT_EQ(rows[6][csv_column("error")], "rank 1 was killed by signal 9 during the case");
  EXPECT_EQ(rows[6][csv_column("seconds")], "2.5");
}

// Each side's truth error in two columns, its max and mean ulp (%.17g, "inf"),
// empty where unset; rows of tensors without truth errors leave all four empty.
TEST(Report, CsvCarriesTruthErrors) {
  Report r = with_truth_errors();
  r.cases[0].tensors[0].truth_error_b = TruthError{1.0 / 3, 0.1};
  const auto rows = parse_csv(render_csv(r));
  ASSERT_EQ(rows.size(), 1u + 1 + 3 + 1);
  auto truth = [&rows](size_t row) {
    std::vector<std::string> out;
    for (const char* c : {"truth_max_ulp_a", "truth_mean_ulp_a", "truth_max_ulp_b", "truth_mean_ulp_b"})
      out.push_back(rows[row][csv_column(c)]);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(truth(1), (V{"0.5", "0.25", "0.33333333333333331", "0.10000000000000001"}));
  EXPECT_EQ(truth(2), (V{"inf", "3", "", ""}));
  for (const size_t row : {3, 4, 5}) EXPECT_EQ(truth(row), (V{"", "", "", ""})) << row;
}

// --- human units -------------------------------------------------------------

TEST(Report, DurationAndBytesInHumanUnits) {
  EXPECT_EQ(duration_text(0), "0 s");
  EXPECT_EQ(duration_text(850e-6), "850 us");
  EXPECT_EQ(duration_text(0.0123), "12.3 ms");
  EXPECT_EQ(duration_text(0.9996), "1 s");  // rounds into the next unit, never "1e+03 ms"
  EXPECT_EQ(duration_text(4.56), "4.56 s");
  EXPECT_EQ(duration_text(59.96), "1 min 00 s");
  EXPECT_EQ(duration_text(125.4), "2 min 05 s");
  EXPECT_EQ(bytes_text(0), "0 B");
  EXPECT_EQ(bytes_text(1023), "1023 B");
  EXPECT_EQ(bytes_text(1536), "1.5 KiB");
  EXPECT_EQ(bytes_text(uint64_t{1023} << 10), "0.999 MiB");  // 1023 KiB: past 3 digits
  EXPECT_EQ(bytes_text(123456789), "118 MiB");
  EXPECT_EQ(bytes_text(uint64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(bytes_text(uint64_t{80} << 30), "80 GiB");
  EXPECT_EQ(bytes_text(~uint64_t{0}), "16 EiB");
}

// --- atomic writes -----------------------------------------------------------

TEST(Report, WritesAreAtomicAndFailuresLeaveNoTrace) {
  const fs::path d = temp_dir("atomic");
  const Report r = sample_report();
  const std::string p = (d / "r.json").string();
  write_json(r, p);
  write_csv(r, (d / "r.csv").string());
  write_junit(r, (d / "r.xml").string());
  EXPECT_EQ(read_all(p), render_json(r));
  EXPECT_EQ(read_all((d / "r.csv").string()), render_csv(r));
  // Target is a directory: rename fails, the directory and its contents survive,
  // no temporary is left behind.
  fs::create_directory(d / "busy");
  std::ofstream(d / "busy" / "keep") << "keep";
  EXPECT_THROW(write_json(r, (d / "busy").string()), io::IoError);
  EXPECT_EQ(read_all((d / "busy" / "keep").string()), "keep");
  // Missing directory: nothing created.
  EXPECT_THROW(write_csv(r, (d / "nodir" / "r.csv").string()), io::IoError);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(d)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    ++entries;
  }
  EXPECT_EQ(entries, 4u);  // r.json, r.csv, r.xml, busy
  fs::remove_all(d);
}

}  // namespace
}  // namespace bp::harness
