// Shared pieces of the bp::cuda op suites (tests/optimized/cuda/test_cuda_<op>.cpp): the
// contracts to run, device copies with poisoned outputs, bit comparison with the
// CPU reference, and input generators with edge values.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "optimized/cuda/common.h"
#include "reference/common/rng.h"
#include "reference/contract/contract.h"
#include "tests/support/contracts.h"
#include "tests/support/float_gen.h"

namespace bp::test {

using cuda::DeviceBuffer;

// Suites take the contract name as their parameter.
class ContractTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Knobs& knobs() const { return find_contract(GetParam())->knobs; }
};
// The ops whose bits v2 changes (attention, logprob): every contract.
#define BP_ALL_CONTRACTS ::testing::ValuesIn(::bp::test::all_contract_names())
// The ops v2 leaves alone (it changes only the softmax's knobs): v1's pair covers
// both dot models, and v2 computes the same bits.
#define BP_V1_CONTRACTS ::testing::Values("bf16-sm90tc-v1", "bf16-fmaseq-v1")

// An output buffer filled with 0x5a bytes: a finite value no op here produces by
// accident (a NaN poison would compare equal to an expected NaN).
template <class T>
DeviceBuffer<T> poisoned(size_t n) {
  DeviceBuffer<T> b(n);
  if (n > 0) BP_CUDA_CHECK(cudaMemset(b.get(), 0x5a, n * sizeof(T)));
  return b;
}

inline uint32_t compared_bits(float x) { return canonical_bits(x); }
inline uint32_t compared_bits(bf16 x) { return is_nan(x) ? kCanonicalNanBf16 : x.bits; }
inline uint32_t raw_bits(float x) { return bits_of(x); }
inline uint32_t raw_bits(bf16 x) { return x.bits; }

// Bit-identical after NaN canonicalisation (SPEC.md §3); the failure names the
// count, the first index and both values.
template <class T>
::testing::AssertionResult same_bits(const std::vector<T>& reference, const std::vector<T>& gpu) {
  if (reference.size() != gpu.size())
    return ::testing::AssertionFailure() << "sizes differ: " << reference.size() << " vs " << gpu.size();
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < reference.size(); ++i)
    if (compared_bits(reference[i]) != compared_bits(gpu[i]) && mismatches++ == 0) first = i;
  if (mismatches == 0) return ::testing::AssertionSuccess();
  char buf[160];
  std::snprintf(buf, sizeof buf, "%zu of %zu elements differ; first at %zu: reference 0x%08x, gpu 0x%08x", mismatches,
                reference.size(), first, raw_bits(reference[first]), raw_bits(gpu[first]));
  return ::testing::AssertionFailure() << buf;
}

// The same raw bits, NaN payloads included: repeated runs on one device.
template <class T>
bool identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Values that take special paths: NaNs (quiet, signalling, negative, with
// payload), ±Inf, ±0, subnormals, the extremes of the normal range, ±1.
inline const std::vector<uint16_t>& special_bf16() {
  static const std::vector<uint16_t> v = {0x7fc0, 0xffc0, 0x7f81, 0x7fff, 0x7f80, 0xff80, 0x0000,
                                          0x8000, 0x0001, 0x8001, 0x007f, 0x807f, 0x0080, 0x8080,
                                          0x7f7f, 0xff7f, 0x3f80, 0xbf80, 0x3f81, 0x4000};
  return v;
}

// R(scale · uniform[-1, 1)) from counter_bf16, with one element in `one_in`
// replaced by a special value (none when one_in is 0).
inline std::vector<bf16> random_inputs(size_t n, uint64_t seed, float scale, int one_in = 0) {
  std::vector<bf16> v = random_bf16(n, seed, scale);
  if (one_in > 0) {
    FloatGen g(seed ^ 0x5eedu);
    const std::vector<uint16_t>& s = special_bf16();
    for (bf16& x : v)
      if (g.chance(one_in)) x.bits = s[g.range(0, static_cast<int>(s.size()) - 1)];
  }
  return v;
}

// Every bf16 bit pattern is equally likely: all exponents, NaNs and Infs included.
inline std::vector<bf16> random_bit_patterns(size_t n, uint64_t seed) {
  std::vector<bf16> v(n);
  for (size_t i = 0; i < n; ++i) v[i].bits = static_cast<uint16_t>(counter_hash(seed, i));
  return v;
}

}  // namespace bp::test
