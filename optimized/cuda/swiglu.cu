// swiglu on the GPU (SPEC.md §5.7): the reference's own per-element functions
// (swiglu_value, swiglu_grads in reference/ops/swiglu.h are __host__ __device__),
// one grid-stride thread per element; the dense MLP composed of the CUDA linear
// and swiglu in the reference's order.
#include "optimized/cuda/common.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/linear.h"
#include "optimized/cuda/swiglu.h"
#include "reference/numerics/chunked.h"
#include "reference/ops/swiglu.h"

namespace bp::cuda {
namespace {

// Both kernels go by packs of 8 (16-byte loads and stores) where every pointer is
// 16-byte aligned, element by element otherwise.
__global__ void swiglu_fwd_kernel(const bf16* __restrict__ g, const bf16* __restrict__ u, bf16* __restrict__ m,
                                  size_t n, bool packed) {
  for_each_packed(
      n, packed,
      [&](size_t i) {
        const Bf16x8 gs = load8(g + i), us = load8(u + i);
        store8(m + i, Bf16x8::of([&](int j) { return ref::swiglu_value(gs[j], us[j]); }));
      },
      [&](size_t i) { m[i] = ref::swiglu_value(g[i], u[i]); });
}

__global__ void swiglu_bwd_kernel(const bf16* __restrict__ g, const bf16* __restrict__ u, const bf16* __restrict__ dm,
                                  bf16* __restrict__ dg, bf16* __restrict__ du, size_t n, bool packed) {
  for_each_packed(
      n, packed,
      [&](size_t i) {
        const Bf16x8 gs = load8(g + i), us = load8(u + i), dms = load8(dm + i);
        bf16 dgs[kPack], dus[kPack];
#pragma unroll
        for (int j = 0; j < kPack; ++j) ref::swiglu_grads(gs[j], us[j], dms[j], dgs[j], dus[j]);
        store8(dg + i, Bf16x8::of([&](int j) { return dgs[j]; }));
        store8(du + i, Bf16x8::of([&](int j) { return dus[j]; }));
      },
      [&](size_t i) { ref::swiglu_grads(g[i], u[i], dm[i], dg[i], du[i]); });
}


// y = R(x) (not sum_round, whose +0 start would turn an accumulator of −0 into +0).
__global__ void round_kernel(const float* __restrict__ x, bf16* __restrict__ y, size_t n) {
  for_each_index(n, [&](size_t i) { y[i] = round_bf16(x[i]); });
}

size_t elems(int rows, int cols) { return static_cast<size_t>(rows) * cols; }

}  // namespace

void swiglu_fwd(const bf16* g, const bf16* u, bf16* m, int n, cudaStream_t stream) {
  if (n <= 0) return;
  const bool packed = all_aligned16({g, u, m});
  swiglu_fwd_kernel<<<grid_for_packed(n, packed), kBlockThreads, 0, stream>>>(g, u, m, n, packed);
  BP_CUDA_CHECK_LAUNCH();
}

void swiglu_bwd(const bf16* g, const bf16* u, const bf16* dm, bf16* dg, bf16* du, int n, cudaStream_t stream) {
  if (n <= 0) return;
  const bool packed = all_aligned16({g, u, dm, dg, du});
  swiglu_bwd_kernel<<<grid_for_packed(n, packed), kBlockThreads, 0, stream>>>(g, u, dm, dg, du, n, packed);
  BP_CUDA_CHECK_LAUNCH();
}

void mlp_hidden_fwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, bf16* g, bf16* u, bf16* m, int T,
                    int H, int I, cudaStream_t stream) {
  linear_fwd(kn, a, wg, g, T, H, I, 1, stream);
  linear_fwd(kn, a, wu, u, T, H, I, 1, stream);
  swiglu_fwd(g, u, m, T * I, stream);
}

void mlp_fwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* wd, bf16* d, int T, int H,
             int I, cudaStream_t stream) {
  DeviceBuffer<bf16> g(elems(T, I), stream), u(elems(T, I), stream), m(elems(T, I), stream);
  mlp_hidden_fwd(kn, a, wg, wu, g.get(), u.get(), m.get(), T, H, I, stream);
  linear_fwd(kn, m.get(), wd, d, T, I, H, kn.tp_tree_width, stream);
}

void mlp_input_grad_acc(const Knobs& kn, const bf16* dg, const bf16* du, const bf16* wg, const bf16* wu, float* acc,
                        int T, int H, int I, cudaStream_t stream) {
  const DgradPair gate_up{dg, wg, du, wu, T, acc};
  linear_dgrad_pair_grouped(kn, &gate_up, 1, H, I, kn.tp_tree_width, fixed_chunk_len(I, kn.tp_tree_width), stream);
}

void mlp_down_bwd(const Knobs& kn, const bf16* dy, const bf16* wd, const bf16* m, bf16* dm, float* dwd, int T, int H,
                  int I, cudaStream_t stream) {
  linear_dgrad(kn, dy, wd, dm, T, I, H, 1, stream);
  linear_wgrad(kn, dy, m, dwd, T, I, H, stream);
}

void mlp_hidden_bwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* g, const bf16* u,
                    const bf16* dm, float* da_acc, float* dwg, float* dwu, int T, int H, int I, cudaStream_t stream) {
  DeviceBuffer<bf16> dg(elems(T, I), stream), du(elems(T, I), stream);
  swiglu_bwd(g, u, dm, dg.get(), du.get(), T * I, stream);
  mlp_input_grad_acc(kn, dg.get(), du.get(), wg, wu, da_acc, T, H, I, stream);
  linear_wgrad(kn, dg.get(), a, dwg, T, H, I, stream);
  linear_wgrad(kn, du.get(), a, dwu, T, H, I, stream);
}

void mlp_bwd(const Knobs& kn, const bf16* a, const bf16* wg, const bf16* wu, const bf16* wd, const bf16* dd, bf16* da,
             float* dwg, float* dwu, float* dwd, int T, int H, int I, cudaStream_t stream) {
  DeviceBuffer<bf16> g(elems(T, I), stream), u(elems(T, I), stream), m(elems(T, I), stream), dm(elems(T, I), stream);
  DeviceBuffer<float> acc(elems(T, H), stream);
  mlp_hidden_fwd(kn, a, wg, wu, g.get(), u.get(), m.get(), T, H, I, stream);
  mlp_down_bwd(kn, dd, wd, m.get(), dm.get(), dwd, T, H, I, stream);
  mlp_hidden_bwd(kn, a, wg, wu, g.get(), u.get(), dm.get(), acc.get(), dwg, dwu, T, H, I, stream);
  const size_t n = elems(T, H);
  if (n == 0) return;
  round_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(acc.get(), da, n);
  BP_CUDA_CHECK_LAUNCH();
}

}  // namespace bp::cuda
