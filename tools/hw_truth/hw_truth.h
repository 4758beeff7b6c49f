// Shared between hw_truth.cu (device side, main) and hw_host.cpp (host side, built
// by g++ like the reference library, so host results are the reference's own).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace bp::hw {

// One block of cases is one wgmma.m64n8k16 tile (four mma.sync.m16n8k16 tiles):
// A is 64 x K (row i contiguous), B is K x 8 stored by column (column j
// contiguous), C is 64 x 8. Output (i, j) is the case c = C[i][j], a = row i of A,
// b = column j of B, so every lane's output is a case of its own.
constexpr int kM = 64;
constexpr int kN = 8;
constexpr int kCasesPerBlock = kM * kN;

struct BlockSet {
  int k = 16;
  std::vector<std::string> category;  // per block
  std::vector<uint32_t> c;            // blocks x 64 x 8 fp32 bits
  std::vector<uint16_t> a;            // blocks x 64 x k bf16 bits
  std::vector<uint16_t> b;            // blocks x 8 x k bf16 bits

  int blocks() const { return static_cast<int>(category.size()); }
  size_t cases() const { return static_cast<size_t>(blocks()) * kCasesPerBlock; }
  void add_block(const std::string& cat);  // appends one zero block
  uint32_t* c_of(int blk) { return &c[static_cast<size_t>(blk) * kCasesPerBlock]; }
  uint16_t* a_of(int blk) { return &a[static_cast<size_t>(blk) * kM * k]; }
  uint16_t* b_of(int blk) { return &b[static_cast<size_t>(blk) * kN * k]; }
  const uint16_t* a_of(int blk) const { return &a[static_cast<size_t>(blk) * kM * k]; }
  const uint16_t* b_of(int blk) const { return &b[static_cast<size_t>(blk) * kN * k]; }
};

// An edge-case probe: one dot product asked a question; its block repeats it in
// every output.
struct Probe {
  std::string question;  // e.g. "zero_sign"
  std::string name;
  uint32_t c = 0;
  uint16_t a[16] = {};
  uint16_t b[16] = {};
  std::string note;  // what the answer tells
};

// Single-group categories (k = 16), chained categories (k = 64, 128).
std::vector<std::string> single_categories();
std::vector<std::string> chain_categories();
BlockSet generate_blocks(const std::vector<std::string>& categories, int k, int blocks_per_category, uint64_t seed);
// Small integers with exact sums: any layout error shows as a wrong value.
BlockSet layout_probe_block();
std::vector<Probe> make_probes();
BlockSet probe_blocks(const std::vector<Probe>& probes);

// bp::Sm90Tc::chain for every output of every block (OpenMP over blocks).
std::vector<uint32_t> model_outputs(const BlockSet& set);

// Device results for a block set, one vector per instruction.
// wgmma twice more: from a +0 accumulator (scale-d = 1, what the GEMM kernels
// do after clearing) and with scale-d = 0 on the first k16 group (C ignored): the
// kernels may start a chunk either way only if the two agree bit for bit.
struct Results {
  std::vector<uint32_t> mma, wgmma, wgmma_from_zero, wgmma_scale_d0;
};

// --- bp::math, host build ---------------------------------------------------
// The functions compared, in one list for both sides (index = function id).
#define BP_HW_MATH_FUNCTIONS(X) X(exp) X(exp2) X(exp2_poly) X(log) X(rsqrt) X(sigmoid) X(silu) X(sin) X(cos)
// Three more, after those: "exp_batch", the kernels' exp (optimized/cuda/device_util.cuh
// exp_in_place, 32 values per thread) on the device against the host's math::exp;
// "bf16_cvt", cvt.rn.bf16x2.f32 (ptx.cuh cvt_bf16x2_rn, attention's mma operands)
// against the host's R, both widened back to fp32 (NaNs compare canonicalised); and
// "exp2_poly_floor", exp2_poly with the kernels' core (device_util.cuh
// exp2_poly_core_floor) against the host's math::exp2_poly.
float widened_round_bf16(float x);
const std::vector<std::string>& math_functions();
// out[i] = bits of f(float_of(first + i * step)) for i < n, computed with OpenMP.
void host_math(int fn, uint32_t first, uint32_t step, uint32_t n, uint32_t* out);
// Mismatches of canonicalised bits between two arrays (OpenMP, no reductions);
// the first few (index, host, device) go to examples.
uint64_t count_mismatches(const uint32_t* host, const uint32_t* device, uint32_t n, uint32_t first, uint32_t step,
                          std::vector<std::array<uint32_t, 3>>* examples, size_t max_examples);

// --- Reporting ----------------------------------------------------------------
struct CountRow {
  std::string category, instruction;
  int k = 16;
  uint64_t cases = 0, mismatches = 0, nonfinite = 0;
};
struct ProbeResult {
  Probe probe;
  uint32_t model = 0, mma = 0, wgmma = 0;
  bool uniform = true;  // all 512 outputs of its block agreed
};
struct MathRow {
  std::string function;
  uint64_t inputs = 0, mismatches = 0;
  double seconds = 0;
  std::vector<std::array<uint32_t, 3>> examples;  // input, host bits, device bits
};
struct Report {
  std::vector<std::pair<std::string, std::string>> device;  // name, value
  bool quick = false;
  std::string layout;  // "ok" or what failed
  std::string wgmma_descriptor;
  std::vector<CountRow> counts;
  std::vector<ProbeResult> probes;
  std::vector<std::pair<std::string, std::string>> answers;  // question, answer
  std::map<uint32_t, uint64_t> nan_bits;                    // NaN outputs seen, by bit pattern
  std::vector<std::string> math_requested;  // the functions this run compares
  std::vector<MathRow> math;
  uint64_t dot_mismatches = 0, math_mismatches = 0;
  uint64_t instructions_disagree = 0;  // outputs where mma.sync and wgmma differ
  uint64_t scale_d0_outputs = 0, scale_d0_disagree = 0;  // wgmma_from_zero vs wgmma_scale_d0 (Results)
  std::vector<std::string> notes;
};

// Representative cases of the single-group set (and every probe and mismatch)
// as CSV; the format is documented at the top of the file and in test_hw_vectors.
void write_cases_csv(const std::string& path, const BlockSet& singles, const Results& singles_hw,
                     const std::vector<uint32_t>& singles_model, const BlockSet& probes, const Results& probes_hw,
                     const std::vector<Probe>& probe_list, int per_category);
void write_summary(const std::string& path, const Report& report);
// No mismatch anywhere, and the layout probe passed (or the dot capture was not run).
bool report_passes(const Report& report);

// Canonical NaN comparison (SPEC.md §3): payloads are not part of the contract.
uint32_t canonical(uint32_t bits);
std::string hex32(uint32_t v);

}  // namespace bp::hw
