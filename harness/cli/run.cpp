// `bitparity run`: one case to a safetensors dump (what users diff and bisect).
#include <cstdio>

#include "harness/cli/common.h"
#include "harness/engine/single_case.h"
#include "harness/exit_codes.h"
#include "harness/io/files.h"
#include "harness/io/safetensors.h"

namespace bp::harness {

namespace {

struct RunOptions {
  PlanFlags plan;
  std::string out;
  bool quiet = false;
};

int run(const RunOptions& o) {
  const SweepPlan plan = o.plan.plan(single_case_defaults());
  io::check_outputs({{"--out", o.out}}, o.plan.input_files(plan));
  WeightsLog weights("run", o.quiet);
  const SingleRun r = run_single_case(plan, weights.listener());
  std::vector<io::WriteTensor> w;
  for (const NamedTensor& t : r.tensors) {
    const auto* bytes = t.type == CmpType::F32 ? reinterpret_cast<const uint8_t*>(t.f32_values.data())
                                               : reinterpret_cast<const uint8_t*>(t.bf16_values.data());
    const size_t n = t.type == CmpType::F32 ? t.f32_values.size() * 4 : t.bf16_values.size() * 2;
    w.push_back({t.name, t.type == CmpType::F32 ? io::DType::F32 : io::DType::BF16, t.shape, {bytes, n}});
  }
  io::write_safetensors(o.out, std::move(w), r.metadata);
  if (!o.quiet)
    std::fprintf(text_stream({o.out}), "run: %s: %zu tensors -> %s\n", r.id.c_str(), r.tensors.size(), o.out.c_str());
  return kExitExact;
}

}  // namespace

Subcommand add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand(
      "run",
      "run one case (default: qwen3-dense-tiny, bf16-sm90tc-v3, reference implementation, tp1-ep1-cp1, extend) and "
      "write its outputs to a safetensors dump. Tensors: logprobs.<s> F32 [len-1] and entropy.<s> F32 [len-1] per "
      "sequence s; grads.<hf name> F32 (extend path, unless --no-grads); with --capture ops, ops.<op> BF16 "
      "[tokens, features] for every op (ops.embed, ops.layers.<i>.q_proj, ..., ops.logits). --implementation "
      "float64: the float64 truth model (no contract, unsharded, extend, no captures), rounded to F32; --contract "
      "truth is its old spelling. Exit 0 written, 2 bad usage or input, 3 internal error, 125 cannot run here");
  o->plan.add_to(sub);
  sub->add_option("--out,-o", o->out, "the dump to write (.safetensors, written atomically; '-': stdout)")->required();
  sub->add_flag("--quiet,-q", o->quiet, "print nothing but errors");
  return guarded_subcommand(sub, [o] { return run(*o); });
}

}  // namespace bp::harness
