#include "dot_tiles.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "attention.h"
#include "reference/numerics/chunked.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace bp::ref {
namespace {

void fill_zero(float* out, int rows_a, int rows_b) {
  std::fill(out, out + static_cast<size_t>(rows_a) * rows_b, 0.0f);
}

std::atomic<bool> g_simd_enabled{true};

// Row i's present slots.
int range_lo(const int* lo, int i, int first) { return lo ? lo[i] : first; }
int range_hi(const int* hi, int i, int k) { return hi ? hi[i] : k; }

// framed_chain for output (i, j) of framed_chains.
template <class Model>
float framed_one(float c, int i, int j, int k, int first, FrameOperand a, FrameOperand b, int lo, int hi) {
  const ptrdiff_t at = hi > lo ? lo - first : 0;  // an empty range reads nothing
  return framed_chain<Model>(c, a.p + i * a.outer + at * a.step, a.step, b.p + j * b.outer + at * b.step, b.step, lo,
                             hi, k);
}

}  // namespace

void framed_chains_scalar(DotModel model, int rows, int cols, int k, int first, FrameOperand a, FrameOperand b,
                          const int* lo, const int* hi, float* c, int ldc) {
  with_dot_model(model, [&](auto m) {
    using Model = decltype(m);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) {
        float& out = c[static_cast<size_t>(i) * ldc + j];
        out = framed_one<Model>(out, i, j, k, first, a, b, range_lo(lo, i, first), range_hi(hi, i, k));
      }
  });
}

void dot_rows_scalar(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len,
                     int chunks, float* out) {
  if (k == 0) return fill_zero(out, rows_a, rows_b);
  with_dot_model(model, [&](auto m) {
    using Model = decltype(m);
#pragma omp parallel
    {
      std::vector<float> partials(chunks);
#pragma omp for collapse(2) schedule(static)
      for (int i = 0; i < rows_a; ++i)
        for (int j = 0; j < rows_b; ++j)
          out[static_cast<size_t>(i) * rows_b + j] =
              split_dot<Model>(a + static_cast<size_t>(i) * k, 1, b + static_cast<size_t>(j) * k, 1, k, chunk_len,
                               chunks, partials.data());
    }
  });
}

#if defined(__x86_64__)
namespace {

// Tiles: kMB rows of a by kNB rows of b per task (b is repacked per tile: a tall tile
// keeps that to 1/kMB of the products), K in blocks of kKC (a multiple of
// the sm90 group, so groups never straddle a block); within a block, panels of kNR
// outputs (two AVX2 vectors) by Tiles::kMR rows stay in registers for the whole block.
constexpr int kNR = 16;
constexpr int kMB = 192;
constexpr int kNB = 64;
constexpr int kKC = 256;
static_assert(kKC % Sm90Tc::kGroup == 0, "a K block holds whole sm90 groups");

int round_up(int x, int m) { return (x + m - 1) / m * m; }

#define BP_AVX2 __attribute__((target("avx2,fma")))

BP_AVX2 inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// fma-seq: operands widened to fp32 once; each lane is one output's fma chain.
struct FmaSeqTiles {
  using Model = FmaSeq;
  static constexpr int kMR = 6;
  static constexpr int kPlanes = 1;
  static void put_a(bf16 x, int32_t* p, size_t) { p[0] = static_cast<int32_t>(static_cast<uint32_t>(x.bits) << 16); }
  static void put_b(bf16 x, int32_t* p, size_t plane) { put_a(x, p, plane); }

  // c[r][0:16] = the chain continued over kc products of a's row r and the panel.
  BP_AVX2 static void kernel(const int32_t* a, size_t lda, size_t, const int32_t* b, size_t, int kc, float* c,
                             int ldc) {
    __m256 acc[kMR][2];
    for (int r = 0; r < kMR; ++r)
      for (int v = 0; v < 2; ++v) acc[r][v] = _mm256_loadu_ps(c + r * ldc + 8 * v);
    for (int k = 0; k < kc; ++k) {
      const __m256 b0 = _mm256_castsi256_ps(load(b + k * kNR)), b1 = _mm256_castsi256_ps(load(b + k * kNR + 8));
      for (int r = 0; r < kMR; ++r) {
        const __m256 av = _mm256_castsi256_ps(_mm256_set1_epi32(a[r * lda + k]));
        acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);  // one rounding, as fma_rn
        acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
      }
    }
    for (int r = 0; r < kMR; ++r)
      for (int v = 0; v < 2; ++v) _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
  }

  static void repair(const bf16*, const bf16*, int, float*, int, int, int, int) {}

  // framed_chains: the lanes run every row over the same slots, an absent one being
  // +0·b, i.e. c + (±0) where the definition adds +0. The two differ only on a zero
  // accumulator's sign, so the definition's own +0 fix-ups make them equal: before
  // the slots (lo > 0), c never -0 then keeps its bits through c + (±0); after them
  // (hi < k), c + 0 maps ±0 to +0 and keeps every other value.
  static float framed_in(float c, bool absent_before) { return absent_before ? add_rn(c, 0.0f) : c; }
  template <class Recompute>
  static float framed_out(float lanes, bool absent_after, Recompute&&) {
    return absent_after ? add_rn(lanes, 0.0f) : lanes;
  }
};

// sm90-tc: operands split once into a signed significand and an exponent (planes
// 0 and 1), so a group is integer work in eight lanes: E = max exponent, then the
// exact products shifted right by E − their exponent, truncated, summed (SPEC.md
// §2.3.3). Lanes whose result leaves the fp32 normal range (overflow, subnormal)
// come out as kSentinel and are recomputed by Sm90Tc::chain: rare, and exact.
struct Sm90TcTiles {
  using Model = Sm90Tc;
  static constexpr int kMR = 2;
  static constexpr int kPlanes = 2;
  static constexpr int32_t kZeroExp = -1000;  // a zero's exponent: below any E, so it never sets one
  static constexpr uint32_t kSentinel = 0x7fffffffu;

  static void put(bf16 x, int32_t* p, size_t plane, int pre_shift) {
    if ((x.bits & 0x7fffu) == 0) {
      p[0] = 0;
      p[plane] = kZeroExp;
      return;
    }
    uint32_t sig;
    int exp;
    detail::split_bf16(x.bits, sig, exp);
    const auto s = static_cast<int32_t>(sig << pre_shift);
    p[0] = (x.bits >> 15) ? -s : s;
    p[plane] = exp;
  }
  // a carries the products' alignment: sig_a·sig_b·2^11 has 25 fraction bits below
  // 2^(ea+eb) (kFracBits − 14) and stays below 2^27.
  static void put_a(bf16 x, int32_t* p, size_t plane) { put(x, p, plane, Sm90Tc::kFracBits - 14); }
  static void put_b(bf16 x, int32_t* p, size_t plane) { put(x, p, plane, 0); }

  // The accumulator's exponent as a term (kZeroExp for ±0, which takes no part).
  BP_AVX2 static __m256i c_exponent(__m256i cu) {
    const __m256i ef = _mm256_and_si256(_mm256_srli_epi32(cu, 23), _mm256_set1_epi32(0xff));
    const __m256i zero = _mm256_cmpeq_epi32(_mm256_slli_epi32(cu, 1), _mm256_setzero_si256());
    return _mm256_blendv_epi8(_mm256_sub_epi32(ef, _mm256_set1_epi32(127)), _mm256_set1_epi32(kZeroExp), zero);
  }

  // The low 32 bits of two vectors of four 64-bit lanes, as eight lanes in order.
  BP_AVX2 static __m256i low_dwords(__m256i lo, __m256i hi) {
    const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    return _mm256_set_m128i(_mm256_castsi256_si128(_mm256_permutevar8x32_epi32(hi, idx)),
                            _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(lo, idx)));
  }

  // fp32 bits of total · 2^(E − 25) rounded toward zero, for four lanes; *bad marks
  // the lanes outside the normal range. total is an exact integer below 2^33 in a
  // double, so its exponent is the leading bit's position and its top 23 fraction
  // bits are the truncated fp32 significand.
  BP_AVX2 static __m256i to_f32_bits(__m256d total, __m128i e, __m256i* bad) {
    const __m256i db = _mm256_castpd_si256(total);
    const __m256i mag = _mm256_and_si256(db, _mm256_set1_epi64x(0x7fffffffffffffffLL));
    // Exponent field: (1023 + p) − 1023 + (E − 25) + 127 = ue + 127.
    const __m256i adjust = _mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_sub_epi32(e, _mm_set1_epi32(921))), 23);
    const __m256i fb = _mm256_add_epi64(_mm256_srli_epi64(mag, 29), adjust);
    const __m256i zero = _mm256_cmpeq_epi64(mag, _mm256_setzero_si256());
    const __m256i ok = _mm256_and_si256(_mm256_cmpgt_epi64(fb, _mm256_set1_epi64x((1LL << 23) - 1)),
                                        _mm256_cmpgt_epi64(_mm256_set1_epi64x(255LL << 23), fb));
    *bad = _mm256_andnot_si256(_mm256_or_si256(ok, zero), _mm256_set1_epi64x(-1));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi64(db, 32), _mm256_set1_epi64x(0x80000000LL));
    return _mm256_andnot_si256(zero, _mm256_or_si256(fb, sign));  // a zero sum is +0
  }

  // The group's result from c (its bits cu), E and the products' sum S.
  BP_AVX2 static __m256i finish_group(__m256i cu, __m256i e, __m256i s) {
    const __m256i cexp = c_exponent(cu);
    const __m256i csig = _mm256_or_si256(_mm256_and_si256(cu, _mm256_set1_epi32(0x7fffff)), _mm256_set1_epi32(0x800000));
    // c's term, 25 fraction bits below 2^E: (csig · 4) >> (E − cexp), truncated, signed
    // like c. For c = ±0 the shift is E − kZeroExp >= 32, which gives 0.
    __m256i tc = _mm256_srlv_epi32(_mm256_slli_epi32(csig, 2), _mm256_sub_epi32(e, cexp));
    tc = _mm256_sign_epi32(tc, cu);
    // |S| < 16 · 2^27 and |tc| < 2^26: their sum is exact in a double.
    const __m256d lo = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(s)),
                                     _mm256_cvtepi32_pd(_mm256_castsi256_si128(tc)));
    const __m256d hi = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(s, 1)),
                                     _mm256_cvtepi32_pd(_mm256_extracti128_si256(tc, 1)));
    __m256i bad_lo, bad_hi;
    const __m256i r_lo = to_f32_bits(lo, _mm256_castsi256_si128(e), &bad_lo);
    const __m256i r_hi = to_f32_bits(hi, _mm256_extracti128_si256(e, 1), &bad_hi);
    // A sentinel coming in (its exponent field is all ones) stays one.
    const __m256i bad_in = _mm256_cmpeq_epi32(_mm256_and_si256(cu, _mm256_set1_epi32(0x7f800000)),
                                              _mm256_set1_epi32(0x7f800000));
    const __m256i bad = _mm256_or_si256(low_dwords(bad_lo, bad_hi), bad_in);
    return _mm256_blendv_epi8(low_dwords(r_lo, r_hi), _mm256_set1_epi32(static_cast<int32_t>(kSentinel)), bad);
  }

  BP_AVX2 static void kernel(const int32_t* a, size_t lda, size_t a_plane, const int32_t* b, size_t b_plane, int kc,
                             float* c, int ldc) {
    const int32_t *as = a, *ae = a + a_plane, *bs = b, *be = b + b_plane;
    for (int g = 0; g < kc; g += Sm90Tc::kGroup) {
      const int n = std::min(Sm90Tc::kGroup, kc - g);
      __m256i e[kMR][2], s[kMR][2];
      for (int r = 0; r < kMR; ++r)
        for (int v = 0; v < 2; ++v) {
          e[r][v] = _mm256_max_epi32(c_exponent(load(c + r * ldc + 8 * v)),
                                     _mm256_set1_epi32(Sm90Tc::kMinAlignExponent));
          s[r][v] = _mm256_setzero_si256();
        }
      for (int k = g; k < g + n; ++k) {
        const __m256i eb[2] = {load(be + k * kNR), load(be + k * kNR + 8)};
        for (int r = 0; r < kMR; ++r) {
          const __m256i ea = _mm256_set1_epi32(ae[r * lda + k]);
          for (int v = 0; v < 2; ++v) e[r][v] = _mm256_max_epi32(e[r][v], _mm256_add_epi32(ea, eb[v]));
        }
      }
      for (int k = g; k < g + n; ++k) {
        const __m256i sb[2] = {load(bs + k * kNR), load(bs + k * kNR + 8)};
        const __m256i eb[2] = {load(be + k * kNR), load(be + k * kNR + 8)};
        for (int r = 0; r < kMR; ++r) {
          const __m256i sa = _mm256_set1_epi32(as[r * lda + k]), ea = _mm256_set1_epi32(ae[r * lda + k]);
          for (int v = 0; v < 2; ++v) {
            const __m256i p = _mm256_mullo_epi32(sa, sb[v]);  // exact: below 2^27
            const __m256i shift = _mm256_sub_epi32(e[r][v], _mm256_add_epi32(ea, eb[v]));
            // Shifts of 32 or more give 0, as a term that far below E truncates to.
            const __m256i t = _mm256_srlv_epi32(_mm256_abs_epi32(p), shift);
            s[r][v] = _mm256_add_epi32(s[r][v], _mm256_sign_epi32(t, p));
          }
        }
      }
      for (int r = 0; r < kMR; ++r)
        for (int v = 0; v < 2; ++v)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc + 8 * v),
                              finish_group(load(c + r * ldc + 8 * v), e[r][v], s[r][v]));
    }
  }

  // Sentinel lanes of one chunk's tile (rows × cols, leading dimension ld) recomputed
  // by the definition; a and b point at the tile's first rows at the chunk's start.
  static void repair(const bf16* a, const bf16* b, int k, float* c, int ld, int rows, int cols, int len) {
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j)
        if (bits_of(c[r * ld + j]) == kSentinel)
          c[r * ld + j] = Sm90Tc::chain(0.0f, a + static_cast<size_t>(r) * k, 1, b + static_cast<size_t>(j) * k, 1, len);
  }

  // framed_chains: a zero product takes no part and groups wholly absent map c to c
  // (±0 to +0, which the lanes' zero c shares), so the lanes need no fix-up. A
  // subnormal c (the lanes model normal ones) enters as the sentinel; sentinel
  // lanes are recomputed by the definition from the original c.
  static float framed_in(float c, bool) {
    const uint32_t u = bits_of(c);
    return (u & 0x7f800000u) == 0 && (u & 0x7fffffu) != 0 ? float_of(kSentinel) : c;
  }
  template <class Recompute>
  static float framed_out(float lanes, bool, Recompute&& recompute) {
    return bits_of(lanes) == kSentinel ? recompute() : lanes;
  }
};

// One tile: rows [i0, i0 + rows) of a against rows [j0, j0 + cols) of b, every chunk
// into acc ([chunk][kMB][kNB]), then each output's partials through the tree.
template <class Tiles>
struct TileRun {
  const bf16 *a, *b;
  int rows_a, rows_b, k, chunk_len, chunks;
  const int32_t* ap;  // a converted, rows padded to kMR with zeros
  size_t a_plane;
  float* out;

  BP_AVX2 void pack_b(int j0, int cols, int kb, int kc, int32_t* bp) const {
    const size_t plane = static_cast<size_t>(kKC) * kNB;
    for (int p = 0; p < (cols + kNR - 1) / kNR; ++p)
      for (int jj = 0; jj < kNR; ++jj) {
        const int j = p * kNR + jj;
        int32_t* to = bp + static_cast<size_t>(p) * kKC * kNR + jj;
        if (j >= cols) {  // lanes past b's last row: zeros, results dropped
          for (int kk = 0; kk < kc; ++kk) Tiles::put_b(bf16{0}, to + kk * kNR, plane);
          continue;
        }
        const bf16* row = b + static_cast<size_t>(j0 + j) * k + kb;
        for (int kk = 0; kk < kc; ++kk) Tiles::put_b(row[kk], to + kk * kNR, plane);
      }
  }

  BP_AVX2 void operator()(int i0, int j0, int32_t* bp, float* acc, float* partials) const {
    const int rows = std::min(kMB, rows_a - i0), cols = std::min(kNB, rows_b - j0);
    const int rows_p = round_up(rows, Tiles::kMR), panels = (cols + kNR - 1) / kNR;
    for (int c = 0; c < chunks; ++c) {
      const int k0 = std::min(c * chunk_len, k), len = chunk_extent(k, chunk_len, c);
      float* cacc = acc + static_cast<size_t>(c) * kMB * kNB;
      std::fill(cacc, cacc + static_cast<size_t>(rows_p) * kNB, 0.0f);
      for (int kb = k0; kb < k0 + len; kb += kKC) {
        const int kc = std::min(kKC, k0 + len - kb);
        pack_b(j0, cols, kb, kc, bp);
        for (int p = 0; p < panels; ++p)
          for (int r = 0; r < rows_p; r += Tiles::kMR)
            Tiles::kernel(ap + static_cast<size_t>(i0 + r) * k + kb, k, a_plane, bp + static_cast<size_t>(p) * kKC * kNR,
                          static_cast<size_t>(kKC) * kNB, kc, cacc + r * kNB + p * kNR, kNB);
      }
      Tiles::repair(a + static_cast<size_t>(i0) * k + k0, b + static_cast<size_t>(j0) * k + k0, k, cacc, kNB, rows,
                    cols, len);
    }
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j) {
        for (int c = 0; c < chunks; ++c) partials[c] = acc[(static_cast<size_t>(c) * kMB + r) * kNB + j];
        out[static_cast<size_t>(i0 + r) * rows_b + j0 + j] = pairwise_tree(partials, chunks);
      }
  }
};

template <class Tiles>
void run_tiles(const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len, int chunks, float* out) {
  const int mp = round_up(rows_a, Tiles::kMR);
  const size_t a_plane = static_cast<size_t>(mp) * k;
  std::vector<int32_t> ap(Tiles::kPlanes * a_plane, 0);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < rows_a; ++i)
    for (int kk = 0; kk < k; ++kk) {
      const size_t at = static_cast<size_t>(i) * k + kk;
      Tiles::put_a(a[at], ap.data() + at, a_plane);
    }
  const TileRun<Tiles> run{a, b, rows_a, rows_b, k, chunk_len, chunks, ap.data(), a_plane, out};
  const int tiles_i = (rows_a + kMB - 1) / kMB, tiles_j = (rows_b + kNB - 1) / kNB;
#pragma omp parallel
  {
    std::vector<int32_t> bp(static_cast<size_t>(Tiles::kPlanes) * kKC * kNB);
    std::vector<float> acc(static_cast<size_t>(chunks) * kMB * kNB), partials(chunks);
#pragma omp for collapse(2) schedule(static)
    for (int ti = 0; ti < tiles_i; ++ti)
      for (int tj = 0; tj < tiles_j; ++tj) run(ti * kMB, tj * kNB, bp.data(), acc.data(), partials.data());
  }
}

bool is_finite(bf16 x) { return (x.bits & 0x7f80u) != 0x7f80u; }

// The sm90 lanes model finite operands only; Inf and NaN take the definition.
bool all_finite(const bf16* x, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!is_finite(x[i])) return false;
  return true;
}

// Scratch that lives with the thread: framed_chains runs many times inside callers'
// parallel loops.
template <class T>
T* scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// framed_chains in the tiles' lanes: every row runs over slots [ks, kmax) (ks the
// group boundary at or below the first present slot, kmax the last present slot's
// end) with a's slots outside the row's range packed as +0, so groups keep their
// frame offsets; Tiles::framed_in/out settle what that differs in from the frame.
// Operands with Inf or NaN (whose product with an absent +0 would not vanish) take
// the definition. Returns false, computing nothing, where it does not apply.
template <class Tiles>
BP_AVX2 bool run_framed(int rows, int cols, int k, int first, FrameOperand a, FrameOperand b, const int* lo,
                        const int* hi, float* c, int ldc) {
  int kmin = k, kmax = 0;
  for (int i = 0; i < rows; ++i) {
    const int l = range_lo(lo, i, first), h = range_hi(hi, i, k);
    if (l < h) kmin = std::min(kmin, l), kmax = std::max(kmax, h);
  }
  if (kmin >= kmax) return false;  // no products at all
  for (int j = 0; j < cols; ++j)
    for (int s = kmin; s < kmax; ++s)
      if (!is_finite(b.p[j * b.outer + (s - first) * b.step])) return false;
  for (int i = 0; i < rows; ++i)
    for (int s = range_lo(lo, i, first); s < range_hi(hi, i, k); ++s)
      if (!is_finite(a.p[i * a.outer + (s - first) * a.step])) return false;

  thread_local std::vector<int32_t> a_buf, b_buf;
  thread_local std::vector<float> c_buf;
  const int ks = kmin / Sm90Tc::kGroup * Sm90Tc::kGroup, span = kmax - ks;
  const int rows_p = round_up(rows, Tiles::kMR), cols_p = round_up(cols, kNR);
  const size_t a_plane = static_cast<size_t>(rows_p) * span, b_plane = static_cast<size_t>(kKC) * kNR;
  int32_t* ap = scratch(a_buf, Tiles::kPlanes * a_plane);
  int32_t* bp = scratch(b_buf, Tiles::kPlanes * b_plane);
  float* cc = scratch(c_buf, static_cast<size_t>(rows_p) * cols_p);
  for (int i = 0; i < rows_p; ++i) {
    const int l = i < rows ? range_lo(lo, i, first) : k, h = i < rows ? range_hi(hi, i, k) : k;
    for (int s = ks; s < kmax; ++s)
      Tiles::put_a(s >= l && s < h ? a.p[i * a.outer + (s - first) * a.step] : bf16{0}, ap + i * span + (s - ks),
                   a_plane);
    for (int j = 0; j < cols_p; ++j)
      cc[i * cols_p + j] = i < rows && j < cols ? Tiles::framed_in(c[static_cast<size_t>(i) * ldc + j], l > 0) : 0.0f;
  }
  for (int kb = ks; kb < kmax; kb += kKC) {
    const int kc = std::min(kKC, kmax - kb);
    for (int p = 0; p < cols_p / kNR; ++p) {
      for (int s = kb; s < kb + kc; ++s)
        for (int jj = 0; jj < kNR; ++jj) {
          const int j = p * kNR + jj;
          Tiles::put_b(j < cols && s >= kmin ? b.p[j * b.outer + (s - first) * b.step] : bf16{0},
                       bp + (s - kb) * kNR + jj, b_plane);
        }
      for (int r = 0; r < rows_p; r += Tiles::kMR)
        Tiles::kernel(ap + static_cast<size_t>(r) * span + (kb - ks), span, a_plane, bp, b_plane, kc,
                      cc + r * cols_p + p * kNR, cols_p);
    }
  }
  for (int i = 0; i < rows; ++i) {
    const int l = range_lo(lo, i, first), h = range_hi(hi, i, k);
    for (int j = 0; j < cols; ++j) {
      float& out = c[static_cast<size_t>(i) * ldc + j];
      const auto definition = [&] { return framed_one<typename Tiles::Model>(out, i, j, k, first, a, b, l, h); };
      out = l < h ? Tiles::framed_out(cc[i * cols_p + j], h < k, definition) : definition();
    }
  }
  return true;
}

bool framed_chains_simd(DotModel model, int rows, int cols, int k, int first, FrameOperand a, FrameOperand b,
                        const int* lo, const int* hi, float* c, int ldc) {
  if (model == DotModel::FmaSeq) return run_framed<FmaSeqTiles>(rows, cols, k, first, a, b, lo, hi, c, ldc);
  return run_framed<Sm90TcTiles>(rows, cols, k, first, a, b, lo, hi, c, ldc);
}

}  // namespace

bool dot_rows_simd_available() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

void dot_rows_simd(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len,
                   int chunks, float* out) {
  if (k == 0) return fill_zero(out, rows_a, rows_b);
  if (model == DotModel::FmaSeq) return run_tiles<FmaSeqTiles>(a, rows_a, b, rows_b, k, chunk_len, chunks, out);
  if (all_finite(a, static_cast<size_t>(rows_a) * k) && all_finite(b, static_cast<size_t>(rows_b) * k))
    return run_tiles<Sm90TcTiles>(a, rows_a, b, rows_b, k, chunk_len, chunks, out);
  dot_rows_scalar(model, a, rows_a, b, rows_b, k, chunk_len, chunks, out);
}

#else

bool dot_rows_simd_available() { return false; }

namespace {
bool framed_chains_simd(DotModel, int, int, int, int, FrameOperand, FrameOperand, const int*, const int*, float*, int) {
  return false;
}
}  // namespace

void dot_rows_simd(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len,
                   int chunks, float* out) {
  dot_rows_scalar(model, a, rows_a, b, rows_b, k, chunk_len, chunks, out);
}

#endif

bool dot_simd_enabled() { return dot_rows_simd_available() && g_simd_enabled.load(std::memory_order_relaxed); }
void set_dot_simd_enabled(bool on) { g_simd_enabled.store(on, std::memory_order_relaxed); }

void dot_rows(DotModel model, const bf16* a, int rows_a, const bf16* b, int rows_b, int k, int chunk_len, int chunks,
              float* out) {
  if (dot_simd_enabled()) return dot_rows_simd(model, a, rows_a, b, rows_b, k, chunk_len, chunks, out);
  dot_rows_scalar(model, a, rows_a, b, rows_b, k, chunk_len, chunks, out);
}

void framed_chains(DotModel model, int rows, int cols, int k, int first, FrameOperand a, FrameOperand b,
                   const int* lo, const int* hi, float* c, int ldc) {
  if (dot_simd_enabled() && framed_chains_simd(model, rows, cols, k, first, a, b, lo, hi, c, ldc)) return;
  framed_chains_scalar(model, rows, cols, k, first, a, b, lo, hi, c, ldc);
}

}  // namespace bp::ref
