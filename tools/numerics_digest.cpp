// numerics_digest: SHA-256 digests of the output bits of the numerics core
// (reference/numerics/), independent of any contract. The same digests must come
// out with any number of OpenMP threads, at -O0 and -O3, with g++ and clang: the
// golden file fixtures/golden/numerics.txt pins them (SPEC.md §3).
//
//   numerics_digest                  print "<name> <sha256>" per item
//   numerics_digest --write FILE     (re)write the golden file
//   numerics_digest --check FILE     compare; exit 1 listing the items that differ
//   --timings                        also print each item's seconds to stderr
//
// Inputs come from a counter-based generator (splitmix64 of seed and indices, then
// integer-only bit mappings), so every compiler and thread count sees the same
// inputs. Outputs are computed in parallel over independent indices into arrays
// (no reduction clauses, no atomics) and hashed serially in index order. NaN
// outputs are hashed canonicalised (SPEC.md §2.1 NaN policy).
#include <omp.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "reference/common/sha256.h"
#include "reference/numerics/bf16.h"
#include "reference/numerics/chunked.h"
#include "reference/numerics/dot.h"
#include "reference/numerics/math.h"
#include "reference/numerics/reduce.h"

static_assert(std::endian::native == std::endian::little,
              "digests hash output arrays as little-endian bytes; add a byte swap for this target");

namespace bp {
namespace {

constexpr uint64_t kSeed = 0xb17a5170d16e5700ull;  // fixed: changing it changes every digest

// ---------------------------------------------------------------- generator
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Random 64 bits for (stream, problem, index): a pure function of its arguments.
constexpr uint64_t rnd(uint64_t stream, uint64_t problem, uint64_t index) {
  return splitmix64(splitmix64(splitmix64(kSeed ^ stream) ^ problem) ^ index);
}
// Integer in [lo, hi] from random bits (modulo bias is irrelevant; it is deterministic).
constexpr int in_range(uint64_t r, int lo, int hi) { return lo + static_cast<int>(r % static_cast<uint64_t>(hi - lo + 1)); }

// Input regimes for the dot products (problem index mod kRegimes).
enum Regime : int { kNarrow = 0, kWide, kFull, kSpecial, kCancel, kRegimes };

uint16_t bf16_bits(uint64_t r, int regime) {
  const uint16_t sign = static_cast<uint16_t>((r >> 63) << 15);
  const uint16_t mant = static_cast<uint16_t>((r >> 8) & 0x7fu);
  switch (regime) {
    case kNarrow:  // |x| in [2^-4, 2^5)
      return sign | static_cast<uint16_t>(in_range(r >> 16, 127 - 4, 127 + 4) << 7) | mant;
    case kFull: {  // finite patterns over (nearly) the whole range, subnormals and zeros
      uint16_t u = static_cast<uint16_t>(r >> 16);
      if (((r >> 40) & 31u) != 0) {  // mostly |x| < 2^64, so that not every sum overflows
        u = static_cast<uint16_t>((u & 0x807fu) | (in_range(r >> 45, 0, 127 + 63) << 7));
      }
      if ((u & 0x7f80u) == 0x7f80u) u &= 0xff7fu;  // Inf/NaN exponent -> largest finite binade
      if (((r >> 40) & 15u) == 1) u &= 0x807fu;     // 1/16: zero or subnormal
      return u;
    }
    default:  // kWide, kSpecial, kCancel: |x| in [2^-40, 2^41), so products span 2^160
      return sign | static_cast<uint16_t>(in_range(r >> 16, 127 - 40, 127 + 40) << 7) | mant;
  }
}

uint32_t f32_bits(uint64_t r, int regime) {
  const uint32_t sign = static_cast<uint32_t>(r >> 63) << 31;
  const uint32_t mant = static_cast<uint32_t>(r >> 8) & 0x7fffffu;
  const uint64_t sel = (r >> 40) & 15u;
  if (sel == 0) return 0u;               // +0
  if (sel == 1) return 0x80000000u;      // -0
  switch (regime) {
    case kNarrow:
      return sign | (static_cast<uint32_t>(in_range(r >> 32, 127 - 4, 127 + 4)) << 23) | mant;
    case kFull: {
      uint32_t u = static_cast<uint32_t>(r >> 16);
      if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xff7fffffu;
      if (sel == 2) u &= 0x807fffffu;  // subnormal
      return u;
    }
    default:
      return sign | (static_cast<uint32_t>(in_range(r >> 32, 127 - 60, 127 + 60)) << 23) | mant;
  }
}

constexpr uint16_t kBf16Specials[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x0001, 0x8001,
                                      0x7f7f, 0xff7f, 0x0080, 0x3f80, 0xbf80};

// One dot problem: a[0..k), b[0..k) bf16 and c fp32, a function of (k, problem).
void dot_problem(int k, uint64_t p, bf16* a, bf16* b, float& c) {
  const int regime = static_cast<int>(p % kRegimes);
  const uint64_t stream = 0xd07000ull + static_cast<uint64_t>(k);
  for (int i = 0; i < k; ++i) {
    const uint64_t ra = rnd(stream, p, 2ull * i), rb = rnd(stream, p, 2ull * i + 1);
    a[i].bits = bf16_bits(ra, regime);
    b[i].bits = bf16_bits(rb, regime);
    if (regime == kCancel && (i & 1)) {  // cancel the previous product, sometimes off by one ulp
      a[i] = a[i - 1];
      b[i].bits = static_cast<uint16_t>(b[i - 1].bits ^ 0x8000u);
      if ((rb & 3u) == 0) b[i].bits ^= 1u;
    }
  }
  const uint64_t rc = rnd(stream, p, 0xffffffffull);
  c = float_of(f32_bits(rc, regime == kCancel ? kNarrow : regime));
  if (regime == kSpecial) {  // one special operand in about 3/4 of the problems
    const uint64_t rs = rnd(stream, p, 0xfffffffeull);
    const int where = static_cast<int>((rs >> 8) % static_cast<uint64_t>(k + 1));
    const uint16_t v = kBf16Specials[(rs >> 32) % (sizeof kBf16Specials / sizeof kBf16Specials[0])];
    switch (rs & 3u) {
      case 0: break;
      case 1: if (where < k) a[where].bits = v; break;
      case 2: if (where < k) b[where].bits = v; break;
      case 3: c = widen(bf16{v}); break;
    }
  }
}

// fp32 inputs of reduction problem p: by p mod 3, exponents within ±4 (order
// matters most), within ±60, or ±60 mixed with any finite pattern (subnormals,
// zeros, overflow) and rare Inf/NaN.
float reduce_input(uint64_t stream, uint64_t p, int i) {
  const uint64_t r = rnd(stream, p, static_cast<uint64_t>(i));
  switch (p % 3) {
    case 0: return float_of(f32_bits(r, kNarrow));
    case 1: return float_of(f32_bits(r, kWide));
    default:
      if (((r >> 48) & 0xfffu) == 0) {
        constexpr uint32_t s[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f7fffffu};
        return float_of(s[(r >> 4) & 3u]);
      }
      return float_of(f32_bits(r, ((r >> 44) & 7u) == 0 ? kFull : kWide));
  }
}

// ---------------------------------------------------------------- digests
struct Item {
  std::string name;
  std::string hex;
  double secs = 0, hash_secs = 0;  // for --timings
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
Clock::time_point g_item_start = Clock::now();
double g_hash_secs = 0;

// Appends an item with the time spent on it since the previous one.
void add(std::vector<Item>& items, Item it) {
  it.secs = seconds_since(g_item_start);
  it.hash_secs = g_hash_secs;
  items.push_back(std::move(it));
  g_item_start = Clock::now();
  g_hash_secs = 0;
}

// Serial SHA-256 of the output array in index order.
template <class T>
std::string hash_array(const std::vector<T>& v) {
  const auto t = Clock::now();
  std::string hex = Sha256().update(v.data(), v.size() * sizeof(T)).hex();
  g_hash_secs += seconds_since(t);
  return hex;
}

// out[i] = f(i) for i in [0, n), in parallel over independent outputs.
template <class T, class F>
std::string digest_indexed(size_t n, F&& f) {
  std::vector<T> out(n);
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[static_cast<size_t>(i)] = f(static_cast<uint64_t>(i));
  return hash_array(out);
}

// The strided sample of all 2^32 fp32 inputs: u = i · kStride (kStride odd, so the
// low bits vary too), about 2^24 of them, then the special values.
constexpr uint64_t kStride = 257;
constexpr uint64_t kStrided = ((1ull << 32) - 1) / kStride + 1;

std::vector<uint32_t> special_inputs() {
  const uint32_t base[] = {
      0x00000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x3f800000u, 0x3f000000u, 0x40000000u,
      0x7f7fffffu, 0x7f800000u, 0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0x3fc90fdbu, 0x40490fdbu,
      0x40c90fdbu, 0x42b17218u, 0x42b17217u, 0xc2aeac50u, 0xc2cff1b5u, 0x43000000u, 0xc3150000u,
      0xc3160000u, 0xc2fc0000u, 0x4b800000u, 0x4b000000u, 0x5f000000u, 0x4e800000u, 0x47c35000u,
      0x501502f9u, 0x7e967699u, 0x3f317218u, 0x3fb8aa3bu, 0x33800000u, 0x39800000u, 0x41200000u,
      0x41a00000u, 0x42000000u, 0x42c80000u, 0x3c23d70au, 0x3dcccccdu, 0x41100000u, 0x41300000u};
  std::vector<uint32_t> v;
  for (uint32_t b : base)
    for (uint32_t s : {0u, 0x80000000u})
      for (int d = -2; d <= 2; ++d) v.push_back((b ^ s) + static_cast<uint32_t>(d));
  return v;
}

inline uint32_t sample_input(uint64_t i, const std::vector<uint32_t>& specials) {
  return i < kStrided ? static_cast<uint32_t>(i * kStride) : specials[i - kStrided];
}

template <class F>
void math_item(std::vector<Item>& items, const char* name, const std::vector<uint32_t>& specials, F&& f) {
  add(items, {name, digest_indexed<uint32_t>(kStrided + specials.size(), [&](uint64_t i) {
                     return canonical_bits(f(float_of(sample_input(i, specials))));
                   })});
}

template <class Model>
std::string dot_digest(int k, uint64_t problems) {
  std::vector<uint32_t> out(problems);
  const int64_t count = static_cast<int64_t>(problems);
#pragma omp parallel
  {
    std::vector<bf16> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < count; ++p) {
      float c;
      dot_problem(k, static_cast<uint64_t>(p), a.data(), b.data(), c);
      out[static_cast<size_t>(p)] = canonical_bits(Model::chain(c, a.data(), 1, b.data(), 1, k));
    }
  }
  return hash_array(out);
}

// chunked_dot (`parts` chunks) or token_chunked_dot (chunks of `parts`); the dot
// problems' c is not used (every chunk starts at +0).
template <class Model>
std::string chunked_digest(int k, int parts, bool token) {
  constexpr uint64_t kProblems = 1u << 11;
  std::vector<uint32_t> out(kProblems);
#pragma omp parallel
  {
    std::vector<bf16> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
    std::vector<float> partials(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < static_cast<int64_t>(kProblems); ++p) {
      float c;
      dot_problem(k, static_cast<uint64_t>(p), a.data(), b.data(), c);
      const float r = token ? token_chunked_dot<Model>(a.data(), 1, b.data(), 1, k, parts, partials.data())
                            : chunked_dot<Model>(a.data(), 1, b.data(), 1, k, parts, partials.data());
      out[static_cast<size_t>(p)] = canonical_bits(r);
    }
  }
  return hash_array(out);
}

// reduce.pairwise_tree / reduce.lane_sum: problem p has n = sizes[(p / 3) % sizes.size()].
template <class Reduce>
std::string reduce_digest(uint64_t stream, const std::vector<int>& sizes, uint64_t problems, Reduce&& reduce) {
  std::vector<uint32_t> out(problems);
  const int64_t count = static_cast<int64_t>(problems);
#pragma omp parallel
  {
    std::vector<float> x;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < count; ++p) {
      const int n = sizes[static_cast<size_t>(p / 3) % sizes.size()];  // p % 3 is the regime
      x.resize(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = reduce_input(stream, static_cast<uint64_t>(p), i);
      out[static_cast<size_t>(p)] = canonical_bits(reduce(x, n));
    }
  }
  return hash_array(out);
}

std::vector<Item> compute_all() {
  std::vector<Item> items;
  const std::vector<uint32_t> specials = special_inputs();

  // bf16: R over the strided sample, R around every bf16 boundary (the five low
  // halves 0, 0x7fff, 0x8000, 0x8001, 0xffff under each of the 2^16 high halves),
  // and f over all 2^16 patterns.
  add(items, {"bf16.round_bf16.strided", digest_indexed<uint16_t>(kStrided + specials.size(), [&](uint64_t i) {
                     return round_bf16(float_of(sample_input(i, specials))).bits;
                   })});
  add(items, {"bf16.round_bf16.boundaries", digest_indexed<uint16_t>(5u << 16, [](uint64_t i) {
                     constexpr uint32_t low[] = {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
                     return round_bf16(float_of(static_cast<uint32_t>(i / 5) << 16 | low[i % 5])).bits;
                   })});
  add(items, {"bf16.widen.all", digest_indexed<uint32_t>(1u << 16, [](uint64_t i) {
                     return bits_of(widen(bf16{static_cast<uint16_t>(i)}));
                   })});

  math_item(items, "math.exp", specials, [](float x) { return math::exp(x); });
  math_item(items, "math.exp2", specials, [](float x) { return math::exp2(x); });
  math_item(items, "math.exp2_poly", specials, [](float x) { return math::exp2_poly(x); });
  math_item(items, "math.log", specials, [](float x) { return math::log(x); });
  math_item(items, "math.rsqrt", specials, [](float x) { return math::rsqrt(x); });
  math_item(items, "math.sigmoid", specials, [](float x) { return math::sigmoid(x); });
  math_item(items, "math.silu", specials, [](float x) { return math::silu(x); });
  math_item(items, "math.sin", specials, [](float x) { return math::sin(x); });
  math_item(items, "math.cos", specials, [](float x) { return math::cos(x); });

  // Dot models on seeded problems; regimes rotate with the problem index.
  for (int k : {1, 15, 16, 17, 64, 1000}) {
    const uint64_t problems = k <= 64 ? (1u << 14) : (1u << 11);
    add(items, {"dot.sm90tc.K" + std::to_string(k), dot_digest<Sm90Tc>(k, problems)});
    add(items, {"dot.fmaseq.K" + std::to_string(k), dot_digest<FmaSeq>(k, problems)});
  }

  // Chunked dots (chunked.h): K = 1024 in 8 chunks (tp_tree_width), and K = 1000
  // tokens in chunks of 128 (grad_token_chunk), on the same kind of problems.
  add(items, {"dot.chunked.sm90tc.K1024.C8", chunked_digest<Sm90Tc>(1024, 8, false)});
  add(items, {"dot.chunked.fmaseq.K1024.C8", chunked_digest<FmaSeq>(1024, 8, false)});
  add(items, {"dot.token_chunked.sm90tc.K1000.chunk128", chunked_digest<Sm90Tc>(1000, 128, true)});
  add(items, {"dot.token_chunked.fmaseq.K1000.chunk128", chunked_digest<FmaSeq>(1000, 128, true)});

  // Reductions.
  const std::vector<int> tree_sizes = {1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32, 33, 64, 100, 127, 128, 255, 256, 1000, 1024, 4097};
  add(items, {"reduce.pairwise_tree", reduce_digest(0x7ee, tree_sizes, 1u << 13, [](std::vector<float>& x, int n) {
                     return pairwise_tree(x.data(), n);
                   })});
  const std::vector<int> row_sizes = {0, 1, 7, 8, 9, 255, 256, 2047, 2048, 2049, 4096, 5000, 8192, 16387};
  const LaneShape shape{256, 8};
  add(items, {"reduce.lane_sum.256x8", reduce_digest(0x1a5e, row_sizes, 1u << 11, [&](std::vector<float>& x, int n) {
                     float scratch[256];
                     return lane_sum(n, shape, scratch, [&](int i) { return x[static_cast<size_t>(i)]; });
                   })});
  add(items, {"reduce.lane_sum.256x8.squares", reduce_digest(0x5e5e, row_sizes, 1u << 11, [&](std::vector<float>& x, int n) {
                     float scratch[256];
                     return lane_sum(n, shape, scratch, [&](int i) {
                       const float v = x[static_cast<size_t>(i)];
                       return mul_rn(v, v);
                     });
                   })});
  return items;
}

// ---------------------------------------------------------------- golden file
constexpr const char* kHeader =
    "# Contract-independent numerics digests (bf16, math, dot models, reductions): SHA-256 of output bits, "
    "identical for any thread count, optimisation level and compiler. Regenerate on purpose only: "
    "build/tools/numerics_digest --write fixtures/golden/numerics.txt";

bool read_golden(const std::string& path, std::map<std::string, std::string>& golden, std::vector<std::string>& order) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string name, hex;
    if (!(ss >> name >> hex)) continue;
    if (!golden.count(name)) order.push_back(name);
    golden[name] = hex;
  }
  return true;
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--write FILE | --check FILE] [--timings]\n", argv0);
  return 2;
}

}  // namespace
}  // namespace bp

int main(int argc, char** argv) {
  std::string write_path, check_path;
  bool timings = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--timings") {
      timings = true;
    } else if ((arg == "--write" || arg == "--check") && i + 1 < argc) {
      (arg == "--write" ? write_path : check_path) = argv[++i];
    } else if (arg == "-h" || arg == "--help") {
      bp::usage(argv[0]);
      return 0;
    } else {
      return bp::usage(argv[0]);
    }
  }
  if (!write_path.empty() && !check_path.empty()) return bp::usage(argv[0]);

  const auto t0 = bp::Clock::now();
  bp::g_item_start = t0;
  const std::vector<bp::Item> items = bp::compute_all();
  const double secs = bp::seconds_since(t0);
  if (timings)
    for (const auto& it : items)
      std::fprintf(stderr, "  %-40s %7.3f s (hash %.3f s)\n", it.name.c_str(), it.secs, it.hash_secs);
  std::fprintf(stderr, "numerics_digest: %zu items, %d threads, %.2f s\n", items.size(), omp_get_max_threads(), secs);

  std::string text;
  for (const auto& it : items) text += it.name + " " + it.hex + "\n";

  if (!write_path.empty()) {
    std::ofstream out(write_path, std::ios::binary | std::ios::trunc);
    out << bp::kHeader << "\n" << text;
    if (!out.good()) {
      std::fprintf(stderr, "numerics_digest: cannot write %s\n", write_path.c_str());
      return 2;
    }
    std::fprintf(stderr, "numerics_digest: wrote %zu digests to %s\n", items.size(), write_path.c_str());
    return 0;
  }
  if (check_path.empty()) {
    std::fputs(text.c_str(), stdout);
    return 0;
  }

  std::map<std::string, std::string> golden;
  std::vector<std::string> order;
  if (!bp::read_golden(check_path, golden, order)) {
    std::fprintf(stderr, "numerics_digest: cannot read golden file %s\n", check_path.c_str());
    return 2;
  }
  std::vector<std::string> bad;
  std::map<std::string, bool> seen;
  for (const auto& it : items) {
    seen[it.name] = true;
    const auto g = golden.find(it.name);
    if (g == golden.end()) bad.push_back(it.name + ": not in the golden file (new item) got " + it.hex);
    else if (g->second != it.hex) bad.push_back(it.name + ": expected " + g->second + " got " + it.hex);
  }
  for (const auto& name : order)
    if (!seen.count(name))
      bad.push_back(name + ": in the golden file but not computed by this build");
  if (bad.empty()) {
    std::printf("numerics_digest: all %zu digests match %s\n", items.size(), check_path.c_str());
    return 0;
  }
  std::printf("numerics_digest: %zu of %zu digests DIFFER from %s:\n", bad.size(), items.size(), check_path.c_str());
  for (const auto& b : bad) std::printf("  %s\n", b.c_str());
  std::printf(
      "If the numerics changed on purpose (a deliberate change to reference/numerics/), regenerate the golden file\n"
      "with a strict Release build and commit it with the reason:\n"
      "  %s --write %s\n"
      "Otherwise this build (compiler, optimisation level, flags or thread count) does not reproduce the numerics "
      "bit for bit: that is a bug.\n",
      argv[0], check_path.c_str());
  return 1;
}
