// bench_rowops: the bandwidth-bound ops (rmsnorm, residual, rope, logprob fwd/bwd) beside
// the device's own copy bandwidth (cudaMemcpy device to device, measured in the
// same run) on Qwen3-30B-A3B shapes. Each op's bytes are the least it must move
// (every input read once, every output written once). CSV on stdout:
//   op,shape,us,bytes,GBps,copy_GBps,fraction_of_copy,peak_bytes
// peak_bytes: the peak of DeviceBuffer's pool over the op's calls (bench::measure).
// Each op allocates its own inputs and outputs before its calls and frees them after
// its row, so the peak is exactly those (nothing else is live; logprob_bwd's include
// the forward's row max and sum it reads) plus what a call allocates from the pool
// (logprob_fwd's chunk partials), each rounded up to the pool's granularity.
// Exit 125 without a Hopper GPU.
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "optimized/cuda/logprob.h"
#include "optimized/cuda/residual.h"
#include "optimized/cuda/rmsnorm.h"
#include "optimized/cuda/rope.h"
#include "reference/ops/rope.h"

namespace bp {
namespace {

constexpr int kTokens = 4096, kHidden = 2048, kHeads = 32, kHeadDim = 128, kVocab = 151936, kLogprobRows = 512;
constexpr size_t kAct = size_t{kTokens} * kHidden;

using bench::measure;
using bench::Measured;
using bench::Options;

void row(const char* op, const char* shape, const Measured& m, double bytes, double copy) {
  const double gbps = bytes / m.us * 1e-3;
  std::printf("%s,%s,%.2f,%.0f,%.1f,%.1f,%.3f,%llu\n", op, shape, m.us, bytes, gbps, copy, gbps / copy,
              static_cast<unsigned long long>(m.peak_bytes));
  std::fflush(stdout);
}

void rmsnorm_row(const Options& opt, const Knobs& kn, double copy) {
  cuda::DeviceBuffer<bf16> x(kAct), y(kAct), w(kHidden);
  cuda::DeviceBuffer<float> rstd(kTokens);
  bench::fill(x, 1);
  bench::fill(w, 3);
  row("rmsnorm_fwd", "4096x2048",
      measure(opt, [&] { cuda::rmsnorm_fwd(kn, x.get(), w.get(), 1e-6f, y.get(), rstd.get(), kTokens, 1, kHidden); }),
      2.0 * kAct * sizeof(bf16) + kTokens * sizeof(float), copy);
}

void residual_row(const Options& opt, const Knobs& kn, double copy) {
  cuda::DeviceBuffer<bf16> x(kAct), o(kAct), y(kAct);
  bench::fill(x, 1);
  bench::fill(o, 2);
  row("residual_fwd", "4096x2048", measure(opt, [&] { cuda::residual_fwd(kn, x.get(), o.get(), y.get(), kAct); }),
      3.0 * kAct * sizeof(bf16), copy);
}

void rope_row(const Options& opt, const Knobs& kn, double copy) {
  const size_t q = size_t{kTokens} * kHeads * kHeadDim;
  cuda::DeviceBuffer<bf16> qx(q), qy(q);
  bench::fill(qx, 4);
  std::vector<bf16> cos_h(size_t{kTokens} * kHeadDim / 2), sin_h(cos_h.size());
  ref::rope_tables(1e6f, kHeadDim, kTokens, cos_h.data(), sin_h.data());
  const cuda::DeviceBuffer<bf16> cos_d(cos_h), sin_d(sin_h);
  std::vector<int32_t> pos_h(kTokens);
  std::iota(pos_h.begin(), pos_h.end(), 0);
  const cuda::DeviceBuffer<int32_t> pos(pos_h);
  const ref::RopeTable table{cos_d.get(), sin_d.get(), kTokens, kHeadDim};
  row("rope_fwd", "4096x32x128",
      measure(opt, [&] { cuda::rope_fwd(kn, table, pos.get(), qx.get(), qy.get(), kTokens, kHeads); }),
      2.0 * q * sizeof(bf16) + 2.0 * cos_h.size() * sizeof(bf16), copy);
}

// The forward, then the backward from the forward's M and S; `tag` names the contract
// ("" for v1, "_v3" for v3's one-pass log-softmax, SPEC.md §5.10 v2 and v3).
void logprob_rows(const Options& opt, const Knobs& kn, const std::string& tag, double copy) {
  const size_t lg = size_t{kLogprobRows} * kVocab;
  cuda::DeviceBuffer<bf16> logits(lg);
  bench::fill(logits, 5);
  std::vector<int32_t> tgt_h(kLogprobRows);
  for (int i = 0; i < kLogprobRows; ++i) tgt_h[size_t(i)] = (i * 7919) % kVocab;
  const cuda::DeviceBuffer<int32_t> tgt(tgt_h);
  cuda::DeviceBuffer<float> mx(kLogprobRows), sm(kLogprobRows);
  {
    cuda::DeviceBuffer<float> lp(kLogprobRows);
    row(("logprob_fwd" + tag).c_str(), "512x151936", measure(opt, [&] {
          cuda::logprob_fwd(kn, logits.get(), tgt.get(), kLogprobRows, kVocab, 1.0f, lp.get(), mx.get(), sm.get(),
                            nullptr);
        }),
        1.0 * lg * sizeof(bf16), copy);
  }
  if (kn.log_softmax == LogSoftmax::kOnePass) {  // the same kernels without the call's host check of the targets
    const int C = kn.tp_tree_width;
    cuda::DeviceBuffer<float> cmax(size_t{kLogprobRows} * C), csum(size_t{kLogprobRows} * C), xt(kLogprobRows),
        lp(kLogprobRows);
    row(("logprob_fwd" + tag + "_stages").c_str(), "512x151936", measure(opt, [&] {
          cuda::logprob_chunk_states(kn, logits.get(), kVocab, kLogprobRows, kVocab, kVocab / C, C, 1.0f, cmax.get(),
                                     csum.get(), nullptr, C);
          cuda::logprob_target_logit(kn, logits.get(), kVocab, kLogprobRows, 0, kVocab, tgt.get(), 1.0f, xt.get());
          cuda::logprob_merge_states(kn, cmax.get(), csum.get(), nullptr, xt.get(), kLogprobRows, mx.get(), sm.get(),
                                     lp.get(), nullptr);
        }),
        1.0 * lg * sizeof(bf16), copy);
  }
  // Read every logit, write every gradient.
  const cuda::DeviceBuffer<float> coef(std::vector<float>(kLogprobRows, -1.0f));
  cuda::DeviceBuffer<bf16> dlogits(lg);
  row(("logprob_bwd" + tag).c_str(), "512x151936", measure(opt, [&] {
        cuda::logprob_bwd(kn, logits.get(), tgt.get(), coef.get(), mx.get(), sm.get(), kLogprobRows, kVocab, 1.0f,
                          dlogits.get());
      }),
      2.0 * lg * sizeof(bf16), copy);
  row(("logprob_bwd" + tag + "_slice").c_str(), "512x151936", measure(opt, [&] {
        cuda::logprob_bwd_slice(kn, logits.get(), kVocab, kLogprobRows, 0, kVocab, tgt.get(), coef.get(), mx.get(),
                                sm.get(), 1.0f, dlogits.get());
      }),
      2.0 * lg * sizeof(bf16), copy);
}

int run(const Options& opt) {
  bench::require_hopper("bench_rowops", opt);
  const Knobs& kn = find_contract("bf16-sm90tc-v1")->knobs;
  const double copy = bench::copy_gbps(opt);
  std::printf("op,shape,us,bytes,GBps,copy_GBps,fraction_of_copy,peak_bytes\n");
  rmsnorm_row(opt, kn, copy);
  residual_row(opt, kn, copy);
  rope_row(opt, kn, copy);
  logprob_rows(opt, kn, "", copy);
  logprob_rows(opt, find_contract("bf16-sm90tc-v3")->knobs, "_v3", copy);
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  return kExitExact;
}

}  // namespace
}  // namespace bp

int main(int argc, char** argv) {
  const bp::bench::Options opt = bp::bench::parse_options("bench_rowops", argc, argv);
  return bp::bench::guarded_main("bench_rowops", [&] { return bp::run(opt); });
}
