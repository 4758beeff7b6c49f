// The bitparity binary never hangs, never runs away and never calls a user's
// mistake an internal error (issue #18, items 4, 5, 6 and 11): non-regular inputs
// (FIFOs, standard input) are refused before they are opened; a plan whose work
// exceeds the documented limit is refused unless --force; a second SIGTERM stops
// the case in flight and still writes the interrupted report; progress per layer
// on a terminal; symlink loops, unreadable folders, negative seeds and huge
// layouts are bad input (exit 2) with a short message naming the option or file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/cli_run.h"

namespace bp {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

class CliHangs : public test::CliTest {
 protected:
  // The dense fixture's config.json, for model directories of the tests' own.
  static std::string dense_tiny_config() {
    const char* src = std::getenv("BP_SOURCE_DIR");
    const std::string text = read(std::string(src ? src : ".") + "/fixtures/models/qwen3-dense-tiny/config.json");
    EXPECT_FALSE(text.empty()) << "BP_SOURCE_DIR must name the source tree";
    return text;
  }
  // A FIFO named `leaf` in the test's directory (nobody ever writes to it).
  std::string fifo(const std::string& leaf) const {
    const std::string p = path(leaf);
    EXPECT_EQ(::mkfifo(p.c_str(), 0644), 0) << p;
    return p;
  }
  // bitparity `args` under a time limit (SIGKILL: a sweep finishes its case on SIGTERM); 137 when it would hang.
  int run_limited(int seconds, const std::string& args) {
    return shell("timeout -s KILL " + std::to_string(seconds) + " '" + BP_BITPARITY_EXE + "' " + args);
  }
  // The message is one line naming `what`, exit code 2.
  void expect_bad_input(int rc, const std::string& what) const {
    EXPECT_EQ(rc, 2) << out_ << err_;
    EXPECT_NE(err_.find(what), std::string::npos) << "expected '" << what << "' in: " << err_;
    EXPECT_EQ(err_.find('\n'), err_.size() - 1) << "one message line: " << err_;
  }
};

// --- item 4: non-regular files ---------------------------------------------------------

TEST_F(CliHangs, FifoInputsAreRefusedNotOpened) {
  const std::string config = dense_tiny_config();
  // config.json a FIFO.
  std::filesystem::create_directories(path("cfg_fifo"));
  fifo("cfg_fifo/config.json");
  expect_bad_input(run_limited(20, "run --model " + path("cfg_fifo") + " --out " + path("o.safetensors")),
                   "cfg_fifo/config.json: not a regular file");
  // model.safetensors a FIFO.
  std::filesystem::create_directories(path("st_fifo"));
  write("st_fifo/config.json", config);
  fifo("st_fifo/model.safetensors");
  expect_bad_input(run_limited(20, "run --model " + path("st_fifo") + " --out " + path("o.safetensors")),
                   "st_fifo/model.safetensors: not a regular file");
  // The index a FIFO, and a shard a FIFO.
  std::filesystem::create_directories(path("index_fifo"));
  write("index_fifo/config.json", config);
  fifo("index_fifo/model.safetensors.index.json");
  expect_bad_input(run_limited(20, "run --model " + path("index_fifo") + " --out " + path("o.safetensors")),
                   "index_fifo/model.safetensors.index.json: not a regular file");
  std::filesystem::create_directories(path("shard_fifo"));
  write("shard_fifo/config.json", config);
  write("shard_fifo/model.safetensors.index.json",
        "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00001.safetensors\"}}");
  fifo("shard_fifo/model-00001-of-00001.safetensors");
  expect_bad_input(run_limited(20, "run --model " + path("shard_fifo") + " --out " + path("o.safetensors")),
                   "shard_fifo/model-00001-of-00001.safetensors: not a regular file");
  // A plan and a tokens file.
  const std::string plan = fifo("plan.json");
  expect_bad_input(run_limited(20, "sweep --plan " + plan), plan + ": not a regular file");
  const std::string tokens = fifo("tokens.json");
  expect_bad_input(run_limited(20, "run --tokens " + tokens + " --out " + path("o.safetensors")),
                   tokens + ": not a regular file");
  // A dump to diff, a report to read back.
  const std::string dump = fifo("dump.safetensors");
  expect_bad_input(run_limited(20, "diff " + dump + " " + dump), dump + ": not a regular file");
  const std::string report = fifo("r.json");
  expect_bad_input(run_limited(20, "report " + report), report + ": not a regular file");
  // A symlink to a FIFO is the FIFO.
  std::filesystem::create_symlink(plan, path("plan_link.json"));
  expect_bad_input(run_limited(20, "sweep --plan " + path("plan_link.json")), "not a regular file");
}

TEST_F(CliHangs, StandardInputIsRefusedClearly) {
  // Even when standard input is a regular file: inputs are named files.
  const std::string plan = write("plan.json", "{\"paths\": [\"ragged\"], \"implementations\": [\"reference\"]}");
  expect_bad_input(run_limited(20, "sweep --plan - < " + plan), "bad input: -: standard input is not read");
  expect_bad_input(run_limited(20, "sweep --plan /dev/stdin < " + plan), "bad input: /dev/stdin: standard input");
  const std::string tokens = write("tokens.json", "{\"sequences\": [[1, 2, 3]]}");
  expect_bad_input(run_limited(20, "run --tokens /dev/stdin --out " + path("o.safetensors") + " < " + tokens),
                   "bad input: /dev/stdin: standard input");
}

// --- item 6: paths the file system refuses --------------------------------------------

TEST_F(CliHangs, SymlinkLoopsAreBadInput) {
  std::filesystem::create_symlink(path("loop"), path("loop"));
  expect_bad_input(run_limited(20, "run --model " + path("loop") + " --out " + path("o.safetensors")),
                   "command line: --model[0]: ");
  EXPECT_NE(err_.find("symbolic links"), std::string::npos) << err_;
  expect_bad_input(run_limited(20, "run --tokens " + path("loop") + " --out " + path("o.safetensors")),
                   path("loop") + ": ");
  EXPECT_NE(err_.find("symbolic links"), std::string::npos) << err_;
  // Inside a model directory.
  std::filesystem::create_directories(path("m"));
  write("m/config.json", dense_tiny_config());
  std::filesystem::create_symlink(path("m/model.safetensors"), path("m/model.safetensors"));
  expect_bad_input(run_limited(20, "run --model " + path("m") + " --out " + path("o.safetensors")),
                   "model.safetensors");
  EXPECT_NE(err_.find("symbolic links"), std::string::npos) << err_;
}

TEST_F(CliHangs, NonUtf8PathsAreBadInput) {
  const std::string bad = path("m\xff\xfe");
  std::filesystem::create_directories(bad);
  write("m\xff\xfe/config.json", dense_tiny_config());
  // Dumps and reports record the model and tokens file as JSON text, which is UTF-8.
  expect_bad_input(run_limited(60, "run --lengths 5,9 --model '" + bad + "' --out " + path("o.safetensors")),
                   "command line: --model[0]: ");
  EXPECT_NE(err_.find("UTF-8"), std::string::npos) << err_;
  expect_bad_input(run_limited(20, "sweep --model '" + bad + "' --json " + path("r.json")), "--model[0]");
  const std::string tokens = write("t\xff.json", "{\"sequences\": [[1, 2, 3]]}");
  expect_bad_input(run_limited(20, "run --tokens '" + tokens + "' --out " + path("o.safetensors")),
                   "command line: --tokens: ");
  EXPECT_NE(err_.find("UTF-8"), std::string::npos) << err_;
  EXPECT_FALSE(std::filesystem::exists(path("o.safetensors")));
}

// --- item 5: runaway work ---------------------------------------------------------------

TEST_F(CliHangs, WorkBeyondTheLimitIsRefusedUnlessForced) {
  // 40960 tokens of Qwen3-0.6B: about two days of CPU reference time.
  for (const std::string& cmd : std::vector<std::string>{"run --out " + path("o.safetensors"), "sweep",
                                                        "bisect --a path=extend --b path=decode"}) {
    expect_bad_input(run_limited(60, cmd + " --model qwen3-0.6b --lengths 40960"),
                     "work estimate: the plan needs about ");
    EXPECT_NE(err_.find("FLOP"), std::string::npos) << err_;
    EXPECT_NE(err_.find("--force"), std::string::npos) << err_;
  }
  // A model too large for the memory it may have: refused by the estimate or, with
  // --force, out of memory; either way bad input with the estimate, never exit 3.
  const std::string limited = "ulimit -v 8000000; ";
  EXPECT_EQ(shell(limited + "timeout 120 '" + BP_BITPARITY_EXE + "' run --model qwen3-30b-a3b --lengths 5,9 --out " +
                  path("o.safetensors")),
            2)
      << err_;
  EXPECT_NE(err_.find("work estimate: "), std::string::npos) << err_;
  EXPECT_NE(err_.find("GiB"), std::string::npos) << err_;
  EXPECT_EQ(shell(limited + "timeout 120 '" + BP_BITPARITY_EXE + "' run --force --model qwen3-30b-a3b --lengths 5,9 " +
                  "--out " + path("o.safetensors")),
            2)
      << err_;
  EXPECT_NE(err_.find("work estimate: out of memory: the plan needs about "), std::string::npos) << err_;
  EXPECT_FALSE(std::filesystem::exists(path("o.safetensors")));
}

// A config of 2·10^7 layers: the estimate counts its parameters from the config's
// numbers and refuses it at once, in constant memory. (It used to build every
// layer's weight specs first: the kernel's OOM killer after 68 s on 24 GiB; under
// this test's 2 GB, "out of memory" after 16 s with no estimate.)
TEST_F(CliHangs, AHugeLayerCountIsRefusedByTheEstimateInConstantMemory) {
  json cfg = json::parse(dense_tiny_config());
  cfg["num_hidden_layers"] = 20000000;
  cfg.erase("layer_types");
  std::filesystem::create_directories(path("huge"));
  write("huge/config.json", cfg.dump());
  const int rc = shell("ulimit -v 2000000; timeout -s KILL 60 '" + std::string(BP_BITPARITY_EXE) + "' sweep --model " +
                       path("huge") + " --json " + path("r.json"));
  expect_bad_input(rc, "work estimate: the plan needs about ");
  EXPECT_NE(err_.find("FLOP"), std::string::npos) << err_;
  EXPECT_FALSE(std::filesystem::exists(path("r.json")));
}

// Issue 53 item 8: an emulated rank whose thread cannot start (here: every thread's
// stack, sized by RLIMIT_STACK, is larger than the address-space limit) is its case's
// error; the sweep goes on and writes its reports (it aborted, exit 134, no report).
TEST_F(CliHangs, ARankThreadThatCannotStartIsTheCasesError) {
  const std::string r = path("r.json");
  const int rc = shell("OMP_NUM_THREADS=1 prlimit --stack=4294967296 --as=3221225472 '" + exe() +
                       "' sweep --model qwen3-dense-tiny --contract bf16-fmaseq-v2 --lengths 5,9 --path extend "
                       "--implementation emulated,reference --tp 2,1 --json " + r);
  EXPECT_EQ(rc, 3) << out_ << err_;
  ASSERT_TRUE(std::filesystem::exists(r)) << err_;
  const json j = json::parse(read(r));
  size_t errors = 0, exact = 0;
  for (const json& c : j["cases"]) {
    if (c["verdict"] == "error") {
      ++errors;
      EXPECT_NE(c["error"].get<std::string>().find("could not start its thread"), std::string::npos) << c;
    }
    if (c["verdict"] == "exact") ++exact;
  }
  EXPECT_EQ(errors, 2u) << j["cases"];  // emulated tp2 and tp1
  EXPECT_EQ(exact, 1u) << j["cases"];   // the reference, after them
}

// The signals the process catches, from /proc (the SigCgt mask).
uint64_t caught_signals(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("SigCgt:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  return 0;
}

TEST_F(CliHangs, SecondSigtermStopsTheCaseInFlight) {
  const std::string report = path("r.json");
  // One case of a minute or more: the reference's decode of 4000 tokens (then the canonical
  // extend forward and backward). Decode's ops are short, so cancellation, checked between
  // ops, is prompt.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!std::freopen(path("out.txt").c_str(), "w", stdout)) std::_Exit(99);
    ::execl(BP_BITPARITY_EXE, BP_BITPARITY_EXE, "sweep", "--model", "qwen3-dense-tiny", "--contract", "bf16-fmaseq-v1",
            "--lengths", "4000", "--implementation", "reference", "--path", "decode", "--json", report.c_str(),
            static_cast<char*>(nullptr));
    std::_Exit(98);
  }
  // Once the sweep handles SIGTERM (it does from its first case on), send two.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!(caught_signals(pid) & (uint64_t{1} << (SIGTERM - 1))) && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const auto sent = Clock::now();
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) == 0 && Clock::now() - sent < std::chrono::seconds(15))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (Clock::now() - sent >= std::chrono::seconds(15)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    FAIL() << "the case in flight ran on after the second SIGTERM";
  }
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 130) << read(path("out.txt"));
  const json j = json::parse(read(report));
  EXPECT_EQ(j["status"], "interrupted");
  ASSERT_EQ(j["cases"].size(), 1u);
  EXPECT_EQ(j["cases"][0]["id"], "qwen3-dense-tiny/bf16-fmaseq-v1/reference/tp1-ep1-cp1/decode");
  EXPECT_EQ(j["cases"][0]["verdict"], "skipped");
  EXPECT_EQ(j["cases"][0]["skip_reason"].get<std::string>().rfind("interrupted: ", 0), 0u) << j["cases"][0];
}

TEST_F(CliHangs, ATerminalShowsTheEstimateAndTheLayerOfALongCase) {
  ASSERT_EQ(std::system("script --version >/dev/null 2>&1"), 0) << "needs script (bsdutils, essential on Debian)";
  // script(1) gives the sweep a terminal; its output is the terminal's.
  ASSERT_EQ(shell("script -qec \"'" + std::string(BP_BITPARITY_EXE) +
                  "' sweep --model qwen3-dense-tiny --contract bf16-fmaseq-v1 --lengths 600 --implementation "
                  "reference --path extend\" /dev/null"),
            0)
      << out_ << err_;
  EXPECT_NE(out_.find("sweep: 1 cases: about "), std::string::npos) << out_;
  EXPECT_NE(out_.find("FLOP (about "), std::string::npos) << out_;
  // A backward layer of 600 tokens takes longer than the line's refresh interval.
  EXPECT_NE(out_.find("backward layer "), std::string::npos) << out_;
  // Without a terminal: neither.
  ASSERT_EQ(run("sweep --model qwen3-dense-tiny --contract bf16-fmaseq-v1 --lengths 5 --implementation reference "
                "--path extend"),
            0);
  EXPECT_EQ((out_ + err_).find("layer "), std::string::npos) << out_ << err_;
  EXPECT_EQ((out_ + err_).find("FLOP"), std::string::npos) << out_ << err_;
}

// --- item 11: exit codes and messages of the command line ------------------------------

TEST_F(CliHangs, ImpossibleGridBlamesTheFlagThatMadeIt) {
  expect_bad_input(run_limited(20, "sweep --model qwen3-dense-tiny --cp 1000"), "command line: --cp: ");
  EXPECT_EQ(err_.find("default plan"), std::string::npos) << err_;
  const std::string plan = write("plan.json", "{\"models\": [\"qwen3-dense-tiny\"], \"tp\": [3, 5]}");
  expect_bad_input(run_limited(20, "sweep --plan " + plan), plan + ": tp: ");
  // Given with an axis that is fine, the impossible one is blamed.
  expect_bad_input(run_limited(20, "sweep --model qwen3-dense-tiny --tp 1,2 --cp 1000"), "command line: --cp: ");
}

TEST_F(CliHangs, NegativeAndOutOfRangeIntegersAreRefused) {
  for (const std::string opt : {"--seed", "--weight-seed", "--coef-seed"}) {
    EXPECT_EQ(run_limited(20, "run " + opt + " -1 --out " + path("o.safetensors")), 2) << opt << out_ << err_;
    EXPECT_NE(err_.find(opt), std::string::npos) << err_;
    EXPECT_EQ(run_limited(20, "run " + opt + " 18446744073709551616 --out " + path("o.safetensors")), 2)
        << opt << out_ << err_;
    EXPECT_NE(err_.find(opt), std::string::npos) << err_;
  }
  EXPECT_FALSE(std::filesystem::exists(path("o.safetensors")));
  EXPECT_EQ(run_limited(20, "run --lengths 5,99999999999 --out " + path("o.safetensors")), 2) << err_;
  EXPECT_NE(err_.find("--lengths"), std::string::npos) << err_;
  EXPECT_EQ(run_limited(20, "sweep --tp 1,-2"), 2) << err_;
  EXPECT_NE(err_.find("--tp"), std::string::npos) << err_;
  // The largest seed is fine.
  EXPECT_EQ(run_limited(60, "run --lengths 5,9 --seed 18446744073709551615 --out " + path("o.safetensors")), 0) << err_;
}

TEST_F(CliHangs, HugeUserInputIsCutInMessages) {
  const std::string digits(100000, '1');
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"sweep --layout tp" + digits + "-ep1-cp1", "command line: --layout[0]"},
      {"sweep --path chunked:" + digits, "command line: --path[0]"},
      {"sweep --model x" + digits, "command line: --model[0]"},
      {"sweep --contract c" + digits, "command line: --contract[0]"},
      {"sweep --implementation i" + digits, "command line: --implementation[0]"},
      {"sweep --model ./d" + digits, "command line: --model[0]"},
      {"bisect --b path=decode --a temperature=" + digits + "x", "--a: temperature"},
      {"bisect --b path=decode --a tp=1," + digits, "--a: tp"},
  };
  for (const auto& [args, field] : bad) {
    expect_bad_input(run_limited(20, args), field + ": ");
    EXPECT_LT(err_.size(), 400u) << err_.substr(0, 400);
    EXPECT_NE(err_.find(" characters)"), std::string::npos) << err_.substr(0, 400);
  }
}

TEST_F(CliHangs, UnreadableFolderIsPermissionDeniedNotMissing) {
  // Root reads anything; drop the capabilities that let it (as any user runs).
  ASSERT_EQ(std::system("setpriv --help >/dev/null 2>&1"), 0) << "needs setpriv (util-linux, essential on Debian)";
  const std::string no_dac = "--inh-caps=-dac_override,-dac_read_search --bounding-set=-dac_override,-dac_read_search ";
  std::filesystem::create_directories(path("locked/m"));
  write("locked/m/config.json", dense_tiny_config());
  ::chmod(path("locked").c_str(), 0);
  const int rc = shell("setpriv " + no_dac + "'" + BP_BITPARITY_EXE + "' run --model " + path("locked/m") + " --out " +
                       path("o.safetensors"));
  const std::string model_err = err_;
  const int tokens_rc = shell("setpriv " + no_dac + "'" + BP_BITPARITY_EXE + "' run --tokens " +
                              path("locked/t.json") + " --out " + path("o.safetensors"));
  const std::string tokens_err = err_;
  ::chmod(path("locked").c_str(), 0755);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(model_err.find("Permission denied"), std::string::npos) << model_err;
  EXPECT_EQ(model_err.find("does not exist"), std::string::npos) << model_err;
  EXPECT_EQ(tokens_rc, 2);
  EXPECT_NE(tokens_err.find("Permission denied"), std::string::npos) << tokens_err;
}

}  // namespace
}  // namespace bp
