// hw_truth: captures the Hopper tensor cores' bf16 dot products once and checks
// them against bp::Sm90Tc bit for bit; settles the open edge cases of SPEC.md
// §2.3.3 with explicit probes; compares the device build of bp::math with the host
// build over all 2^32 inputs.
//
//   hw_truth [--out DIR] [--quick] [--seed N] [--no-math | --math-only] [--math f,g,..]
//
// Writes DIR/summary.json and DIR/sm90_cases.csv (DIR: --out, else $OUT, else
// ./hw_out); summary.json is written once the dot products are done and again
// after each math function, so a run stopped early still reports what it did.
// The full math comparison costs about 8 x 2^32 host evaluations (minutes on 16
// cores); --math picks functions and --math-only skips the dot products, to split it.
// Exit 0: no mismatch; 1: mismatches (see summary.json); 3: CUDA error;
// 125: no Hopper GPU here (CTest's SKIP_RETURN_CODE).
//
// Each block of cases is one 64 x 8 output tile with K = 16 (or 64, 128 for
// chains): output (i, j) is the case (C[i][j], row i of A, column j of B). The
// same blocks go through mma.sync.m16n8k16 (four warps, 16 rows each) and through
// wgmma.m64n8k16 (one warpgroup), walking K upward with the accumulator in registers;
// wgmma also runs from a +0 accumulator and with scale-d = 0 on the first group,
// which must agree bit for bit (the GEMM kernels start a chunk with scale-d = 0).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "harness/exit_codes.h"
#include "optimized/cuda/device_util.cuh"
#include "optimized/cuda/ptx.cuh"
#include "reference/numerics/math.h"
#include "tools/hw_truth/hw_truth.h"

namespace bp::hw {
namespace {

#define BP_CUDA(call)                                                                                  \
  do {                                                                                                 \
    const cudaError_t err_ = (call);                                                                   \
    if (err_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "hw_truth: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(err_), __FILE__, \
                   __LINE__);                                                                          \
      std::exit(kExitInternal);                                                                        \
    }                                                                                                  \
  } while (0)

// ---------------------------------------------------------------------------
// mma.sync.m16n8k16: fragment layouts of the PTX ISA ("Matrix Fragments for
// mma.m16n8k16 with floating point type"), with g = lane / 4, t = lane % 4:
//   A (16 x 16, row):  a0,a1: (g, 2t..2t+1)   a2,a3: (g+8, 2t..)   a4,a5: (g, 2t+8..)   a6,a7: (g+8, 2t+8..)
//   B (16 x 8, col):   b0,b1: (k = 2t..2t+1, n = g)   b2,b3: (k = 2t+8.., n = g)
//   C/D (16 x 8):      c0,c1: (g, 2t..2t+1)   c2,c3: (g+8, 2t..2t+1)
// Two bf16 share a 32-bit register, the lower index in the low half.
__device__ inline uint32_t pack2(uint16_t lo, uint16_t hi) { return lo | (static_cast<uint32_t>(hi) << 16); }

__device__ inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The accumulator layout of both instructions within a warp's 16 rows: element
// e of lane (g, t) is output (row0 + g + 8·(e/2), 2t + e%2).
__device__ inline int out_index(int row0, int e) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  return (row0 + g + 8 * (e / 2)) * kN + 2 * t + (e % 2);
}

// One warp per 16-row slice of a block (warp w: rows 16w..16w+15).
__global__ void __launch_bounds__(128) mma_sync_kernel(const uint32_t* __restrict__ c, const uint16_t* __restrict__ a,
                                                       const uint16_t* __restrict__ b, int k, uint32_t* __restrict__ d) {
  const int blk = blockIdx.x, row0 = (threadIdx.x / 32) * 16;
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const uint32_t* C = c + static_cast<size_t>(blk) * kCasesPerBlock;
  const uint16_t* A0 = a + (static_cast<size_t>(blk) * kM + row0 + g) * k;  // row g of the slice
  const uint16_t* A1 = A0 + 8 * k;                                            // row g + 8
  const uint16_t* B = b + (static_cast<size_t>(blk) * kN + g) * k;           // column g
  float acc[4];
  for (int e = 0; e < 4; ++e) acc[e] = __uint_as_float(C[out_index(row0, e)]);
  for (int k0 = 0; k0 < k; k0 += 16) {
    const int kk = k0 + 2 * t;
    const uint32_t fa[4] = {pack2(A0[kk], A0[kk + 1]), pack2(A1[kk], A1[kk + 1]), pack2(A0[kk + 8], A0[kk + 9]),
                            pack2(A1[kk + 8], A1[kk + 9])};
    const uint32_t fb[2] = {pack2(B[kk], B[kk + 1]), pack2(B[kk + 8], B[kk + 9])};
    mma_m16n8k16(acc, fa, fb);
  }
  uint32_t* D = d + static_cast<size_t>(blk) * kCasesPerBlock;
  for (int e = 0; e < 4; ++e) D[out_index(row0, e)] = __float_as_uint(acc[e]);
}

// ---------------------------------------------------------------------------
// wgmma.m64n8k16 with both operands in shared memory, K-major, no swizzle. The
// canonical no-swizzle layout is built of 8 x 8 "core matrices" (8 rows of 16
// bytes, stored as 128 contiguous bytes). The matrix descriptor gives the byte
// distance between core matrices adjacent in K (leading dimension byte offset,
// LBO) and between those adjacent in M or N (stride dimension byte offset, SBO);
// CUTLASS's make_gmma_desc<Major::K> for INTERLEAVE has the same meaning.
// Our tiles: core matrix (row/8, kk/8) at (row/8)·256 + (kk/8)·128.
constexpr uint32_t kCoreK = 128, kCoreRow = 256;

struct Descriptor {
  uint32_t lbo, sbo;  // bytes
};

__device__ inline uint32_t tile_offset(int row, int kk) {
  return (row / 8) * kCoreRow + (kk / 8) * kCoreK + (row % 8) * 16 + (kk % 8) * 2;
}

// Descriptor bits: 0-13 start address >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4,
// 49-51 base offset (0), 62-63 swizzle mode (0 = none).
__device__ inline uint64_t smem_descriptor(const void* p, Descriptor desc) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | (static_cast<uint64_t>((desc.lbo >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((desc.sbo >> 4) & 0x3fffu) << 32);
}

// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous wgmma (CUTLASS's warpgroup_fence_operand).
__device__ inline void fence_operands(float (&d)[4]) {
  asm volatile("" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])::"memory");
}

__device__ inline void wgmma_m64n8k16(float (&d)[4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  // scale-d = 1 accumulates into d (0: d's input is ignored), scale-a = scale-b = 1,
  // no transpose (K-major).
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// Where a wgmma run's accumulator starts: the case's C, +0, or C ignored through
// scale-d = 0 on the first k16 group.
enum class Start : int { FromC, FromZero, ScaleD0 };

// One warpgroup per block; warp w's accumulator rows are 16w..16w+15 with the
// same per-warp layout as mma.sync's C/D.
__global__ void __launch_bounds__(128) wgmma_kernel(const uint32_t* __restrict__ c, const uint16_t* __restrict__ a,
                                                    const uint16_t* __restrict__ b, int k, uint32_t* __restrict__ d,
                                                    Descriptor desc, Start start) {
  __shared__ __align__(128) uint8_t sa[kM * 16 * 2];
  __shared__ __align__(128) uint8_t sb[kN * 16 * 2];
  const int blk = blockIdx.x, row0 = (threadIdx.x / 32) * 16;
  const uint32_t* C = c + static_cast<size_t>(blk) * kCasesPerBlock;
  const uint16_t* A = a + static_cast<size_t>(blk) * kM * k;
  const uint16_t* B = b + static_cast<size_t>(blk) * kN * k;
  float acc[4];
  for (int e = 0; e < 4; ++e) acc[e] = start == Start::FromZero ? 0.0f : __uint_as_float(C[out_index(row0, e)]);
  const uint64_t desc_a = smem_descriptor(sa, desc), desc_b = smem_descriptor(sb, desc);
  for (int k0 = 0; k0 < k; k0 += 16) {
    for (int e = threadIdx.x; e < kM * 16; e += blockDim.x)
      *reinterpret_cast<uint16_t*>(sa + tile_offset(e / 16, e % 16)) = A[(e / 16) * k + k0 + e % 16];
    for (int e = threadIdx.x; e < kN * 16; e += blockDim.x)
      *reinterpret_cast<uint16_t*>(sb + tile_offset(e / 16, e % 16)) = B[(e / 16) * k + k0 + e % 16];
    // Generic-proxy stores must be visible to the async proxy (the tensor cores).
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    fence_operands(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    wgmma_m64n8k16(acc, desc_a, desc_b, start == Start::ScaleD0 && k0 == 0 ? 0 : 1);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_operands(acc);
    __syncthreads();  // the next step overwrites the tiles
  }
  uint32_t* D = d + static_cast<size_t>(blk) * kCasesPerBlock;
  for (int e = 0; e < 4; ++e) D[out_index(row0, e)] = __float_as_uint(acc[e]);
}

// ---------------------------------------------------------------------------
// bp::math on the device: out[i] = f(first + i·step).
#define BP_HW_FUNCTOR(f) \
  struct Math_##f {      \
    __device__ float operator()(float x) const { return bp::math::f(x); } \
  };
BP_HW_MATH_FUNCTIONS(BP_HW_FUNCTOR)
#undef BP_HW_FUNCTOR

template <class F>
__global__ void math_kernel(uint32_t first, uint32_t step, uint32_t n, uint32_t* __restrict__ out) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = __float_as_uint(F{}(__uint_as_float(first + i * step)));
}

// bf16_cvt: the low half of cvt.rn.bf16x2.f32, widened.
struct CvtBf16 {
  __device__ float operator()(float x) const { return __uint_as_float(bp::cuda::cvt_bf16x2_rn(x, 0.0f) << 16); }
};

// exp2_poly_floor: math::exp2_poly with the kernels' core (device_util.cuh
// exp2_poly_core_floor), its clamp and NaN select around it.
struct Exp2PolyFloor {
  __device__ float operator()(float x) const {
    return x != x ? bp::math::detail::canonical_nan() : bp::cuda::exp2_poly_core_floor(fminf(x, 128.0f));
  }
};

// exp_batch: math::exp as the kernels evaluate it, 32 values per thread through
// exp_in_place (the branch-free common case and the subnormal redo); n % 32 == 0.
constexpr int kExpBatch = 32;
__global__ void exp_batch_kernel(uint32_t first, uint32_t step, uint32_t n, uint32_t* __restrict__ out) {
  for (uint32_t base = (blockIdx.x * blockDim.x + threadIdx.x) * kExpBatch; base < n;
       base += gridDim.x * blockDim.x * kExpBatch) {
    float x[kExpBatch];
    for (int j = 0; j < kExpBatch; ++j) x[j] = __uint_as_float(first + (base + j) * step);
    bp::cuda::exp_in_place<kExpBatch>(x);
    for (int j = 0; j < kExpBatch; ++j) out[base + j] = __float_as_uint(x[j]);
  }
}

void launch_math(int fn, uint32_t first, uint32_t step, uint32_t n, uint32_t* out) {
  int id = 0;
#define BP_HW_LAUNCH(f)                                      \
  if (fn == id++) {                                          \
    math_kernel<Math_##f><<<4096, 256>>>(first, step, n, out); \
    return;                                                  \
  }
  BP_HW_MATH_FUNCTIONS(BP_HW_LAUNCH)
#undef BP_HW_LAUNCH
  if (fn == id++) exp_batch_kernel<<<1024, 256>>>(first, step, n, out);
  else if (fn == id++) math_kernel<CvtBf16><<<4096, 256>>>(first, step, n, out);
  else math_kernel<Exp2PolyFloor><<<4096, 256>>>(first, step, n, out);
}

// ---------------------------------------------------------------------------
template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(size_t n) { BP_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T))); }
  DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) {
    BP_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> to_host(size_t n) const {
    std::vector<T> v(n);
    BP_CUDA(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

Results run_blocks(const BlockSet& set, Descriptor desc) {
  Results r;
  if (set.blocks() == 0) return r;
  DeviceBuffer<uint32_t> c(set.c), d(set.cases());
  DeviceBuffer<uint16_t> a(set.a), b(set.b);
  mma_sync_kernel<<<set.blocks(), 128>>>(c.p, a.p, b.p, set.k, d.p);
  BP_CUDA(cudaGetLastError());
  BP_CUDA(cudaDeviceSynchronize());
  r.mma = d.to_host(set.cases());
  for (auto [start, out] : {std::pair{Start::FromC, &r.wgmma}, std::pair{Start::FromZero, &r.wgmma_from_zero},
                            std::pair{Start::ScaleD0, &r.wgmma_scale_d0}}) {
    BP_CUDA(cudaMemset(d.p, 0xff, set.cases() * sizeof(uint32_t)));
    wgmma_kernel<<<set.blocks(), 128>>>(c.p, a.p, b.p, set.k, d.p, desc, start);
    BP_CUDA(cudaGetLastError());
    BP_CUDA(cudaDeviceSynchronize());
    *out = d.to_host(set.cases());
  }
  return r;
}

// ---------------------------------------------------------------------------
struct Options {
  std::string out;
  bool quick = false, dot = true;
  std::vector<int> math;  // function ids to compare
  uint64_t seed = 1;
};

std::vector<int> parse_functions(const std::string& list) {
  std::vector<int> ids;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t end = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, end - pos);
    const auto& names = math_functions();
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      std::fprintf(stderr, "hw_truth: unknown math function '%s'\n", name.c_str());
      std::exit(kExitBadInput);
    }
    ids.push_back(static_cast<int>(it - names.begin()));
    pos = end + 1;
  }
  return ids;
}

Options parse_options(int argc, char** argv) {
  Options o;
  const char* env = std::getenv("OUT");
  o.out = env && *env ? std::string(env) : "hw_out";
  for (size_t f = 0; f < math_functions().size(); ++f) o.math.push_back(static_cast<int>(f));
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) o.out = argv[++i];
    else if (arg == "--quick") o.quick = true;
    else if (arg == "--no-math") o.math.clear();
    else if (arg == "--math-only") o.dot = false;
    else if (arg == "--math" && i + 1 < argc) o.math = parse_functions(argv[++i]);
    else if (arg == "--seed" && i + 1 < argc) o.seed = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: hw_truth [--out DIR] [--quick] [--seed N] [--no-math | --math-only] [--math f,g,..]\n");
      std::exit(kExitBadInput);
    }
  }
  return o;
}

// A Hopper GPU (compute capability 9.0) or a reason why not.
bool find_hopper(std::string& why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    why = std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(err) + ")";
    return false;
  }
  cudaDeviceProp prop{};
  BP_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || prop.minor != 0) {
    why = std::string(prop.name) + " is sm_" + std::to_string(prop.major * 10 + prop.minor) +
          "; these probes need Hopper (sm_90a: wgmma)";
    return false;
  }
  return true;
}

void describe_device(Report& rep) {
  cudaDeviceProp prop{};
  BP_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  BP_CUDA(cudaDriverGetVersion(&driver));
  BP_CUDA(cudaRuntimeGetVersion(&runtime));
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  rep.device.push_back({"name", prop.name});
  rep.device.push_back({"compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor)});
  rep.device.push_back({"multiprocessors", std::to_string(prop.multiProcessorCount)});
  rep.device.push_back({"memory_bytes", std::to_string(prop.totalGlobalMem)});
  rep.device.push_back({"cuda_driver_api", version(driver)});
  rep.device.push_back({"cuda_runtime", version(runtime)});
  rep.device.push_back({"nvcc", std::to_string(__CUDACC_VER_MAJOR__) + "." + std::to_string(__CUDACC_VER_MINOR__) +
                                    "." + std::to_string(__CUDACC_VER_BUILD__)});
  std::ifstream drv("/proc/driver/nvidia/version");
  std::string line;
  if (std::getline(drv, line)) rep.device.push_back({"kernel_driver", line});
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Counts mismatches against the model per (category, instruction); collects raw
// NaN output bits. Returns the number of mismatching outputs (either instruction).
uint64_t compare_set(const BlockSet& set, const Results& hw, const std::vector<uint32_t>& model, Report& rep) {
  std::map<std::pair<std::string, std::string>, CountRow> rows;
  uint64_t bad = 0;
  for (size_t idx = 0; idx < set.cases(); ++idx) {
    std::string cat = set.category[idx / kCasesPerBlock];
    if (cat.rfind("probe.", 0) == 0) cat = "probe";
    const uint32_t want = canonical(model[idx]);
    const bool nonfinite = (model[idx] & 0x7f800000u) == 0x7f800000u;
    bool any = false;
    for (const auto& [name, out] : {std::pair<const char*, const std::vector<uint32_t>*>{"mma.sync.m16n8k16", &hw.mma},
                                    {"wgmma.m64n8k16", &hw.wgmma}}) {
      CountRow& row = rows[{cat, name}];
      row.category = cat;
      row.instruction = name;
      row.k = set.k;
      ++row.cases;
      row.nonfinite += nonfinite;
      const uint32_t got = (*out)[idx];
      if (canonical(got) != want) ++row.mismatches, any = true;
      if ((got & 0x7fffffffu) > 0x7f800000u) ++rep.nan_bits[got];
    }
    bad += any;
    rep.instructions_disagree += canonical(hw.mma[idx]) != canonical(hw.wgmma[idx]);
    ++rep.scale_d0_outputs;
    rep.scale_d0_disagree += canonical(hw.wgmma_from_zero[idx]) != canonical(hw.wgmma_scale_d0[idx]);
  }
  for (auto& [key, row] : rows) rep.counts.push_back(row);
  return bad;
}

// The layout probe decides whether the operand placement is right before any
// numerics are judged; for wgmma it also tries the descriptor with LBO and SBO
// exchanged, in case the hardware reads them the other way round.
bool check_layout(Report& rep, Descriptor& desc) {
  const BlockSet probe = layout_probe_block();
  const std::vector<uint32_t> want = model_outputs(probe);
  const Descriptor tries[2] = {{kCoreK, kCoreRow}, {kCoreRow, kCoreK}};
  bool mma_ok = false, wgmma_ok = false;
  for (const Descriptor& t : tries) {
    const Results r = run_blocks(probe, t);
    mma_ok = r.mma == want;
    if (r.wgmma == want) {
      desc = t;
      wgmma_ok = true;
      break;
    }
  }
  rep.wgmma_descriptor = "no swizzle, K-major, LBO " + std::to_string(desc.lbo) + " B, SBO " + std::to_string(desc.sbo) +
                         " B" + (desc.lbo == kCoreK ? "" : " (LBO/SBO exchanged: the first try failed)");
  rep.layout = mma_ok && wgmma_ok ? "ok"
               : std::string("FAILED:") + (mma_ok ? "" : " mma.sync fragments") + (wgmma_ok ? "" : " wgmma descriptors");
  std::printf("layout probe (exact small-integer sums, K = 32): %s; wgmma %s\n", rep.layout.c_str(),
              rep.wgmma_descriptor.c_str());
  return mma_ok && wgmma_ok;
}

std::vector<ProbeResult> run_probes(const std::vector<Probe>& probes, const BlockSet& set, const Results& hw,
                                    const std::vector<uint32_t>& model) {
  std::vector<ProbeResult> out;
  for (size_t p = 0; p < probes.size(); ++p) {
    const size_t base = p * kCasesPerBlock;
    ProbeResult r{probes[p], model[base], hw.mma[base], hw.wgmma[base], true};
    for (size_t i = base; i < base + kCasesPerBlock; ++i)
      r.uniform = r.uniform && hw.mma[i] == r.mma && hw.wgmma[i] == r.wgmma;
    out.push_back(r);
  }
  return out;
}

bool matches(const ProbeResult& p) {
  return canonical(p.mma) == canonical(p.model) && canonical(p.wgmma) == canonical(p.model);
}

// Plain-language answers to the open points of SPEC.md §2.3.3, read off the probes.
void answer_questions(Report& rep) {
  std::map<std::string, std::vector<const ProbeResult*>> by_q;
  for (const ProbeResult& p : rep.probes) by_q[p.probe.question].push_back(&p);
  for (const auto& [q, ps] : by_q) {
    std::string differ;
    for (const ProbeResult* p : ps)
      if (!matches(*p)) differ += " " + p->probe.name + "(hw " + hex32(p->mma) + "/" + hex32(p->wgmma) + ", model " +
                                  hex32(p->model) + ")";
    rep.answers.push_back({q, differ.empty() ? "all " + std::to_string(ps.size()) + " probes match the model"
                                             : "differ from the model:" + differ});
  }
  std::string nan = "hardware NaN outputs seen:";
  for (const auto& [bits, n] : rep.nan_bits) nan += " " + hex32(bits) + " (x" + std::to_string(n) + ")";
  rep.answers.push_back({"nan_output_bits", rep.nan_bits.empty() ? "no NaN output seen" : nan});
  std::string zeros = "hw (mma/wgmma) per probe:";
  for (const ProbeResult* p : by_q["zero_sign"]) zeros += " " + p->probe.name + "=" + hex32(p->mma) + "/" + hex32(p->wgmma);
  rep.answers.push_back({"exact_zero_sign_detail", zeros});
  // E floor: the deepest e0 whose borrow survived on both instructions.
  std::string floor = "borrow of 2^(e0-24) from 2^e0 kept (as the model, no floor) for e0 =";
  bool all = true;
  for (const ProbeResult* p : by_q["e_floor"])
    if (p->probe.name.rfind("borrow_below_", 0) == 0) {
      if (matches(*p)) floor += " " + p->probe.name.substr(std::strlen("borrow_below_2^"));
      else all = false;
    }
  rep.answers.push_back({"e_floor_detail", floor + (all ? " (all probed)" : "; NOT for the others: a floor on E")});
}

void print_report(const Report& rep) {
  for (const CountRow& c : rep.counts)
    std::printf("  k=%-3d %-16s %-18s cases %9llu  mismatches %llu  (model non-finite %llu)\n", c.k, c.category.c_str(),
                c.instruction.c_str(), static_cast<unsigned long long>(c.cases),
                static_cast<unsigned long long>(c.mismatches), static_cast<unsigned long long>(c.nonfinite));
  std::printf("probes:\n");
  for (const ProbeResult& p : rep.probes)
    std::printf("  %-20s %-32s model %s  mma %s  wgmma %s  %s%s\n", p.probe.question.c_str(), p.probe.name.c_str(),
                hex32(p.model).c_str(), hex32(p.mma).c_str(), hex32(p.wgmma).c_str(), matches(p) ? "ok" : "DIFFERS",
                p.uniform ? "" : " (not uniform over the tile)");
  std::printf("answers:\n");
  for (const auto& [q, a] : rep.answers) std::printf("  %s: %s\n", q.c_str(), a.c_str());
}

// Device vs host build of every bp::math function, over all 2^32 inputs (quick:
// 2^20 inputs spread over the whole range), in chunks compared exactly.
void compare_math(Report& rep, bool quick, const std::vector<int>& functions, const std::string& summary) {
  const uint32_t step = quick ? 4099u : 1u;
  const uint64_t total = quick ? (1ull << 20) : (1ull << 32);
  const uint32_t chunk = quick ? (1u << 20) : (1u << 26);
  DeviceBuffer<uint32_t> dev(chunk);
  std::vector<uint32_t> host(chunk), device(chunk);
  for (int fn : functions) {
    const auto t0 = std::chrono::steady_clock::now();
    MathRow row;
    row.function = math_functions()[fn];
    for (uint64_t done = 0; done < total; done += chunk) {
      const uint32_t first = static_cast<uint32_t>(done * step);
      launch_math(fn, first, step, chunk, dev.p);
      BP_CUDA(cudaGetLastError());
      host_math(fn, first, step, chunk, host.data());  // overlaps the kernel
      BP_CUDA(cudaMemcpy(device.data(), dev.p, chunk * sizeof(uint32_t), cudaMemcpyDeviceToHost));
      row.mismatches += count_mismatches(host.data(), device.data(), chunk, first, step, &row.examples, 8);
      row.inputs += chunk;
    }
    row.seconds = seconds_since(t0);
    std::printf("math %-8s inputs %llu  mismatches %llu  (%.1f s)\n", row.function.c_str(),
                static_cast<unsigned long long>(row.inputs), static_cast<unsigned long long>(row.mismatches),
                row.seconds);
    std::fflush(stdout);
    rep.math_mismatches += row.mismatches;
    rep.math.push_back(row);
    write_summary(summary, rep);
  }
}

// The dot-product capture: layout probe, categories, chains and probes through
// both instructions, compared with the model; writes the CSV.
void capture_dots(const Options& opt, Report& rep) {
  const auto t0 = std::chrono::steady_clock::now();
  Descriptor desc{kCoreK, kCoreRow};
  if (!check_layout(rep, desc)) rep.notes.push_back("layout probe failed: the counts below are not model evidence");

  const int per_cat = opt.quick ? 8 : 256, per_chain = opt.quick ? 2 : 64;
  const BlockSet singles = generate_blocks(single_categories(), 16, per_cat, opt.seed);
  const BlockSet chain64 = generate_blocks(chain_categories(), 64, per_chain, opt.seed);
  const BlockSet chain128 = generate_blocks(chain_categories(), 128, per_chain, opt.seed);
  const std::vector<Probe> probe_list = make_probes();
  const BlockSet probes = probe_blocks(probe_list);

  const Results hw_singles = run_blocks(singles, desc), hw64 = run_blocks(chain64, desc),
                hw128 = run_blocks(chain128, desc), hw_probes = run_blocks(probes, desc);
  const std::vector<uint32_t> m_singles = model_outputs(singles), m64 = model_outputs(chain64),
                              m128 = model_outputs(chain128), m_probes = model_outputs(probes);
  rep.dot_mismatches = compare_set(singles, hw_singles, m_singles, rep) + compare_set(chain64, hw64, m64, rep) +
                       compare_set(chain128, hw128, m128, rep) + compare_set(probes, hw_probes, m_probes, rep);
  rep.probes = run_probes(probe_list, probes, hw_probes, m_probes);
  answer_questions(rep);
  std::printf("dot products: %zu single-group, %zu chained (K=64), %zu chained (K=128), %zu probe outputs; "
              "mismatching outputs %llu; mma.sync vs wgmma disagree %llu; wgmma from +0 vs scale-d = 0 disagree "
              "%llu of %llu (%.1f s)\n",
              singles.cases(), chain64.cases(), chain128.cases(), probes.cases(),
              static_cast<unsigned long long>(rep.dot_mismatches),
              static_cast<unsigned long long>(rep.instructions_disagree),
              static_cast<unsigned long long>(rep.scale_d0_disagree),
              static_cast<unsigned long long>(rep.scale_d0_outputs), seconds_since(t0));
  print_report(rep);
  write_cases_csv(opt.out + "/sm90_cases.csv", singles, hw_singles, m_singles, probes, hw_probes, probe_list,
                  opt.quick ? 16 : 256);
}

int run(const Options& opt) {
  std::string why;
  if (!find_hopper(why)) {
    std::printf("hw_truth: %s. Nothing to capture here: skipped (exit 125).\n", why.c_str());
    return kExitCannotTest;
  }
  std::filesystem::create_directories(opt.out);
  Report rep;
  rep.quick = opt.quick;
  describe_device(rep);
  for (const auto& [k, v] : rep.device) std::printf("%s: %s\n", k.c_str(), v.c_str());
  const auto t0 = std::chrono::steady_clock::now();

  const std::string summary = opt.out + "/summary.json";
  if (opt.dot) {
    capture_dots(opt, rep);
  } else {
    rep.layout = "not run (--math-only)";
  }
  for (int fn : opt.math) rep.math_requested.push_back(math_functions()[fn]);
  write_summary(summary, rep);
  compare_math(rep, opt.quick, opt.math, summary);
  rep.notes.push_back("total time " + std::to_string(seconds_since(t0)) + " s");
  write_summary(summary, rep);
  const bool pass = report_passes(rep);
  std::printf("hw_truth: %s; wrote %s%s\n", pass ? "PASS" : "FAIL", summary.c_str(),
              opt.dot ? (" and " + opt.out + "/sm90_cases.csv").c_str() : "");
  return pass ? kExitExact : kExitMismatch;
}

}  // namespace
}  // namespace bp::hw

int main(int argc, char** argv) { return bp::hw::run(bp::hw::parse_options(argc, argv)); }
