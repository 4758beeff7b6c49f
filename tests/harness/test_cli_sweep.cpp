// `bitparity sweep`, `run`, `bisect` and `list` end to end: the REAL binary run
// through the shell on small plans of the tiny fixtures. Exit codes (0 exact,
// 1 mismatch, 2 bad input, 125 cannot test, 130 interrupted), reports validated
// against the schema, the +ring negative control, bad plans naming file and field
// with earlier reports untouched, SIGTERM mid-sweep, run dumps read back by diff,
// bisect's first divergent op.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/cli_run.h"
#include "support/json_schema.h"

namespace bp {
namespace {

using nlohmann::json;

// A small, fast plan: the dense fixture, the fma-seq contract, short sequences.
const std::string kSmall = "--model qwen3-dense-tiny --contract bf16-fmaseq-v1 --lengths 5,9 ";
// In a cuda case's skip reason, with or without CUDA in the build ("no CUDA in this
// build", "no CUDA device"): CI machines have no GPU.
const std::string kNoGpu = "no CUDA";

class CliSweep : public test::CliTest {
 protected:
  // The JSON report at `p`, checked against the schema.
  static json valid_report(const std::string& p) { return test::valid_report(read(p)); }
};

TEST_F(CliSweep, SmallSweepExactWithGradsAndValidReports) {
  ASSERT_EQ(run("sweep " + kSmall + "--tp 1,2 --cp 2 --cp-split zigzag --path extend --path chunked:5,3 --verbose "
                "--json " + path("r.json") + " --csv " + path("r.csv") + " --junit " + path("r.xml") + " --html " +
                path("r.html")),
            0)
      << out_ << err_;
  EXPECT_NE(out_.find("ALL EXACT"), std::string::npos) << out_;
  EXPECT_NE(out_.find("emulated        tp2-ep1-cp2z"), std::string::npos) << out_;
  const json j = valid_report(path("r.json"));
  EXPECT_EQ(j["status"], "complete");
  EXPECT_EQ(j["verdict"], "exact");
  // reference (1 layout) + emulated (tp1-ep1-cp2z, tp2-ep1-cp2z), 2 paths each.
  ASSERT_EQ(j["cases"].size(), 6u);
  const json& ext = j["cases"][2];
  EXPECT_EQ(ext["id"], "qwen3-dense-tiny/bf16-fmaseq-v1/emulated/tp1-ep1-cp2z/extend");
  EXPECT_EQ(ext["parameters"]["layout"], "tp1-ep1-cp2z");
  EXPECT_EQ(ext["parameters"]["backend"], "emulated");  // the report's key for the implementation
  size_t grads = 0;
  for (const json& t : ext["tensors"]) grads += t["name"].get<std::string>().rfind("grads.", 0) == 0;
  EXPECT_EQ(grads, 3u * 11u + 2u);  // 11 per dense layer, embedding (tied) and final norm
  EXPECT_EQ(ext["tensors"][0]["name"], "logprobs.0");
  EXPECT_TRUE(ext["tensors"][0]["metrics"].contains("train_rollout_logprob_abs_diff"));
  for (const json& t : j["cases"][3]["tensors"])  // chunked: no backward
    EXPECT_EQ(t["name"].get<std::string>().rfind("grads.", 0), std::string::npos);
  EXPECT_EQ(read(path("r.csv")).rfind("case_id,", 0), 0u);
  EXPECT_NE(read(path("r.xml")).find("tp2-ep1-cp2z/chunked:5,3"), std::string::npos);
  EXPECT_NE(read(path("r.html")).find("<table class=\"grid\""), std::string::npos);
  // Every case's run is timed (and --verbose shows it); the CPU implementations have no
  // device, so no peak device memory.
  // They run in this one process: no ranks, no collectives; no case failed.
  for (const json& c : j["cases"]) {
    EXPECT_GT(c["seconds"].get<double>(), 0) << c["id"];
    EXPECT_EQ(c["peak_device_bytes"], nullptr) << c["id"];
    EXPECT_FALSE(c.contains("ranks")) << c["id"];
    EXPECT_FALSE(c.contains("communication")) << c["id"];
    EXPECT_EQ(c["error"], nullptr) << c["id"];
  }
  EXPECT_NE(out_.find("sweep: 6 of 6 cases: 6 exact, 0 mismatch, 0 nonfinite, 0 error, 0 skipped; "), std::string::npos)
      << out_;
  // --verbose: each case's run and its comparison, timed.
  const std::string duration = "([0-9.]+ (us|ms|s)|[0-9]+ min [0-9]{2} s)";
  const std::regex timed_line("\nexact qwen3-dense-tiny/bf16-fmaseq-v1/emulated/tp2-ep1-cp2z/extend \\(" + duration +
                              ", compared in " + duration + "\\)\n");
  EXPECT_TRUE(std::regex_search(out_, timed_line)) << out_;
}

TEST_F(CliSweep, MoeExpertParallelDecodeWithCaptures) {
  ASSERT_EQ(run("sweep --model qwen3-moe-tiny --contract bf16-fmaseq-v1 --lengths 4,7 --implementation emulated --layout "
                "tp1-ep2-cp1,tp2-ep4-cp2z --path decode --capture ops --json " + path("r.json")),
            0)
      << out_ << err_;
  const json j = valid_report(path("r.json"));
  ASSERT_EQ(j["cases"].size(), 2u);
  bool expert_out = false;
  for (const json& t : j["cases"][1]["tensors"]) expert_out |= t["name"] == "ops.layers.3.expert_out";
  EXPECT_TRUE(expert_out);
}

// The contract's negative control: a ring all-reduce of the row-parallel partial
// sums must be caught, first at the first row-parallel output, under v1 and v2.
TEST_F(CliSweep, RingReductionIsCaught) {
  for (const std::string contract : {"bf16-fmaseq-v1", "bf16-fmaseq-v2"}) {
    // The default tokens (6, 11, 17): with these the ring's first changed rounding is in o_proj.
    ASSERT_EQ(run("sweep --model qwen3-dense-tiny --contract " + contract + " --implementation emulated --layout "
                  "tp2-ep1-cp1+ring --path ragged --capture ops --json " + path("r.json")),
              1)
        << contract << out_ << err_;
    EXPECT_NE(out_.find("MISMATCH"), std::string::npos) << out_;
    const json j = valid_report(path("r.json"));
    EXPECT_EQ(j["verdict"], "mismatch") << contract;
    EXPECT_EQ(j["cases"][0]["first_divergent_op"], "layers.0.attn_out") << contract;
  }
}

// Issue 53 item 3: a negative control that comes out bit-identical on a short input
// is no pass: its cases skip, tensors kept, naming the control and what to change,
// with a warning; the sweep is no "ALL EXACT" of the control.
// (Before: every case exact, "ALL EXACT".)
TEST_F(CliSweep, AControlThatDidNotDifferIsNoPass) {
  ASSERT_EQ(run("sweep --model qwen3-dense-tiny --contract bf16-sm90tc-v2 --implementation emulated --layout "
                "tp2-ep1-cp1+ring --lengths 5,7 --path extend --path decode --json " + path("r.json")),
            125)
      << out_ << err_;
  EXPECT_EQ(out_.find("ALL EXACT"), std::string::npos) << out_;
  EXPECT_NE(err_.find("warning: 2 negative-control cases came out bit-identical"), std::string::npos) << err_;
  const json j = valid_report(path("r.json"));
  ASSERT_EQ(j["cases"].size(), 2u);
  for (const json& c : j["cases"]) {
    EXPECT_EQ(c["verdict"], "skipped") << c["id"];
    EXPECT_NE(c["skip_reason"].get<std::string>().find("the negative control +ring came out bit-identical"),
              std::string::npos);
    EXPECT_FALSE(c["tensors"].empty()) << "the compared tensors stay in the report";
  }
}

// A sweep that names no contract runs v3's pair (SPEC.md §1.4); v1 and v2 stay selectable by name.
TEST_F(CliSweep, DefaultContractsAreV3) {
  ASSERT_EQ(run("sweep --model qwen3-dense-tiny --lengths 5 --implementation reference --path extend --no-grads "
                "--json " + path("r.json")),
            0)
      << out_ << err_;
  const json j = valid_report(path("r.json"));
  ASSERT_EQ(j["cases"].size(), 2u);
  EXPECT_EQ(j["cases"][0]["id"], "qwen3-dense-tiny/bf16-sm90tc-v3/reference/tp1-ep1-cp1/extend");
  EXPECT_EQ(j["cases"][1]["id"], "qwen3-dense-tiny/bf16-fmaseq-v3/reference/tp1-ep1-cp1/extend");
}

TEST_F(CliSweep, BadPlansExitTwoNamingFileAndFieldAndKeepTheReport) {
  const std::string report = path("r.json");
  ASSERT_EQ(run("sweep " + kSmall + "--implementation reference --path ragged --json " + report), 0) << err_;
  const std::string before = read(report);
  struct Bad {
    std::string plan, field;
  };
  const std::vector<Bad> bad = {
      {"{\"tp\": [1, 2", ""},  // malformed JSON
      {"{\"models\": [\"qwen3-dense-tiny\"], \"frobnicate\": 1}", "frobnicate"},
      {"{\"tp\": \"2\"}", "tp"},
      {"{\"tp\": [1, 1]}", "tp[1]"},
      {"{\"contracts\": [\"bf16-nope\"]}", "contracts[0]"},
      {"{\"backends\": [\"tpu\"]}", "backends[0]"},
      {"{\"paths\": [\"chunked:0\"]}", "paths[0]"},
      {"{\"layouts\": [\"tp2-ep1\"]}", "layouts[0]"},
      {"{\"models\": [\"qwen3-dense-tiny\"], \"layouts\": [\"tp16-ep1-cp1\"]}", "layouts[0]"},  // tp > C
      {"{\"models\": [\"qwen3-dense-tiny\"], \"layouts\": [\"tp1-ep2-cp1\"]}", "layouts[0]"},  // dense: no ep
      {"{\"models\": [\"no-such-fixture\"]}", "models[0]"},
      {"{\"models\": [\"./no/such/dir\"]}", "models[0]"},
      {"{\"tokens\": {\"seed\": 1, \"file\": \"t.json\"}}", "tokens"},
      {"{\"tokens\": {\"lengths\": [1]}}", "tokens.lengths[0]"},
      {"{\"temperature\": 0}", "temperature"},
      {"{\"capture\": \"all\"}", "capture"},
      {"{\"layouts\": [\"tp1-ep1-cp1\"], \"tp\": [1]}", "layouts"},
      {"[1, 2]", ""},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string plan = write("plan" + std::to_string(i) + ".json", bad[i].plan);
    EXPECT_EQ(run("sweep --plan " + plan + " --json " + report), 2) << bad[i].plan << "\n" << out_ << err_;
    EXPECT_NE(err_.find(plan + ": " + bad[i].field), std::string::npos) << bad[i].plan << ": " << err_;
    EXPECT_EQ(err_.find('\n'), err_.size() - 1) << "one message line: " << err_;
  }
  // A tokens file with a token outside the vocabulary names that file and token.
  const std::string tokens = write("tokens.json", "{\"sequences\": [[1, 2, 3], [4, 512]]}");
  const std::string plan = write("plan_tokens.json", "{\"tokens\": {\"file\": \"tokens.json\"}, \"paths\": [\"ragged\"]}");
  EXPECT_EQ(run("sweep --plan " + plan + " --json " + report), 2);
  EXPECT_NE(err_.find(tokens + ": sequences[1][1]: token 512"), std::string::npos) << err_;
  // Flags are named as options.
  EXPECT_EQ(run("sweep " + kSmall + "--layout tp3-ep1-cp1 --json " + report), 2);
  EXPECT_NE(err_.find("command line: --layout[0]: model qwen3-dense-tiny cannot run layout tp3-ep1-cp1"),
            std::string::npos)
      << err_;
  EXPECT_EQ(run("sweep --cp-split diagonal --json " + report), 2);
  EXPECT_NE(err_.find("command line: --cp-split[0]"), std::string::npos) << err_;
  EXPECT_EQ(run("sweep --tp two --json " + report), 2);
  EXPECT_EQ(run("sweep --frobnicate"), 2);
  EXPECT_EQ(run("sweep " + kSmall + "--json " + path("nodir/r.json")), 2);
  EXPECT_NE(err_.find("nodir"), std::string::npos) << err_;
  EXPECT_EQ(read(report), before);
}

TEST_F(CliSweep, SigtermMidSweepLeavesAValidInterruptedReport) {
  const std::string report = path("r.json"), out = path("out.txt");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!std::freopen(out.c_str(), "w", stdout)) std::_Exit(99);
    ::execl(BP_BITPARITY_EXE, BP_BITPARITY_EXE, "sweep", "--model", "qwen3-dense-tiny", "--contract", "bf16-fmaseq-v1",
            "--lengths", "5,9", "--implementation", "emulated", "--tp", "1,2,4", "--cp", "1,2", "--path", "decode",
            "--path", "ragged", "--verbose", "--json", report.c_str(), static_cast<char*>(nullptr));
    std::_Exit(98);
  }
  // Wait for the first finished case (a --verbose line), then stop the sweep.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read(out).find(" qwen3-dense-tiny/") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 130) << read(out);
  EXPECT_NE(read(out).find("INTERRUPTED"), std::string::npos) << read(out);
  const json j = valid_report(report);
  EXPECT_EQ(j["status"], "interrupted");
  EXPECT_GE(j["cases"].size(), 1u);
  EXPECT_LT(j["cases"].size(), 12u);  // 6 layouts x 2 paths planned
  for (const json& c : j["cases"]) EXPECT_EQ(c["verdict"], "exact");
}

// Without a Hopper GPU a cuda case skips, and says so before its model is built
// (the weights log stays silent: a real checkpoint's host copy alone can exceed the
// machine's memory).
TEST_F(CliSweep, CudaImplementationCannotTestHere) {
  EXPECT_EQ(run("sweep " + kSmall + "--implementation cuda --path extend --json " + path("r.json")), 125) << out_ << err_;
  EXPECT_EQ(err_.find("weights"), std::string::npos) << err_;
  const json j = valid_report(path("r.json"));
  EXPECT_EQ(j["cases"][0]["verdict"], "skipped");
  EXPECT_NE(j["cases"][0]["skip_reason"].get<std::string>().find(kNoGpu), std::string::npos) << j["cases"][0];
  // Mixed with an implementation that runs: the run counts (exit 0), the cuda case is skipped.
  EXPECT_EQ(run("sweep " + kSmall + "--implementation reference,cuda --tp 1 --path ragged --json " + path("r.json")), 0);
  EXPECT_EQ(run("run --implementation cuda --out " + path("c.safetensors")), 125);
}

// Real ranks and the GPU canonical need a GPU: without one their cases skip, nothing
// else is touched; a layout of NCCL's control is refused for the other implementations.
TEST_F(CliSweep, NcclAndCanonicalCudaCannotTestHere) {
  EXPECT_EQ(run("sweep " + kSmall + "--implementation nccl --layout tp2-ep1-cp1+nccl-bf16sum --path extend --json " +
                path("r.json")),
            125)
      << out_ << err_;
  EXPECT_EQ(err_.find("weights"), std::string::npos) << err_;  // nothing built for a case that cannot run
  const json j = valid_report(path("r.json"));
  EXPECT_EQ(j["cases"][0]["verdict"], "skipped");
  EXPECT_EQ(run("sweep " + kSmall + "--implementation emulated --layout tp2-ep1-cp1+nccl-bf16sum --path extend"), 2);
  EXPECT_NE(err_.find("implementation nccl only"), std::string::npos) << err_;
  // A canonical that cannot run here: every case skips, naming it, and the requested
  // reports are written (the sweep used to end at the canonical's CannotTest, exit
  // 125 with no report).
  for (const std::string canonical : {"cuda", "nccl:tp2-ep1-cp1"}) {
    SCOPED_TRACE(canonical);
    std::filesystem::remove(path("c.json"));
    EXPECT_EQ(run("sweep " + kSmall + "--implementation emulated --layout tp2-ep1-cp1 --canonical " + canonical +
                  " --path extend --json " + path("c.json") + " --csv " + path("c.csv")),
              125)
        << err_;
    const json c = valid_report(path("c.json"));
    ASSERT_FALSE(c["cases"].empty());
    for (const json& k : c["cases"]) {
      EXPECT_EQ(k["verdict"], "skipped") << k;
      EXPECT_NE(k["skip_reason"].get<std::string>().find("cannot run here"), std::string::npos) << k;
    }
    EXPECT_EQ(read(path("c.csv")).rfind("case_id,", 0), 0u);
  }
  EXPECT_NE(valid_report(path("c.json"))["cases"][0]["skip_reason"].get<std::string>().find(
                "its canonical, nccl:tp2-ep1-cp1, cannot run here"),
            std::string::npos);
  EXPECT_EQ(run("sweep " + kSmall + "--canonical cpu"), 2);
  EXPECT_NE(err_.find("--canonical: unknown canonical 'cpu'"), std::string::npos) << err_;
  EXPECT_EQ(run("run --implementation nccl --out " + path("n.safetensors")), 2);
}

// Launchers set their variables on CPU nodes too (srun, torchrun, mpirun): a mixed
// plan still runs its CPU cases, on rank 0, and skips its nccl cases with the reason
// (it used to exit 125 before any case, which `git bisect run` reads as skip); in a
// build with NCCL the other ranks have nothing to do and say so (exit 0, no report),
// and a bad BP_RANK_TIMEOUT_S is refused.
TEST_F(CliSweep, LauncherVariablesWithoutAGpuStillRunTheCpuCases) {
  const std::string mixed = "sweep " + kSmall + "--implementation emulated,nccl --layout tp2-ep1-cp1 --path extend ";
  for (const std::string vars : {"SLURM_PROCID=0 SLURM_NTASKS=1 ", "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 "}) {
    SCOPED_TRACE(vars);
    ASSERT_EQ(shell(vars + "'" + exe() + "' " + mixed + "--json " + path("r.json")), 0) << out_ << err_;
    const json j = valid_report(path("r.json"));
    ASSERT_EQ(j["cases"].size(), 2u) << j["cases"];
    for (const json& c : j["cases"]) {
      const bool nccl = c["parameters"]["backend"] == "nccl";
      EXPECT_EQ(c["verdict"], nccl ? "skipped" : "exact") << c;
      if (nccl) {
        EXPECT_FALSE(c["skip_reason"].get<std::string>().empty()) << c;
      }
    }
  }
  ASSERT_EQ(run("list"), 0);
  if (out_.find("not available in this build: no NCCL") != std::string::npos) return;  // no launcher is read
  EXPECT_EQ(shell("SLURM_PROCID=1 SLURM_NTASKS=2 '" + exe() + "' " + mixed + "--json " + path("r1.json")), 0) << err_;
  EXPECT_NE(err_.find("rank 1 of 2 (started by Slurm)"), std::string::npos) << err_;
  EXPECT_FALSE(std::filesystem::exists(path("r1.json")));
  // A rank's collective timeout that is no number of seconds is refused before any
  // rank starts (it was read with atof: "abc" and -1 meant 1 ms, 1e400 forever).
  for (const char* bad : {"0", "-1", "abc", "nan", "1e400", "10s"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(shell(std::string("BP_RANK_TIMEOUT_S=") + bad + " '" + exe() + "' " + mixed), 2) << err_;
    EXPECT_NE(err_.find(std::string("BP_RANK_TIMEOUT_S=") + bad + ": not a number of seconds"), std::string::npos)
        << err_;
  }
}

// --verify-layers: after the cases, the CPU reference re-runs the chosen layers and
// the head from the canonical run's captured inputs (here the CPU canonical: a
// self-check; under --canonical cuda the GPU's, which needs a GPU: scripts/device).
TEST_F(CliSweep, VerifyLayers) {
  ASSERT_EQ(run("sweep " + kSmall + "--implementation emulated --layout tp2-ep1-cp1 --path extend --verify-layers 0,2 "
                "--json " + path("r.json")),
            0)
      << out_ << err_;
  const json j = valid_report(path("r.json"));
  ASSERT_EQ(j["cases"].size(), 2u);
  const json& v = j["cases"][1];
  EXPECT_EQ(v["id"], "qwen3-dense-tiny/bf16-fmaseq-v1/verify-layers");
  EXPECT_EQ(v["verdict"], "exact");
  EXPECT_EQ(v["parameters"]["verified_layers"], "0,2 and the head, forward and backward");
  EXPECT_EQ(v["parameters"]["path"], "verify-layers");
  EXPECT_NE(out_.find("verify-layers"), std::string::npos) << out_;  // its own column
  std::set<std::string> names;
  for (const json& t : v["tensors"]) names.insert(t["name"].get<std::string>());
  // Forward: the layers' ops and the head; backward: their input gradients and parameters'
  // gradients (the embedding's, tied here, with layer 0's).
  for (const char* n : {"logprobs.0", "entropy.1", "ops.embed", "ops.layers.0.input_norm", "ops.layers.2.resid_mlp",
                        "ops.final_norm", "ops.logits", "resid_grad.3", "resid_grad.2", "resid_grad.0",
                        "grads.model.layers.0.self_attn.q_proj.weight", "grads.model.layers.2.mlp.down_proj.weight",
                        "grads.model.norm.weight", "grads.model.embed_tokens.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  for (const std::string& n : names) {
    EXPECT_EQ(n.find("layers.1."), std::string::npos) << n;
    EXPECT_NE(n, "resid_grad.1");
  }
  // The first case compares no ops (no --capture): the captures stay the verification's.
  for (const json& t : j["cases"][0]["tensors"]) EXPECT_NE(t["name"].get<std::string>().rfind("ops.", 0), 0u);

  EXPECT_EQ(run("sweep " + kSmall + "--implementation emulated --layout tp2-ep1-cp1 --path extend --verify-layers 0,9"),
            2);
  EXPECT_NE(err_.find("layer 9 does not exist: the model has 3 layers"), std::string::npos) << err_;
  EXPECT_EQ(run("sweep " + kSmall + "--verify-layers first"), 2);
  EXPECT_NE(err_.find("--verify-layers: expected \"all\""), std::string::npos) << err_;
}

// --canonical <implementation>:<layout>: a layout's result is what the other cases are
// compared with (for models too large for one GPU); its refusals.
TEST_F(CliSweep, LayoutCanonical) {
  ASSERT_EQ(run("sweep " + kSmall + "--implementation reference,emulated --layout tp1-ep1-cp2z --path extend "
                "--path decode --canonical emulated:tp2-ep1-cp1 --json " + path("r.json")),
            0)
      << out_ << err_;
  const json j = valid_report(path("r.json"));
  ASSERT_EQ(j["cases"].size(), 4u);
  for (const json& c : j["cases"]) {
    EXPECT_EQ(c["verdict"], "exact") << c["id"];
    EXPECT_EQ(c["parameters"]["canonical"], "emulated:tp2-ep1-cp1") << c["id"];
  }
  // The control's ring reduction differs from the canonical layout's tree: caught.
  EXPECT_EQ(run("sweep " + kSmall + "--implementation emulated --layout tp2-ep1-cp1+ring --path extend "
                "--canonical emulated:tp2-ep1-cp1"),
            1)
      << out_ << err_;
  for (const auto& [canonical, message] : std::vector<std::pair<std::string, std::string>>{
           {"emulated", "emulated runs layouts: name the canonical one"},
           {"reference:tp2-ep1-cp1", "the reference runs unsharded"},
           {"emulated:tp3-ep1-cp1", "cannot run the canonical layout tp3-ep1-cp1"},
           {"emulated:tp2-ep1-cp1+ring", "a negative control's layout"},
           {"float64", "unknown canonical 'float64'"},
           {"emulated:tp2", "layout 'tp2' is not of the form"}}) {
    EXPECT_EQ(run("sweep " + kSmall + "--path extend --canonical " + canonical), 2) << canonical;
    EXPECT_NE(err_.find(message), std::string::npos) << canonical << ": " << err_;
  }
  EXPECT_EQ(run("sweep " + kSmall + "--path extend --canonical emulated:tp2-ep1-cp1 --verify-layers 1,1"), 2);
  EXPECT_NE(err_.find("needs an unsharded canonical (reference or cuda), not emulated:tp2-ep1-cp1"), std::string::npos)
      << err_;
  // On real ranks without GPUs: nothing can be tested.
  EXPECT_EQ(run("sweep " + kSmall + "--implementation emulated --layout tp1-ep1-cp2 --path extend "
                "--canonical nccl:tp2-ep1-cp1"),
            125)
      << err_;
}

// Issue 53 items 11, 14, 16: what a command cannot use is refused (exit 2) naming the
// option, never ignored or an internal error.
TEST_F(CliSweep, OptionsACommandCannotUseAreRefused) {
  // The emulated implementation captures no layer input gradients, even unsharded:
  // no canonical for the replay (it was exit 3, "did not capture resid_grad.1").
  EXPECT_EQ(run("sweep " + kSmall + "--path extend --canonical emulated:tp1-ep1-cp1 --verify-layers all"), 2)
      << out_ << err_;
  EXPECT_NE(err_.find("--verify-layers: layer-sliced verification replays the unsharded model's layers from the "
                      "canonical run's captures: it needs an unsharded canonical (reference or cuda), not "
                      "emulated:tp1-ep1-cp1"),
            std::string::npos)
      << err_;
  // run and bisect compare with no canonical result.
  EXPECT_EQ(run("run --canonical cuda --out " + path("o.safetensors")), 2) << err_;
  EXPECT_NE(err_.find("--canonical"), std::string::npos) << err_;
  EXPECT_EQ(run("bisect --verify-layers 3 --a path=decode --b path=extend"), 2) << err_;
  EXPECT_NE(err_.find("--verify-layers"), std::string::npos) << err_;
  EXPECT_FALSE(std::filesystem::exists(path("o.safetensors")));
  // An empty --verify-layers is a mistake, not "verify nothing".
  EXPECT_EQ(run("sweep " + kSmall + "--path extend --verify-layers ''"), 2) << out_ << err_;
  EXPECT_NE(err_.find("--verify-layers: must not be empty"), std::string::npos) << err_;
  // A temperature that is no finite number is quoted as given, not as JSON's null.
  for (const std::string t : {"nan", "inf", "1e400"}) {
    EXPECT_EQ(run("run --temperature " + t + " --out " + path("o.safetensors")), 2) << t;
    EXPECT_NE(err_.find("--temperature: '" + t + "' is not a finite number"), std::string::npos) << err_;
  }
}

// --backend and a plan's "backends" are the old names of --implementation and
// "implementations": the same case, the same dump. A plan giving both is refused.
TEST_F(CliSweep, BackendIsTheOldNameOfImplementation) {
  const std::string common = "run --lengths 5,9 --contract bf16-fmaseq-v1 --layout tp2-ep1-cp1 ";
  const std::string a = path("a.safetensors"), b = path("b.safetensors"), c = path("c.safetensors");
  ASSERT_EQ(run(common + "--implementation emulated --out " + a), 0) << err_;
  ASSERT_EQ(run(common + "--backend emulated --out " + b), 0) << err_;
  const std::string old_plan = write("old.json", "{\"backends\": [\"emulated\"]}");
  ASSERT_EQ(run(common + "--plan " + old_plan + " --out " + c), 0) << err_;
  EXPECT_EQ(read(a), read(b));
  EXPECT_EQ(read(a), read(c));
  const std::string both = write("both.json", "{\"implementations\": [\"emulated\"], \"backends\": [\"emulated\"]}");
  EXPECT_EQ(run("sweep --plan " + both), 2);
  EXPECT_NE(err_.find(both + ": backends: the old name of implementations"), std::string::npos) << err_;
  EXPECT_EQ(err_.find('\n'), err_.size() - 1) << "one message line: " << err_;
}

TEST_F(CliSweep, RunDumpsDiffAndBisect) {
  const std::string a = path("a.safetensors"), b = path("b.safetensors"), c = path("c.safetensors");
  const std::string common = "run --lengths 5,9 --capture ops --contract bf16-fmaseq-v1 ";
  ASSERT_EQ(run(common + "--out " + a), 0) << err_;
  ASSERT_EQ(run(common + "--implementation emulated --layout tp2-ep1-cp2z --out " + b), 0) << err_;
  EXPECT_EQ(run("diff -q " + a + " " + b), 0) << out_ << err_;
  ASSERT_EQ(run(common + "--weight-seed 99 --out " + c), 0) << err_;
  EXPECT_EQ(run("diff -q " + a + " " + c), 1);
  // Different weights: embed (tokens and weights only) is the first difference.
  EXPECT_EQ(run("bisect " + a + " " + c), 1) << out_ << err_;
  EXPECT_NE(out_.find("first difference: ops.embed (op embed)"), std::string::npos) << out_;
  EXPECT_EQ(run("bisect " + a + " " + b), 0) << out_ << err_;
  EXPECT_NE(out_.find("no difference"), std::string::npos) << out_;
  // The float64 truth model: a dump of the same tensors (no captures), not the contract's bits.
  const std::string t = path("t.safetensors"), r = path("r.safetensors");
  ASSERT_EQ(run("run --lengths 5,9 --implementation float64 --out " + t), 0) << err_;
  EXPECT_NE(out_.find("run: qwen3-dense-tiny/float64: "), std::string::npos) << out_;
  const std::string header = read(t).substr(0, 1024);  // "__metadata__" sorts first in the JSON header
  EXPECT_NE(header.find("\"bitparity.implementation\":\"float64\""), std::string::npos) << header;
  EXPECT_EQ(header.find("bitparity.contract"), std::string::npos) << "it has no contract: " << header;
  ASSERT_EQ(run("run --lengths 5,9 --out " + r), 0) << err_;
  EXPECT_EQ(run("diff -q " + r + " " + t), 1);
  EXPECT_EQ(run("run --implementation float64 --path decode --out " + t), 2);
  EXPECT_NE(err_.find("command line: --path[0]: the float64 truth has no paths"), std::string::npos) << err_;
  EXPECT_EQ(run("run --implementation float64 --contract bf16-fmaseq-v1 --out " + t), 2);
  EXPECT_NE(err_.find("command line: --contract: the float64 truth has no contract"), std::string::npos) << err_;
  // `--contract truth` is its old spelling: the same dump, byte for byte.
  const std::string old = path("old.safetensors");
  ASSERT_EQ(run("run --lengths 5,9 --contract truth --out " + old), 0) << err_;
  EXPECT_EQ(read(old), read(t));
  EXPECT_EQ(run("run --contract truth --path decode --out " + old), 2);
  EXPECT_NE(err_.find("command line: --path[0]: the float64 truth has no paths"), std::string::npos) << err_;
  // Only `run` takes it.
  EXPECT_EQ(run("sweep --implementation reference,float64"), 2);
  EXPECT_NE(err_.find("command line: --implementation[1]: float64, the float64 truth model, runs only in "
                      "`bitparity run`"),
            std::string::npos)
      << err_;
  EXPECT_EQ(run("sweep --contract truth"), 2);
  EXPECT_NE(err_.find("command line: --contract[0]: unknown contract 'truth'"), std::string::npos) << err_;
  // A dump that is not safetensors is bad input naming the file.
  const std::string junk = write("junk.safetensors", "not a dump");
  EXPECT_EQ(run("bisect " + a + " " + junk), 2);
  EXPECT_NE(err_.find("junk.safetensors"), std::string::npos) << err_;
}

TEST_F(CliSweep, BisectSpecsFindTheFirstDivergentOp) {
  const std::string base = "bisect --contract bf16-fmaseq-v1 --no-grads ";  // default tokens, as above
  ASSERT_EQ(run(base + "--a implementation=reference --b implementation=emulated,layout=tp2-ep1-cp1+ring --json " +
                path("r.json")),
            1)
      << out_ << err_;
  EXPECT_NE(out_.find("first difference: ops.layers.0.attn_out (layer 0, op attn_out)"), std::string::npos) << out_;
  EXPECT_NE(out_.find("input ops.layers.0.attn"), std::string::npos) << out_;
  EXPECT_NE(out_.find("its captured inputs are equal"), std::string::npos) << out_;
  EXPECT_EQ(valid_report(path("r.json"))["cases"][0]["first_divergent_op"], "layers.0.attn_out");
  // chunked:5,3 continues over the comma; decode and chunked agree bit for bit.
  // backend= is the old name of implementation=.
  EXPECT_EQ(run(base + "--a path=decode --b path=chunked:5,3,backend=emulated,layout=tp1-ep1-cp2"), 0) << out_ << err_;
  EXPECT_EQ(run(base + "--a path=decode --b implementation=emulated,backend=emulated"), 2);
  EXPECT_NE(err_.find("--b: backend: given twice"), std::string::npos) << err_;
  EXPECT_EQ(run(base + "--a path=decode --b frobnicate=1"), 2);
  EXPECT_NE(err_.find("--b: frobnicate"), std::string::npos) << err_;
  EXPECT_EQ(run(base + "--a path=decode"), 2);
  // A run off the extend path computes no gradients by design: the other side's are
  // said and left out, not a difference (a tensor missing otherwise is one).
  EXPECT_EQ(run("bisect --contract bf16-fmaseq-v1 --lengths 5,9 --a path=decode --b path=extend"), 0) << out_ << err_;
  EXPECT_NE(out_.find("not compared: 35 gradient tensor(s) of one side only"), std::string::npos) << out_;
}

TEST_F(CliSweep, ListNamesModelsLayoutsAndPaths) {
  ASSERT_EQ(run("list"), 0) << err_;
  for (const char* s : {"qwen3-dense-tiny", "qwen3-moe-tiny", "bf16-sm90tc-v1   hash 43a602a29cdd98f8",
                        "bf16-fmaseq-v1   hash 833bb4d7d43b7bb1", "bf16-sm90tc-v2   hash 4af40b8561fc78fd",
                        "bf16-fmaseq-v2   hash aee5a46e84d4f39c", "bf16-sm90tc-v3   hash 1e4d52369050db29",
                        "bf16-fmaseq-v3   hash c558b9429a00e2a9", "implementations:\n", "emulated", "float64",
                        "tp4-ep4-cp2z", "decode"})
    EXPECT_NE(out_.find(s), std::string::npos) << s << "\n" << out_;
  EXPECT_EQ(run("list --model " + path("nothere")), 2);
  EXPECT_NE(err_.find("nothere"), std::string::npos) << err_;
}

// A model that cannot run some layouts is told which constraint excluded each axis
// (sweep, list), and the field blamed is one the user set: the model when the
// layouts are the defaults; `run` with no plan never mentions a plan.
TEST_F(CliSweep, ExcludedLayoutsNameTheirCause) {
  const std::string fixture = std::string(std::getenv("BP_SOURCE_DIR")) + "/fixtures/models/qwen3-dense-tiny";
  const json cfg = json::parse(read(fixture + "/config.json"));
  auto model = [&](const std::string& name, const json& changes) {
    std::filesystem::create_directories(path(name));
    json c = cfg;
    c.update(changes);
    write(name + "/config.json", c.dump());
    return path(name);
  };
  // 12 query heads on 6 kv heads: tp 4 neither shards nor replicates them (tp 2 does).
  const std::string gqa6 = model("gqa6", {{"num_attention_heads", 12}, {"num_key_value_heads", 6}});
  const std::string odd = model("odd", {{"vocab_size", 300}});
  // q dim 6 x 18 = 108: tp 2 splits the heads evenly (54 each) where the chunks (of 14) would not.
  const std::string oddq = model("oddq", {{"num_attention_heads", 6}, {"num_key_value_heads", 2}, {"head_dim", 18}});
  const std::string shortpos = model("short", {{"max_position_embeddings", 8}});
  const std::string mqa = model("mqa", {{"num_key_value_heads", 1}});  // tp 2, 4 replicate its kv head
  EXPECT_EQ(run("sweep --model " + gqa6 + " --lengths 5 --tp 4 --ep 2,4"), 2);
  EXPECT_NE(err_.find("command line: --tp: no layout of the grid can run model " + gqa6 + " under bf16-sm90tc-v3: "
                      "tp 4: neither divides num_key_value_heads 6 nor is a multiple of it"),
            std::string::npos)
      << err_;
  EXPECT_NE(err_.find("; ep 2, 4: needs a MoE model"), std::string::npos) << err_;
  // A q dim that is not a multiple of tp_tree_width runs unsharded; tp shards refuse it.
  EXPECT_EQ(run("sweep --model " + oddq + " --lengths 5 --tp 2"), 2);
  EXPECT_NE(err_.find("command line: --tp: no layout of the grid can run model " + oddq +
                      " under bf16-sm90tc-v3: tp 2: needs q dim (heads x head_dim) 108 to be a multiple of "
                      "tp_tree_width 8"),
            std::string::npos)
      << err_;
  // Sizes that each run alone but not together.
  EXPECT_EQ(run("sweep --model qwen3-moe-tiny --lengths 5 --tp 4 --ep 4 --cp 8"), 2);
  EXPECT_NE(err_.find("tp4-ep4-cp8: layout tp4-ep4-cp8 has 128 ranks; at most 64 are emulated"), std::string::npos)
      << err_;
  EXPECT_EQ(run("run --model " + oddq + " --lengths 5 --implementation emulated --layout tp2-ep1-cp1 --out " +
                path("x.safetensors")),
            2);
  EXPECT_EQ(err_.find("plan"), std::string::npos) << err_;
  EXPECT_NE(err_.find("model " + oddq +
                      " cannot run layout tp2-ep1-cp1: tp 2 needs q dim (heads x head_dim) 108 to "
                      "be a multiple"),
            std::string::npos)
      << err_;
  EXPECT_EQ(run("run --model " + shortpos + " --out " + path("x.safetensors")), 2);
  EXPECT_EQ(err_.find("plan"), std::string::npos) << err_;
  EXPECT_NE(err_.find("defaults: --lengths[1]: 11 tokens exceed the model's max_position_embeddings 8"),
            std::string::npos)
      << err_;
  ASSERT_EQ(run("list --model " + gqa6 + " --model " + odd + " --model " + oddq + " --model " + mqa), 0) << err_;
  EXPECT_NE(out_.find("missing tp 4: neither divides num_key_value_heads 6"), std::string::npos) << out_;
  const size_t mqa_at = out_.find("  " + mqa + " ", out_.find("\nlayouts"));  // its line of layouts
  ASSERT_NE(mqa_at, std::string::npos) << out_;
  const std::string mqa_line = out_.substr(mqa_at, out_.find('\n', mqa_at) - mqa_at);
  EXPECT_NE(mqa_line.find(" tp2-ep1-cp1 "), std::string::npos) << mqa_line;
  EXPECT_NE(mqa_line.find(" tp4-ep1-cp2z"), std::string::npos) << mqa_line;
  EXPECT_NE(out_.find("missing ep 2, 4: needs a MoE model"), std::string::npos) << out_;
  const size_t odd_at = out_.find("  " + odd + " ", out_.find("\nlayouts"));
  ASSERT_NE(odd_at, std::string::npos) << out_;
  const std::string odd_line = out_.substr(odd_at, out_.find('\n', odd_at) - odd_at);
  EXPECT_NE(odd_line.find(" tp1-ep1-cp2z"), std::string::npos) << odd_line;
  EXPECT_NE(odd_line.find(" tp2-ep1-cp1 "), std::string::npos) << odd_line;  // vocab slices of 152 and 148
  EXPECT_NE(out_.find("missing tp 2: needs q dim (heads x head_dim) 108 to be a multiple of tp_tree_width 8"),
            std::string::npos)
      << out_;
  // And its replicated layouts run, exact against the unsharded reference.
  EXPECT_EQ(run("sweep --model " + mqa + " --lengths 5,9 --layout tp4-ep1-cp1,tp2-ep1-cp2z --path extend"), 0)
      << out_ << err_;
  // The odd vocabulary (config only: generated weights) sweeps every layout it runs,
  // forward and backward, exact; and `run` dumps it.
  EXPECT_EQ(run("sweep --model " + odd + " --lengths 5,9 --path extend --path decode"), 0) << out_ << err_;
  EXPECT_EQ(run("run --model " + odd + " --lengths 5 --out " + path("odd.safetensors")), 0) << err_;
}

// The README's main command: the default sweep (both fixtures, the v3 pair,
// reference + emulated, every layout the fixtures allow, four paths, gradients).
TEST_F(CliSweep, SlowDefaultSweepIsExact) {
  ASSERT_EQ(run("sweep --json " + path("r.json")), 0) << out_ << err_;
  const json j = valid_report(path("r.json"));
  EXPECT_EQ(j["cases"].size(), 304u);
  EXPECT_EQ(j["verdict"], "exact");
  for (const json& c : j["cases"]) EXPECT_NE(c["id"].get<std::string>().find("-v3/"), std::string::npos) << c["id"];
}

}  // namespace
}  // namespace bp
