#include "harness/compare/compare.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "reference/common/parallel_blocks.h"
#include "reference/truth/ulp.h"

namespace bp::harness {

const char* cmp_type_name(CmpType t) { return t == CmpType::BF16 ? "BF16" : "F32"; }

size_t ulp_bin(double ulp) {
  if (!(ulp == ulp) || std::isinf(ulp)) return kUlpBinNan;
  // Distances are exact integers in [1, 2^32): bin k holds [2^k, 2^(k+1)).
  const uint64_t u = static_cast<uint64_t>(std::max(ulp, 1.0));
  size_t k = 0;
  for (uint64_t v = u >> 1; v; v >>= 1) ++k;  // floor(log2(u))
  return std::min(k, kUlpBinNan - 1);
}

std::string ulp_bin_label(size_t bin) {
  if (bin == 0) return "1";
  if (bin >= kUlpBinNan) return "NaN";
  if (bin == kUlpBinNan - 1) return ">=" + std::to_string(1ull << bin);
  return "[" + std::to_string(1ull << bin) + "," + std::to_string((2ull << bin) - 1) + "]";
}

uint64_t ordered_key_f32(uint32_t bits) {
  return (bits & 0x80000000u) ? static_cast<uint32_t>(~bits) : (bits | 0x80000000u);
}
uint64_t ordered_key_bf16(uint16_t bits) {
  return (bits & 0x8000u) ? static_cast<uint16_t>(~bits) : static_cast<uint16_t>(bits | 0x8000u);
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Tensors this large are first checked for equal bits in parallel (equal_in_parallel).
constexpr uint64_t kParallelCompareElements = uint64_t{1} << 20;

// One element type's view: bits, NaN/Inf tests, widening to double, ordered key.
struct F32Traits {
  using Bits = uint32_t;
  static constexpr CmpType kType = CmpType::F32;
  static bool nan(Bits u) { return (u & 0x7fffffffu) > 0x7f800000u; }
  static bool inf(Bits u) { return (u & 0x7fffffffu) == 0x7f800000u; }
  static double value(Bits u) { return static_cast<double>(float_of(u)); }
  static uint64_t key(Bits u) { return ordered_key_f32(u); }
};
struct BF16Traits {
  using Bits = uint16_t;
  static constexpr CmpType kType = CmpType::BF16;
  static bool nan(Bits u) { return (u & 0x7fffu) > 0x7f80u; }
  static bool inf(Bits u) { return (u & 0x7fffu) == 0x7f80u; }
  static double value(Bits u) { return static_cast<double>(float_of(static_cast<uint32_t>(u) << 16)); }
  static uint64_t key(Bits u) { return ordered_key_bf16(u); }
};

template <class T>
double ulp_distance(typename T::Bits a, typename T::Bits b) {
  const bool na = T::nan(a), nb = T::nan(b);
  if (na || nb) return (na && nb) ? 0.0 : kInf;
  const uint64_t ka = T::key(a), kb = T::key(b);
  return static_cast<double>(ka > kb ? ka - kb : kb - ka);
}

// Whether a and b hold equal bits under the NaN policy, and if so their NaN and Inf
// counts: fixed blocks in parallel, integer counts only. Most compared tensors are
// equal, and this pass settles them; the element-order loop below then runs only on
// tensors that differ, so the metrics never depend on the thread count.
struct EqualCounts {
  bool equal = true;
  uint64_t nans = 0, infs = 0;
};

template <class T>
EqualCounts equal_in_parallel(const uint8_t* a, const uint8_t* b, uint64_t n) {
  using Bits = typename T::Bits;
  const auto part = parallel_blocks<EqualCounts>(n, uint64_t{1} << 18, [&](uint64_t begin, uint64_t end) {
    uint64_t unequal = 0, nans = 0, infs = 0;  // branch-free, so the loop vectorises
    for (uint64_t i = begin; i < end; ++i) {
      Bits x, y;
      std::memcpy(&x, a + i * sizeof(Bits), sizeof(Bits));
      std::memcpy(&y, b + i * sizeof(Bits), sizeof(Bits));
      const bool nx = T::nan(x);
      unequal += (x != y) & !(nx & T::nan(y));
      nans += nx;
      infs += T::inf(x);
    }
    return EqualCounts{unequal == 0, nans, infs};
  });
  EqualCounts all;
  for (const EqualCounts& c : part) {
    all.equal = all.equal && c.equal;
    all.nans += c.nans;
    all.infs += c.infs;
  }
  return all;
}

template <class T>
TensorMetrics run(const uint8_t* a, const uint8_t* b, uint64_t n, std::vector<uint64_t> shape) {
  using Bits = typename T::Bits;
  if (n >= kParallelCompareElements)
    if (const EqualCounts c = equal_in_parallel<T>(a, b, n); c.equal)
      return equal_metrics(T::kType, n, std::move(shape), c.nans, c.infs);
  TensorMetrics m;
  m.dtype = cmp_type_name(T::kType);
  m.shape = std::move(shape);
  m.elements = n;
  double sum_abs = 0;
  for (uint64_t i = 0; i < n; ++i) {
    Bits x, y;
    std::memcpy(&x, a + i * sizeof(Bits), sizeof(Bits));
    std::memcpy(&y, b + i * sizeof(Bits), sizeof(Bits));
    const bool nx = T::nan(x), ny = T::nan(y);
    m.nan_a += nx;
    m.nan_b += ny;
    m.inf_a += T::inf(x);
    m.inf_b += T::inf(y);
    const bool equal = (nx && ny) || (!nx && !ny && x == y);
    if (equal) continue;
    ++m.mismatches;
    if (m.ulp_histogram.empty()) m.ulp_histogram.assign(kUlpBins, 0);
    if (m.first_mismatch < 0) m.first_mismatch = static_cast<int64_t>(i);
    double abs_diff, ulp;
    if (nx || ny) {
      abs_diff = kInf;
      ulp = kInf;
    } else {
      const double vx = T::value(x), vy = T::value(y);
      // Same-signed infinities were caught by the bit compare; any other pair with
      // an Inf differs by +inf (Inf - Inf of opposite signs is +-inf, never NaN).
      abs_diff = std::fabs(vx - vy);
      ulp = ulp_distance<T>(x, y);
    }
    m.max_abs_diff = std::max(m.max_abs_diff, abs_diff);
    m.max_ulp_diff = std::max(m.max_ulp_diff, ulp);
    sum_abs += abs_diff;
    ++m.ulp_histogram[ulp_bin(ulp)];
  }
  m.bit_identical = m.mismatches == 0;
  m.mean_abs_diff = n ? sum_abs / static_cast<double>(n) : 0.0;
  return m;
}

}  // namespace

double ulp_distance_f32(float a, float b) { return ulp_distance<F32Traits>(bits_of(a), bits_of(b)); }
double ulp_distance_bf16(bf16 a, bf16 b) { return ulp_distance<BF16Traits>(a.bits, b.bits); }

TensorMetrics equal_metrics(CmpType t, uint64_t n, std::vector<uint64_t> shape, uint64_t nans, uint64_t infs) {
  TensorMetrics m;
  m.dtype = cmp_type_name(t);
  m.shape = std::move(shape);
  m.elements = n;
  m.nan_a = m.nan_b = nans;
  m.inf_a = m.inf_b = infs;
  return m;
}

TensorMetrics compare_bytes(CmpType t, const uint8_t* a, const uint8_t* b, uint64_t n, std::vector<uint64_t> shape) {
  switch (t) {
    case CmpType::F32: return run<F32Traits>(a, b, n, std::move(shape));
    case CmpType::BF16: return run<BF16Traits>(a, b, n, std::move(shape));
  }
  throw std::invalid_argument("compare: unsupported element type");
}

TensorMetrics compare(std::span<const float> a, std::span<const float> b, std::vector<uint64_t> shape) {
  if (a.size() != b.size()) throw std::invalid_argument("compare: tensors of different sizes");
  if (shape.empty()) shape = {a.size()};
  return compare_bytes(CmpType::F32, reinterpret_cast<const uint8_t*>(a.data()),
                       reinterpret_cast<const uint8_t*>(b.data()), a.size(), std::move(shape));
}

TensorMetrics compare(std::span<const bf16> a, std::span<const bf16> b, std::vector<uint64_t> shape) {
  if (a.size() != b.size()) throw std::invalid_argument("compare: tensors of different sizes");
  if (shape.empty()) shape = {a.size()};
  return compare_bytes(CmpType::BF16, reinterpret_cast<const uint8_t*>(a.data()),
                       reinterpret_cast<const uint8_t*>(b.data()), a.size(), std::move(shape));
}

double ulp_at(CmpType t, double truth) { return truth::ulp_of(truth, t == CmpType::BF16 ? 7 : 23); }

namespace {

// |v − t| in ulp_at(t); equal non-finite values (NaN with NaN, an infinity with
// itself) are 0 apart, any other pair with a non-finite member +inf.
double ulps_from_truth(CmpType type, double v, double t) {
  if (!std::isfinite(v) || !std::isfinite(t)) return (v == t || (std::isnan(v) && std::isnan(t))) ? 0 : INFINITY;
  return std::fabs(v - t) / ulp_at(type, t);
}

double as_double(bf16 v) { return widen(v); }
double as_double(float v) { return v; }

template <class T>
TruthError truth_error_of(CmpType type, std::span<const T> values, std::span<const double> truth) {
  if (values.size() != truth.size()) throw std::invalid_argument("truth_error: tensors of different sizes");
  TruthError e;
  for (size_t i = 0; i < values.size(); ++i) {
    const double u = ulps_from_truth(type, as_double(values[i]), truth[i]);
    e.max_ulp = std::max(e.max_ulp, u);
    e.mean_ulp += u;
  }
  if (!values.empty()) e.mean_ulp /= static_cast<double>(values.size());
  return e;
}

}  // namespace

TruthError truth_error(std::span<const bf16> values, std::span<const double> truth) {
  return truth_error_of(CmpType::BF16, values, truth);
}
TruthError truth_error(std::span<const float> values, std::span<const double> truth) {
  return truth_error_of(CmpType::F32, values, truth);
}

bool looks_like_logprob(const std::string& name) {
  std::string s = name;
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s.find("logprob") != std::string::npos;
}

}  // namespace bp::harness
