// rope: rotary position embedding, neox half-split (HF Qwen3 rotary in bf16),
// SPEC.md §5.5. The cos/sin tables are built once on the host and shared by every
// backend; the apply functions take any head count (q [T][Hq][D], k [T][Hkv][D]).
#pragma once
#include <cstdint>

#include "reference/contract/contract.h"

namespace bp::ref {

// inv_freq[j] = theta^(-2j/D) in fp32 by the contract's exp2, exp and log, j < D/2:
// with theta = m·2^k (m in [1, 2)) and e = 2j/D, inv_freq[j] = 2^(-e·k)·exp(-e·log(m)).
// Throws std::invalid_argument unless theta is a positive normal float and D even.
void rope_inv_freq(float theta, int D, float* inv_freq);

// cos_table[p][j] = R(cos(f32(p)·inv_freq[j])), sin_table likewise, p < max_pos.
void rope_tables(float theta, int D, int max_pos, bf16* cos_table, bf16* sin_table);

// The tables as the apply functions read them: [max_pos][head_dim/2] bf16 each.
struct RopeTable {
  const bf16* cos;
  const bf16* sin;
  int max_pos;
  int head_dim;
};

// Rotates every head of x [T][H][head_dim] by its token's absolute position pos[t]:
// first half R(R(x1·c) − R(x2·s)), second half R(R(x2·c) + R(x1·s)). out may be x
// (in place) but must not partly overlap it. Throws std::invalid_argument, naming
// the position, if some pos[t] is outside [0, max_pos); nothing is written then.
void rope_fwd(const Knobs& kn, const RopeTable& table, const int32_t* pos, const bf16* x, bf16* out, int T, int H);

// The transpose: the rotation by the opposite angle in the same rounding style,
// first half R(R(d1·c) + R(d2·s)), second half R(R(d2·c) − R(d1·s)).
void rope_bwd(const Knobs& kn, const RopeTable& table, const int32_t* pos, const bf16* dout, bf16* dx, int T, int H);

}  // namespace bp::ref
