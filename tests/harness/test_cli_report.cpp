// `bitparity report` end to end: the REAL binary on reports written by the report
// writers; exit codes 0/1/2/3 with and without --baseline; malformed JSON and CSV
// named by file and field; --html written atomically and never by a failed run;
// and the page loaded in headless Chromium (grid present, no console error).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "harness/report/report.h"
#include "support/cli_run.h"
#include "support/golden.h"
#include "support/sample_report.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using harness::Report;
using test::compared_tensor;
using test::sample_case;
using test::sample_sweep_report;

class CliReport : public test::CliTest {
 protected:
  std::string json_report(const std::string& leaf, const Report& r) const {
    harness::write_json(r, path(leaf));
    return path(leaf);
  }

};

size_t count_lines_with(const std::string& text, const std::string& what) {
  std::istringstream lines(text);
  size_t n = 0;
  for (std::string line; std::getline(lines, line);) n += line.find(what) != std::string::npos;
  return n;
}

Report exact_only() {
  Report r = sample_sweep_report();
  r.cases.resize(4);  // the four exact grid cases
  return r;
}

TEST_F(CliReport, VerdictWithoutBaseline) {
  EXPECT_EQ(run("report '" + json_report("exact.json", exact_only()) + "'"), 0) << err_;
  EXPECT_NE(out_.find("4 cases: 4 exact, 0 mismatch, 0 nonfinite, 0 error, 0 skipped"), std::string::npos) << out_;
  EXPECT_NE(out_.find("verdict: exact"), std::string::npos);
  EXPECT_EQ(run("report '" + json_report("sweep.json", sample_sweep_report()) + "'"), 1) << err_;
  EXPECT_NE(out_.find("MISMATCH tp2-decode: first tensor logprobs (compared), first divergent op layer0.mlp.down_proj"),
            std::string::npos)
      << out_;
  // A CSV report reads the same way.
  harness::write_csv(sample_sweep_report(), path("sweep.csv"));
  EXPECT_EQ(run("report '" + path("sweep.csv") + "'"), 1) << err_;
  Report skipped_only = sample_sweep_report();
  skipped_only.cases = {sample_case(skipped_only, "moe-ep2-decode")};
  EXPECT_EQ(run("report '" + json_report("skipped.json", skipped_only) + "'"), 0) << err_;
}

TEST_F(CliReport, BaselineRegressionsExitOne) {
  const std::string old = json_report("old.json", sample_sweep_report());
  Report now = sample_sweep_report();
  sample_case(now, "tp1-full").tensors[0] = compared_tensor("logprobs", 2, 1);
  sample_case(now, "tp1-full").settle();
  EXPECT_EQ(run("report '" + json_report("now.json", now) + "' --baseline '" + old + "'"), 1) << err_;
  EXPECT_NE(out_.find("newly failing (1):\n  ! tp1-full / logprobs: 2/8 differ"), std::string::npos) << out_;
  EXPECT_NE(out_.find("baseline: REGRESSION"), std::string::npos);
  // A compared case that disappeared is a regression too; the baseline may be CSV.
  harness::write_csv(sample_sweep_report(), path("old.csv"));
  Report fewer = sample_sweep_report();
  fewer.cases.erase(fewer.cases.begin());
  EXPECT_EQ(run("report '" + json_report("fewer.json", fewer) + "' --baseline '" + path("old.csv") + "'"), 1) << err_;
  EXPECT_NE(out_.find("cases removed (1):\n  ! tp1-full: was exact"), std::string::npos) << out_;
}

// A report holding a case that failed with an error exits 3, as the sweep that wrote
// it did (after its reports); against a baseline, exact -> error is a regression.
TEST_F(CliReport, ErrorCaseExitsThreeAndRegressesAgainstABaseline) {
  Report failed = sample_sweep_report();
  harness::Case& c = sample_case(failed, "tp1-full");
  c.verdict = harness::Verdict::kError;
  c.error = "rank 1 threw: \x1b[31mboom";
  c.tensors.clear();
  const std::string now = json_report("failed.json", failed);
  EXPECT_EQ(run("report '" + now + "'"), 3) << err_;
  EXPECT_NE(out_.find("7 cases: 3 exact, 2 mismatch, 0 nonfinite, 1 error, 1 skipped"), std::string::npos) << out_;
  EXPECT_NE(out_.find("  ERROR tp1-full: rank 1 threw: \\x1b[31mboom\n"), std::string::npos) << out_;
  EXPECT_NE(out_.find("verdict: error"), std::string::npos) << out_;
  harness::write_csv(failed, path("failed.csv"));
  EXPECT_EQ(run("report '" + path("failed.csv") + "'"), 3) << err_;
  EXPECT_EQ(run("report '" + now + "' --baseline '" + json_report("old.json", sample_sweep_report()) + "'"), 1) << err_;
  EXPECT_NE(out_.find("newly failing (1):\n  ! tp1-full: exact -> error: rank 1 threw: \\x1b[31mboom"),
            std::string::npos)
      << out_;
  EXPECT_EQ(run("report '" + path("old.json") + "' --baseline '" + now + "'"), 0) << err_;
  EXPECT_NE(out_.find("newly passing (1):\n    tp1-full: error: rank 1 threw"), std::string::npos) << out_;
}

TEST_F(CliReport, BaselineImprovementsExitZero) {
  const std::string old = json_report("old.json", sample_sweep_report());
  Report now = sample_sweep_report();
  sample_case(now, "tp2-decode").tensors[0] = compared_tensor("logprobs", 0, 0);
  sample_case(now, "tp2-decode").settle();
  // The report still mismatches ("other"), but nothing newly fails.
  EXPECT_EQ(run("report '" + json_report("now.json", now) + "' --baseline '" + old + "'"), 0) << err_;
  EXPECT_NE(out_.find("newly passing (1):\n    tp2-decode / logprobs: was 3/8 differ"), std::string::npos) << out_;
  EXPECT_NE(out_.find("baseline: no regression"), std::string::npos);
  EXPECT_EQ(run("report '" + old + "' --baseline '" + old + "'"), 0) << err_;
  EXPECT_NE(out_.find("  no changes\n"), std::string::npos) << out_;
}

TEST_F(CliReport, MalformedReportsExitTwoNamingFileAndField) {
  std::string text = read(json_report("r.json", sample_sweep_report()));
  text.replace(text.find("\"mismatches\": 0"), 15, "\"mismatches\": \"none\"");
  std::ofstream(path("bad.json"), std::ios::binary) << text;
  EXPECT_EQ(run("report '" + path("bad.json") + "'"), 2);
  EXPECT_EQ(err_, "bitparity report: bad input: " + path("bad.json") +
                      ": cases[0].tensors[0].metrics.mismatches: expected an integer >= 0, found \"none\"\n");
  std::ofstream(path("trunc.json"), std::ios::binary) << text.substr(0, 100);
  EXPECT_EQ(run("report '" + path("trunc.json") + "'"), 2);
  EXPECT_NE(err_.find(path("trunc.json") + ": "), std::string::npos) << err_;
  // As a baseline too.
  EXPECT_EQ(run("report '" + path("r.json") + "' --baseline '" + path("bad.json") + "'"), 2);
  EXPECT_NE(err_.find("bad.json: cases[0].tensors[0].metrics.mismatches"), std::string::npos) << err_;

  harness::write_csv(sample_sweep_report(), path("r.csv"));
  std::string csv = read(path("r.csv"));
  csv.replace(csv.find("[8],[8],true"), 12, "[8],[8],maybe");
  std::ofstream(path("bad.csv"), std::ios::binary) << csv;
  EXPECT_EQ(run("report '" + path("bad.csv") + "'"), 2);
  EXPECT_EQ(err_, "bitparity report: bad input: " + path("bad.csv") +
                      ": line 2, column bit_identical: expected true or false, found \"maybe\"\n");
  // A report of a schema before 3 (no case times) asks for a re-run.
  std::string v2 = read(path("r.json"));
  v2.replace(v2.find("\"schema_version\": 6"), 19, "\"schema_version\": 2");
  std::ofstream(path("v2.json"), std::ios::binary) << v2;
  EXPECT_EQ(run("report '" + path("v2.json") + "'"), 2);
  EXPECT_EQ(err_, "bitparity report: bad input: " + path("v2.json") +
                      ": schema_version: this bitparity reads schema_version 3 to 6; this report's is 2; re-run the "
                      "command that wrote it\n");
  EXPECT_EQ(run("report '" + path("missing.json") + "'"), 2);
  EXPECT_NE(err_.find("missing.json"), std::string::npos);
  EXPECT_EQ(run("report"), 2);  // REPORT is required
}

// A case whose tensors have both sides' truth errors (conform: the engine's and the
// contract's distance from the float64 truth) gets one line: in how many tensors the
// engine is the farther, and the worst of them; JSON and CSV alike.
TEST_F(CliReport, TruthErrorsInTheSummary) {
  Report r = exact_only();
  std::vector<harness::TensorRecord>& t = r.cases[0].tensors;  // tp1-full: logprobs, a gradient
  t[0].truth_error_a = harness::TruthError{4, 2};
  t[0].truth_error_b = t[1].truth_error_a = t[1].truth_error_b = harness::TruthError{1, 0.5};
  r.cases[1].tensors[0].truth_error_a = harness::TruthError{1, 0.5};  // one side only: no line
  const std::string farther = "  TRUTH tp1-full: the engine is farther from the float64 truth than the contract in 1 "
                              "of 2 tensors, most in logprobs (mean 2 / 0.5 ulp)\n";
  EXPECT_EQ(run("report '" + json_report("truth.json", r) + "'"), 0) << err_;
  EXPECT_NE(out_.find(farther), std::string::npos) << out_;
  EXPECT_EQ(count_lines_with(out_, "TRUTH"), 1u) << out_;
  harness::write_csv(r, path("truth.csv"));
  EXPECT_EQ(run("report '" + path("truth.csv") + "'"), 0) << err_;
  EXPECT_NE(out_.find(farther), std::string::npos) << out_;
  t[0].truth_error_a = harness::TruthError{1, 0.5};
  EXPECT_EQ(run("report '" + json_report("truth.json", r) + "'"), 0) << err_;
  EXPECT_NE(out_.find("  TRUTH tp1-full: the engine is no farther from the float64 truth than the contract in any "
                      "of 2 tensors\n"),
            std::string::npos)
      << out_;
  EXPECT_EQ(run("report '" + json_report("exact.json", exact_only()) + "'"), 0) << err_;
  EXPECT_EQ(out_.find("TRUTH"), std::string::npos) << out_;
}

// Issue 53 item 15: last month's report, committed as a CI baseline, survives the
// upgrade: reports written by the builds of schema 3, 4 and 5 (fixtures/reports/) are read
// and compared, JSON and CSV; before, `report` refused them (exit 2, "re-run").
TEST_F(CliReport, ReportsOfEarlierSchemasServeAsBaselines) {
  const std::string old3 = test::source_path("fixtures/reports/schema3.json");
  const std::string old4 = test::source_path("fixtures/reports/schema4.csv");
  const std::string old5 = test::source_path("fixtures/reports/schema5.csv");
  EXPECT_EQ(run("report '" + old3 + "'"), 1) << err_;  // its run had two mismatches (the +ring control)
  EXPECT_NE(out_.find("10 cases"), std::string::npos) << out_;
  EXPECT_EQ(run("report '" + old4 + "' --baseline '" + old3 + "'"), 0) << out_ << err_;
  EXPECT_EQ(run("report '" + old5 + "' --baseline '" + old4 + "'"), 0) << out_ << err_;
}

TEST_F(CliReport, HtmlIsAtomicAndAFailedRunKeepsTheEarlierPage) {
  const std::string r = json_report("r.json", sample_sweep_report());
  const std::string page = path("page.html");
  EXPECT_EQ(run("report '" + r + "' --html '" + page + "'"), 1) << err_;
  const std::string first = read(page);
  EXPECT_NE(first.find("<table class=\"grid\""), std::string::npos);
  EXPECT_NE(first.find(">1.5 GiB</td>"), std::string::npos);  // "other"'s peak device memory
  std::ofstream(path("bad.json"), std::ios::binary) << "{";
  EXPECT_EQ(run("report '" + path("bad.json") + "' --html '" + page + "'"), 2);
  EXPECT_EQ(run("report '" + r + "' --baseline '" + path("bad.json") + "' --html '" + page + "'"), 2);
  EXPECT_EQ(read(page), first);
  fs::create_directory(path("dir.html"));
  EXPECT_EQ(run("report '" + r + "' --html '" + path("dir.html") + "'"), 2);
  EXPECT_NE(err_.find("dir.html: --html: is a directory"), std::string::npos) << err_;
  EXPECT_EQ(run("report '" + r + "' --html '" + path("nodir/p.html") + "'"), 2);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST_F(CliReport, HelpDocumentsExitCodes) {
  EXPECT_EQ(run("report --help"), 0);
  EXPECT_NE(out_.find("--baseline"), std::string::npos) << out_;
  EXPECT_NE(out_.find("newly fails"), std::string::npos) << out_;
  EXPECT_NE(out_.find("2 for an unreadable or malformed report"), std::string::npos) << out_;
  EXPECT_NE(out_.find("3 a case that failed with an error"), std::string::npos) << out_;
}

// --- the page in a browser ---------------------------------------------------------

// Headless Chromium on `html`: the serialised DOM in dom_, every console line
// (Chromium logs console messages, errors and uncaught exceptions as "CONSOLE") in
// console_. Returns the exit code.
class CliReportBrowser : public CliReport {
 protected:
  int load(const std::string& html) {
    const std::string profile = path("chromium-profile");
    const int rc = shell("timeout 60 chromium --headless --no-sandbox --disable-gpu --no-first-run "
                         "--user-data-dir='" + profile + "' --enable-logging=stderr --v=0 --dump-dom 'file://" +
                         html + "'");
    dom_ = out_;
    console_.clear();
    std::istringstream lines(err_);
    for (std::string line; std::getline(lines, line);)
      if (line.find(":CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos)
        console_ += line + "\n";
    return rc;
  }
  std::string dom_, console_;
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST_F(CliReportBrowser, PageLoadsWithTheGridAndNoConsoleErrors) {
  ASSERT_EQ(std::system("command -v chromium >/dev/null 2>&1"), 0)
      << "chromium is not installed: run scripts/setup (it installs the Debian package chromium)";
  const std::string old = json_report("old.json", sample_sweep_report());
  Report now = sample_sweep_report();
  sample_case(now, "tp1-full").tensors[0] = compared_tensor("logprobs", 1, 1);
  // Captured ops with truth errors: the heat map, its truth twin beside it, the table of them.
  const std::pair<const char*, double> engine_mean_ulp[] = {{"ops.embed", 0.25}, {"ops.layers.0.attn", 2}};
  for (const auto& [op, mean] : engine_mean_ulp) {
    harness::TensorRecord t = compared_tensor(op, 0, 0);
    t.truth_error_a = harness::TruthError{4 * mean, mean};
    t.truth_error_b = harness::TruthError{1, 0.5};
    sample_case(now, "tp1-full").tensors.push_back(t);
  }
  sample_case(now, "tp1-full").settle();
  const std::string page = path("page.html");
  ASSERT_EQ(run("report '" + json_report("now.json", now) + "' --baseline '" + old + "' --html '" + page + "'"), 1)
      << err_;

  ASSERT_EQ(load(page), 0) << err_;
  EXPECT_NE(dom_.find("</html>"), std::string::npos) << "the page did not load";
  EXPECT_EQ(count(dom_, "<table class=\"grid\""), 2u);
  EXPECT_EQ(count(dom_, "<td class=\"cell "), static_cast<size_t>(test::kSampleGridCells));
  EXPECT_EQ(count(dom_, "<svg class=\"hist\""), 2u);  // tp1-full and tp2-decode logprobs
  EXPECT_NE(dom_.find("id=\"baseline\""), std::string::npos);
  EXPECT_EQ(count(dom_, "<table class=\"heat\">"), 1u);
  EXPECT_EQ(count(dom_, "<table class=\"heat truth\">"), 1u);
  EXPECT_EQ(count(dom_, "<table class=\"legend\">"), 1u);
  EXPECT_EQ(count(dom_, "<table class=\"truth\">"), 1u);
  EXPECT_EQ(dom_.find("<script"), std::string::npos);  // hostile names stayed text
  EXPECT_EQ(console_, "");

  // Negative control: the same page with a script error is caught.
  std::ofstream(path("broken.html"), std::ios::binary)
      << read(page) << "<script>console.error('broken'); no_such_function();</script>\n";
  ASSERT_EQ(load(path("broken.html")), 0) << err_;
  EXPECT_NE(console_.find("no_such_function"), std::string::npos) << err_;
}

}  // namespace
}  // namespace bp
