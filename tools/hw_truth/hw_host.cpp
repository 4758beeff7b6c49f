// Host side of hw_truth: case generation, the sm90-tc model's answers, the host
// build of bp::math, and the reports. Compiled by g++ with the reference's flags,
// so every host result here is the reference's own.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "reference/numerics/dot.h"
#include "reference/numerics/math.h"
#include "reference/numerics/sm90_vectors.h"
#include "tests/support/float_gen.h"
#include "tools/hw_truth/hw_truth.h"

namespace bp::hw {

void BlockSet::add_block(const std::string& cat) {
  category.push_back(cat);
  c.resize(cases(), 0);
  a.resize(static_cast<size_t>(blocks()) * kM * k, 0);
  b.resize(static_cast<size_t>(blocks()) * kN * k, 0);
}

uint32_t canonical(uint32_t bits) { return canonical_bits(float_of(bits)); }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

namespace {

std::string hex16(uint16_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04x", v);
  return buf;
}

// Exact powers of two as bit patterns, subnormals included.
uint16_t bf_pow2(int e) {  // e >= -133
  return e >= -126 ? static_cast<uint16_t>((e + 127) << 7) : static_cast<uint16_t>(1u << (e + 133));
}
uint32_t f_pow2(int e) {  // e >= -149
  return e >= -126 ? static_cast<uint32_t>(e + 127) << 23 : 1u << (e + 149);
}
constexpr uint16_t kNeg16 = 0x8000u;
uint16_t neg16(uint16_t x) { return static_cast<uint16_t>(x | kNeg16); }
constexpr uint32_t kNeg32 = 0x80000000u;
constexpr uint16_t kOne16 = 0x3f80u;
constexpr uint32_t kOne32 = 0x3f800000u;
constexpr uint16_t kInf16 = 0x7f80u;
constexpr uint32_t kInf32 = 0x7f800000u;

using Gen = test::FloatGen;

// One block's operands; each category fills them so that every (row, column)
// pairing is a case of that category.
struct BlockView {
  int k;
  uint32_t* c;  // 64 x 8
  uint16_t* a;  // 64 x k
  uint16_t* b;  // 8 x k
  uint16_t& A(int i, int kk) { return a[i * k + kk]; }
  uint16_t& B(int j, int kk) { return b[j * k + kk]; }
};

template <class FA, class FB, class FC>
void fill_each(BlockView v, FA fa, FB fb, FC fc) {
  for (int i = 0; i < kM * v.k; ++i) v.a[i] = fa();
  for (int i = 0; i < kN * v.k; ++i) v.b[i] = fb();
  for (int i = 0; i < kCasesPerBlock; ++i) v.c[i] = fc();
}

// NaN, Inf and signed zero operands sprinkled over otherwise uniform data, so some
// outputs of a block stay finite and others meet one or several specials.
uint16_t special_bf16(Gen& g) {
  return g.pick<uint16_t>({kInf16, kInf16 | kNeg16, 0x7fc0, 0xffc0, 0x7f81, 0x7fff, kNeg16, 0x0000, 0x7f7f, 0x0001});
}
uint32_t special_f32(Gen& g) {
  return g.pick<uint32_t>({kInf32, kInf32 | kNeg32, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fc12345, kNeg32, 0,
                           0x7f7fffff, 0x00000001});
}

void fill_block(Gen& g, const std::string& cat, BlockView v) {
  const int k = v.k;
  if (cat == "uniform") {
    fill_each(
        v, [&] { return g.bf(g.range(-8, 8)); }, [&] { return g.bf(g.range(-8, 8)); },
        [&] { return g.chance(8) ? 0u : g.f32(g.range(-12, 12)); });
  } else if (cat == "wide") {  // products from 2^-266 to 2^256, c over all finite fp32
    fill_each(
        v, [&] { return g.bf_any_finite(); }, [&] { return g.bf_any_finite(); }, [&] { return g.f32_any_finite(); });
  } else if (cat == "cancel") {
    // B pairs equal elements (2m, 2m+1) in every column and A negates them in every
    // row, so each pair of products cancels exactly or to an ulp in every output.
    fill_each(
        v, [] { return uint16_t{0}; }, [] { return uint16_t{0}; },
        [&] { return g.chance(2) ? static_cast<uint32_t>(g.bits(1)) << 31 : g.f32(g.range(-30, 0)); });
    for (int j = 0; j < kN; ++j)
      for (int kk = 0; kk + 1 < k; kk += 2) v.B(j, kk) = v.B(j, kk + 1) = g.bf(g.range(-4, 4));
    for (int i = 0; i < kM; ++i)
      for (int kk = 0; kk + 1 < k; kk += 2) {
        v.A(i, kk) = g.bf(g.range(-4, 4));
        v.A(i, kk + 1) = static_cast<uint16_t>(v.A(i, kk) ^ kNeg16);
        if (g.chance(3)) v.A(i, kk + 1) = static_cast<uint16_t>(v.A(i, kk + 1) + (g.chance(2) ? 1 : -1));
      }
  } else if (cat == "tiny_huge") {  // one huge product per row beside tiny ones
    fill_each(
        v, [&] { return g.bf(g.range(-60, -10)); }, [&] { return g.bf(g.range(-4, 4)); },
        [&] { return g.f32(g.range(-60, 60)); });
    for (int i = 0; i < kM; ++i) v.A(i, g.range(0, k - 1)) = g.bf(g.range(20, 60));
  } else if (cat == "window") {  // products 18..30 binades below c: the truncation window
    const int e0 = g.range(-20, 20);
    fill_each(
        v, [&] { return g.bf(e0 - g.range(18, 30)); }, [&] { return g.bf(g.range(-1, 1)); },
        [&] { return g.f32(e0); });
    for (int i = 0; i < kM; ++i)
      if (g.chance(4)) v.A(i, g.range(0, k - 1)) = g.bf(e0);
  } else if (cat == "zeros") {
    fill_each(
        v, [&] { return g.chance(2) ? g.bf_signed_zero() : g.bf(g.range(-8, 8)); },
        [&] { return g.chance(2) ? g.bf_signed_zero() : g.bf(g.range(-8, 8)); },
        [&] { return g.chance(2) ? static_cast<uint32_t>(g.bits(1)) << 31 : g.f32(g.range(-8, 8)); });
  } else if (cat == "bf16_subnormal") {
    fill_each(
        v, [&] { return g.chance(2) ? g.bf_subnormal() : g.bf(g.range(-126, -110)); },
        [&] { return g.chance(4) ? g.bf_subnormal() : g.bf(g.range(-20, 20)); },
        [&] { return g.chance(2) ? g.f32_subnormal() : g.f32(g.range(-126, -100)); });
  } else if (cat == "f32_subnormal") {  // subnormal c, products around 2^-160..2^-120
    fill_each(
        v, [&] { return g.bf(g.range(-80, -60)); }, [&] { return g.bf(g.range(-80, -60)); },
        [&] { return g.chance(8) ? g.f32(g.range(-126, -120)) : g.f32_subnormal(); });
  } else if (cat == "overflow") {  // products 2^110..2^130, c near the top
    fill_each(
        v, [&] { return g.bf(g.range(55, 64)); }, [&] { return g.bf(g.range(55, 64)); },
        [&] { return g.chance(4) ? 0x7f7fffffu | (g.bits(1) << 31) : g.f32(g.range(110, 127)); });
  } else if (cat == "specials") {
    fill_each(
        v, [&] { return g.chance(24) ? special_bf16(g) : g.bf(g.range(-8, 8)); },
        [&] { return g.chance(24) ? special_bf16(g) : g.bf(g.range(-8, 8)); },
        [&] { return g.chance(8) ? special_f32(g) : g.f32(g.range(-8, 8)); });
  } else if (cat == "signed_zero") {  // values that often cancel exactly, zeros of both signs
    fill_each(
        v, [&] { return g.pick<uint16_t>({0x0000, kNeg16, kOne16, kOne16 | kNeg16, 0x3f00, 0xbf00}); },
        [&] { return g.pick<uint16_t>({0x0000, kNeg16, kOne16, kOne16 | kNeg16}); },
        [&] { return g.pick<uint32_t>({0u, kNeg32, kOne32, kOne32 | kNeg32, 0x3f000000u, 0xbf000000u}); });
  } else {
    throw std::logic_error("unknown category " + cat);
  }
}

}  // namespace

std::vector<std::string> single_categories() {
  return {"uniform",        "wide",          "cancel",   "tiny_huge", "window",     "zeros",
          "bf16_subnormal", "f32_subnormal", "overflow", "specials",  "signed_zero"};
}
std::vector<std::string> chain_categories() {
  return {"uniform", "wide", "cancel", "tiny_huge", "window", "zeros", "specials"};
}

BlockSet generate_blocks(const std::vector<std::string>& categories, int k, int blocks_per_category, uint64_t seed) {
  BlockSet set;
  set.k = k;
  Gen g(seed * 1000003u + static_cast<uint64_t>(k));
  for (const std::string& cat : categories)
    for (int n = 0; n < blocks_per_category; ++n) {
      set.add_block(cat);
      const int blk = set.blocks() - 1;
      fill_block(g, cat, BlockView{k, set.c_of(blk), set.a_of(blk), set.b_of(blk)});
    }
  return set;
}

BlockSet layout_probe_block() {
  // Two k16 steps so that the walk over K is checked too. Small integers: sums stay
  // below 2^24, so every correct layout gives these exact values and any misplaced
  // operand gives others.
  BlockSet set;
  set.k = 32;
  set.add_block("layout");
  Gen g(12345);
  for (int i = 0; i < kM * set.k; ++i) set.a[i] = round_bf16(static_cast<float>(g.range(-8, 8))).bits;
  for (int i = 0; i < kN * set.k; ++i) set.b[i] = round_bf16(static_cast<float>(g.range(-8, 8))).bits;
  for (int i = 0; i < kCasesPerBlock; ++i) set.c[i] = bits_of(static_cast<float>(1000 * i));
  return set;
}

namespace {

struct Term {
  int k;
  uint16_t a, b;
};
Probe probe(const char* question, const char* name, uint32_t c, std::initializer_list<Term> terms,
            const char* note) {
  Probe p;
  p.question = question;
  p.name = name;
  p.c = c;
  p.note = note;
  for (const Term& t : terms) p.a[t.k] = t.a, p.b[t.k] = t.b;
  return p;
}
Probe probe_all(const char* question, const char* name, uint32_t c, uint16_t a, uint16_t b, const char* note) {
  Probe p = probe(question, name, c, {}, note);
  std::fill(p.a, p.a + 16, a);
  std::fill(p.b, p.b + 16, b);
  return p;
}

void add_nan_probes(std::vector<Probe>& v) {
  const char* q = "nan_inf";
  v.push_back(probe(q, "c_qnan", 0x7fc00000, {{0, kOne16, kOne16}}, "NaN c: output bits"));
  v.push_back(probe(q, "c_qnan_payload", 0x7fc12345, {{0, kOne16, kOne16}}, "is a payload kept?"));
  v.push_back(probe(q, "c_neg_qnan", 0xffc00000, {{0, kOne16, kOne16}}, "is the sign kept?"));
  v.push_back(probe(q, "c_snan", 0x7f800001, {{0, kOne16, kOne16}}, "signalling NaN c"));
  v.push_back(probe(q, "a_qnan", kOne32, {{0, 0x7fc0, kOne16}}, "NaN operand"));
  v.push_back(probe(q, "a_neg_qnan_payload", kOne32, {{3, 0xffa1, kOne16}}, "negative NaN operand with payload"));
  v.push_back(probe(q, "a_snan", kOne32, {{0, 0x7f81, kOne16}}, "signalling NaN operand"));
  v.push_back(probe(q, "b_qnan", kOne32, {{5, kOne16, 0x7fc0}}, "NaN in B"));
  v.push_back(probe(q, "inf_times_zero", kOne32, {{0, kInf16, 0x0000}}, "Inf x 0 -> NaN (model)"));
  v.push_back(probe(q, "zero_times_neg_inf", kOne32, {{0, kNeg16, kInf16 | kNeg16}}, "-0 x -Inf -> NaN (model)"));
  v.push_back(probe(q, "inf_minus_inf_products", 0, {{0, kInf16, kOne16}, {1, kInf16 | kNeg16, kOne16}},
                    "+Inf and -Inf products -> NaN (model)"));
  v.push_back(probe(q, "inf_product_minus_inf_c", kInf32 | kNeg32, {{0, kInf16, kOne16}}, "+Inf product, -Inf c"));
  v.push_back(probe(q, "inf_c", kInf32, {{0, kOne16, kOne16}}, "Inf c with finite products"));
  v.push_back(probe(q, "neg_inf_product", kOne32, {{0, kInf16 | kNeg16, 0x4000}}, "-Inf x 2 -> -Inf"));
  v.push_back(probe(q, "inf_times_subnormal", 0, {{0, kInf16, 0x0001}}, "Inf x subnormal -> Inf, not NaN"));
  v.push_back(probe(q, "nan_and_inf", 0, {{0, 0x7fc0, kOne16}, {1, kInf16, kOne16}}, "NaN beside Inf"));
}

void add_zero_sign_probes(std::vector<Probe>& v) {
  const char* q = "zero_sign";
  v.push_back(probe(q, "c_neg0_zero_products", kNeg32, {}, "c = -0, every product +0: no terms"));
  v.push_back(probe_all(q, "c_neg0_neg0_products", kNeg32, kNeg16, kOne16, "c = -0, 16 products -0 (IEEE: -0)"));
  v.push_back(probe_all(q, "c_pos0_neg0_products", 0, kNeg16, kOne16, "c = +0, 16 products -0"));
  v.push_back(probe_all(q, "all_inputs_neg0", kNeg32, kNeg16, kNeg16, "c, a, b all -0 (products +0)"));
  v.push_back(probe(q, "c_neg0_products_cancel", kNeg32, {{0, kOne16, kOne16}, {1, kOne16 | kNeg16, kOne16}},
                    "c = -0, 1 - 1"));
  v.push_back(probe(q, "c_pos0_products_cancel", 0, {{0, kOne16, kOne16}, {1, kOne16 | kNeg16, kOne16}},
                    "c = +0, 1 - 1"));
  v.push_back(probe(q, "c_cancels_product", kOne32, {{0, kOne16 | kNeg16, kOne16}}, "1 + (-1)"));
  v.push_back(probe(q, "neg_c_cancels_product", kOne32 | kNeg32, {{0, kOne16, kOne16}}, "-1 + 1"));
  v.push_back(probe(q, "neg_c_cancels_two", kOne32 | kNeg32, {{0, 0x3f00, kOne16}, {1, 0x3f00, kOne16}},
                    "-1 + 0.5 + 0.5"));
  v.push_back(probe(q, "negative_underflow", 0, {{0, 0x8001, 0x0001}}, "-2^-266 alone: model -0"));
  v.push_back(probe(q, "positive_underflow", 0, {{0, 0x0001, 0x0001}}, "2^-266 alone: model +0"));
  v.push_back(probe(q, "negative_underflow_neg0_c", kNeg32, {{0, 0x8001, 0x0001}}, "-0 + -2^-266"));
  v.push_back(probe(q, "huge_products_cancel", 0, {{0, bf_pow2(127), bf_pow2(127)}, {1, neg16(bf_pow2(127)), bf_pow2(127)}},
                    "2^254 - 2^254 (products beyond fp32 range)"));
  v.push_back(probe(q, "huge_cancel_small_c", kOne32,
                    {{0, bf_pow2(127), bf_pow2(127)}, {1, neg16(bf_pow2(127)), bf_pow2(127)}},
                    "1 + 2^254 - 2^254: c truncated away at E = 254 (model +0)"));
}

// A floor F on E would make the quantum 2^(F-25): the borrow of -2^(e0-24) from
// 2^e0 survives exactly while e0 >= F - 1.
void add_e_floor_probes(std::vector<Probe>& v) {
  for (int e0 : {-100, -120, -126, -127, -130, -135, -140, -145, -148}) {
    const int x = e0 / 2, y = e0 - x;              // both >= -126: normal bf16 factors
    const int x1 = (e0 - 24) / 2, y1 = e0 - 24 - x1;
    Probe p = probe("e_floor", "", 0, {{0, bf_pow2(x), bf_pow2(y)}, {1, neg16(bf_pow2(x1)), bf_pow2(y1)}},
                    "2^e0 - 2^(e0-24): the model keeps the borrow (no floor on E)");
    p.name = "borrow_below_2^" + std::to_string(e0);
    v.push_back(p);
  }
  // Dense sweep: which borrows 2^(e0-d) survive beside 2^e0 near the bottom of
  // the range pins the floor exactly (the result stays below 2^e0 iff kept).
  for (int e0 = -150; e0 <= -118; ++e0)
    for (int d = 20; d <= 25; ++d) {
      const int x = e0 / 2, y = e0 - x, x1 = (e0 - d) / 2, y1 = e0 - d - x1;
      Probe p = probe("e_floor", "", 0, {{0, bf_pow2(x), bf_pow2(y)}, {1, neg16(bf_pow2(x1)), bf_pow2(y1)}},
                      "2^e0 - 2^(e0-d) sweep");
      p.name = "sweep_e" + std::to_string(e0) + "_d" + std::to_string(d);
      v.push_back(p);
    }
  const char* q = "e_floor";
  v.push_back(probe(q, "borrow_subnormal_factor", 0,
                    {{0, bf_pow2(-70), bf_pow2(-70)}, {1, neg16(0x0001), bf_pow2(-31)}},
                    "2^-140 - 2^-164, the small product from a subnormal factor: model keeps the borrow"));
  v.push_back(probe(q, "c_subnormal_exponent", f_pow2(-140), {{0, neg16(bf_pow2(-80)), bf_pow2(-80)}},
                    "subnormal c counts as exponent -126: -2^-160 truncated (true exponent would borrow)"));
  v.push_back(probe(q, "bf16_subnormal_exponent", 0,
                    {{0, 0x0001, bf_pow2(10)}, {1, neg16(bf_pow2(-72)), bf_pow2(-73)}},
                    "2^-133 x 2^10 has exponent -116: -2^-145 truncated (true exponent -123 would keep it)"));
  v.push_back(probe_all(q, "sixteen_2^-150", 0, bf_pow2(-75), bf_pow2(-75), "16 x 2^-150 = 2^-146"));
  v.push_back(probe_all(q, "sixteen_2^-160", 0, bf_pow2(-80), bf_pow2(-80), "16 x 2^-160 = 2^-156: below fp32, +0"));
  v.push_back(probe(q, "subnormal_squared_beside_min_c", f_pow2(-149), {{0, bf_pow2(-127), bf_pow2(-127)}},
                    "2^-149 + 2^-254"));
}

void add_truncation_probes(std::vector<Probe>& v) {
  const char* q = "negative_truncation";
  v.push_back(probe(q, "c1_minus_2^-30", kOne32, {{0, neg16(bf_pow2(-30)), kOne16}},
                    "toward zero gives 1 (3f800000); floor gives 3f7fffff"));
  v.push_back(probe(q, "c1_minus_four_2^-27", kOne32,
                    {{0, neg16(bf_pow2(-27)), kOne16}, {1, neg16(bf_pow2(-27)), kOne16},
                     {2, neg16(bf_pow2(-27)), kOne16}, {3, neg16(bf_pow2(-27)), kOne16}},
                    "toward zero gives 3f800000; floor gives 3f7ffffe"));
  v.push_back(probe(q, "c1ulp_minus_2^-26", 0x3f800001, {{0, neg16(bf_pow2(-26)), kOne16}},
                    "toward zero gives 3f800001; floor gives 3f800000"));
  v.push_back(probe(q, "cneg1_minus_2^-30", kOne32 | kNeg32, {{0, neg16(bf_pow2(-30)), kOne16}},
                    "control: -1 either way"));
}

void add_overflow_probes(std::vector<Probe>& v) {
  const char* q = "overflow";
  v.push_back(probe(q, "max_plus_2^104", 0x7f7fffff, {{0, bf_pow2(52), bf_pow2(52)}},
                    "sum exactly 2^128: Inf (model) or max (IEEE RZ)"));
  v.push_back(probe(q, "max_plus_2^103", 0x7f7fffff, {{0, bf_pow2(52), bf_pow2(51)}}, "below 2^128: max"));
  v.push_back(probe(q, "product_2^254", 0, {{0, bf_pow2(127), bf_pow2(127)}}, "one product beyond fp32: Inf"));
  v.push_back(probe(q, "neg_max_minus_2^104", 0xff7fffff, {{0, neg16(bf_pow2(52)), bf_pow2(52)}}, "-Inf"));
  v.push_back(probe(q, "intermediate_above_fp32", 0, {{0, bf_pow2(65), bf_pow2(65)}, {1, 0xdfff, bf_pow2(65)}},
                    "2^130 - (2^130 - 2^122) = 2^122: products beyond fp32, sum in range"));
}

void add_targeted_probes(std::vector<Probe>& v) {
  int n = 0;
  for (const Sm90Vector& t : sm90_targeted_vectors()) {
    Probe p;
    p.question = "targeted";
    p.name = "vector_" + std::to_string(n++);
    p.note = t.what;
    p.c = bits_of(t.c);
    for (int i = 0; i < 16; ++i) {
      p.a[i] = round_bf16(t.a[i]).bits;
      p.b[i] = round_bf16(t.b.empty() ? 1.0f : t.b[i]).bits;
    }
    v.push_back(p);
  }
}

}  // namespace

std::vector<Probe> make_probes() {
  std::vector<Probe> v;
  add_targeted_probes(v);
  add_nan_probes(v);
  add_zero_sign_probes(v);
  add_e_floor_probes(v);
  add_truncation_probes(v);
  add_overflow_probes(v);
  return v;
}

BlockSet probe_blocks(const std::vector<Probe>& probes) {
  BlockSet set;
  set.k = 16;
  for (const Probe& p : probes) {
    set.add_block("probe." + p.question + "." + p.name);
    const int blk = set.blocks() - 1;
    std::fill(set.c_of(blk), set.c_of(blk) + kCasesPerBlock, p.c);
    for (int i = 0; i < kM; ++i) std::copy(p.a, p.a + 16, set.a_of(blk) + i * 16);
    for (int j = 0; j < kN; ++j) std::copy(p.b, p.b + 16, set.b_of(blk) + j * 16);
  }
  return set;
}

std::vector<uint32_t> model_outputs(const BlockSet& set) {
  std::vector<uint32_t> out(set.cases());
  const int k = set.k;
#pragma omp parallel for schedule(dynamic)
  for (int blk = 0; blk < set.blocks(); ++blk) {
    std::vector<bf16> a(k), b(k);
    for (int i = 0; i < kM; ++i)
      for (int j = 0; j < kN; ++j) {
        const size_t base_a = (static_cast<size_t>(blk) * kM + i) * k, base_b = (static_cast<size_t>(blk) * kN + j) * k;
        for (int kk = 0; kk < k; ++kk) a[kk].bits = set.a[base_a + kk], b[kk].bits = set.b[base_b + kk];
        const size_t idx = static_cast<size_t>(blk) * kCasesPerBlock + i * kN + j;
        out[idx] = bits_of(Sm90Tc::chain(float_of(set.c[idx]), a.data(), 1, b.data(), 1, k));
      }
  }
  return out;
}

// --- bp::math -----------------------------------------------------------------
namespace {
using MathFn = float (*)(float);
#define BP_HW_NAME(f) #f,
#define BP_HW_PTR(f) &bp::math::f,
const std::vector<std::string> kMathNames = {BP_HW_MATH_FUNCTIONS(BP_HW_NAME) "exp_batch", "bf16_cvt",
                                             "exp2_poly_floor"};
const std::vector<MathFn> kMathPtrs = {BP_HW_MATH_FUNCTIONS(BP_HW_PTR) & bp::math::exp, &widened_round_bf16,
                                       &bp::math::exp2_poly};
#undef BP_HW_NAME
#undef BP_HW_PTR
}  // namespace

float widened_round_bf16(float x) { return widen(round_bf16(x)); }

const std::vector<std::string>& math_functions() { return kMathNames; }

void host_math(int fn, uint32_t first, uint32_t step, uint32_t n, uint32_t* out) {
  const MathFn f = kMathPtrs.at(fn);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i)
    out[i] = bits_of(f(float_of(first + static_cast<uint32_t>(i) * step)));
}

uint64_t count_mismatches(const uint32_t* host, const uint32_t* device, uint32_t n, uint32_t first, uint32_t step,
                          std::vector<std::array<uint32_t, 3>>* examples, size_t max_examples) {
  // Counted per slice into its own slot, then summed in order: no reduction clause.
  constexpr uint32_t kSlice = 1u << 16;
  const int64_t slices = (static_cast<int64_t>(n) + kSlice - 1) / kSlice;
  std::vector<uint64_t> per_slice(slices, 0);
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < slices; ++s) {
    const uint32_t end = static_cast<uint32_t>(std::min<int64_t>(n, (s + 1) * kSlice));
    uint64_t m = 0;
    for (uint32_t i = static_cast<uint32_t>(s * kSlice); i < end; ++i) m += canonical(host[i]) != canonical(device[i]);
    per_slice[s] = m;
  }
  uint64_t total = 0;
  for (int64_t s = 0; s < slices; ++s) {
    total += per_slice[s];
    if (per_slice[s] == 0 || !examples || examples->size() >= max_examples) continue;
    const uint32_t end = static_cast<uint32_t>(std::min<int64_t>(n, (s + 1) * kSlice));
    for (uint32_t i = static_cast<uint32_t>(s * kSlice); i < end && examples->size() < max_examples; ++i)
      if (canonical(host[i]) != canonical(device[i])) examples->push_back({first + i * step, host[i], device[i]});
  }
  return total;
}

// --- Reports --------------------------------------------------------------------
namespace {

void write_csv_header(std::ofstream& f) {
  f << "# bitparity: Hopper bf16 tensor-core dot products captured by tools/hw_truth/hw_truth.cu\n"
       "# (checked by tests/reference/numerics/test_hw_vectors.cpp against bp::Sm90Tc, SPEC.md 2.3.2).\n"
       "# One row per single-group case: d = c + sum_{i<16} a_i*b_i, computed by one\n"
       "# mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (column mma) and one\n"
       "# wgmma.mma_async.m64n8k16.f32.bf16.bf16 k16 step (column wgmma).\n"
       "# Columns: category, c, a0..a15, b0..b15, mma, wgmma. c, mma and wgmma are fp32 bit\n"
       "# patterns as 8 hex digits; a_i, b_i are bf16 bit patterns as 4 hex digits; no 0x.\n"
       "# NaN outputs are written as the hardware gave them; comparisons canonicalise NaN.\n"
       "# category 'probe.<question>.<name>' rows are the edge-case probes of summary.json.\n";
  f << "category,c";
  for (int i = 0; i < 16; ++i) f << ",a" << i;
  for (int i = 0; i < 16; ++i) f << ",b" << i;
  f << ",mma,wgmma\n";
}

void write_csv_row(std::ofstream& f, const std::string& category, const BlockSet& set, const Results& hw, size_t idx) {
  const int blk = static_cast<int>(idx / kCasesPerBlock), cell = static_cast<int>(idx % kCasesPerBlock);
  const int i = cell / kN, j = cell % kN;
  f << category << ',' << hex32(set.c[idx]);
  for (int kk = 0; kk < 16; ++kk) f << ',' << hex16(set.a_of(blk)[i * set.k + kk]);
  for (int kk = 0; kk < 16; ++kk) f << ',' << hex16(set.b_of(blk)[j * set.k + kk]);
  f << ',' << hex32(hw.mma[idx]) << ',' << hex32(hw.wgmma[idx]) << '\n';
}

}  // namespace

void write_cases_csv(const std::string& path, const BlockSet& singles, const Results& singles_hw,
                     const std::vector<uint32_t>& singles_model, const BlockSet& probes, const Results& probes_hw,
                     const std::vector<Probe>& probe_list, int per_category) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  write_csv_header(f);
  std::set<size_t> chosen;
  // Every mismatch (up to a cap), so the capture shows where the model is wrong.
  for (size_t idx = 0; idx < singles.cases() && chosen.size() < 2000; ++idx) {
    const uint32_t m = canonical(singles_model[idx]);
    if (canonical(singles_hw.mma[idx]) != m || canonical(singles_hw.wgmma[idx]) != m) chosen.insert(idx);
  }
  // Then per category a spread of cases: different blocks, rows and columns.
  std::map<std::string, std::vector<int>> blocks_of;
  for (int blk = 0; blk < singles.blocks(); ++blk) blocks_of[singles.category[blk]].push_back(blk);
  for (const auto& [cat, blks] : blocks_of)
    for (int n = 0; n < per_category; ++n) {
      const int blk = blks[n % blks.size()];
      chosen.insert(static_cast<size_t>(blk) * kCasesPerBlock + (static_cast<size_t>(n) * 37 + n / blks.size()) % kCasesPerBlock);
    }
  for (size_t idx : chosen) write_csv_row(f, singles.category[idx / kCasesPerBlock], singles, singles_hw, idx);
  for (size_t p = 0; p < probe_list.size(); ++p)
    write_csv_row(f, probes.category[p], probes, probes_hw, p * kCasesPerBlock);
}

bool report_passes(const Report& r) {
  const bool layout_ok = r.layout == "ok" || r.layout.rfind("not run", 0) == 0;
  return layout_ok && r.dot_mismatches == 0 && r.scale_d0_disagree == 0 && r.math_mismatches == 0 &&
         r.math.size() == r.math_requested.size();
}

void write_summary(const std::string& path, const Report& r) {
  using nlohmann::json;
  json j;
  j["program"] = "tools/hw_truth/hw_truth.cu";
  j["quick"] = r.quick;
  for (const auto& [k, v] : r.device) j["device"][k] = v;
  j["layout_probe"] = r.layout;
  j["wgmma_descriptor"] = r.wgmma_descriptor;
  j["nan_policy"] = "outputs compared after NaN canonicalisation (SPEC.md 3); raw NaN bits under nan_output_bits";
  json counts = json::array();
  for (const CountRow& c : r.counts)
    counts.push_back({{"category", c.category}, {"k", c.k}, {"instruction", c.instruction}, {"cases", c.cases},
                      {"mismatches", c.mismatches}, {"model_nonfinite", c.nonfinite}});
  j["dot"]["counts"] = counts;
  j["dot"]["mismatches"] = r.dot_mismatches;
  j["dot"]["instructions_disagree"] = r.instructions_disagree;
  j["dot"]["scale_d0"] = {{"outputs", r.scale_d0_outputs},
                          {"disagree", r.scale_d0_disagree},
                          {"what", "wgmma from a +0 accumulator vs scale-d = 0 on the first k16 group"}};
  json probes = json::array();
  for (const ProbeResult& p : r.probes) {
    json terms = json::array();
    for (int i = 0; i < 16; ++i)
      if ((p.probe.a[i] | p.probe.b[i]) != 0 && !(p.probe.a[i] == 0 && p.probe.b[i] == kOne16))  // skip 0 x 1 filler
        terms.push_back({{"k", i}, {"a", hex16(p.probe.a[i])}, {"b", hex16(p.probe.b[i])}});
    probes.push_back({{"question", p.probe.question}, {"name", p.probe.name}, {"note", p.probe.note},
                      {"c", hex32(p.probe.c)}, {"terms", terms}, {"model", hex32(p.model)}, {"mma", hex32(p.mma)},
                      {"wgmma", hex32(p.wgmma)},
                      {"mma_matches_model", canonical(p.mma) == canonical(p.model)},
                      {"wgmma_matches_model", canonical(p.wgmma) == canonical(p.model)},
                      {"uniform_over_tile", p.uniform}});
  }
  j["probes"] = probes;
  for (const auto& [q, a] : r.answers) j["answers"][q] = a;
  for (const auto& [bits, n] : r.nan_bits) j["nan_output_bits"][hex32(bits)] = n;
  json math = json::array();
  for (const MathRow& m : r.math) {
    json ex = json::array();
    for (const auto& e : m.examples) ex.push_back({{"x", hex32(e[0])}, {"host", hex32(e[1])}, {"device", hex32(e[2])}});
    math.push_back({{"function", m.function}, {"inputs", m.inputs}, {"mismatches", m.mismatches},
                    {"seconds", m.seconds}, {"examples", ex}});
  }
  j["math"] = math;
  j["math_mismatches"] = r.math_mismatches;
  j["notes"] = r.notes;
  j["math_requested"] = r.math_requested;
  j["pass"] = report_passes(r);
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << j.dump(2) << '\n';
}

}  // namespace bp::hw
