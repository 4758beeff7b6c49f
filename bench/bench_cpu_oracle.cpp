// bench_cpu_oracle: the CPU reference's kernels against this host's fp32 FMA peak,
// measured in the same run (issue #22). A plain table on stdout; not a test.
//   bench_cpu_oracle [--quick]     (OMP_NUM_THREADS picks the threads)
// Peak: independent register-resident fma chains, one thread and all threads, in
// AVX2 and (where the host has it) AVX-512; the larger counts. Kernels at
// Qwen3-0.6B shapes over 512 tokens: linear (forward, dX, dW) under both dot
// models, the scalar definition beside them for the speed-up, attention's forward
// and backward, and RMSNorm as the row op. GFLOP/s counts 2 per multiply-add of the
// op's definition (the attention backward: its five products per visible pair, the
// recompute of P counted once); RMSNorm counts 4 per element (square-add, scale,
// weight, round).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "reference/common/rng.h"
#include "reference/contract/contract.h"
#include "reference/numerics/chunked.h"
#include "reference/ops/attention.h"
#include "reference/ops/dot_tiles.h"
#include "reference/ops/linear.h"
#include "reference/ops/rmsnorm.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best seconds per call over repeats filling at least min_s (and at least 2 calls).
template <class F>
double best_seconds(F&& f, double min_s) {
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 2 || total < min_s; ++rep) {
    const auto t0 = Clock::now();
    f();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
  }
  return best;
}

#if defined(__x86_64__)
// Twelve independent chains per thread (fma latency 4–5 cycles × 2 ports); x < 1 and
// a small y keep every value normal.
__attribute__((target("avx2,fma"))) float fma_chains_avx2(long iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(1.0f + i);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-6f);
  for (long it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  float s = 0;
  for (int i = 0; i < 12; ++i) s += _mm256_cvtss_f32(acc[i]);
  return s;
}
__attribute__((target("avx512f"))) float fma_chains_avx512(long iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(1.0f + i);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-6f);
  for (long it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  float s = 0;
  for (int i = 0; i < 12; ++i) s += _mm512_cvtss_f32(acc[i]);
  return s;
}
#endif

volatile float g_sink;

// GFLOP/s of `lanes`-wide fma chains on `threads` threads.
template <class Chains>
double fma_peak(Chains chains, int lanes, int threads) {
  const long iters = 20'000'000;
  const double s = best_seconds(
      [&] {
#pragma omp parallel num_threads(threads)
        {
          const float r = chains(iters);
          if (r == 0.0f) g_sink = r;  // a use of every thread's chains
        }
      },
      0.3);
  return 2.0 * 12 * lanes * iters * threads / s * 1e-9;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

double g_peak = 0;  // all threads, GFLOP/s

void row(const char* kernel, const char* model, const std::string& shape, double flops, double s) {
  const double gf = flops / s * 1e-9;
  std::printf("| %-14s | %-7s | %-26s | %10.2f | %8.2f | %6.2f%% |\n", kernel, model, shape.c_str(), s * 1e3, gf,
              100.0 * gf / g_peak);
}

struct LinearShape {
  const char* name;
  int M, K, N, chunks;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace bp;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int threads = omp_get_max_threads();
  std::printf("# bench_cpu_oracle: %s, %d threads, SIMD path %s\n", cpu_name().c_str(), threads,
              ref::dot_rows_simd_available() ? "AVX2+FMA" : "absent (scalar definition)");

#if defined(__x86_64__)
  const double avx2_1 = fma_peak(fma_chains_avx2, 8, 1), avx2_all = fma_peak(fma_chains_avx2, 8, threads);
  double avx512_1 = 0, avx512_all = 0;
  if (__builtin_cpu_supports("avx512f"))
    avx512_1 = fma_peak(fma_chains_avx512, 16, 1), avx512_all = fma_peak(fma_chains_avx512, 16, threads);
  std::printf("# fp32 FMA peak, GFLOP/s: AVX2 %.1f (1 thread) %.1f (%d threads); AVX-512 %.1f / %.1f%s\n", avx2_1,
              avx2_all, threads, avx512_1, avx512_all, avx512_1 ? "" : " (absent)");
  g_peak = std::max(avx2_all, avx512_all);
#else
  std::printf("# no x86-64 FMA peak loop on this host\n");
  return 2;
#endif
  std::printf("# fractions below are of the all-thread peak, %.1f GFLOP/s\n\n", g_peak);
  std::printf("| %-14s | %-7s | %-26s | %10s | %8s | %7s |\n", "kernel", "model", "shape", "ms", "GFLOP/s", "of peak");
  std::printf("|----------------|---------|----------------------------|------------|----------|---------|\n");

  const int T = quick ? 128 : 512;
  const double min_s = quick ? 0.2 : 1.0;
  // Qwen3-0.6B: hidden 1024, 16 query and 8 kv heads of 128, MLP 3072; the
  // row-parallel projections (o, down) cut K into tp_tree_width chunks.
  const LinearShape shapes[] = {{"q_proj", T, 1024, 2048, 1},  {"kv_proj", T, 1024, 1024, 1},
                                {"o_proj C=8", T, 2048, 1024, 8}, {"gate/up", T, 1024, 3072, 1},
                                {"down C=8", T, 3072, 1024, 8}};
  for (const char* name : {"bf16-fmaseq-v1", "bf16-sm90tc-v1"}) {
    const Knobs kn = find_contract(name)->knobs;
    const char* model = kn.dot == DotModel::FmaSeq ? "fma-seq" : "sm90-tc";
    for (const LinearShape& s : shapes) {
      const auto x = random_bf16(size_t(s.M) * s.K, 1, 1.0f), w = random_bf16(size_t(s.N) * s.K, 2, 0.05f);
      std::vector<float> acc(size_t(s.M) * s.N);
      const double sec = best_seconds(
          [&] {
            ref::linear_acc(kn, x.data(), w.data(), acc.data(), s.M, s.K, s.N, s.chunks,
                            fixed_chunk_len(s.K, s.chunks));
          },
          min_s);
      row("linear fwd", model, std::string(s.name) + " " + std::to_string(s.M) + "x" + std::to_string(s.K) + "x" +
                                   std::to_string(s.N), 2.0 * s.M * s.K * s.N, sec);
    }
    {  // the gradients of gate/up: dX over N = 3072 in C chunks, dW over tokens
      const int K = 1024, N = 3072;
      const auto x = random_bf16(size_t(T) * K, 3, 1.0f), w = random_bf16(size_t(N) * K, 4, 0.05f),
                 dy = random_bf16(size_t(T) * N, 5, 1.0f);
      std::vector<float> dx(size_t(T) * K), dw(size_t(N) * K);
      const std::string shape = "gate/up " + std::to_string(T) + "x1024x3072";
      row("linear dX", model, shape + " C=8", 2.0 * T * K * N,
          best_seconds(
              [&] { ref::linear_dgrad_acc(kn, dy.data(), w.data(), dx.data(), T, K, N, 8, fixed_chunk_len(N, 8)); },
              min_s));
      row("linear dW", model, shape,
          2.0 * T * K * N, best_seconds([&] { ref::linear_wgrad(kn, dy.data(), x.data(), dw.data(), T, K, N); }, min_s));
    }
    {  // the definition, one output at a time (what every GEMM ran before dot_tiles)
      const int M = quick ? 8 : 32, K = 1024, N = 1024;
      const auto a = random_bf16(size_t(M) * K, 6, 1.0f), b = random_bf16(size_t(N) * K, 7, 0.05f);
      std::vector<float> out(size_t(M) * N);
      row("scalar defn", model, std::to_string(M) + "x1024x1024",
          2.0 * M * K * N, best_seconds([&] { ref::dot_rows_scalar(kn.dot, a.data(), M, b.data(), N, K, K, 1, out.data()); }, min_s));
    }
    {  // attention, one causal sequence: QK^T and PV over T(T+1)/2 pairs per head forward;
       // the backward's products of the definition (scores, dP, dq, dk, dv) likewise
      const ref::AttnDims dims{16, 8, 128};
      const ref::AttnSeq seq{0, T, 0, 0};
      const auto q = random_bf16(size_t(T) * dims.Hq * dims.D, 8, 1.0f),
                 k = random_bf16(size_t(T) * dims.Hkv * dims.D, 9, 1.0f),
                 v = random_bf16(size_t(T) * dims.Hkv * dims.D, 10, 1.0f),
                 dout = random_bf16(q.size(), 13, 1.0f);
      std::vector<bf16> o(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
      std::vector<float> m(size_t(T) * dims.Hq), l(m.size());
      const double pairs = 0.5 * T * (T + 1.0) * dims.Hq;
      const std::string shape = "16/8 heads x128, T=" + std::to_string(T);
      row("attention fwd", model, shape, 4.0 * pairs * dims.D,
          best_seconds([&] { ref::attention_fwd(kn, dims, &seq, 1, q.data(), k.data(), v.data(), o.data(), m.data(), l.data()); }, min_s));
      row("attention bwd", model, shape, 10.0 * pairs * dims.D, best_seconds([&] {
            ref::attention_bwd(kn, dims, &seq, 1, q.data(), k.data(), v.data(), o.data(), m.data(), l.data(), dout.data(),
                               dq.data(), dk.data(), dv.data());
          }, min_s));
    }
    {
      const int n = 1024;
      const auto x = random_bf16(size_t(T) * n, 11, 1.0f), w = random_bf16(n, 12, 1.0f);
      std::vector<bf16> out(x.size());
      std::vector<float> rstd(T);
      row("rmsnorm fwd", model, std::to_string(T) + "x1024", 4.0 * T * n,
          best_seconds([&] { ref::rmsnorm_fwd(kn, x.data(), w.data(), 1e-6f, out.data(), rstd.data(), T, 1, n); }, min_s));
    }
  }
  return 0;
}
