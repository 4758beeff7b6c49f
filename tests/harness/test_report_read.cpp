// Reading reports back (harness/report/read.h): JSON round trip byte for byte, CSV
// back to the same verdicts and metrics, malformed reports refused naming the
// field; the baseline comparison (baseline.h); the HTML page's structure and
// escaping as text (tests/harness/test_cli_report.cpp loads it in a browser).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <functional>
#include <limits>
#include <optional>

#include "harness/io/errors.h"
#include "harness/report/baseline.h"
#include "harness/report/html.h"
#include "harness/report/read.h"
#include "support/golden.h"
#include "support/sample_report.h"

namespace bp::harness {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::compared_tensor;
using test::sample_case;
using test::sample_sweep_report;

fs::path temp_file(const std::string& leaf) {
  const fs::path d = fs::temp_directory_path() / ("bp_test_report_read_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d / leaf;
}

// The BadInput a parse throws, or "" when it parses.
std::string json_error(const std::string& text) {
  try {
    parse_report_json(text, "r.json");
  } catch (const io::BadInput& e) {
    return e.what();
  }
  return "";
}

// The BadInput reading `text` as the CSV file `p` throws, or "" when it reads.
std::string csv_error(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  try {
    read_report_csv(p.string());
  } catch (const io::BadInput& e) {
    return e.what();
  }
  return "";
}

// `back`, read from a CSV of `r`, with what CSV does not carry taken from `r`.
Report with_what_csv_drops(Report back, const Report& r) {
  back.command = r.command;
  back.created_utc = r.created_utc;
  back.environment = r.environment;
  for (Case& c : back.cases)
    for (const Case& a : r.cases)
      if (a.id == c.id) {
        c.skip_reason = a.skip_reason;
        c.ranks = a.ranks;
        c.communication = a.communication;
      }
  return back;
}

// What follows run_status ("complete") on a row without truth errors and GPU: their empty columns.
std::string empty_after_status() { return std::string(kCsvColumns.size() - 1 - csv_column("run_status"), ','); }

// --- JSON ----------------------------------------------------------------------

TEST(ReportRead, JsonRoundTripIsByteIdentical) {
  Report r = sample_sweep_report();
  r.interrupted = true;
  r.environment.git_dirty = true;
  r.environment.gpu_name = "NVIDIA H100";
  const std::string text = render_json(r);
  const Report back = parse_report_json(text, "r.json");
  EXPECT_EQ(render_json(back), text);
  EXPECT_EQ(back.cases.size(), r.cases.size());
  EXPECT_TRUE(back.interrupted);
  const Case& bad = sample_case(const_cast<Report&>(back), "tp2-decode");
  EXPECT_EQ(bad.first_divergent_op, "layer0.mlp.down_proj");
  EXPECT_EQ(bad.tensors[0].metrics->ulp_histogram, r.cases[4].tensors[0].metrics->ulp_histogram);
  EXPECT_EQ(bad.tensors[0].metrics->ulp_histogram[2], 3u);  // 5 ulp: bin [4,7]
  EXPECT_TRUE(bad.tensors[1].metrics->ulp_histogram.empty());
  EXPECT_EQ(bad.seconds, 0.625);  // the fifth case
  EXPECT_EQ(bad.peak_device_bytes, std::nullopt);
  EXPECT_EQ(back.cases.back().seconds, 75.5);
  EXPECT_EQ(back.cases.back().peak_device_bytes, test::kSamplePeakDeviceBytes);
  // Through a file too.
  const fs::path p = temp_file("r.json");
  write_json(r, p.string());
  EXPECT_EQ(render_json(read_report(p.string())), text);
}

TEST(ReportRead, JsonMalformedNamesTheField) {
  const json good = json::parse(render_json(sample_sweep_report()));
  auto broken = [&](const std::function<void(json&)>& mutate) {
    json j = good;
    mutate(j);
    return json_error(j.dump());
  };
  EXPECT_EQ(broken([](json&) {}), "");
  EXPECT_EQ(broken([](json& j) { j["cases"][4]["tensors"][0]["metrics"].erase("max_ulp_diff"); }),
            "r.json: cases[4].tensors[0].metrics.max_ulp_diff: required field is missing");
  EXPECT_EQ(broken([](json& j) { j["cases"][4]["tensors"][0]["metrics"]["mismatches"] = "3"; }),
            "r.json: cases[4].tensors[0].metrics.mismatches: expected an integer >= 0, found \"3\"");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["metrics"]["elements"] = -8; }),
            "r.json: cases[0].tensors[0].metrics.elements: expected an integer >= 0, found -8");
  EXPECT_EQ(broken([](json& j) { j["schema_version"] = 1; }),
            "r.json: schema_version: this bitparity reads schema_version 3 to 6; this report's is 1; re-run the "
            "command that wrote it");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["surprise"] = 1; }), "r.json: cases[0].surprise: unknown field");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["verdict"] = "exactish"; }),
            "r.json: cases[0].verdict: \"exactish\" is not a verdict (exact, mismatch, skipped, nonfinite, error)");
  EXPECT_EQ(broken([](json& j) { j["cases"][4]["verdict"] = "exact"; }),
            "r.json: cases[4].verdict: is \"exact\" but its tensors give \"mismatch\"");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["parameters"]["model"] = 3; }),
            "r.json: cases[0].parameters.model: expected a string, found an integer");
  EXPECT_EQ(broken([](json& j) { j["cases"][4]["tensors"][0]["metrics"]["ulp_histogram"][2] = 2; }),
            "r.json: cases[4].tensors[0].metrics.ulp_histogram: counts 2 elements but mismatches is 3");
  EXPECT_EQ(broken([](json& j) { j["cases"][2]["id"] = "tp1-full"; }),
            "r.json: cases[2].id: case id \"tp1-full\" appears twice (a baseline matches cases by id)");
  // Derived fields must agree with the records.
  EXPECT_EQ(broken([](json& j) { j["summary"]["exact"] = 9; }),
            "r.json: summary.exact: disagrees with the rest of the report (expected 4)");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["bit_identical"] = false; }),
            "r.json: cases[0].tensors[0].bit_identical: disagrees with the rest of the report (expected true)");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["metrics"].erase("train_rollout_logprob_abs_diff"); }),
            "r.json: cases[0].tensors[0].metrics.train_rollout_logprob_abs_diff: is missing (the report's records require it)");
  EXPECT_EQ(broken([](json& j) { j["cases"][1]["seconds"] = -1; }),
            "r.json: cases[1].seconds: expected a number >= 0, found -1");
  EXPECT_EQ(broken([](json& j) { j["cases"][1]["seconds"] = nullptr; }),
            "r.json: cases[1].seconds: expected a number >= 0, found null");
  EXPECT_EQ(broken([](json& j) { j["cases"][6]["peak_device_bytes"] = 1.5; }),
            "r.json: cases[6].peak_device_bytes: expected an integer >= 0, found 1.5");
  EXPECT_EQ(broken([](json& j) { j["cases"][6].erase("peak_device_bytes"); }),
            "r.json: cases[6].peak_device_bytes: required field is missing");
  EXPECT_NE(json_error("{\"schema_version\": 3,"), "");
  EXPECT_NE(json_error("[]").find("r.json: (top level): expected an object, found an array"), std::string::npos);
}

// The sample with truth errors (schema 6) on tp1-full's two tensors, both sides, one
// side, an infinite one, and on a tensor only in A.
Report with_truth_errors() {
  Report r = sample_sweep_report();
  Case& c = sample_case(r, "tp1-full");
  c.tensors[0].truth_error_a = TruthError{0.5, 1.0 / 3};
  c.tensors[0].truth_error_b = TruthError{INFINITY, 0.1};
  c.tensors[1].truth_error_b = TruthError{2, 0.75};
  sample_case(r, "other <b>&'\"").tensors[1].truth_error_a = TruthError{1e-300, 3e-5};
  return r;
}

// Every tensor's truth errors, in record order.
std::vector<std::pair<std::optional<TruthError>, std::optional<TruthError>>> truth_errors(const Report& r) {
  std::vector<std::pair<std::optional<TruthError>, std::optional<TruthError>>> out;
  for (const Case& c : r.cases)
    for (const TensorRecord& t : c.tensors) out.emplace_back(t.truth_error_a, t.truth_error_b);
  return out;
}

TEST(ReportRead, TruthErrorsRoundTripExactly) {
  const Report r = with_truth_errors();
  const std::string text = render_json(r);
  const Report back = parse_report_json(text, "r.json");
  EXPECT_EQ(render_json(back), text);
  EXPECT_EQ(truth_errors(back), truth_errors(r));
  EXPECT_EQ(sample_case(const_cast<Report&>(back), "tp1-full").tensors[0].truth_error_b->max_ulp, INFINITY);
  const fs::path p = temp_file("truth.csv");
  write_csv(r, p.string());
  const Report csv = read_report(p.string());
  EXPECT_EQ(truth_errors(csv), truth_errors(r));
  EXPECT_EQ(render_json(with_what_csv_drops(csv, r)), text);
}

TEST(ReportRead, TruthErrorsMalformedNamesTheField) {
  const json good = json::parse(render_json(with_truth_errors()));
  auto broken = [&](const std::function<void(json&)>& mutate) {
    json j = good;
    mutate(j);
    return json_error(j.dump());
  };
  const std::string at = "r.json: cases[0].tensors[0].truth_error";
  EXPECT_EQ(broken([](json&) {}), "");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["truth_error"]["a"]["max_ulp"] = -1; }),
            at + ".a.max_ulp: expected a number >= 0 or \"inf\", found -1");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["truth_error"]["b"]["mean_ulp"] = "nan"; }),
            at + ".b.mean_ulp: expected a number >= 0 or \"inf\", found \"nan\"");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["truth_error"].erase("b"); }),
            at + ".b: required field is missing");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["truth_error"]["c"] = nullptr; }), at + ".c: unknown field");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["truth_error"]["a"].erase("mean_ulp"); }),
            at + ".a.mean_ulp: required field is missing");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["truth_error"]["a"] = 3; }),
            at + ".a: expected an object, found an integer");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["tensors"][0]["truth_error"] = {{"a", nullptr}, {"b", nullptr}}; }),
            at + ": has neither side (a tensor without truth errors has no \"truth_error\")");
  // A side on any tensor reads (the writer writes what it is given).
  EXPECT_EQ(broken([](json& j) {
              j["cases"][1]["tensors"][0]["truth_error"] = {{"a", nullptr}, {"b", {{"max_ulp", 1}, {"mean_ulp", 0.5}}}};
            }),
            "");

  const fs::path p = temp_file("truth-bad.csv");
  const std::string csv = render_csv(with_truth_errors());
  auto csv_broken = [&](const std::string& from, const std::string& to) {
    std::string text = csv;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return csv_error(p, text.replace(at, from.size(), to));
  };
  EXPECT_EQ(csv_error(p, csv), "");
  EXPECT_EQ(csv_broken(",0.5,0.33333333333333331,", ",0.5,,"),
            p.string() + ": line 2, column truth_mean_ulp_a: is empty but truth_max_ulp_a is not (a side's truth "
                         "error is both numbers or neither)");
  EXPECT_EQ(csv_broken(",inf,0.10000000000000001,", ",,0.10000000000000001,"),
            p.string() + ": line 2, column truth_max_ulp_b: is empty but truth_mean_ulp_b is not (a side's truth "
                         "error is both numbers or neither)");
  EXPECT_EQ(csv_broken(",0.5,0.33333333333333331,", ",-0.5,0.33333333333333331,"),
            p.string() + ": line 2, column truth_max_ulp_a: expected a number >= 0 or \"inf\", found \"-0.5\"");
  // The row of a case without tensors has none.
  const size_t skipped = csv.find("moe-ep2-decode");
  ASSERT_NE(skipped, std::string::npos);
  std::string tensorless = csv;
  tensorless.replace(tensorless.find(",complete,,,", skipped), 12, ",complete,1,1,");
  EXPECT_NE(csv_error(p, tensorless).find("column truth_max_ulp_a: must be empty in the row of a case without tensors"),
            std::string::npos)
      << csv_error(p, tensorless);
}

// Issue 53 item 15: a CI baseline survives an upgrade. Reports written by earlier
// builds (fixtures/reports/README.md) read back, JSON and CSV, to the same cases, and
// serve as a baseline; what their version did not have is refused naming the
// version; versions before 3 and after the current one are refused. (Before: every
// earlier version was refused, "re-run the command that wrote the report".)
TEST(ReportRead, EarlierSchemaVersionsReadBack) {
  for (const int v : {3, 4, 5}) {
    const std::string stem = test::source_path("fixtures/reports/schema" + std::to_string(v));
    const Report j = read_report(stem + ".json"), c = read_report(stem + ".csv");
    ASSERT_EQ(j.cases.size(), 10u) << v;
    EXPECT_EQ(j.count(Verdict::kExact), 4u);
    EXPECT_EQ(j.count(Verdict::kMismatch), 2u);
    EXPECT_EQ(j.count(Verdict::kSkipped), 4u);
    EXPECT_FALSE(j.interrupted);
    ASSERT_EQ(c.cases.size(), j.cases.size());
    for (size_t i = 0; i < j.cases.size(); ++i) {
      EXPECT_EQ(c.cases[i].id, j.cases[i].id);
      EXPECT_EQ(c.cases[i].verdict, j.cases[i].verdict);
      EXPECT_EQ(c.cases[i].parameters, j.cases[i].parameters);
      ASSERT_EQ(c.cases[i].tensors.size(), j.cases[i].tensors.size());
      for (size_t k = 0; k < j.cases[i].tensors.size(); ++k)
        EXPECT_EQ(c.cases[i].tensors[k].metrics.has_value() && c.cases[i].tensors[k].metrics->mismatches,
                  j.cases[i].tensors[k].metrics.has_value() && j.cases[i].tensors[k].metrics->mismatches);
    }
    // As a baseline: the same run read from either format is no change.
    EXPECT_TRUE(compare_to_baseline(j, stem + ".json", c, stem + ".csv").changes.empty()) << v;
  }
  // What a version did not have is refused, naming the version that added it.
  const json v3 = json::parse(std::ifstream(test::source_path("fixtures/reports/schema3.json")));
  const json v4 = json::parse(std::ifstream(test::source_path("fixtures/reports/schema4.json")));
  EXPECT_EQ(json_error(v3.dump()), "");
  EXPECT_EQ(json_error(v4.dump()), "");
  auto broken = [](json j, const std::function<void(json&)>& mutate) {
    mutate(j);
    return json_error(j.dump());
  };
  EXPECT_EQ(broken(v3, [](json& j) { j["cases"][0]["verdict"] = "nonfinite"; }),
            "r.json: cases[0].verdict: the verdict \"nonfinite\" is not in a report of schema_version 3 "
            "(schema_version 4 added it)");
  EXPECT_EQ(broken(v3, [](json& j) { j["summary"]["error"] = 0; }),
            "r.json: summary.error: is not in a report of schema_version 3 (schema_version 5 added it)");
  EXPECT_EQ(broken(v4, [](json& j) { j["cases"][2]["error"] = nullptr; }),
            "r.json: cases[2].error: is not in a report of schema_version 4 (schema_version 5 added it)");
  EXPECT_EQ(broken(v4, [](json& j) { j["cases"][2]["ranks"] = 2; }),
            "r.json: cases[2].ranks: is not in a report of schema_version 4 (schema_version 5 added it)");
  EXPECT_EQ(broken(v4, [](json& j) { j["cases"][0]["tensors"][0]["truth_error"] = {{"a", nullptr}, {"b", nullptr}}; }),
            "r.json: cases[0].tensors[0].truth_error: is not in a report of schema_version 4 (schema_version 6 added it)");
  const json v5 = json::parse(std::ifstream(test::source_path("fixtures/reports/schema5.json")));
  EXPECT_EQ(json_error(v5.dump()), "");
  EXPECT_EQ(broken(v5, [](json& j) {
              j["cases"][2]["tensors"][1]["truth_error"] = {{"a", {{"max_ulp", 1}, {"mean_ulp", 0.5}}}, {"b", nullptr}};
            }),
            "r.json: cases[2].tensors[1].truth_error: is not in a report of schema_version 5 (schema_version 6 added it)");
  // What the version had is held to it as in a current report.
  EXPECT_EQ(broken(v4, [](json& j) { j["summary"]["nonfinite"] = 1; }),
            "r.json: summary.nonfinite: disagrees with the rest of the report (expected 0)");
  // A report as schema_version 2 wrote it (no seconds, no peak_device_bytes), and one
  // of a later bitparity, are refused.
  json v2 = json::parse(render_json(sample_sweep_report()));
  v2["schema_version"] = 2;
  for (json& c : v2["cases"]) c.erase("seconds"), c.erase("peak_device_bytes");
  EXPECT_EQ(json_error(v2.dump()), "r.json: schema_version: this bitparity reads schema_version 3 to 6; this "
                                   "report's is 2; re-run the command that wrote it");
  EXPECT_EQ(broken(v4, [](json& j) { j["schema_version"] = 7; }),
            "r.json: schema_version: this bitparity reads schema_version 3 to 6; this report's is 7 (written by a "
            "later bitparity)");
}

TEST(ReportRead, CsvGivesTheSameVerdictsAndMetrics) {
  const Report r = sample_sweep_report();
  const fs::path p = temp_file("r.csv");
  write_csv(r, p.string());
  const Report back = read_report(p.string());
  ASSERT_EQ(back.cases.size(), r.cases.size());
  for (size_t i = 0; i < r.cases.size(); ++i) {
    const Case &a = r.cases[i], &b = back.cases[i];
    EXPECT_EQ(b.id, a.id);
    EXPECT_EQ(b.verdict, a.verdict);
    EXPECT_EQ(b.parameters, a.parameters);
    EXPECT_EQ(b.first_divergent_op, a.first_divergent_op);
    EXPECT_EQ(b.seconds, a.seconds);
    EXPECT_EQ(b.peak_device_bytes, a.peak_device_bytes);
    ASSERT_EQ(b.tensors.size(), a.tensors.size()) << a.id;
    for (size_t k = 0; k < a.tensors.size(); ++k) {
      const TensorRecord &x = a.tensors[k], &y = b.tensors[k];
      EXPECT_EQ(tensor_key(y), tensor_key(x));
      EXPECT_EQ(y.status, x.status);
      EXPECT_EQ(y.shape_a, x.shape_a);
      EXPECT_EQ(y.matches(), x.matches());
      ASSERT_EQ(y.metrics.has_value(), x.metrics.has_value());
      if (!x.metrics) continue;
      EXPECT_EQ(y.metrics->mismatches, x.metrics->mismatches);
      EXPECT_EQ(y.metrics->max_ulp_diff, x.metrics->max_ulp_diff);
      EXPECT_EQ(y.metrics->max_abs_diff, x.metrics->max_abs_diff);
      EXPECT_EQ(y.metrics->mean_abs_diff, x.metrics->mean_abs_diff);
      EXPECT_EQ(y.metrics->first_mismatch, x.metrics->first_mismatch);
      EXPECT_EQ(y.metrics->ulp_histogram, x.metrics->ulp_histogram);
    }
  }
  // The whole report's JSON, but for what CSV does not carry, is the same.
  EXPECT_EQ(render_json(with_what_csv_drops(back, r)), render_json(r));
}

// Issue 53 item 5: the parameters column escapes ';', '=' and its escape character,
// so a model folder named like a parameter list reads back as that folder, not as a
// case of another contract; a CSV written before the escaping still reads.
TEST(ReportRead, CsvParametersKeepAnyModelPath) {
  Report r = sample_sweep_report();
  Case& c = r.cases.front();
  const std::string tricky = "x;contract=bf16-fmaseq-v1";
  c.parameters["model"] = tricky;
  c.parameters["layout"] = "a\\;b=\\";  // the escape character itself, before and after the others
  c.parameters["odd;key="] = "";
  const fs::path p = temp_file("tricky.csv");
  write_csv(r, p.string());
  const Report back = read_report(p.string());
  EXPECT_EQ(back.cases.front().parameters, c.parameters);
  EXPECT_EQ(back.cases.front().parameters.at("contract"), "v1");
  // An earlier CSV: no escapes, a backslash kept as it is.
  Report plain = sample_sweep_report();
  std::string text = render_csv(plain);
  const std::string from = "model=qwen3-tiny", to = "model=C:\\dir\\m";
  ASSERT_NE(text.find(from), std::string::npos);
  for (size_t at; (at = text.find(from)) != std::string::npos;) text.replace(at, from.size(), to);
  const fs::path old = temp_file("old.csv");
  std::ofstream(old, std::ios::binary) << text;
  EXPECT_EQ(read_report(old.string()).cases.front().parameters.at("model"), "C:\\dir\\m");
}

TEST(ReportRead, CsvMalformedNamesLineAndColumn) {
  const fs::path p = temp_file("bad.csv");
  const std::string good = render_csv(sample_sweep_report());
  auto error_of = [&p](const std::string& text) { return csv_error(p, text); };
  EXPECT_EQ(error_of(good), "");
  std::string policy = good;
  policy.replace(policy.find("nan_equal"), 9, "nan_eq");
  EXPECT_EQ(error_of(policy), p.string() + ": line 2, column nan_policy: expected \"nan_equal\"");
  std::string no_col = good;
  no_col.replace(no_col.find(",ulp_histogram"), 14, "");
  EXPECT_NE(error_of(no_col).find("ulp_histogram"), std::string::npos) << error_of(no_col);
  std::string bad_verdict = good;
  bad_verdict.replace(bad_verdict.find("tp1-full,exact"), 14, "tp1-full,exaxt");
  EXPECT_EQ(error_of(bad_verdict),
            p.string() +
                ": line 2, column case_verdict: \"exaxt\" is not a verdict (exact, mismatch, skipped, nonfinite, error)");
  std::string bad_bool = good;
  bad_bool.replace(bad_bool.find(",true,true,"), 11, ",yes,true,");
  EXPECT_EQ(error_of(bad_bool), p.string() + ": line 2, column bit_identical: expected true or false, found \"yes\"");
  // The case's time and peak: a measurement each, the same on every row of the case.
  std::string bad_seconds = good;
  bad_seconds.replace(bad_seconds.find(",0.125,"), 7, ",-0.125,");
  EXPECT_EQ(error_of(bad_seconds), p.string() + ": line 2, column seconds: expected a number >= 0, found \"-0.125\"");
  std::string inf_seconds = good;
  inf_seconds.replace(inf_seconds.find(",0.125,"), 7, ",inf,");
  EXPECT_EQ(error_of(inf_seconds), p.string() + ": line 2, column seconds: expected a number >= 0, found \"inf\"");
  std::string split_seconds = good;
  split_seconds.replace(split_seconds.find(",0.125,", split_seconds.find(",0.125,") + 1), 7, ",0.126,");
  EXPECT_EQ(error_of(split_seconds), p.string() + ": line 3, column seconds: differs from the first row of its case");
  std::string bad_peak = good;
  bad_peak.replace(bad_peak.find(",1610612736"), 11, ",1.5GiB");
  EXPECT_NE(error_of(bad_peak).find("column peak_device_bytes: expected an integer >= 0, found \"1.5GiB\""),
            std::string::npos)
      << error_of(bad_peak);
  // The tensorless row of a skipped case may carry its time.
  std::string skipped_time = good;
  const size_t skipped_row = skipped_time.find("moe-ep2-decode");
  ASSERT_NE(skipped_row, std::string::npos);
  const size_t skipped_end = skipped_time.find("\r\n", skipped_row);
  skipped_time.replace(skipped_time.rfind(",0,", skipped_end), 3, ",2.5,");
  EXPECT_EQ(error_of(skipped_time), "");
  // Every row carries the report's status, the same on every row.
  std::string bad_status = good;
  bad_status.replace(bad_status.find(",complete" + empty_after_status() + "\r\n"), 9, ",finished");
  EXPECT_EQ(error_of(bad_status),
            p.string() + ": line 2, column run_status: \"finished\" is not a run status (complete, interrupted)");
  std::string split_status = good;
  const std::string status_end = ",complete" + empty_after_status() + "\r\n";  // then the empty truth and GPU columns
  const size_t first_status = split_status.find(status_end);
  split_status.replace(split_status.find(status_end, first_status + 1), 9, ",interrupted");
  EXPECT_EQ(error_of(split_status), p.string() + ": line 3, column run_status: differs from the first row's");
  // A report without cases is one row with only its status, and only then.
  Report none = sample_sweep_report();
  none.cases.clear();
  none.interrupted = true;
  const std::string empty = render_csv(none);
  EXPECT_EQ(error_of(empty), "");
  std::ofstream(p, std::ios::binary) << empty;
  EXPECT_TRUE(read_report_csv(p.string()).interrupted);
  std::string stray = empty;
  stray.replace(stray.find("\r\n") + 2, 2, ",,x");
  EXPECT_EQ(error_of(stray), p.string() + ": line 2, column parameters: must be empty in the row of a report without "
                                          "cases (case_id and case_verdict are empty)");
  const std::string report_row = empty.substr(empty.find("\r\n") + 2);
  EXPECT_NE(error_of(good + report_row.substr(0, report_row.find(",interrupted")) + status_end)
                .find("column case_id: a report without cases has one row"),
            std::string::npos);
  // Line ends: CRLF as written, LF, none at the end, blank lines at the end.
  std::string lf = good;
  for (size_t at = lf.find("\r\n"); at != std::string::npos; at = lf.find("\r\n", at)) lf.erase(at, 1);
  for (const std::string& text : {lf, good.substr(0, good.size() - 2), good + "\r\n\r\n", lf + "\n"})
    EXPECT_EQ(error_of(text), "") << text.substr(text.size() - 20);
  // A CSV in the schema 2 layout (without seconds, peak_device_bytes, error, run_status, the truth errors and
  // the GPU columns) is refused, naming them; one in the schema 4 layout (without error, the truth errors
  // and the GPU columns) reads, and one in the schema 5 layout (without the truth errors) reads as written.
  // `good` without the columns `drop`, counted from the last (0); the sample's quoted
  // commas all sit left of them, and joining the fields back restores them.
  auto without_columns = [&good](std::initializer_list<size_t> drop) {
    std::string out;
    for (size_t at = 0; at < good.size();) {
      const size_t end = good.find("\r\n", at);
      std::vector<std::string> fields(1);
      for (const char ch : good.substr(at, end - at)) {
        if (ch == ',') fields.emplace_back();
        else fields.back() += ch;
      }
      std::string line;
      for (size_t k = 0; k < fields.size(); ++k)
        if (std::find(drop.begin(), drop.end(), fields.size() - 1 - k) == drop.end())
          line += (line.empty() ? "" : ",") + fields[k];
      out += line + "\r\n";
      at = end + 2;
    }
    return out;
  };
  const std::string v2 = without_columns({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  ASSERT_EQ(v2.rfind("case_id,", 0), 0u);
  ASSERT_NE(v2.find(",ulp_histogram\r\n"), std::string::npos);
  EXPECT_NE(error_of(v2).find("seconds"), std::string::npos) << error_of(v2);
  const std::string v4 = without_columns({0, 1, 2, 3, 4, 5, 6, 7, 9});
  ASSERT_NE(v4.find(",peak_device_bytes,run_status\r\n"), std::string::npos) << v4.substr(0, 400);
  EXPECT_EQ(error_of(v4), "");
  const std::string v5 = without_columns({4, 5, 6, 7});
  ASSERT_NE(v5.find(",error,run_status,gpu_name,"), std::string::npos) << v5.substr(0, 400);
  EXPECT_EQ(error_of(v5), "");
  EXPECT_EQ(render_json(with_what_csv_drops(read_report_csv(p.string()), sample_sweep_report())),
            render_json(sample_sweep_report()));
  EXPECT_NE(error_of("case_id\r\nx\r\n").find(p.string()), std::string::npos);
}

// --- baseline --------------------------------------------------------------------

std::vector<std::pair<ChangeKind, std::string>> kinds(const BaselineDiff& d) {
  std::vector<std::pair<ChangeKind, std::string>> out;
  for (const Change& c : d.changes) out.emplace_back(c.kind, c.case_id + (c.tensor.empty() ? "" : "/" + c.tensor));
  return out;
}

TEST(ReportBaseline, IdenticalReportsHaveNoChanges) {
  const Report r = sample_sweep_report();
  const BaselineDiff d = compare_to_baseline(r, "old", r, "new");
  EXPECT_TRUE(d.changes.empty());
  EXPECT_FALSE(d.regressed());
}

TEST(ReportBaseline, TimesAndPeaksAreNoChange) {
  const Report old = sample_sweep_report();
  Report now = old;
  for (Case& c : now.cases) {
    c.seconds = c.seconds * 10 + 1;
    c.peak_device_bytes = c.peak_device_bytes ? std::nullopt : std::optional<uint64_t>(uint64_t{1} << 33);
  }
  const BaselineDiff d = compare_to_baseline(old, "old", now, "new");
  EXPECT_TRUE(d.changes.empty()) << format_baseline_diff(d);
}

TEST(ReportBaseline, ClassifiesEveryKindOfChange) {
  const Report old = sample_sweep_report();
  Report now = old;
  sample_case(now, "tp1-full").tensors[0] = compared_tensor("logprobs", 1, 2);  // newly failing
  sample_case(now, "tp1-full").settle();
  sample_case(now, "tp2-decode").tensors[0] = compared_tensor("logprobs", 0, 0);  // newly passing
  sample_case(now, "tp2-decode").settle();
  sample_case(now, "other <b>&'\"").tensors.push_back(compared_tensor("new", 0, 0));  // tensor added
  sample_case(now, "tp1-decode").tensors.pop_back();  // tensor removed
  Case& moe = sample_case(now, "moe-ep2-decode");  // skipped -> exact
  moe.verdict = Verdict::kExact;
  moe.tensors.push_back(compared_tensor("logprobs", 0, 0));
  now.cases.erase(now.cases.begin() + 2);  // tp1-prefill removed
  Case added;
  added.id = "tp4-full";
  added.tensors.push_back(compared_tensor("logprobs", 0, 0));
  now.cases.push_back(added);
  const BaselineDiff d = compare_to_baseline(old, "old", now, "new");
  using K = ChangeKind;
  const std::vector<std::pair<K, std::string>> expected = {
      {K::kNewlyFailing, "tp1-full/logprobs"},
      {K::kCaseRemoved, "tp1-prefill"},
      {K::kTensorRemoved, "tp1-decode/grad.layers.0.mlp.down_proj"},
      {K::kNewlyPassing, "tp2-decode/logprobs"},
      {K::kCaseAdded, "tp4-full"},
      {K::kTensorAdded, "other <b>&'\"/new"},
      {K::kSkipChanged, "moe-ep2-decode"},
  };
  EXPECT_EQ(kinds(d), expected);
  EXPECT_TRUE(d.regressed());
  EXPECT_TRUE(d.changes[0].regression);
  EXPECT_TRUE(d.changes[1].regression);  // a compared case is gone
  EXPECT_FALSE(d.changes[2].regression);
  EXPECT_EQ(d.changes[0].detail, "1/8 differ, max_ulp_diff 2, max_abs_diff 2.38e-07");
  const std::string text = format_baseline_diff(d);
  EXPECT_NE(text.find("newly failing (1):\n  ! tp1-full / logprobs: 1/8 differ"), std::string::npos) << text;
  EXPECT_NE(text.find("baseline: REGRESSION (2 newly failing or no longer compared; marked !)"), std::string::npos);
}

TEST(ReportBaseline, ImprovementsAndMetricChangesAreNoRegression) {
  const Report old = sample_sweep_report();
  Report now = old;
  sample_case(now, "tp2-decode").tensors[0] = compared_tensor("logprobs", 2, 100);  // still failing, changed
  sample_case(now, "tp2-decode").first_divergent_op = "layer1.attn";
  now.cases.erase(now.cases.begin() + 5);  // the skipped case is gone: not compared before, no regression
  const BaselineDiff d = compare_to_baseline(old, "old", now, "new");
  ASSERT_EQ(d.changes.size(), 3u) << format_baseline_diff(d);
  EXPECT_EQ(d.changes[0].kind, ChangeKind::kCaseRemoved);
  EXPECT_FALSE(d.changes[0].regression);
  EXPECT_EQ(d.changes[1].detail, "mismatches 3 -> 2, max_ulp_diff 5 -> 100, max_abs_diff 5.96e-07 -> 1.19e-05");
  EXPECT_EQ(d.changes[2].detail, "first_divergent_op layer0.mlp.down_proj -> layer1.attn");
  EXPECT_FALSE(d.regressed());
  // A new case that mismatches is newly failing.
  Case added;
  added.id = "tp8-full";
  added.tensors.push_back(compared_tensor("logprobs", 1, 1));
  added.settle();
  now.cases.push_back(added);
  EXPECT_TRUE(compare_to_baseline(old, "old", now, "new").regressed());
}

// A match of NaN with NaN proves nothing: a tensor all NaN/Inf, or a logprob
// tensor holding one, makes the case "nonfinite", never "exact"; the verdict
// survives JSON and CSV, and against a baseline exact -> nonfinite is a regression.
TEST(ReportNonFinite, AllNanTensorOrNanLogprobIsItsOwnVerdict) {
  // n F32 elements, the first `nan` of them NaN, the same on both sides.
  auto all_nan = [](const std::string& name, size_t n, size_t nan) {
    std::vector<float> v(n, -0.5f);
    std::fill_n(v.begin(), nan, std::numeric_limits<float>::quiet_NaN());
    TensorRecord t = compared_tensor(name, 0, 0);
    t.shape_a = t.shape_b = std::vector<uint64_t>{n};
    t.metrics = compare(v, v, {n});
    t.metrics->is_logprob = t.is_logprob;
    return t;
  };
  Case c;
  c.id = "c";
  c.tensors = {all_nan("grads.w", 6, 5)};  // one finite element left: a match that proves something
  c.settle();
  EXPECT_EQ(c.verdict, Verdict::kExact);
  c.tensors = {all_nan("grads.w", 6, 6)};
  c.settle();
  EXPECT_EQ(c.verdict, Verdict::kNonFinite);
  c.tensors = {all_nan("logprobs.0", 6, 1)};
  c.settle();
  EXPECT_EQ(c.verdict, Verdict::kNonFinite);
  c.tensors.push_back(compared_tensor("entropy.0", 1, 3));  // a mismatch outranks it
  c.settle();
  EXPECT_EQ(c.verdict, Verdict::kMismatch);

  Report old = sample_sweep_report();
  Report now = old;
  sample_case(now, "tp1-full").tensors[0] = all_nan("logprobs", 3, 3);
  sample_case(now, "tp1-full").settle();
  EXPECT_EQ(now.overall(), Verdict::kMismatch);  // the sample's own mismatch case
  EXPECT_EQ(now.count(Verdict::kNonFinite), 1u);
  Report back = parse_report_json(render_json(now), "r.json");
  EXPECT_EQ(sample_case(back, "tp1-full").verdict, Verdict::kNonFinite);
  EXPECT_EQ(to_json(back)["summary"]["nonfinite"], 1);
  const fs::path csv = temp_file("nonfinite.csv");
  write_csv(now, csv.string());
  Report from_csv = read_report(csv.string());
  EXPECT_EQ(sample_case(from_csv, "tp1-full").verdict, Verdict::kNonFinite);
  const BaselineDiff d = compare_to_baseline(old, "old", now, "new");
  EXPECT_TRUE(d.regressed()) << format_baseline_diff(d);
  EXPECT_EQ(d.count(ChangeKind::kNewlyFailing), 1u) << format_baseline_diff(d);
  EXPECT_NE(format_baseline_diff(d).find("non-finite"), std::string::npos) << format_baseline_diff(d);
  const BaselineDiff back_to_exact = compare_to_baseline(now, "now", old, "old");
  EXPECT_EQ(back_to_exact.count(ChangeKind::kNewlyPassing), 1u) << format_baseline_diff(back_to_exact);
}

// --- a case that failed with an error; ranks and communication ---------------------

constexpr const char* kRankKilled = "rank 1 was killed by signal 9 during the case";

// The sample with its empty grid cell (tp2 / prefill) a case that failed on 2 ranks,
// and tp1-full run on 2 ranks with collectives.
Report sample_with_error() {
  Report r = sample_sweep_report();
  Case failed;
  failed.id = "tp2-prefill";
  failed.parameters = {
      {"model", "qwen3-tiny"}, {"contract", "v1"}, {"backend", "cpu"}, {"layout", "tp2"}, {"path", "prefill"}};
  failed.verdict = Verdict::kError;
  failed.error = kRankKilled;
  failed.seconds = 0.75;
  failed.ranks = 2;
  r.cases.push_back(failed);
  Case& two = sample_case(r, "tp1-full");
  two.ranks = 2;
  two.communication = {{"all_gather", 40, uint64_t{3} << 20}, {"all_to_all", 2, uint64_t{1} << 19}};
  return r;
}

TEST(ReportError, JsonRoundTripIsByteIdentical) {
  const Report r = sample_with_error();
  const std::string text = render_json(r);
  Report back = parse_report_json(text, "r.json");
  EXPECT_EQ(render_json(back), text);
  EXPECT_EQ(back.overall(), Verdict::kError);
  const Case& failed = sample_case(back, "tp2-prefill");
  EXPECT_EQ(failed.verdict, Verdict::kError);
  EXPECT_EQ(failed.error, kRankKilled);
  EXPECT_EQ(failed.seconds, 0.75);
  EXPECT_EQ(failed.ranks, 2);
  EXPECT_TRUE(failed.tensors.empty());
  const Case& two = sample_case(back, "tp1-full");
  EXPECT_EQ(two.ranks, 2);
  EXPECT_EQ(two.communication, sample_case(const_cast<Report&>(r), "tp1-full").communication);
  EXPECT_EQ(sample_case(back, "tp1-decode").ranks, std::nullopt);
  EXPECT_TRUE(sample_case(back, "tp1-decode").communication.empty());
}

TEST(ReportError, JsonMalformedNamesTheField) {
  const json good = json::parse(render_json(sample_with_error()));
  const size_t failed = good["cases"].size() - 1;
  const std::string at = "r.json: cases[" + std::to_string(failed) + "]";
  auto broken = [&](const std::function<void(json&)>& mutate) {
    json j = good;
    mutate(j);
    return json_error(j.dump());
  };
  EXPECT_EQ(broken([](json&) {}), "");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["error"] = "boom"; }),
            "r.json: cases[0].error: must be a string for a case with verdict \"error\" and null otherwise");
  EXPECT_EQ(broken([&](json& j) { j["cases"][failed]["error"] = nullptr; }),
            at + ".error: must be a string for a case with verdict \"error\" and null otherwise");
  EXPECT_EQ(broken([&](json& j) { j["cases"][failed].erase("error"); }), at + ".error: required field is missing");
  EXPECT_EQ(broken([](json& j) { j["summary"]["error"] = 0; }),
            "r.json: summary.error: disagrees with the rest of the report (expected 1)");
  EXPECT_EQ(broken([](json& j) { j["verdict"] = "mismatch"; }),
            "r.json: verdict: disagrees with the rest of the report (expected \"error\")");
  EXPECT_EQ(broken([&](json& j) { j["cases"][failed]["ranks"] = 0; }),
            at + ".ranks: expected an integer >= 1, found 0");
  EXPECT_EQ(broken([&](json& j) { j["cases"][failed]["ranks"] = -2; }),
            at + ".ranks: expected an integer >= 0, found -2");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["communication"] = json::array(); }),
            "r.json: cases[0].communication: is empty: a case that called no collectives has no \"communication\"");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["communication"][1]["collective"] = "all_gather"; }),
            "r.json: cases[0].communication[1].collective: collective \"all_gather\" appears twice");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["communication"][0]["bytes"] = 1.5; }),
            "r.json: cases[0].communication[0].bytes: expected an integer >= 0, found 1.5");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["communication"][0]["rank"] = 0; }),
            "r.json: cases[0].communication[0].rank: unknown field");
  EXPECT_EQ(broken([](json& j) { j["cases"][0]["communication"][0].erase("calls"); }),
            "r.json: cases[0].communication[0].calls: required field is missing");
}

TEST(ReportError, CsvCarriesTheVerdictAndMessage) {
  const Report r = sample_with_error();
  const fs::path p = temp_file("error.csv");
  write_csv(r, p.string());
  Report back = read_report(p.string());
  EXPECT_EQ(back.overall(), Verdict::kError);
  EXPECT_EQ(sample_case(back, "tp2-prefill").verdict, Verdict::kError);
  EXPECT_EQ(sample_case(back, "tp2-prefill").error, kRankKilled);
  EXPECT_EQ(sample_case(back, "tp2-prefill").seconds, 0.75);
  // CSV carries neither ranks nor communication (read.h); the rest comes back.
  Report same = back;
  same.command = r.command;
  same.created_utc = r.created_utc;
  same.environment = r.environment;
  sample_case(same, "moe-ep2-decode").skip_reason = "no GPU";
  sample_case(same, "tp2-prefill").ranks = 2;
  sample_case(same, "tp1-full").ranks = 2;
  sample_case(same, "tp1-full").communication = sample_case(const_cast<Report&>(r), "tp1-full").communication;
  EXPECT_EQ(render_json(same), render_json(r));
  // An error message on a case that did not fail is refused.
  std::string text = render_csv(r);
  const size_t row = text.find("\r\ntp1-decode,") + 2;
  const size_t error_field = text.find(",,complete" + empty_after_status() + "\r\n", row);  // error (empty), then run_status
  ASSERT_NE(error_field, std::string::npos);
  text.insert(error_field + 1, "boom");
  std::ofstream(p, std::ios::binary) << text;
  try {
    read_report_csv(p.string());
    ADD_FAILURE() << "read";
  } catch (const io::BadInput& e) {
    EXPECT_EQ(std::string(e.what()),
              p.string() + ": line 4, column error: must be empty unless case_verdict is \"error\"");
  }
}

// Issue 53 item 10: what bitparity writes it reads back. A CSV field holding line
// breaks (a rank's multi-line error, a model path, a tensor name) reads back whole
// (before: a line-by-line parser read each line as a row and refused the file); the
// RFC 4180 errors still name the line.
TEST(ReportRead, CsvFieldsWithLineBreaksReadBack) {
  Report r = sample_with_error();
  sample_case(r, "tp2-prefill").error = "rank 1 threw:\nCUDA error\r\n  at upload, \"weights\"";
  sample_case(r, "tp1-full").parameters["model"] = "/models/two\nlines";
  sample_case(r, "tp1-full").tensors[0].name = "logprobs\n.0";
  const fs::path p = temp_file("lines.csv");
  write_csv(r, p.string());
  EXPECT_EQ(render_json(with_what_csv_drops(read_report(p.string()), r)), render_json(r));
  auto error_of = [&p](const std::string& text) { return csv_error(p, text); };
  const std::string header = render_csv(r).substr(0, render_csv(r).find("\r\n") + 2);
  EXPECT_EQ(error_of(header + "a,\"b\r\n\r\nc"), p.string() + ": line 2: a quoted field is never closed");
  EXPECT_EQ(error_of(header + "a,b\"c\r\n"), p.string() + ": line 2: a '\"' inside a field that does not start with one");
  EXPECT_EQ(error_of(header + "\"a\nb\",\"c\"d\r\n"),
            p.string() + ": line 3: expected ',' or a line end after a closing quote");
  EXPECT_EQ(error_of(header + "\"a\nb\",c\r\n"), p.string() + ": line 2: has 2 fields; the header has 38");
  EXPECT_EQ(error_of(""), p.string() + ": CSV: no header: the file is empty");
  EXPECT_EQ(error_of("\xEF\xBB\xBF" + render_csv(r)), "") << "a byte order mark (a spreadsheet's save)";
}

// Issue 53 item 10: a JSON report past 64 MiB (a sweep of many tensors) reads back;
// inputs a user writes by hand keep their 64 MiB bound. (Before: "file is larger
// than 67108864 bytes".)
TEST(ReportRead, JsonReportPastSixtyFourMiBReadsBack) {
  Report r = sample_sweep_report();
  Case& c = sample_case(r, "tp1-full");
  const std::string long_name(4096, 'w');
  for (int i = 0; i < 17000; ++i) c.tensors.push_back(compared_tensor(long_name + std::to_string(i), 0, 0));
  const fs::path p = temp_file("large.json");
  write_json(r, p.string());
  ASSERT_GT(fs::file_size(p), uintmax_t{64} << 20);
  Report back = read_report(p.string());
  EXPECT_EQ(sample_case(back, "tp1-full").tensors.size(), c.tensors.size());
  fs::remove(p);
}

TEST(ReportBaseline, ErrorIsNewlyFailingAndItsEndNewlyPassing) {
  const Report old = sample_sweep_report();
  auto failing = [](Report r, const std::string& id, const std::string& message = kRankKilled) {
    Case& c = sample_case(r, id);
    c.verdict = Verdict::kError;
    c.error = message;
    c.tensors.clear();
    c.first_divergent_op.reset();
    return r;
  };
  auto changes = [](const Report& a, const Report& b) {
    const BaselineDiff d = compare_to_baseline(a, "old", b, "new");
    std::vector<std::string> out;
    for (const Change& c : d.changes)
      out.push_back(std::string(change_kind_title(c.kind)) + (c.regression ? " ! " : " ") + c.case_id + ": " +
                    c.detail);
    return out;
  };
  using V = std::vector<std::string>;
  const std::string killed = kRankKilled;
  // exact -> error: newly failing (its tensors are not listed as removed); back: newly passing.
  const Report exact_failed = failing(old, "tp1-full");
  EXPECT_EQ(changes(old, exact_failed), V{"newly failing ! tp1-full: exact -> error: " + killed});
  EXPECT_EQ(changes(exact_failed, old), V{"newly passing tp1-full: error: " + killed + " -> exact"});
  // mismatch -> error: newly failing too (the case no longer comes to a comparison);
  // error -> mismatch still fails, no regression.
  const Report mismatch_failed = failing(old, "tp2-decode");
  EXPECT_EQ(changes(old, mismatch_failed), V{"newly failing ! tp2-decode: mismatch -> error: " + killed});
  EXPECT_EQ(changes(mismatch_failed, old),
            V{"still failing, metrics changed tp2-decode: error: " + killed + " -> mismatch"});
  // skipped -> error: newly failing; error -> skipped: a skip change.
  const Report skipped_failed = failing(old, "moe-ep2-decode");
  EXPECT_EQ(changes(old, skipped_failed), V{"newly failing ! moe-ep2-decode: skipped -> error: " + killed});
  EXPECT_EQ(changes(skipped_failed, old), V{"skip changes moe-ep2-decode: error: " + killed + " -> skipped"});
  // Another message: listed, no regression; the same: no change.
  EXPECT_EQ(changes(exact_failed, failing(old, "tp1-full", "rank 0 threw: x")),
            V{"still failing, metrics changed tp1-full: error " + killed + " -> rank 0 threw: x"});
  EXPECT_TRUE(changes(exact_failed, exact_failed).empty());
  // A new case that fails is newly failing; an error case gone is no regression (it was never compared).
  const Report with_error = sample_with_error();
  const BaselineDiff added = compare_to_baseline(old, "old", with_error, "new");
  EXPECT_EQ(changes(old, with_error), V{"newly failing ! tp2-prefill: new case, error: " + killed});
  EXPECT_TRUE(added.regressed());
  EXPECT_EQ(changes(with_error, old),
            V{"cases removed tp2-prefill: was error: " + killed});
  EXPECT_FALSE(compare_to_baseline(with_error, "old", old, "new").regressed());
}

// Like time and peak, ranks and communication are measurements: never a change.
TEST(ReportBaseline, RanksAndCommunicationAreNoChange) {
  const Report old = sample_sweep_report();
  Report now = old;
  for (Case& c : now.cases) {
    c.ranks = 4;
    c.communication = {{"all_reduce", 7, 1234}};
  }
  const BaselineDiff d = compare_to_baseline(old, "old", now, "new");
  EXPECT_TRUE(d.changes.empty()) << format_baseline_diff(d);
  EXPECT_TRUE(compare_to_baseline(now, "old", old, "new").changes.empty());
}

TEST(ReportBaseline, AmbiguousTensorNamesAreBadInput) {
  Report r = sample_sweep_report();
  r.cases[0].tensors.push_back(r.cases[0].tensors[0]);
  EXPECT_THROW(compare_to_baseline(r, "old.json", sample_sweep_report(), "new.json"), io::BadInput);
}

// --- HTML as text ------------------------------------------------------------------

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(ReportHtml, GridCellsHistogramsAndEscaping) {
  const Report r = sample_sweep_report();
  const std::string h = render_html(r, "sweep<1>.json", nullptr);
  EXPECT_EQ(count(h, "<table class=\"grid\""), 2u);
  EXPECT_EQ(count(h, "<td class=\"cell "), static_cast<size_t>(test::kSampleGridCells));
  EXPECT_EQ(count(h, "<td class=\"cell v-none\""), 1u);      // tp2 / prefill
  EXPECT_EQ(count(h, "<td class=\"cell v-mismatch\""), 1u);  // tp2 / decode
  EXPECT_EQ(count(h, "<td class=\"cell v-skipped\""), 1u);   // the MoE group
  EXPECT_EQ(count(h, "<svg class=\"hist\""), 1u);            // one mismatching compared tensor
  EXPECT_EQ(count(h, "<section class=\"case\""), r.cases.size());
  EXPECT_EQ(h.find("<script"), std::string::npos);  // the hostile tensor name is text
  EXPECT_NE(h.find("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"), std::string::npos);
  EXPECT_NE(h.find("moe&lt;&amp;&gt;&quot;"), std::string::npos);
  EXPECT_NE(h.find("sweep&lt;1&gt;.json"), std::string::npos);
  EXPECT_EQ(html_escape(std::string("a\x01\x7f")), "a\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(h.find("http"), std::string::npos);  // no external resource
  EXPECT_EQ(h.find("id=\"baseline\""), std::string::npos);
  // The table of cases: a row per case with its time and peak in human units.
  EXPECT_EQ(count(h, "<table class=\"cases\">"), 1u);
  EXPECT_NE(h.find("<th>time</th><th>peak device memory</th>"), std::string::npos);
  EXPECT_NE(h.find("<td class=\"num\" title=\"0.625000 s\">625 ms</td><td class=\"num\">&ndash;</td></tr>"),
            std::string::npos);
  EXPECT_NE(h.find("<td class=\"num\" title=\"75.500000 s\">1 min 16 s</td><td class=\"num\" title=\"1610612736 "
                   "bytes\">1.5 GiB</td></tr>"),
            std::string::npos);
  const BaselineDiff d = compare_to_baseline(r, "old<.json", r, "new");
  EXPECT_NE(render_html(r, "r.json", &d).find("<h2>Against baseline <code>old&lt;.json</code></h2>"), std::string::npos);
}

// Issue 54: a case holding captured ops shows them as a layers × ops heat map in
// execution order: exact cells green, the others their largest ULP distance (darker
// red with its log2), the first divergent op outlined; a case without ops has none.
TEST(ReportHtml, HeatMapOfCapturedOps) {
  Report r = sample_sweep_report();
  Case& c = sample_case(r, "tp1-full");
  c.tensors = {compared_tensor("ops.embed", 0, 0), compared_tensor("ops.layers.0.q_proj", 0, 0),
               compared_tensor("ops.layers.0.attn", 3, 5000), compared_tensor("ops.layers.1.q_proj", 1, 1),
               compared_tensor("ops.logits", 0, 0), compared_tensor("logprobs.0", 0, 0)};
  c.first_divergent_op = "layers.0.attn";
  c.settle();
  const std::string h = render_html(r, "r.json", nullptr);
  EXPECT_EQ(count(h, "<table class=\"heat\">"), 1u) << "only the case with captured ops";
  const std::string heat = h.substr(h.find("<table class=\"heat\">"), h.find("</table></figure>", h.find("class=\"heat\"")) -
                                                                         h.find("<table class=\"heat\">"));
  // Columns in execution order, only the ops present: embed, q_proj, attn, logits.
  EXPECT_NE(heat.find("<th>embed</th><th>q_proj</th><th>attn</th><th>logits</th>"), std::string::npos) << heat;
  EXPECT_NE(heat.find("<th class=\"row\">model</th><td class=\"exact\""), std::string::npos) << heat;
  EXPECT_EQ(count(heat, "<td class=\"exact\""), 3u);  // embed, layers.0.q_proj, logits
  EXPECT_NE(heat.find("<td class=\"off first\" style=\"background:hsl(0,70%,60%)\" title=\"ops.layers.0.attn: 3 of 8 "
                      "differ, max 5000 ulp\">2^12</td>"),
            std::string::npos)
      << heat;
  EXPECT_NE(heat.find("<td class=\"off\" style=\"background:hsl(0,70%,85%)\" title=\"ops.layers.1.q_proj: 1 of 8 differ, "
                      "max 1 ulp\">1</td>"),
            std::string::npos)
      << heat;
  EXPECT_EQ(heat.find("logprobs"), std::string::npos);
}

// Schema 6: where a case's tensors have truth errors, a table of them (each side's max
// and mean ulp from the float64 truth, and A's mean over B's), and beside the heat map
// of its captured ops a second one of that ratio: green where the engine is as close to
// the truth as the contract or closer, red darker with the ratio's log2 where it is
// farther, grey where a side is missing; the numbers on hover, a legend below.
TEST(ReportHtml, TruthErrorsBesideTheHeatMap) {
  Report r = sample_sweep_report();
  Case& c = sample_case(r, "tp1-full");
  c.tensors = {compared_tensor("ops.embed", 0, 0), compared_tensor("ops.layers.0.q_proj", 0, 0),
               compared_tensor("ops.layers.0.attn", 0, 0), compared_tensor("ops.layers.1.q_proj", 0, 0),
               compared_tensor("ops.logits", 0, 0), compared_tensor("logprobs.0", 0, 0)};
  c.settle();
  const std::string plain = render_html(r, "r.json", nullptr);
  EXPECT_EQ(count(plain, "<table class=\"heat\">"), 1u);
  EXPECT_EQ(count(plain, "<table class=\"heat truth\">"), 0u) << "no truth errors, no second map";
  EXPECT_EQ(count(plain, "<table class=\"truth\">"), 0u);
  EXPECT_EQ(plain.find("float64 truth"), std::string::npos);

  c.tensors[0].truth_error_a = c.tensors[0].truth_error_b = TruthError{1, 0.25};  // as close: 1
  c.tensors[1].truth_error_a = TruthError{0.5, 0.125};                             // closer: 0.5
  c.tensors[1].truth_error_b = TruthError{1, 0.25};
  c.tensors[2].truth_error_a = TruthError{40, 8};  // 16 times farther
  c.tensors[2].truth_error_b = TruthError{1, 0.5};
  c.tensors[3].truth_error_a = TruthError{INFINITY, INFINITY};  // a NaN: infinitely farther
  c.tensors[3].truth_error_b = TruthError{0.5, 0.25};
  c.tensors[4].truth_error_a = TruthError{1, 0.5};  // the contract's not measured
  c.tensors[5].truth_error_a = TruthError{3, 1};    // no op: in the table only
  c.tensors[5].truth_error_b = TruthError{0.5, 0.5};
  const std::string h = render_html(r, "r.json", nullptr);
  EXPECT_EQ(count(h, "<table class=\"heat\">"), 1u);
  ASSERT_EQ(count(h, "<table class=\"heat truth\">"), 1u);
  EXPECT_NE(h.find("<div class=\"heats\">\n<figure>"), std::string::npos);  // side by side
  const size_t from = h.find("<table class=\"heat truth\">");
  const std::string map = h.substr(from, h.find("</figure>", from) - from);
  EXPECT_NE(h.rfind("<figcaption>Error against float64 truth, engine / contract (mean ulp ratio)</figcaption>", from),
            std::string::npos);
  // The first map's rows and columns.
  EXPECT_NE(map.find("<th>embed</th><th>q_proj</th><th>attn</th><th>logits</th>"), std::string::npos) << map;
  EXPECT_NE(map.find("<td class=\"better\" title=\"ops.embed: engine (A) max 1 / mean 0.25 ulp; contract (B) max 1 / "
                     "mean 0.25 ulp; ratio 1\">1</td>"),
            std::string::npos)
      << map;
  EXPECT_NE(map.find("<td class=\"better\" title=\"ops.layers.0.q_proj: engine (A) max 0.5 / mean 0.125 ulp; contract "
                     "(B) max 1 / mean 0.25 ulp; ratio 0.5\">0.5</td>"),
            std::string::npos)
      << map;
  EXPECT_NE(map.find("<td class=\"worse\" style=\"background:hsl(0,70%,65%)\" title=\"ops.layers.0.attn: engine (A) "
                     "max 40 / mean 8 ulp; contract (B) max 1 / mean 0.5 ulp; ratio 16\">16</td>"),
            std::string::npos)
      << map;
  EXPECT_NE(map.find("<td class=\"worse\" style=\"background:hsl(0,70%,45%)\" title=\"ops.layers.1.q_proj: engine (A) "
                     "max inf / mean inf ulp; contract (B) max 0.5 / mean 0.25 ulp; ratio inf\">inf</td>"),
            std::string::npos)
      << map;
  EXPECT_NE(map.find("<td class=\"unmeasured\" title=\"ops.logits: engine (A) max 1 / mean 0.5 ulp; contract (B) not "
                     "measured\">&ndash;</td>"),
            std::string::npos)
      << map;
  EXPECT_EQ(map.find("logprobs"), std::string::npos);
  // Its legend, after the map.
  EXPECT_NE(h.find("<table class=\"legend\"><tr><td class=\"better\">&le; 1</td><td class=\"worse\" "
                   "style=\"background:hsl(0,70%,80%)\">2</td>",
                   from),
            std::string::npos);
  // The case's table: every tensor with truth errors, the logprobs too.
  ASSERT_EQ(count(h, "<table class=\"truth\">"), 1u);
  const size_t table = h.find("<table class=\"truth\">");
  const std::string rows = h.substr(table, h.find("</table>", table) - table);
  EXPECT_EQ(count(rows, "<tr><td>"), 6u);
  EXPECT_NE(rows.find("<tr><td>logprobs.0</td><td class=\"num\">3</td><td class=\"num\">1</td><td class=\"num\">0.5"
                      "</td><td class=\"num\">0.5</td><td class=\"num worse\" style=\"background:hsl(0,70%,80%)\">2"
                      "</td></tr>"),
            std::string::npos)
      << rows;
  EXPECT_NE(rows.find("<tr><td>ops.logits</td><td class=\"num\">1</td><td class=\"num\">0.5</td><td class=\"num\">"
                      "&ndash;</td><td class=\"num\">&ndash;</td><td class=\"num unmeasured\">&ndash;</td></tr>"),
            std::string::npos)
      << rows;
  // A case with truth errors but no captured ops: the table, no map.
  Report no_ops = sample_sweep_report();
  sample_case(no_ops, "tp1-decode").tensors[0].truth_error_a = TruthError{1, 1};
  const std::string t = render_html(no_ops, "r.json", nullptr);
  EXPECT_EQ(count(t, "<table class=\"truth\">"), 1u);
  EXPECT_EQ(count(t, "<table class=\"heat"), 0u);
}

TEST(ReportHtml, ErrorCaseAndCommunication) {
  const Report r = sample_with_error();
  const std::string h = render_html(r, "r.json", nullptr);
  EXPECT_EQ(count(h, "<td class=\"cell v-none\""), 0u);  // tp2 / prefill now holds the failed case
  EXPECT_EQ(count(h, "<td class=\"cell v-error\""), 1u);
  EXPECT_NE(h.find("<span class=\"verdict v-error\">error</span> <code>r.json</code>"), std::string::npos);
  EXPECT_NE(h.find("8 cases: 4 exact, 2 mismatch, 0 nonfinite, 1 error, 1 skipped"), std::string::npos);
  EXPECT_NE(h.find("<p class=\"error\">Error: rank 1 was killed by signal 9 during the case</p>"), std::string::npos);
  EXPECT_NE(h.find("<p class=\"communication\">Ran on 2 ranks; 3.5 MiB moved in 42 collectives: all_gather 40 calls, "
                   "3 MiB; all_to_all 2 calls, 512 KiB</p>"),
            std::string::npos);
  EXPECT_NE(h.find("<p class=\"communication\">Ran on 2 ranks</p>"), std::string::npos);  // the failed case
  EXPECT_EQ(count(h, "<p class=\"communication\">"), 2u);  // single-process cases: no line
}

}  // namespace
}  // namespace bp::harness
