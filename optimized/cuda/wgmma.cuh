// The Hopper PTX of the warpgroup GEMM (linear_wgmma.cu): mbarriers, TMA tile copies and
// wgmma with both operands in 128-byte-swizzled shared memory. Each wgmma k16 is
// one G step of the sm90-tc dot model per output, the same as mma.sync's
// (tools/hw_truth/hw_truth.cu ran both instructions on every captured case and they
// always agreed). Needs sm_90a.
#pragma once
#include <cstdint>

namespace bp::cuda::sm90 {

// --- mbarriers (shared::cta) -----------------------------------------------------
__device__ inline uint32_t shared_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ inline void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the copy engine and the other threads
// (with the __syncthreads that follows).
__device__ inline void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ inline void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_addr(bar)) : "memory");
}
// The producer's arrival, announcing the bytes the phase's copies will deliver.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(bytes)
               : "memory");
}
// Waits until the phase of the given parity has completed; the barrier by its
// shared-memory address (a loop that keeps it saves the conversion each time).
__device__ inline void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t parity) { mbarrier_wait(shared_addr(bar), parity); }

// --- named barriers over one warpgroup (ids 1..15; 0 is __syncthreads) ---------------
__device__ inline void warpgroup_sync(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }
// The same over two warpgroups: sync waits for all 256 threads, arrive counts 128 of
// them without waiting (the other warpgroup's sync completes the barrier).
__device__ inline void two_warpgroups_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ inline void two_warpgroups_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
// Whether any of the warpgroup's 128 threads has x (a barrier too).
__device__ inline bool warpgroup_any(bool x, int id) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\nbar.red.or.pred p, %2, 128, q;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(r)
      : "r"(static_cast<uint32_t>(x)), "r"(id)
      : "memory");
  return r != 0;
}

// --- TMA ----------------------------------------------------------------------------
// One 2-D box of `map` at (inner, outer) into shared memory, completing on `bar`.
// Elements outside the tensor arrive as zeros; the full box counts toward the bytes.
__device__ inline void tma_load_2d(void* dst, const void* map, uint64_t* bar, int inner, int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          shared_addr(dst)),
      "l"(map), "r"(shared_addr(bar)), "r"(inner), "r"(outer)
      : "memory");
}

// One 3-D box of `map` at (c0, c1, c2) (attention's [rows][heads][D] keys and values).
__device__ inline void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(shared_addr(dst)),
      "l"(map), "r"(shared_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// `bytes` contiguous bytes from global into shared memory (both 16-byte aligned, bytes
// a multiple of 16), completing on `bar` (no tensor map: a plain bulk copy).
__device__ inline void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          shared_addr(dst)),
      "l"(src), "r"(bytes), "r"(shared_addr(bar))
      : "memory");
}

// --- clusters: the warpgroup GEMM's CTA pairs, the decode engine's shared x ------------
__device__ inline uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA in the cluster meets here after the barriers' init
// (fence.mbarrier_init orders those): a peer's copies and arrivals may reach this
// CTA's barriers from then on. The arrive is relaxed: a release arrive puts
// MEMBAR.ALL.GPU and ERRBAR before it (a visible stall in the decode engine at
// M = 16), and whatever else the CTA's threads must see of each other needs only
// a __syncthreads before this.
__device__ inline void cluster_sync_after_barrier_init() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// An arrival on the barrier at bar's offset in the shared memory of the cluster's
// CTA `rank`, with the default release at CTA scope: what it orders (a stage's wgmma
// reads, completed by a wgmma wait) needs no cluster-scope fence, and
// `.release.cluster` put a MEMBAR before every arrival, on which the consumer warps
// then stalled most of their time (bench/DECISIONS.md, linear: why 2-CTA clusters
// were slow).
__device__ inline void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(shared_addr(bar)),
      "r"(rank)
      : "memory");
}
__device__ inline uint32_t cluster_size() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
// bulk_load into dst's offset of every CTA of the cluster in `ctas` (a bit per
// rank), each copy completing on the barrier at bar's offset in its CTA.
__device__ inline void bulk_load_multicast(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                           uint16_t ctas) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1], %2, [%3], %4;\n" ::"r"(shared_addr(dst)),
      "l"(src), "r"(bytes), "r"(shared_addr(bar)), "h"(ctas)
      : "memory");
}
// tma_load_2d into dst's offset of every CTA of the cluster in `ctas` (a bit per
// rank), each copy completing on the barrier at bar's offset in its CTA.
__device__ inline void tma_load_2d_multicast(void* dst, const void* map, uint64_t* bar, int inner, int outer,
                                             uint16_t ctas) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(shared_addr(dst)),
      "l"(map), "r"(shared_addr(bar)), "r"(inner), "r"(outer), "h"(ctas)
      : "memory");
}

// Orders this thread's generic-proxy shared-memory writes (st.shared, cp.async)
// before later async-proxy accesses (wgmma operand reads, TMA writes) of the same bytes.
__device__ inline void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// One 2-D box from shared memory (at `src`) into `map` at (inner, outer), in this
// thread's current bulk group; the parts of the box outside the tensor are not written.
__device__ inline void tma_store_2d(const void* map, uint32_t src, int inner, int outer) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map), "r"(src),
               "r"(inner), "r"(outer)
               : "memory");
}
__device__ inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until this thread's bulk groups have read their shared memory (it may be written again).
__device__ inline void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Until they have completed.
__device__ inline void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Four 8 × 8 b16 matrices into shared memory: matrix q from register rq (thread T
// holds row T / 4, elements 2·(T % 4) and + 1, mma's C layout), its row r at the
// address lane 8q + r gives.
__device__ inline void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// --- registers --------------------------------------------------------------------
// setmaxnreg: the producer warpgroup gives registers back, the consumers take them.
template <int Regs>
__device__ inline void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
template <int Regs>
__device__ inline void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

// Eight accumulator operands d[i .. i + 7] of a wgmma asm (inline PTX takes no
// register arrays, so each instruction lists its 32 to 128 outputs).
#define BP_WGMMA_D8(d, i)                                                                                  \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])

// --- wgmma ----------------------------------------------------------------------------
// Shared-memory matrix descriptor with 128-byte swizzle (bits 0-13 start address
// >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 62-63 = 1). The swizzle is a function of
// the address bits, so each operand tile starts 1024-byte aligned.
__device__ inline uint64_t swizzled_descriptor(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3fffu) << 32) | (uint64_t{1} << 62);
}

// desc with its start address `bytes` further. The address field (bits 0–13, in
// 16-byte units) takes the offset without a carry while the new address stays
// below 2^18 (shared memory is smaller), so only the low word changes: one add
// per wgmma instead of rebuilding the descriptor from the address.
__device__ inline uint64_t descriptor_plus(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xffffffff00000000ull) | lo;
}

// x, which every lane of the warp holds alike, taken from lane 0: ptxas then knows
// it warp-uniform and forms what derives from it (the wgmma descriptors of a stage
// or a warpgroup's tile) in uniform registers, instead of moving each word there
// (R2UR). CUTLASS's canonical_warp_group_idx does the same. Every lane calls it.
template <class T>
__device__ inline T warp_uniform(T x) {
  return __shfl_sync(0xffffffffu, x, 0);
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int Pending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous wgmma.
template <int N>
__device__ inline void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d += A·B for a 64 × N tile and one k16 group (scale_d = 0: d = A·B, d's input
// ignored, which hw_truth checks gives the bits of a +0 d), scales 1, TransA /
// TransB = 1 where that operand is stored M- or N-major.
template <int TransA, int TransB>
__device__ inline void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : BP_WGMMA_D8(d, 0), BP_WGMMA_D8(d, 8), BP_WGMMA_D8(d, 16), BP_WGMMA_D8(d, 24),
        BP_WGMMA_D8(d, 32), BP_WGMMA_D8(d, 40), BP_WGMMA_D8(d, 48), BP_WGMMA_D8(d, 56)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB));
}

template <int TransA, int TransB>
__device__ inline void wgmma_m64n192k16(float (&d)[96], uint64_t desc_a, uint64_t desc_b, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
      "}, %96, %97, p, 1, 1, %99, %100;\n}\n"
      : BP_WGMMA_D8(d, 0), BP_WGMMA_D8(d, 8), BP_WGMMA_D8(d, 16), BP_WGMMA_D8(d, 24),
        BP_WGMMA_D8(d, 32), BP_WGMMA_D8(d, 40), BP_WGMMA_D8(d, 48), BP_WGMMA_D8(d, 56),
        BP_WGMMA_D8(d, 64), BP_WGMMA_D8(d, 72), BP_WGMMA_D8(d, 80), BP_WGMMA_D8(d, 88)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB));
}

template <int TransA, int TransB>
__device__ inline void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
      : BP_WGMMA_D8(d, 0), BP_WGMMA_D8(d, 8), BP_WGMMA_D8(d, 16), BP_WGMMA_D8(d, 24),
        BP_WGMMA_D8(d, 32), BP_WGMMA_D8(d, 40), BP_WGMMA_D8(d, 48), BP_WGMMA_D8(d, 56),
        BP_WGMMA_D8(d, 64), BP_WGMMA_D8(d, 72), BP_WGMMA_D8(d, 80), BP_WGMMA_D8(d, 88),
        BP_WGMMA_D8(d, 96), BP_WGMMA_D8(d, 104), BP_WGMMA_D8(d, 112), BP_WGMMA_D8(d, 120)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB));
}

// The same products for N = 64 (attention's scores: 64 keys a block), and with A in
// registers (`_rs`: four b32 of bf16 pairs in mma.sync's m16n8k16 A layout per
// warp, the PTX ISA's wgmma register fragment), as attention's R(P)·V takes them.
template <int TransA, int TransB>
__device__ inline void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : BP_WGMMA_D8(d, 0), BP_WGMMA_D8(d, 8), BP_WGMMA_D8(d, 16), BP_WGMMA_D8(d, 24)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB));
}

template <int TransB>
__device__ inline void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
      : BP_WGMMA_D8(d, 0), BP_WGMMA_D8(d, 8), BP_WGMMA_D8(d, 16), BP_WGMMA_D8(d, 24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
}

template <int TransB>
__device__ inline void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
      : BP_WGMMA_D8(d, 0), BP_WGMMA_D8(d, 8), BP_WGMMA_D8(d, 16), BP_WGMMA_D8(d, 24),
        BP_WGMMA_D8(d, 32), BP_WGMMA_D8(d, 40), BP_WGMMA_D8(d, 48), BP_WGMMA_D8(d, 56)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
}

}  // namespace bp::cuda::sm90
