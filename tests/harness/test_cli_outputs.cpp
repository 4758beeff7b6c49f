// Where the REAL bitparity binary writes, run through the shell: two outputs on one
// file and an output that is an input are refused; a symbolic link is written through
// to its target, "-" and FIFOs straight; an unwritable folder is found before the
// first case, and a report lost at the end costs only itself; a reader that goes
// away (`| head -1`) costs no report; an interrupted run's report says so (exit 130,
// also from CSV); control characters in names reach the terminal escaped; stale
// temporaries of killed writers are cleaned up.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/io/safetensors.h"
#include "harness/report/report.h"
#include "support/cli_run.h"
#include "support/golden.h"
#include "support/sample_report.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A small, fast sweep: the dense fixture, one contract, short sequences.
const std::string kSmall = "--model qwen3-dense-tiny --contract bf16-fmaseq-v1 --lengths 5,9 ";

class CliOutputs : public test::CliTest {
 protected:
  // A dump holding F32 tensors `names`, each [2] = {1, value}.
  std::string dump(const std::string& leaf, const std::vector<std::string>& names, float value = 2) {
    static std::vector<std::vector<float>> keep;  // the bytes outlive the write
    keep.push_back({1, value});
    std::vector<io::WriteTensor> t;
    for (const std::string& n : names)
      t.push_back({n, io::DType::F32, {2}, {reinterpret_cast<const uint8_t*>(keep.back().data()), 8}});
    io::write_safetensors(path(leaf), std::move(t));
    return path(leaf);
  }
  std::string two_dumps() {
    a_ = dump("a.safetensors", {"logprobs"});
    b_ = dump("b.safetensors", {"logprobs"});
    return "diff " + a_ + " " + b_;
  }
  // Runs `args` in the test's directory (relative paths land there).
  int run_here(const std::string& args) {
    return shell("cd '" + dir_.string() + "' && '" + BP_BITPARITY_EXE + "' " + args);
  }
  static bool is_report(const std::string& text) { return json::accept(text) && json::parse(text)["tool"] == "bitparity"; }
  std::string a_, b_;
};

// Item 7: two outputs on one file, by any spelling, and "-" twice, are refused
// before anything is written.
TEST_F(CliOutputs, TwoOutputsOnOneFileAreRefused) {
  const std::string diff = two_dumps();
  const std::string r = path("r.json");
  ASSERT_EQ(run(diff + " --json " + r), 0) << err_;
  const std::string before = read(r);
  fs::create_directories(path("sub"));
  fs::create_symlink(r, path("link.json"));
  for (const std::string& csv : {r, path("sub/../r.json"), path("link.json")}) {
    EXPECT_EQ(run(diff + " --json " + r + " --csv " + csv), 2) << csv << ": " << err_;
    EXPECT_NE(err_.find(csv + ": --csv: is also the --json output"), std::string::npos) << err_;
    EXPECT_EQ(err_.find('\n'), err_.size() - 1) << "one message line: " << err_;
    EXPECT_EQ(read(r), before);
  }
  EXPECT_EQ(run_here(diff + " --json - --csv -"), 2) << err_;
  EXPECT_NE(err_.find("-: --csv: is also the --json output (-): one file per output; at most one output may be "
                      "standard output"),
            std::string::npos)
      << err_;
  EXPECT_FALSE(fs::exists(path("-")));
  EXPECT_EQ(run(diff + " --json " + path("r2.json") + " --junit " + path("./r2.json")), 2) << err_;
  EXPECT_FALSE(fs::exists(path("r2.json")));
}

// Item 7: an output that is one of the command's inputs is refused, the input untouched.
TEST_F(CliOutputs, AnOutputThatIsAnInputIsRefused) {
  const std::string diff = two_dumps();
  const std::string dump_a = read(a_);
  EXPECT_EQ(run(diff + " --json " + a_), 2);
  EXPECT_NE(err_.find(a_ + ": --json: is the input " + a_ + ": writing it would destroy it"), std::string::npos) << err_;
  EXPECT_EQ(run(diff + " --csv " + path("./b.safetensors")), 2);
  EXPECT_NE(err_.find("--csv: is the input " + b_), std::string::npos) << err_;
  EXPECT_EQ(run("bisect " + a_ + " " + b_ + " --json " + a_), 2);
  EXPECT_NE(err_.find("--json: is the input"), std::string::npos) << err_;
  EXPECT_EQ(read(a_), dump_a);

  // report R --html R, and R as the baseline's page.
  harness::write_json(test::sample_sweep_report(), path("R.json"));
  const std::string report = read(path("R.json"));
  EXPECT_EQ(run("report " + path("R.json") + " --html " + path("R.json")), 2);
  EXPECT_NE(err_.find("--html: is the input"), std::string::npos) << err_;
  EXPECT_EQ(run("report " + path("R.json") + " --baseline " + path("R.json") + " --html " + path("R.json")), 2);
  EXPECT_EQ(read(path("R.json")), report);

  // run --out onto a file of the checkpoint it reads (a directory with only a config:
  // generated weights), and sweep/run reports onto the plan or tokens file.
  fs::create_directories(path("ckpt"));
  fs::copy_file(test::source_path("fixtures/models/qwen3-dense-tiny/config.json"), path("ckpt/config.json"));
  const std::string config = read(path("ckpt/config.json"));
  EXPECT_EQ(run("run --lengths 5,9 --model " + path("ckpt") + " --out " + path("ckpt/config.json")), 2);
  EXPECT_NE(err_.find("--out: is the input " + path("ckpt/config.json")), std::string::npos) << err_;
  EXPECT_EQ(read(path("ckpt/config.json")), config);
  const std::string plan = write("plan.json", "{\"tokens\": {\"file\": \"tokens.json\"}}");
  const std::string tokens = write("tokens.json", "{\"sequences\": [[1, 2, 3]]}");
  EXPECT_EQ(run("sweep " + kSmall + "--plan " + plan + " --json " + plan), 2);
  EXPECT_NE(err_.find("--json: is the input " + plan), std::string::npos) << err_;
  EXPECT_EQ(run("run --plan " + plan + " --out " + tokens), 2);
  EXPECT_NE(err_.find("--out: is the input " + tokens), std::string::npos) << err_;
  EXPECT_EQ(read(tokens), "{\"sequences\": [[1, 2, 3]]}");
}

// Item 8: a report path that is a symbolic link (also a dangling one) is written
// through, atomically at its target; the link stays.
TEST_F(CliOutputs, SymbolicLinksAreWrittenThrough) {
  const std::string diff = two_dumps();
  fs::create_directories(path("real"));
  fs::create_symlink(path("real/r.json"), path("dangling.json"));
  fs::create_symlink("real/r.csv", path("relative.csv"));
  write("real/r.csv", "old");
  ASSERT_EQ(run(diff + " --json " + path("dangling.json") + " --csv " + path("relative.csv")), 0) << err_;
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(path("dangling.json"))));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(path("relative.csv"))));
  EXPECT_TRUE(is_report(read(path("real/r.json"))));
  EXPECT_EQ(read(path("real/r.csv")).rfind("case_id,", 0), 0u);
  // A dump too.
  ASSERT_EQ(run("run --lengths 5,9 --out " + path("dangling.json")), 0) << err_;
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(path("dangling.json"))));
  EXPECT_EQ(io::SafetensorsFile::open(path("real/r.json")).tensors().size() > 0, true);
}

// Item 8: "-" (and a link to /dev/stdout) is standard output, which then holds the
// report alone (the table goes to stderr); a FIFO is written straight, not replaced.
TEST_F(CliOutputs, StandardOutputAndFifosAreWrittenStraight) {
  const std::string diff = two_dumps();
  ASSERT_EQ(run_here(diff + " --json -"), 0) << err_;
  EXPECT_TRUE(is_report(out_)) << out_;
  EXPECT_NE(err_.find("all identical"), std::string::npos) << err_;
  EXPECT_FALSE(fs::exists(path("-")));
  fs::create_symlink("/dev/stdout", path("to-stdout"));
  ASSERT_EQ(run(diff + " --csv " + path("to-stdout")), 0) << err_;
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(path("to-stdout"))));
  EXPECT_EQ(out_.rfind("case_id,", 0), 0u) << out_;

  // A dump too: `run --out -` writes the safetensors bytes alone to stdout.
  ASSERT_EQ(run_here("run --lengths 5,9 --no-grads --out -"), 0) << err_;
  write("from-stdout.safetensors", out_);
  EXPECT_EQ(io::SafetensorsFile::open(path("from-stdout.safetensors")).tensors().size(), 4u);  // 2 logprobs, 2 entropy
  EXPECT_NE(err_.find("run: qwen3-dense-tiny/"), std::string::npos) << err_;

  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  const int rc = shell("(timeout 60 cat '" + path("fifo") + "' > '" + path("got.json") + "' &) ; '" + BP_BITPARITY_EXE +
                       "' " + diff + " --json " + path("fifo") + "; s=$?; sleep 0.2; exit $s");
  EXPECT_EQ(rc, 0) << err_;
  struct stat st {};
  ASSERT_EQ(::stat(path("fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  for (int i = 0; i < 100 && !is_report(read(path("got.json"))); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(is_report(read(path("got.json"))));
}

// Item 9: a folder where no file can be made (even root cannot create in /proc) is
// found before the first case.
TEST_F(CliOutputs, UnwritableFolderIsFoundBeforeTheFirstCase) {
  EXPECT_EQ(run("sweep " + kSmall + "--path extend --verbose --csv " + path("r.csv") + " --json /proc/r.json"), 2);
  EXPECT_NE(err_.find("/proc/r.json: --json: cannot create a file in directory /proc"), std::string::npos) << err_;
  EXPECT_EQ(out_, "") << "no case ran";
  EXPECT_FALSE(fs::exists(path("r.csv")));
}

// Item 9: a report whose folder is gone by the end costs only itself: the others are
// written, the lost one named, exit 2.
TEST_F(CliOutputs, AReportLostAtTheEndCostsOnlyItself) {
  fs::create_directories(path("gone"));
  const std::string out = path("out.txt"), json_report = path("gone/r.json"), csv = path("r.csv");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(path("err.txt").c_str(), "w", stderr)) std::_Exit(99);
    ::execl(BP_BITPARITY_EXE, BP_BITPARITY_EXE, "sweep", "--model", "qwen3-dense-tiny", "--contract", "bf16-fmaseq-v1",
            "--lengths", "5,9", "--implementation", "emulated", "--tp", "1,2,4", "--path", "decode", "--path", "ragged",
            "--path", "extend", "--verbose", "--json", json_report.c_str(), "--csv", csv.c_str(),
            static_cast<char*>(nullptr));
    std::_Exit(98);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read(out).find(" qwen3-dense-tiny/") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  fs::remove_all(path("gone"));
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 2) << read(out) << read(path("err.txt"));
  EXPECT_NE(read(path("err.txt")).find("cannot write the --json report: " + json_report), std::string::npos)
      << read(path("err.txt"));
  EXPECT_EQ(read(csv).rfind("case_id,", 0), 0u) << "the CSV is still written";
}

// Past `ulimit -f` a report is lost as on a full disk: said, exit 2, no temporary
// left, and the smaller reports written (the process used to die of SIGXFSZ, exit
// 153, with no message, a partial temporary and the later reports unwritten).
TEST_F(CliOutputs, AFileSizeLimitCostsOnlyTheReportPastIt) {
  fs::create_directories(path("lim"));
  const std::string json_report = path("lim/r.json"), junit = path("lim/r.xml"), csv = path("lim/r.csv");
  // 40 KiB: the JSON report (about 60 KiB) is past it, the CSV (32) and JUnit (1) are not.
  const int rc = shell("prlimit --fsize=40960 '" + exe() + "' sweep --model qwen3-dense-tiny --contract bf16-fmaseq-v1 " +
                       "--lengths 5,9 --implementation emulated --tp 1,2 --path extend --json " + json_report +
                       " --junit " + junit + " --csv " + csv);
  EXPECT_EQ(rc, 2) << out_ << err_;
  EXPECT_NE(err_.find("cannot write the --json report: " + json_report), std::string::npos) << err_;
  EXPECT_FALSE(fs::exists(json_report));
  EXPECT_EQ(read(csv).rfind("case_id,", 0), 0u) << "the CSV is still written";
  EXPECT_NE(read(junit).find("<testsuite"), std::string::npos) << "the JUnit report is still written";
  for (const auto& e : fs::directory_iterator(path("lim")))
    EXPECT_NE(e.path().filename().string()[0], '.') << "a temporary was left: " << e.path();
}

// Item 10: `sweep --verbose | head -1`: the reader goes away, the sweep finishes and
// writes its report.
TEST_F(CliOutputs, AReaderThatGoesAwayCostsNoReport) {
  const std::string r = path("r.json"), rc = path("rc.txt");
  shell("( '" + std::string(BP_BITPARITY_EXE) + "' sweep " + kSmall + "--tp 1,2 --path decode --path ragged --verbose --json " +
        r + "; echo $? > '" + rc + "' ) | head -1");
  EXPECT_EQ(read(rc), "0\n");
  EXPECT_EQ(out_.find('\n'), out_.size() - 1) << out_;
  ASSERT_TRUE(is_report(read(r)));
  const json j = json::parse(read(r));
  EXPECT_EQ(j["status"], "complete");
  EXPECT_EQ(j["cases"].size(), 6u);  // reference, emulated tp1 and tp2, 2 paths each
}

// Item 11: an interrupted run's report exits 130 with a line saying so, from JSON and
// from CSV (which carries the status).
TEST_F(CliOutputs, ReportOfAnInterruptedRunExits130) {
  harness::Report r = test::sample_sweep_report();
  r.interrupted = true;
  harness::write_json(r, path("i.json"));
  harness::write_csv(r, path("i.csv"));
  for (const std::string& p : {path("i.json"), path("i.csv")}) {
    EXPECT_EQ(run("report " + p), 130) << p << ": " << out_ << err_;
    EXPECT_NE(out_.find("report: the run was interrupted: its cases are those that finished"), std::string::npos)
        << out_;
  }
  // With no finished case at all, the CSV still says so.
  r.cases.clear();
  harness::write_csv(r, path("none.csv"));
  EXPECT_EQ(run("report " + path("none.csv")), 130) << out_ << err_;
  r.interrupted = false;
  harness::write_csv(r, path("complete.csv"));
  EXPECT_EQ(run("report " + path("complete.csv")), 0) << out_ << err_;
}

// Item 11: a CSV report with CRLF line ends as other tools save it (a blank last
// line) reads like the one written.
TEST_F(CliOutputs, CrlfCsvIsAccepted) {
  harness::write_csv(test::sample_sweep_report(), path("r.csv"));
  write("saved.csv", read(path("r.csv")) + "\r\n");
  EXPECT_EQ(run("report " + path("saved.csv")), 1) << err_;
  EXPECT_NE(out_.find("7 cases"), std::string::npos) << out_;
}

// Item 11: names from files reach the terminal with control characters escaped,
// the reports keep them as they are.
TEST_F(CliOutputs, ControlCharactersReachTheTerminalEscaped) {
  const std::string evil = "logprobs\x1b[2J\x07\nforged";
  const std::string a = dump("a.safetensors", {evil}, 2), b = dump("b.safetensors", {evil}, 3);
  EXPECT_EQ(run("diff " + a + " " + b + " --json " + path("r.json")), 1) << err_;
  EXPECT_EQ(out_.find('\x1b'), std::string::npos) << out_;
  EXPECT_EQ(out_.find('\x07'), std::string::npos) << out_;
  EXPECT_NE(out_.find("logprobs\\x1b[2J\\x07\\x0aforged"), std::string::npos) << out_;
  EXPECT_EQ(json::parse(read(path("r.json")))["cases"][0]["tensors"][0]["name"], evil);
  EXPECT_EQ(run("report " + path("r.json")), 1);
  EXPECT_EQ(out_.find('\x1b'), std::string::npos) << out_;
  EXPECT_NE(out_.find("logprobs\\x1b[2J\\x07\\x0aforged"), std::string::npos) << out_;
  EXPECT_EQ(run("bisect " + a + " " + b), 1);
  EXPECT_EQ(out_.find('\x1b'), std::string::npos) << out_;
  EXPECT_NE(out_.find("first difference: logprobs\\x1b[2J"), std::string::npos) << out_;
}

// Item 11: temporaries a killed writer left (".<name>.tmp-<pid>-<n>") are removed the
// next time a file is written in their folder, when stale: the writer is gone and a
// minute passed, or a day passed. Others stay.
TEST_F(CliOutputs, StaleTemporariesAreCleanedUp) {
  const pid_t gone = ::fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) std::_Exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const std::string dead = std::to_string(gone), alive = std::to_string(::getpid());
  const auto age = [&](const std::string& leaf, std::chrono::seconds ago) {
    write(leaf, "partial");
    fs::last_write_time(path(leaf), fs::file_time_type::clock::now() - ago);
    return leaf;
  };
  using std::chrono::hours, std::chrono::minutes;
  const std::vector<std::string> stale = {age(".r.json.tmp-" + dead + "-0", minutes(2)),
                                          age(".other.csv.tmp-" + alive + "-3", hours(25))};
  const std::vector<std::string> kept = {age(".r.json.tmp-" + dead + "-1", std::chrono::seconds(0)),
                                         age(".r.json.tmp-" + alive + "-0", minutes(2)),
                                         age("r.json.tmp-" + dead + "-0", hours(25)),
                                         age(".r.json.tmp-" + dead, hours(25)),
                                         age(".r.json.tmp-x" + dead + "-0", hours(25))};
  const std::string diff = two_dumps();
  ASSERT_EQ(run(diff + " --json " + path("r.json")), 0) << err_;
  for (const std::string& leaf : stale) EXPECT_FALSE(fs::exists(path(leaf))) << leaf;
  for (const std::string& leaf : kept) EXPECT_TRUE(fs::exists(path(leaf))) << leaf;
}

}  // namespace
}  // namespace bp
