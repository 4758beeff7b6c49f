// The two dot-product models of SPEC.md §2.3 against exact arithmetic: the
// targeted vectors, exact small-integer sums, derived error bounds on random data,
// chaining, and negative controls (neighbouring models must be told apart).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "reference/numerics/dot.h"
#include "reference/numerics/sm90_vectors.h"
#include "support/float_gen.h"

namespace bp {
namespace {

// ---------------------------------------------------------------------------
// Exact arithmetic. Every bf16 product is an integer below 2^16 times 2^(e >= -266)
// and every fp32 is an integer below 2^24 times 2^(e >= -149), so a fixed-point
// integer with its last bit at 2^-320 holds any sum of them exactly; 640 bits
// (two's complement) leave room up to 2^319, far above the largest product 2^256.
class Exact {
 public:
  static constexpr int kLimbs = 10;
  static constexpr int kLsb = -320;

  static Exact of_float(float x) {
    Exact r;
    const uint32_t u = bits_of(x);
    uint32_t sig;
    int e;
    detail::split_f32(u, sig, e);
    r.add(u >> 31, sig, e - 23);
    return r;
  }
  static Exact product(bf16 x, bf16 y) {
    Exact r;
    r.add_product(x, y);
    return r;
  }

  // += (-1)^neg · mag · 2^e.
  void add(bool neg, uint64_t mag, int e) {
    if (mag == 0) return;
    const int s = e - kLsb;
    std::array<uint64_t, kLimbs> t{};
    const int limb = s / 64, off = s % 64;
    t[limb] = mag << off;
    if (off != 0 && limb + 1 < kLimbs) t[limb + 1] = mag >> (64 - off);
    neg ? sub_limbs(t) : add_limbs(t);
  }
  void add_product(bf16 x, bf16 y) {
    uint32_t sx, sy;
    int ex, ey;
    detail::split_bf16(x.bits, sx, ex);
    detail::split_bf16(y.bits, sy, ey);
    add(((x.bits ^ y.bits) >> 15) != 0, static_cast<uint64_t>(sx) * sy, ex + ey - 14);
  }
  void add(const Exact& o) { add_limbs(o.w_); }
  void sub(const Exact& o) { sub_limbs(o.w_); }

  bool negative() const { return (w_[kLimbs - 1] >> 63) != 0; }
  bool is_zero() const {
    for (uint64_t x : w_)
      if (x) return false;
    return true;
  }
  Exact abs() const {
    if (!negative()) return *this;
    Exact r;
    r.sub(*this);
    return r;
  }
  // Signed comparison: <0, 0, >0.
  friend int compare(const Exact& a, const Exact& b) {
    if (a.negative() != b.negative()) return a.negative() ? -1 : 1;
    for (int i = kLimbs - 1; i >= 0; --i)
      if (a.w_[i] != b.w_[i]) return a.w_[i] < b.w_[i] ? -1 : 1;
    return 0;
  }

 private:
  void add_limbs(const std::array<uint64_t, kLimbs>& t) {
    unsigned __int128 carry = 0;
    for (int i = 0; i < kLimbs; ++i) {
      carry += static_cast<unsigned __int128>(w_[i]) + t[i];
      w_[i] = static_cast<uint64_t>(carry);
      carry >>= 64;
    }
  }
  void sub_limbs(const std::array<uint64_t, kLimbs>& t) {
    uint64_t borrow = 0;
    for (int i = 0; i < kLimbs; ++i) {
      const uint64_t x = w_[i], y = t[i];
      w_[i] = x - y - borrow;
      borrow = (x < y) || (x == y && borrow) ? 1 : 0;
    }
  }
  std::array<uint64_t, kLimbs> w_{};
};

bool is_finite(float x) { return (bits_of(x) & 0x7f800000u) != 0x7f800000u; }

// The exponent a term takes in the alignment (SPEC.md §2.3.2 step 1): the sum of
// the input exponents, a subnormal counting as -126 with a zero leading bit.
int bf16_exponent(bf16 x) {
  const int ef = (x.bits >> 7) & 0xff;
  return ef ? ef - 127 : -126;
}
int f32_exponent(float x) {
  const int ef = (bits_of(x) >> 23) & 0xff;
  return ef ? ef - 127 : -126;
}
// Exponent of one unit in the last place of a finite fp32 (subnormals: 2^-149).
int ulp_exponent(float x) { return f32_exponent(x) - 23; }

// ---------------------------------------------------------------------------
// Random cases.
struct Case {
  float c;
  std::vector<bf16> a, b;
};

enum class Kind { Uniform, Wide, Cancel, TinyHuge, Zeros, Subnormal, Window, kCount };
const char* kind_name(Kind k) {
  static const char* names[] = {"uniform", "wide", "cancel", "tiny_huge", "zeros", "subnormal", "window"};
  return names[static_cast<int>(k)];
}

class Gen : public test::FloatGen {
 public:
  using FloatGen::FloatGen;
  bf16 bf16_exp(int e) { return bf16{bf(e)}; }
  bf16 bf16_subnormal() { return bf16{bf_subnormal()}; }
  bf16 bf16_any_finite() { return bf16{bf_any_finite()}; }
  float f32_exp(int e) { return float_of(f32(e)); }
  float f32_any_finite() { return float_of(FloatGen::f32_any_finite()); }
  float f32_subnormal() { return float_of(FloatGen::f32_subnormal()); }

  Case make(Kind kind, int k);
};

Case Gen::make(Kind kind, int k) {
  Case r{0.0f, std::vector<bf16>(k), std::vector<bf16>(k)};
  switch (kind) {
    case Kind::Uniform:
      for (int i = 0; i < k; ++i) r.a[i] = bf16_exp(range(-8, 8)), r.b[i] = bf16_exp(range(-8, 8));
      r.c = chance(8) ? 0.0f : f32_exp(range(-12, 12));
      break;
    case Kind::Wide:  // the whole exponent range: products from 2^-266 to 2^256
      for (int i = 0; i < k; ++i) r.a[i] = bf16_any_finite(), r.b[i] = bf16_any_finite();
      r.c = f32_any_finite();
      break;
    case Kind::Cancel: {  // pairs that cancel exactly or to a few ulps
      for (int i = 0; i + 1 < k; i += 2) {
        r.a[i] = bf16_exp(range(-4, 4));
        r.b[i] = r.b[i + 1] = bf16_exp(range(-4, 4));
        r.a[i + 1] = bf16{static_cast<uint16_t>(r.a[i].bits ^ 0x8000u)};
        if (chance(3)) r.a[i + 1].bits = static_cast<uint16_t>(r.a[i + 1].bits + (chance(2) ? 1 : -1));
      }
      if (k % 2) r.a[k - 1] = bf16_exp(range(-30, -10)), r.b[k - 1] = bf16_exp(0);
      r.c = chance(2) ? (chance(2) ? -0.0f : 0.0f) : f32_exp(range(-30, 0));
      break;
    }
    case Kind::TinyHuge: {
      const int huge = range(0, k - 1);
      for (int i = 0; i < k; ++i) {
        r.a[i] = i == huge ? bf16_exp(range(20, 60)) : bf16_exp(range(-60, -10));
        r.b[i] = bf16_exp(range(-4, 4));
      }
      r.c = f32_exp(range(-60, 60));
      break;
    }
    case Kind::Zeros:
      for (int i = 0; i < k; ++i) {
        r.a[i] = chance(2) ? bf16{static_cast<uint16_t>(bits(1) << 15)} : bf16_exp(range(-8, 8));
        r.b[i] = chance(2) ? bf16{static_cast<uint16_t>(bits(1) << 15)} : bf16_exp(range(-8, 8));
      }
      r.c = chance(2) ? float_of(bits(1) << 31) : f32_exp(range(-8, 8));
      break;
    case Kind::Subnormal:  // bf16 subnormal inputs, fp32 subnormal c and results
      for (int i = 0; i < k; ++i) {
        r.a[i] = chance(2) ? bf16_subnormal() : bf16_exp(range(-126, -110));
        r.b[i] = chance(4) ? bf16_subnormal() : bf16_exp(range(-20, 20));
      }
      r.c = chance(2) ? f32_subnormal() : f32_exp(range(-126, -100));
      break;
    case Kind::Window: {  // products 18..30 binades below c: the truncation window
      const int e0 = range(-20, 20);
      for (int i = 0; i < k; ++i) {
        r.a[i] = bf16_exp(e0 - range(18, 30));
        r.b[i] = bf16_exp(range(-1, 1));
      }
      if (chance(4)) r.a[range(0, k - 1)] = bf16_exp(e0);
      r.c = f32_exp(e0);
      break;
    }
    case Kind::kCount:
      break;
  }
  return r;
}

// Same-sign variant of a case: every product and c positive (or, if flip, negative).
Case same_sign(Case r, bool flip) {
  for (bf16& x : r.a) x.bits &= 0x7fffu;
  for (bf16& x : r.b) x.bits &= 0x7fffu;
  r.c = std::fabs(r.c);
  if (flip) {
    for (bf16& x : r.a) x.bits |= 0x8000u;
    r.c = -r.c;
  }
  return r;
}

Exact exact_dot(float c, const bf16* a, const bf16* b, int n) {
  Exact s = Exact::of_float(c);
  for (int i = 0; i < n; ++i) s.add_product(a[i], b[i]);
  return s;
}

// ---------------------------------------------------------------------------
// The derived sm90-tc bound. One group step (SPEC.md §2.3.2) on input c and n <= 16
// products forms up to 17 non-zero terms t_i with the largest exponent E. Each is
// truncated toward zero to a multiple of 2^(E-25): it loses less than 2^(E-25).
// The integer sum S' therefore lies within terms · 2^(E-25) of the exact sum S
// (strictly). The RZ conversion keeps the binade of S' (or the subnormal quantum
// 2^-149) and drops less than one unit in the last place of its result r. So
//   |r - S| < terms · 2^(E-25) + ulp(r).
// A chain feeds r into the next group as its c, so with S_g the exact sum of step g
// on its own inputs, |r_G - exact| <= sum_g |r_g - S_g| < sum_g bound_g.
struct GroupBound {
  int terms = 0;
  int e = 0;
};
GroupBound group_terms(float c, const bf16* a, const bf16* b, int n) {
  GroupBound g;
  g.e = -100000;
  for (int i = 0; i < n; ++i) {
    if ((a[i].bits & 0x7fff) == 0 || (b[i].bits & 0x7fff) == 0) continue;
    ++g.terms;
    g.e = std::max(g.e, bf16_exponent(a[i]) + bf16_exponent(b[i]));
  }
  if ((bits_of(c) & 0x7fffffffu) != 0) ++g.terms, g.e = std::max(g.e, f32_exponent(c));
  return g;
}

// Checks one chain against the bound; returns false (with a gtest failure) on a
// violation. Chains that overflow are checked for the sign and size of the overflow.
bool check_sm90_chain(const Case& cs, const char* what) {
  const int k = static_cast<int>(cs.a.size());
  const float model = Sm90Tc::chain(cs.c, cs.a.data(), 1, cs.b.data(), 1, k);
  Exact bound;
  float acc = cs.c;
  for (int g = 0; g < k; g += 16) {
    const int n = std::min(16, k - g);
    const GroupBound gb = group_terms(acc, &cs.a[g], &cs.b[g], n);
    const float next = Sm90Tc::group(acc, &cs.a[g], 1, &cs.b[g], 1, n);
    if (!is_finite(next)) {
      // Overflow: then |S'| >= 2^128 with |S' - S| < terms · 2^(E-25).
      const Exact s = exact_dot(acc, &cs.a[g], &cs.b[g], n);
      Exact reach = s.abs();
      reach.add(false, gb.terms, gb.e - 25);
      Exact big;
      big.add(false, 1, 128);
      EXPECT_EQ(s.negative(), bits_of(next) >> 31 != 0) << what;
      EXPECT_GE(compare(reach, big), 0) << what << ": overflow to Inf below 2^128";
      return compare(reach, big) >= 0;
    }
    if (gb.terms > 0) bound.add(false, gb.terms, gb.e - 25);
    bound.add(false, 1, ulp_exponent(next));
    acc = next;
  }
  EXPECT_EQ(bits_of(acc), bits_of(model)) << what << ": chain is not the groups in order";
  Exact err = Exact::of_float(model);
  err.sub(exact_dot(cs.c, cs.a.data(), cs.b.data(), k));
  const bool ok = compare(err.abs(), bound) < 0;
  EXPECT_TRUE(ok) << what << ": sm90-tc error beyond the derived bound";
  return ok;
}

// fma-seq: each step rounds to nearest, |fl(x) - x| <= ulp(fl(x))/2 (subnormal ulp
// 2^-149), so |acc_K - exact| <= sum_k ulp(acc_k)/2 — the a-posteriori form of the
// standard gamma_K bound, exact and not looser than it.
bool check_fma_chain(const Case& cs, const char* what) {
  const int k = static_cast<int>(cs.a.size());
  Exact bound;
  float acc = cs.c;
  for (int i = 0; i < k; ++i) {
    acc = fma_rn(widen(cs.a[i]), widen(cs.b[i]), acc);
    if (!is_finite(acc)) return true;  // overflowed: IEEE semantics, nothing to bound
    bound.add(false, 1, ulp_exponent(acc) - 1);
  }
  EXPECT_EQ(bits_of(acc), bits_of(FmaSeq::chain(cs.c, cs.a.data(), 1, cs.b.data(), 1, k))) << what;
  Exact err = Exact::of_float(acc);
  err.sub(exact_dot(cs.c, cs.a.data(), cs.b.data(), k));
  const bool ok = compare(err.abs(), bound) <= 0;
  EXPECT_TRUE(ok) << what << ": fma-seq error beyond the rounding bound";
  return ok;
}

// ---------------------------------------------------------------------------
// Negative controls: the model with one knob turned. Written here, not in the
// library, so that nothing can call them by mistake.
struct Variant {
  int frac_bits = Sm90Tc::kFracBits;
  bool normalise = false;  // E from the true (normalised) exponent of each term
  bool nearest = false;    // round-to-nearest-even conversion instead of RZ
  int group = Sm90Tc::kGroup;
};

float variant_group(const Variant& v, float c, const bf16* a, const bf16* b, int n) {
  struct Term {
    bool neg;
    uint64_t mag;
    int lsb, lead;  // value = mag · 2^lsb; lead = the exponent used for E
  };
  std::vector<Term> terms;
  for (int i = 0; i < n; ++i) {
    if ((a[i].bits & 0x7fff) == 0 || (b[i].bits & 0x7fff) == 0) continue;
    uint32_t sx, sy;
    int ex, ey;
    detail::split_bf16(a[i].bits, sx, ex);
    detail::split_bf16(b[i].bits, sy, ey);
    terms.push_back({((a[i].bits ^ b[i].bits) >> 15) != 0, static_cast<uint64_t>(sx) * sy, ex + ey - 14, ex + ey});
  }
  if ((bits_of(c) & 0x7fffffffu) != 0) {
    uint32_t sc;
    int ec;
    detail::split_f32(bits_of(c), sc, ec);
    terms.push_back({(bits_of(c) >> 31) != 0, sc, ec - 23, ec});
  }
  if (terms.empty()) return 0.0f;
  int e = -100000;
  for (Term& t : terms) {
    if (v.normalise) t.lead = detail::msb_index(t.mag) + t.lsb;
    e = std::max(e, t.lead);
  }
  const int q = e - v.frac_bits;  // weight of the last kept bit
  int64_t sum = 0;
  for (const Term& t : terms) {
    const int64_t m = static_cast<int64_t>(detail::shift_trunc(t.mag, t.lsb - q));
    sum += t.neg ? -m : m;
  }
  if (sum == 0) return 0.0f;
  if (v.nearest) return static_cast<float>(std::ldexp(static_cast<double>(sum), q));  // exact double, one RN
  return detail::rz_to_f32(sum < 0, static_cast<uint64_t>(sum < 0 ? -sum : sum), q);
}

float variant_chain(const Variant& v, const Case& cs) {
  float acc = cs.c;
  const int k = static_cast<int>(cs.a.size());
  for (int g = 0; g < k; g += v.group) acc = variant_group(v, acc, &cs.a[g], &cs.b[g], std::min(v.group, k - g));
  return acc;
}

Case vector_case(const Sm90Vector& v) {
  return {v.c, to_bf16_exact(v.a), to_bf16_exact(v.b.empty() ? std::vector<float>(v.a.size(), 1.0f) : v.b)};
}

// ---------------------------------------------------------------------------
TEST(Sm90Tc, TargetedVectors) {
  for (const Sm90Vector& v : sm90_targeted_vectors()) {
    const Case cs = vector_case(v);
    EXPECT_EQ(bits_of(Sm90Tc::group(cs.c, cs.a.data(), 1, cs.b.data(), 1, 16)), v.expect) << v.what;
    EXPECT_EQ(bits_of(Sm90Tc::chain(cs.c, cs.a.data(), 1, cs.b.data(), 1, 16)), v.expect) << v.what;
  }
}

// Small integers with sums below 2^24: every model is exact.
TEST(DotModels, ExactOnSmallIntegers) {
  Gen gen(1);
  for (int trial = 0; trial < 2000; ++trial) {
    const int k = gen.range(1, 128);
    Case cs{static_cast<float>(gen.range(-4096, 4096)), std::vector<bf16>(k), std::vector<bf16>(k)};
    int64_t exact = static_cast<int64_t>(cs.c);
    for (int i = 0; i < k; ++i) {
      const int x = gen.range(-16, 16), y = gen.range(-16, 16);
      cs.a[i] = round_bf16(static_cast<float>(x));
      cs.b[i] = round_bf16(static_cast<float>(y));
      exact += x * y;
    }
    const float want = static_cast<float>(exact);
    const float tc = Sm90Tc::chain(cs.c, cs.a.data(), 1, cs.b.data(), 1, k);
    const float fs = FmaSeq::chain(cs.c, cs.a.data(), 1, cs.b.data(), 1, k);
    // An exact zero is +0 in sm90-tc (SPEC.md §2.3.2 step 4); fma-seq may give -0.
    EXPECT_EQ(bits_of(tc), bits_of(want)) << "trial " << trial;
    EXPECT_EQ(fs, want) << "trial " << trial;
  }
}

TEST(Sm90Tc, ErrorWithinDerivedBound) {
  Gen gen(2);
  for (int kind = 0; kind < static_cast<int>(Kind::kCount); ++kind)
    for (int k : {16, 5, 48, 128})
      for (int trial = 0; trial < 1500; ++trial) {
        const Case cs = gen.make(static_cast<Kind>(kind), k);
        if (!check_sm90_chain(cs, kind_name(static_cast<Kind>(kind)))) {
          ADD_FAILURE() << "kind " << kind_name(static_cast<Kind>(kind)) << " k " << k << " trial " << trial;
          return;
        }
      }
}

TEST(FmaSeq, ErrorWithinRoundingBound) {
  Gen gen(3);
  for (int kind = 0; kind < static_cast<int>(Kind::kCount); ++kind)
    for (int k : {16, 5, 128})
      for (int trial = 0; trial < 1000; ++trial) {
        const Case cs = gen.make(static_cast<Kind>(kind), k);
        if (!check_fma_chain(cs, kind_name(static_cast<Kind>(kind)))) {
          ADD_FAILURE() << "kind " << kind_name(static_cast<Kind>(kind)) << " k " << k << " trial " << trial;
          return;
        }
      }
}

// Truncation and RZ both go toward zero, so when every term has one sign the
// model's magnitude never exceeds the exact one, and the sign is kept.
TEST(Sm90Tc, SameSignTermsTruncateTowardZero) {
  Gen gen(4);
  for (int kind = 0; kind < static_cast<int>(Kind::kCount); ++kind)
    for (int trial = 0; trial < 2000; ++trial) {
      const Case cs = same_sign(gen.make(static_cast<Kind>(kind), 16), trial % 2);
      const float r = Sm90Tc::group(cs.c, cs.a.data(), 1, cs.b.data(), 1, 16);
      const Exact s = exact_dot(cs.c, cs.a.data(), cs.b.data(), 16);
      if (!is_finite(r) || s.is_zero()) continue;
      const Exact m = Exact::of_float(r);
      EXPECT_LE(compare(m.abs(), s.abs()), 0) << kind_name(static_cast<Kind>(kind)) << " trial " << trial;
      if (r != 0.0f) {
        EXPECT_EQ(m.negative(), s.negative()) << kind_name(static_cast<Kind>(kind));
      }
    }
}

// A negative term far below 2^(E-25) truncates to 0 (toward zero), not to -2^(E-25)
// (floor): 1 - 2^-30 gives 1, where floor would give 1 - 2^-24.
TEST(Sm90Tc, NegativeTermTruncatesTowardZero) {
  std::vector<bf16> a(16, bf16{0}), b(16, round_bf16(1.0f));
  a[0] = round_bf16(-0x1p-30f);
  EXPECT_EQ(bits_of(Sm90Tc::group(1.0f, a.data(), 1, b.data(), 1, 16)), 0x3F800000u);
  for (int i = 0; i < 4; ++i) a[i] = round_bf16(-0x1p-27f);  // floor: 1 - 4·2^-25
  EXPECT_EQ(bits_of(Sm90Tc::group(1.0f, a.data(), 1, b.data(), 1, 16)), 0x3F800000u);
}

TEST(Sm90Tc, ShortLastGroupEqualsZeroPadding) {
  Gen gen(5);
  for (int kind = 0; kind < static_cast<int>(Kind::kCount); ++kind)
    for (int k : {1, 5, 15, 17, 31, 33, 100, 127}) {
      const Case cs = gen.make(static_cast<Kind>(kind), k);
      const int padded = (k + 15) / 16 * 16;
      std::vector<bf16> a = cs.a, b = cs.b;
      a.resize(padded, bf16{0});
      b.resize(padded, bf16{0x3f80});  // zero times one: still no term
      EXPECT_EQ(bits_of(Sm90Tc::chain(cs.c, cs.a.data(), 1, cs.b.data(), 1, k)),
                bits_of(Sm90Tc::chain(cs.c, a.data(), 1, b.data(), 1, padded)))
          << kind_name(static_cast<Kind>(kind)) << " k " << k;
    }
}

TEST(Sm90Tc, ChainIsGroupsInIncreasingOrder) {
  Gen gen(6);
  for (int kind = 0; kind < static_cast<int>(Kind::kCount); ++kind)
    for (int k : {32, 64, 70, 128}) {
      const Case cs = gen.make(static_cast<Kind>(kind), k);
      float acc = cs.c;
      for (int g = 0; g < k; g += 16)
        acc = Sm90Tc::group(acc, &cs.a[g], 1, &cs.b[g], 1, std::min(16, k - g));
      EXPECT_EQ(bits_of(Sm90Tc::chain(cs.c, cs.a.data(), 1, cs.b.data(), 1, k)), bits_of(acc));
      // Strided operands read the same elements.
      std::vector<bf16> a2(2 * k), b2(3 * k);
      for (int i = 0; i < k; ++i) a2[2 * i] = cs.a[i], b2[3 * i] = cs.b[i];
      EXPECT_EQ(bits_of(Sm90Tc::chain(cs.c, a2.data(), 2, b2.data(), 3, k)), bits_of(acc));
    }
}

// The variant with every knob at the model's value is the model: the controls
// below differ only by the knob they turn.
TEST(NegativeControls, DefaultVariantIsTheModel) {
  Gen gen(7);
  const Variant v;
  for (int kind = 0; kind < static_cast<int>(Kind::kCount); ++kind)
    for (int trial = 0; trial < 2000; ++trial) {
      const Case cs = gen.make(static_cast<Kind>(kind), 16 * (1 + trial % 3));
      const float m = Sm90Tc::chain(cs.c, cs.a.data(), 1, cs.b.data(), 1, static_cast<int>(cs.a.size()));
      if (!is_finite(m)) continue;  // the variant has no non-finite handling
      ASSERT_EQ(bits_of(variant_chain(v, cs)), bits_of(m)) << kind_name(static_cast<Kind>(kind)) << " " << trial;
    }
}

struct Control {
  const char* name;
  Variant v;
  int vector;  // index of the targeted vector that separates it
};
std::vector<Control> controls() {
  Variant f24, f26, norm, rn, g8;
  f24.frac_bits = 24;
  f26.frac_bits = 26;
  norm.normalise = true;
  rn.nearest = true;
  g8.group = 8;
  return {{"24 fraction bits", f24, 0}, {"26 fraction bits", f26, 1}, {"normalised products", norm, 2},
          {"two groups of 8", g8, 3},   {"round to nearest", rn, 4}};
}

TEST(NegativeControls, EachNeighbourFailsItsTargetedVector) {
  const std::vector<Sm90Vector> vectors = sm90_targeted_vectors();
  for (const Control& ctl : controls()) {
    const Case cs = vector_case(vectors[ctl.vector]);
    EXPECT_NE(bits_of(variant_chain(ctl.v, cs)), vectors[ctl.vector].expect) << ctl.name;
  }
}

TEST(NegativeControls, EachNeighbourDiffersOnRandomData) {
  for (const Control& ctl : controls()) {
    Gen gen(8);
    int differ = 0, total = 0;
    for (int kind = 0; kind < static_cast<int>(Kind::kCount); ++kind)
      for (int trial = 0; trial < 500; ++trial) {
        const Case cs = gen.make(static_cast<Kind>(kind), 16);
        const float m = Sm90Tc::chain(cs.c, cs.a.data(), 1, cs.b.data(), 1, 16);
        if (!is_finite(m)) continue;
        differ += bits_of(variant_chain(ctl.v, cs)) != bits_of(m);
        ++total;
      }
    EXPECT_GT(differ, 0) << ctl.name << " agrees with the model on all " << total << " random cases";
  }
}

// The bound test itself must be able to fail: a model with 20 fraction bits
// breaks the 25-bit bound on random data.
TEST(NegativeControls, BoundCatchesACoarserModel) {
  Gen gen(9);
  Variant coarse;
  coarse.frac_bits = 20;
  int beyond = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const Case cs = gen.make(Kind::Window, 16);
    const float r = variant_chain(coarse, cs);
    const GroupBound gb = group_terms(cs.c, cs.a.data(), cs.b.data(), 16);
    Exact bound;
    bound.add(false, gb.terms, gb.e - 25);
    bound.add(false, 1, ulp_exponent(r));
    Exact err = Exact::of_float(r);
    err.sub(exact_dot(cs.c, cs.a.data(), cs.b.data(), 16));
    beyond += compare(err.abs(), bound) >= 0;
  }
  EXPECT_GT(beyond, 0);
}

}  // namespace
}  // namespace bp
