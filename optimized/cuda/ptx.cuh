// The PTX the tensor-core kernels share (linear_mma.cu, linear_decode.cu,
// attention_tile.cuh): cp.async copies, streamed global loads, ldmatrix fragment
// loads and the bf16 mma.sync whose chain of k16 groups is the sm90-tc dot model
// (tools/hw_truth/hw_truth.cu proves it on the hardware).
#pragma once
#include <cstdint>

#include "reference/numerics/bf16.h"

namespace bp::cuda {

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Two floats at a shared-memory address, by ld/st.shared: a generic pointer that may
// be shared or global compiles to ST.E, which queues behind global traffic (lg_throttle).
__device__ inline float2 ld_shared_f32x2(uint32_t at) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(at) : "memory");
  return v;
}
__device__ inline void st_shared_f32x2(uint32_t at, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(x), "f"(y) : "memory");
}

// 16 bytes global -> shared; src_bytes < 16 zero-fills the rest (0: no read at all).
__device__ inline void cp_async16(void* dst, const void* src, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
// The same for rows streamed once (keys, values): a miss fetches the surrounding 256
// bytes into L2 (a whole key row of head_dim 128), one DRAM burst for the row.
__device__ inline void cp_async16_stream(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 8 bytes of an operand read once per kernel (a streamed weight): not kept in L1,
// and a miss fetches the surrounding 256 bytes into L2, which the same lanes read
// next (one DRAM burst instead of eight 32-byte sectors). volatile keeps the loads
// in program order, ahead of the instructions that use them.
__device__ inline uint2 ld_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
// The same 8 bytes into shared memory by cp.async (its bytes in flight cost no
// registers), with the same L2 prefetch.
__device__ inline void cp_async8_stream(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global.L2::256B [%0], [%1], 8;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// Four 8×8 matrices of b16 from shared memory (PTX ISA, ldmatrix).
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
// The same, transposed: B fragments of an operand stored [k][n].
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// {R(lo), R(hi)} as one register (lo in the low half) for every non-NaN input (a NaN
// becomes 0x7FFF where R gives 0x7FC0): only for mma operands, whose NaN result is
// 0x7FFFFFFF whatever the operand's payload (SPEC.md §2.3.3), so the bits of the
// product do not depend on it. hw_truth's bf16_cvt row checks it over all 2^32 inputs.
__device__ inline uint32_t cvt_bf16x2_rn(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// {R(lo), R(hi)} as one register for every input, a NaN's half the canonical 0x7FC0
// as R gives it: the stored outputs' rounding in 5 instructions a pair where two
// integer roundings take about 13.
__device__ inline uint32_t round_bf16x2(float lo, float hi) {
  uint32_t d = cvt_bf16x2_rn(lo, hi);
  if (lo != lo) d = (d & 0xffff0000u) | kCanonicalNanBf16;
  if (hi != hi) d = (d & 0x0000ffffu) | (uint32_t{kCanonicalNanBf16} << 16);
  return d;
}

// max(a, b), NaN where either is (max.NaN, one FMNMX.NAN): a tree of it tells whether
// any of its inputs was NaN, where fmaxf's ignores them.
__device__ inline float fmax_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

// d = d + A·B for one 16 × 8 tile and one group of 16: one G step of sm90-tc per output.
__device__ inline void mma_m16n8k16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The diagonal of a 16 × 16 product held as two m16n8 tiles, d0 (columns 0-7) and d1
// (8-15): f(g, D[g][g], D[8 + g][8 + g]) on the lane holding them (4g + g/2), g < 8.
// Kernels that need only the diagonal (dots along matching rows or columns of two
// operands) get each element's own chain of k16 groups, the sm90-tc model's.
template <class F>
__device__ void for_diagonal(const float (&d0)[4], const float (&d1)[4], int lane, F&& f) {
  const int g = lane / 4;
  if (lane % 4 != g / 2) return;
  const bool odd = g % 2 != 0;  // selects, not an index: d0 and d1 stay in registers
  f(g, odd ? d0[1] : d0[0], odd ? d1[3] : d1[2]);
}

}  // namespace bp::cuda
