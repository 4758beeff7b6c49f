// Per-tensor comparison metrics (docs/cli.md "diff"): what every bitparity
// report says about two tensors of the same shape and dtype. BF16 and F32 only
// (CmpType): callers refuse other dtypes before comparing (diff: bad input).
//
// NaN policy ("nan_equal", recorded in every metric record and report):
//   - every NaN is canonicalised before the bit compare: two NaNs are equal,
//     whatever their sign or payload;
//   - NaN against a number (finite or infinite) is a mismatch whose abs diff and
//     ULP distance are +infinity.
// Everything else is compared by bits: +0 and -0 are a mismatch (abs diff 0, ULP 1).
//
// ULP distance: |ord(a) - ord(b)| on the ordered-integer mapping of the bits of the
// same type (ord(x) = sign ? ~bits : bits | signbit), a total order in which -0 and
// +0 are one apart, +-max finite and +-Inf one apart. So for non-NaN values, ULP
// distance 0 <=> bits equal. Distances are exact integers held in a double (< 2^32).
//
// abs diff: |double(a) - double(b)| (both widened exactly); Inf vs anything but the
// same Inf is +infinity. mean_abs_diff sums in double in element order.
//
// A tensor of 2^20 elements or more is first checked for equal bits in parallel
// blocks (integer counts only); the element-order loop runs only where that finds a
// difference, so equal gradients cost one parallel pass and no metric depends on the
// thread count.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "reference/numerics/bf16.h"

namespace bp::harness {

inline constexpr const char* kNanPolicy = "nan_equal";
inline constexpr const char* kNanPolicyText =
    "NaNs are canonicalised before the bit compare (two NaNs are equal); NaN against a "
    "number is a mismatch with infinite abs and ULP difference; +0 and -0 differ";

enum class CmpType : uint8_t { BF16, F32 };
const char* cmp_type_name(CmpType t);  // "BF16", "F32"

// ULP-distance histogram of the MISMATCHING elements in log2 bins: bin k (k = 0..30)
// counts distances in [2^k, 2^(k+1)) -- [1], [2,3], [4,7], ... --, bin 31 distances
// >= 2^31, bin 32 NaN against a number (infinite distance). Equal elements are not
// counted, so the bins sum to `mismatches`.
inline constexpr size_t kUlpBins = 33;
inline constexpr size_t kUlpBinNan = kUlpBins - 1;
size_t ulp_bin(double ulp);           // the bin of one distance > 0
std::string ulp_bin_label(size_t bin);  // "1", "[2,3]", "[4,7]", ..., ">=2147483648", "NaN"

struct TensorMetrics {
  std::string dtype;            // "BF16" | "F32"
  std::vector<uint64_t> shape;
  bool bit_identical = true;
  uint64_t elements = 0;
  uint64_t mismatches = 0;
  double max_abs_diff = 0;      // may be +inf
  double max_ulp_diff = 0;      // an exact integer, or +inf
  double mean_abs_diff = 0;     // may be +inf
  int64_t first_mismatch = -1;  // flat (row-major) index, -1 when none
  uint64_t nan_a = 0, nan_b = 0, inf_a = 0, inf_b = 0;
  std::string nan_policy = kNanPolicy;
  std::vector<uint64_t> ulp_histogram;  // kUlpBins counts; empty when bit identical
  // Logprob tensors also carry train_rollout_logprob_abs_diff (== mean_abs_diff).
  bool is_logprob = false;
  double train_rollout_logprob_abs_diff() const { return mean_abs_diff; }
};

// The ordered-integer key of one value's bits (see above).
uint64_t ordered_key_f32(uint32_t bits);
uint64_t ordered_key_bf16(uint16_t bits);
// ULP distance between two values of one type under the NaN policy (+inf for NaN
// vs number, 0 for NaN vs NaN).
double ulp_distance_f32(float a, float b);
double ulp_distance_bf16(bf16 a, bf16 b);

// Compares n elements stored little-endian at a and b (unaligned is fine); `shape`
// is recorded as given (the span overloads default it to {size}).
// What compare() says of two tensors of n elements whose bits are equal (NaN policy),
// each side with `nans` NaNs and `infs` infinities: a comparison settled without the
// element loop (the parallel pass below, or a tensor's digest) gives these metrics.
TensorMetrics equal_metrics(CmpType t, uint64_t n, std::vector<uint64_t> shape, uint64_t nans, uint64_t infs);

TensorMetrics compare_bytes(CmpType t, const uint8_t* a, const uint8_t* b, uint64_t n,
                            std::vector<uint64_t> shape = {});
TensorMetrics compare(std::span<const float> a, std::span<const float> b, std::vector<uint64_t> shape = {});
TensorMetrics compare(std::span<const bf16> a, std::span<const bf16> b, std::vector<uint64_t> shape = {});

// A tensor's distance from its float64 truth (reference/truth), in units in the
// last place of the tensor's own dtype at the truth value: ulp(t) = 2^(e − p) with
// e = max(⌊log2 |t|⌋, −126) and p = 7 (BF16) or 23 (F32), so that a correctly
// rounded value is within 0.5 and the unit does not vanish at t = 0. A non-finite
// value against a finite truth is +inf. `bitparity conform` sets it beside the bit
// comparison: the engine's and the contract's, each on the same inputs.
struct TruthError {
  double max_ulp = 0;   // may be +inf
  double mean_ulp = 0;  // over the elements, summed in element order; may be +inf
  bool operator==(const TruthError&) const = default;
};
double ulp_at(CmpType t, double truth);
TruthError truth_error(std::span<const bf16> values, std::span<const double> truth);
TruthError truth_error(std::span<const float> values, std::span<const double> truth);

// Heuristic used by `bitparity diff`: the tensor holds log-probabilities when its
// name contains "logprob" (any case).
bool looks_like_logprob(const std::string& name);

}  // namespace bp::harness
