// bench_moe: bp::cuda::moe_experts_fwd and moe_experts_bwd on the Qwen3-30B-A3B
// experts (H 2048, I 768, 128 experts, top-8), the default pair of contracts (v3), at T = 128, 1024 and
// 4096 tokens. The routing
// is a fixed random router: token t takes the 8 experts of highest
// counter_hash(kRouterSeed, t·128 + e) (reference/common/rng.h; ties to the lower
// id), which bench/grouped_mm_peer.py regenerates bit for bit, so both time the
// same per-expert row counts. Each time is the median of --reps event-timed calls
// after --warmup calls; a call includes its host plan and uploads (the API's cost).
// Peak device memory: the default pool's high watermark (pool_peak_bytes), reset
// before each case, so it counts the shared expert weights, the case's inputs and
// the call's scratch. CSV on stdout, the columns grouped_mm_peer.py writes too:
//   op,impl,tokens,top_k,experts,H,I,rows,rows_max,experts_used,time_us,tflops,peak_bytes
// flops: experts_fwd 2·rows·3·H·I (gate, up and down GEMMs); experts_bwd twice that
// (their input and weight gradients; the forward our backward recomputes is not
// counted, as autograd's saved activations are not). The backward's outputs: the
// slots' fp32 input gradients, the routing weights' gradients and every expert's
// fp32 weight gradients. Exit 125 without a Hopper GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.cuh"
#include "harness/exit_codes.h"
#include "optimized/cuda/common.h"
#include "optimized/cuda/moe_experts.h"
#include "reference/common/rng.h"
#include "reference/ops/moe_experts.h"

namespace bp {
namespace {

constexpr int kH = 2048, kI = 768, kE = 128, kTopK = 8;
constexpr uint64_t kRouterSeed = 30;

using bench::Options;

// ids [T][k] of the hash router: per token, experts by descending hash, ties to the lower id.
std::vector<int> hash_router(int T) {
  std::vector<int> ids(size_t(T) * kTopK), order(kE);
  std::vector<uint64_t> score(kE);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < kE; ++e) {
      score[e] = counter_hash(kRouterSeed, uint64_t(t) * kE + e);
      order[e] = e;
    }
    std::partial_sort(order.begin(), order.begin() + kTopK, order.end(),
                      [&](int a, int b) { return score[a] != score[b] ? score[a] > score[b] : a < b; });
    std::copy(order.begin(), order.begin() + kTopK, ids.begin() + size_t(t) * kTopK);
  }
  return ids;
}

// All experts' weights, on the device for the whole run.
struct Experts {
  std::vector<cuda::DeviceBuffer<bf16>> gate, up, down;
  std::vector<const bf16*> g, u, d;
  Experts() {
    for (int e = 0; e < kE; ++e) {
      uint32_t seed = 100 + 3 * e;
      for (auto* v : {&gate, &up, &down}) {
        v->emplace_back(size_t(kH) * kI);
        bench::fill(v->back(), seed++);
      }
      g.push_back(gate.back().get());
      u.push_back(up.back().get());
      d.push_back(down.back().get());
    }
  }
  ref::ExpertWeights view() const { return {g.data(), u.data(), d.data()}; }
};

// Every expert's fp32 weight gradients, written (not accumulated) by each backward.
struct ExpertGradBuffers {
  std::vector<cuda::DeviceBuffer<float>> gate, up, down;
  std::vector<float*> g, u, d;
  ExpertGradBuffers() {
    for (int e = 0; e < kE; ++e) {
      for (auto* v : {&gate, &up, &down}) v->emplace_back(size_t(kH) * kI);
      g.push_back(gate.back().get());
      u.push_back(up.back().get());
      d.push_back(down.back().get());
    }
  }
  ref::ExpertGrads view() const { return {g.data(), u.data(), d.data()}; }
};

void print_row(const char* op, const std::string& contract, int T, size_t rows, int rows_max, int used, double us,
               double flops) {
  std::printf("%s,%s,%d,%d,%d,%d,%d,%zu,%d,%d,%.2f,%.2f,%llu\n", op, contract.c_str(), T, kTopK, kE, kH, kI, rows,
              rows_max, used, us, flops / us * 1e-6, static_cast<unsigned long long>(cuda::pool_peak_bytes()));
  std::fflush(stdout);
}

void bench_case(const Options& opt, const std::string& contract, const Experts& w, int T) {
  const Knobs& kn = find_contract(contract)->knobs;
  const std::vector<int> ids = hash_router(T);
  const size_t rows = ids.size();
  std::vector<int> offset(kE + 1), token(rows), slot(rows);
  ref::moe_dispatch(ids.data(), T, kTopK, kE, offset.data(), token.data(), slot.data());
  const ref::MoeDispatch plan{kE, offset.data(), token.data(), slot.data()};
  int rows_max = 0, used = 0;
  for (int e = 0; e < kE; ++e) {
    rows_max = std::max(rows_max, offset[e + 1] - offset[e]);
    used += offset[e + 1] > offset[e];
  }
  const double fwd_flops = 2.0 * double(rows) * 3.0 * kH * kI;
  cuda::DeviceBuffer<bf16> a(size_t(T) * kH), topk_w(rows);
  bench::fill(a, 1);
  bench::fill(topk_w, 2);
  BP_CUDA_CHECK(cudaDeviceSynchronize());
  cuda::reset_pool_peak();
  {
    cuda::DeviceBuffer<bf16> c(rows * kH);
    const double us = bench::median_us(
        opt, [&] { cuda::moe_experts_fwd(kn, plan, 0, kE, a.get(), topk_w.get(), w.view(), c.get(), kTopK, kH, kI); });
    BP_CUDA_CHECK(cudaDeviceSynchronize());
    print_row("experts_fwd", contract, T, rows, rows_max, used, us, fwd_flops);
  }
  cuda::reset_pool_peak();
  {
    const ExpertGradBuffers dw;
    cuda::DeviceBuffer<bf16> dout(size_t(T) * kH), dtopk_w(rows);  // dout [T][H]: every slot of t gets dout[t]
    cuda::DeviceBuffer<float> da_slot(rows * kH);
    bench::fill(dout, 3);
    const double us = bench::median_us(opt, [&] {
      cuda::moe_experts_bwd(kn, plan, 0, kE, a.get(), topk_w.get(), w.view(), dout.get(), da_slot.get(),
                            dtopk_w.get(), dw.view(), kTopK, kH, kI);
    });
    BP_CUDA_CHECK(cudaDeviceSynchronize());
    print_row("experts_bwd", contract, T, rows, rows_max, used, us, 2.0 * fwd_flops);
  }
}

int run(const Options& opt) {
  bench::require_hopper("bench_moe", opt);
  const Experts w;
  std::printf("op,impl,tokens,top_k,experts,H,I,rows,rows_max,experts_used,time_us,tflops,peak_bytes\n");
  for (const std::string& c : default_contract_names())
    for (int T : {128, 1024, 4096}) bench_case(opt, c, w, T);
  return kExitExact;
}

}  // namespace
}  // namespace bp

int main(int argc, char** argv) {
  const bp::bench::Options opt = bp::bench::parse_options("bench_moe", argc, argv);
  return bp::bench::guarded_main("bench_moe", [&] { return bp::run(opt); });
}
