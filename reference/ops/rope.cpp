#include "rope.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "reference/numerics/math.h"

namespace bp::ref {
namespace {

void check_positions(const RopeTable& table, const int32_t* pos, int T) {
  for (int t = 0; t < T; ++t)
    if (pos[t] < 0 || pos[t] >= table.max_pos)
      throw std::invalid_argument("rope: position " + std::to_string(pos[t]) + " of token " + std::to_string(t) +
                                  " is outside the table [0, " + std::to_string(table.max_pos) + ")");
}

void check_table_args(float theta, int D) {
  if ((bits_of(theta) >> 23) == 0 || (bits_of(theta) >> 23) >= 255)
    throw std::invalid_argument("rope: theta = " + std::to_string(theta) + " is not a positive normal float");
  if (D <= 0 || D % 2 != 0) throw std::invalid_argument("rope: head_dim = " + std::to_string(D) + " is not even");
}

// R(f(a)·f(b)): a bf16 product is exact in fp32 (8-bit significands) unless it
// underflows, so this is one rounding, as in HF's bf16 `x * cos`.
float rounded_product(bf16 a, bf16 b) { return widen(round_bf16(mul_rn(widen(a), widen(b)))); }

// Rotates every (x1, x2) pair by (c, s), or by (c, -s) for the transpose: R(-v) = -R(v)
// and a - (-b) = a + b exactly, so the transpose is the forward with the sine negated.
void rotate(const RopeTable& table, const int32_t* pos, const bf16* x, bf16* out, int T, int H, bool transpose) {
  check_positions(table, pos, T);
  const int D = table.head_dim, half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const bf16* c = table.cos + static_cast<size_t>(pos[t]) * half;
      const bf16* s = table.sin + static_cast<size_t>(pos[t]) * half;
      const size_t at = (static_cast<size_t>(t) * H + h) * D;
      for (int j = 0; j < half; ++j) {
        const bf16 x1 = x[at + j], x2 = x[at + half + j];
        const bf16 sj = transpose ? bf16{static_cast<uint16_t>(s[j].bits ^ 0x8000u)} : s[j];
        out[at + j] = round_bf16(sub_rn(rounded_product(x1, c[j]), rounded_product(x2, sj)));
        out[at + half + j] = round_bf16(add_rn(rounded_product(x2, c[j]), rounded_product(x1, sj)));
      }
    }
}

}  // namespace

// theta = m·2^k with m in [1, 2) (theta a positive normal float), so
// theta^-e = 2^(-e·k) · exp(-e·log(m)): e·k is exact for D a power of two and
// log(m) < 0.7 is small, so the argument of exp carries log's error only
// scaled by |log(m)|, not by log(theta) (~13.8 for 1e6) as exp(-e·log(theta)) would.
void rope_inv_freq(float theta, int D, float* inv_freq) {
  check_table_args(theta, D);
  const uint32_t bits = bits_of(theta);
  const float k = static_cast<float>(static_cast<int>(bits >> 23) - 127);
  const float log_m = math::log(float_of((bits & 0x007fffffu) | 0x3f800000u));
  for (int j = 0; j < D / 2; ++j) {
    const float e = div_rn(static_cast<float>(2 * j), static_cast<float>(D));
    inv_freq[j] = mul_rn(math::exp2(-mul_rn(e, k)), math::exp(-mul_rn(e, log_m)));
  }
}

void rope_tables(float theta, int D, int max_pos, bf16* cos_table, bf16* sin_table) {
  check_table_args(theta, D);
  const int half = D / 2;
  std::vector<float> inv_freq(half);
  rope_inv_freq(theta, D, inv_freq.data());
#pragma omp parallel for schedule(static)
  for (int p = 0; p < max_pos; ++p)
    for (int j = 0; j < half; ++j) {
      const float freq = mul_rn(static_cast<float>(p), inv_freq[j]);
      cos_table[static_cast<size_t>(p) * half + j] = round_bf16(math::cos(freq));
      sin_table[static_cast<size_t>(p) * half + j] = round_bf16(math::sin(freq));
    }
}

void rope_fwd(const Knobs&, const RopeTable& table, const int32_t* pos, const bf16* x, bf16* out, int T, int H) {
  rotate(table, pos, x, out, T, H, false);
}

void rope_bwd(const Knobs&, const RopeTable& table, const int32_t* pos, const bf16* dout, bf16* dx, int T, int H) {
  rotate(table, pos, dout, dx, T, H, true);
}

}  // namespace bp::ref
