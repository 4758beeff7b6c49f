// bench_attention: bp::cuda::attention_fwd on Qwen3-30B-A3B attention (32 q / 4 kv
// heads, head_dim 128), both v1 contracts and sm90-tc v3 (v2's forward bits; its own backward chunks):
//   extend  one causal sequence of 1024 and 4096 tokens (batch 1 and 8), and 16384 (batch 1);
//           also sm90-tc v3 with attn_kv_block 128 (impl bf16-sm90tc-v3+kv128: issue 19
//           item 3's measurement of 128 against the contract's 64);
//   decode  q_len 1 for batch 1..64 over caches of 1k..32k keys;
//   backward attention_bwd (dq, dk, dv) of one causal sequence of 1024 and 4096
//           tokens, from the forward's own o, m and l.
// Each time is the median of --reps event-timed calls after --warmup calls (the
// call includes its host planning and task upload: that is the API's cost);
// host_us is the median host time inside one call issued to an idle GPU
// (bench::host_us). Inputs random, never zeros. CSV on stdout, the columns
// bench/sdpa_peer.py writes too:
//   kind,impl,batch,q_len,kv_len,Hq,Hkv,D,time_us,tflops,bytes,gbps,peak_bytes,host_us
// flops count the causal QK^T and PV products (4·Hq·D per visible (query, key));
// the backward counts 2.5 times that (QK^T, dP = dO·V^T, dV, dK and dQ: the
// convention of FlashAttention and of sdpa_peer.py). bytes are q, k, v read once
// and o written once (the decode roofline: gbps against the measured copy
// bandwidth); the backward's are q, k, v, o, dout read and dq, dk, dv written. peak_bytes: the peak of DeviceBuffer's pool over the
// calls (bench::measure): q, k, v, o and the fp32 m, l (allocated before, live
// throughout) plus what each call allocates from the pool (its uploaded runs and
// tasks; partial sums when it splits the keys across CTAs). sdpa_peer.py's
// peak_bytes is torch's counterpart (its q, k, v and each call's allocations).
// --only TEXT keeps the rows whose label kind/contract/batch x q_len x kv_len (e.g.
// extend/bf16-sm90tc-v3/1x4096x4096) contains TEXT, e.g. for a profiler. Exit 125
// without a Hopper GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "harness/exit_codes.h"
#include "optimized/cuda/attention.h"
#include "optimized/cuda/common.h"

namespace bp {
namespace {

constexpr ref::AttnDims kDims{32, 4, 128};  // Qwen3-30B-A3B

using bench::Options;

// `batch` sequences of q_len queries after kv_len − q_len cached keys each.
// The knobs an impl names: a contract, or "+kv128" after one for its knobs with
// attn_kv_block 128.
Knobs impl_knobs(const std::string& impl) {
  const std::string wide = "+kv128";
  const bool wide_blocks = impl.size() > wide.size() && impl.compare(impl.size() - wide.size(), wide.size(), wide) == 0;
  Knobs kn = find_contract(wide_blocks ? impl.substr(0, impl.size() - wide.size()) : impl)->knobs;
  if (wide_blocks) kn.attn_kv_block = 128;
  return kn;
}

void bench_case(const Options& opt, const std::string& contract, const char* kind, int batch, int q_len, int kv_len) {
  const std::string label = std::string(kind) + "/" + contract + "/" + std::to_string(batch) + "x" +
                            std::to_string(q_len) + "x" + std::to_string(kv_len);
  if (!opt.selected(label)) return;
  const Knobs kn = impl_knobs(contract);
  std::vector<ref::AttnSeq> seqs;
  for (int b = 0; b < batch; ++b) seqs.push_back({b * q_len, q_len, kv_len - q_len, b * kv_len});
  const size_t q_elems = size_t(batch) * q_len * kDims.Hq * kDims.D;
  const size_t kv_elems = size_t(batch) * kv_len * kDims.Hkv * kDims.D;
  cuda::DeviceBuffer<bf16> q(q_elems), k(kv_elems), v(kv_elems), o(q_elems);
  cuda::DeviceBuffer<float> m(size_t(batch) * q_len * kDims.Hq), l(m.size());
  bench::fill(q, 1);
  bench::fill(k, 2);
  bench::fill(v, 3);
  auto forward = [&] {
    cuda::attention_fwd(kn, kDims, seqs.data(), batch, q.get(), k.get(), v.get(), o.get(), m.get(), l.get());
  };
  const bool backward = std::string(kind) == "backward";
  bench::Measured run{};
  double host_us = 0;
  if (backward) {
    cuda::DeviceBuffer<bf16> dout(q_elems), dq(q_elems), dk(kv_elems), dv(kv_elems);
    bench::fill(dout, 4);
    forward();
    auto backward_call = [&] {
      cuda::attention_bwd(kn, kDims, seqs.data(), batch, q.get(), k.get(), v.get(), o.get(), m.get(), l.get(),
                          dout.get(), dq.get(), dk.get(), dv.get());
    };
    run = bench::measure(opt, backward_call);
    host_us = bench::host_us(opt, backward_call);
  } else {
    run = bench::measure(opt, forward);
    host_us = bench::host_us(opt, forward);
  }
  const double us = run.us;
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  // Visible (query, key) pairs: query i of a sequence sees kv_len − q_len + i + 1 keys.
  const double pairs = double(batch) * q_len * (kv_len - q_len) + double(batch) * q_len * (q_len + 1) / 2;
  const double flops = (backward ? 10.0 : 4.0) * kDims.Hq * kDims.D * pairs;
  const double bytes = backward ? 2.0 * (4.0 * q_elems + 4.0 * kv_elems) : 2.0 * (2.0 * q_elems + 2.0 * kv_elems);
  std::printf("%s,%s,%d,%d,%d,%d,%d,%d,%.2f,%.2f,%.0f,%.1f,%llu,%.1f\n", kind, contract.c_str(), batch, q_len,
              kv_len, kDims.Hq, kDims.Hkv, kDims.D, us, flops / us * 1e-6, bytes, bytes / us * 1e-3,
              static_cast<unsigned long long>(run.peak_bytes), host_us);
  std::fflush(stdout);
}

int run(const Options& opt) {
  bench::require_hopper("bench_attention", opt);
  std::printf("kind,impl,batch,q_len,kv_len,Hq,Hkv,D,time_us,tflops,bytes,gbps,peak_bytes,host_us\n");
  // v3 beside v1 (SPEC.md §1.4); fma-seq has no speed target.
  for (const char* c : {"bf16-sm90tc-v1", "bf16-sm90tc-v3", "bf16-fmaseq-v1"}) {
    for (int batch : {1, 8})
      for (int T : {1024, 4096}) bench_case(opt, c, "extend", batch, T, T);
    bench_case(opt, c, "extend", 1, 16384, 16384);
    for (int batch : {1, 8, 64})
      for (int cache : {1024, 8192, 32768}) bench_case(opt, c, "decode", batch, 1, cache);
    for (int T : {1024, 4096}) bench_case(opt, c, "backward", 1, T, T);
  }
  for (int batch : {1, 8})
    for (int T : {1024, 4096}) bench_case(opt, "bf16-sm90tc-v3+kv128", "extend", batch, T, T);
  bench_case(opt, "bf16-sm90tc-v3+kv128", "extend", 1, 16384, 16384);
  return kExitExact;
}

}  // namespace
}  // namespace bp

int main(int argc, char** argv) {
  const bp::bench::Options opt = bp::bench::parse_options("bench_attention", argc, argv, /*labeled=*/true);
  return bp::bench::guarded_main("bench_attention", [&] { return bp::run(opt); });
}
