// The targeted vectors of the brief that separate the sm90-tc model from its
// neighbours; each expected value is the model's answer and the H100's.
#pragma once
#include <cstdint>
#include <vector>

#include "bf16.h"

namespace bp {

struct Sm90Vector {
  const char* what;       // what a wrong model would give instead
  float c;
  std::vector<float> a;   // exactly representable in bf16; b is all ones unless given
  std::vector<float> b;
  uint32_t expect;
};

inline std::vector<Sm90Vector> sm90_targeted_vectors() {
  const float p25 = 0x1p-25f, p26 = 0x1p-26f;
  std::vector<float> four(16, 0.0f), eight26(16, 0.0f), mixed(16, 0.0f), cancel(16, 0.0f), three(16, 0.0f);
  std::vector<float> ones(16, 1.0f), mixed_b(16, 1.0f);
  for (int i = 0; i < 4; ++i) four[i] = p25;
  for (int i = 0; i < 8; ++i) eight26[i] = p26;
  mixed[0] = 1.5f;
  mixed_b[0] = 1.5f;
  for (int i = 1; i <= 8; ++i) mixed[i] = p25;
  cancel[0] = 1.0f;
  cancel[1] = -1.0f;
  cancel[8] = 0x1p-30f;
  for (int i = 0; i < 3; ++i) three[i] = p25;
  return {
      {"25 fraction bits (24 would give 0x3F800000)", 1.0f, four, ones, 0x3F800001u},
      {"truncation of each term (26 bits would give 0x3F800001)", 1.0f, eight26, ones, 0x3F800000u},
      {"unnormalised products (normalised would give 0x40100000)", 0.0f, mixed, mixed_b, 0x40100001u},
      {"one group of 16 (two groups of 8 would give 2^-30)", 0.0f, cancel, ones, 0x00000000u},
      {"round toward zero (nearest would give 1 + 2^-23)", 1.0f, three, ones, 0x3F800000u},
  };
}

inline std::vector<bf16> to_bf16_exact(const std::vector<float>& v) {
  std::vector<bf16> out;
  for (float x : v) out.push_back(round_bf16(x));
  return out;
}

}  // namespace bp
