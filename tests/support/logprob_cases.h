// The logprob op's test inputs and its reference run, shared by the CPU suite
// (tests/reference/ops/test_logprob.cpp) and the CUDA suite (tests/optimized/cuda/test_cuda_logprob.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "reference/common/rng.h"
#include "reference/ops/logprob.h"

namespace bp::test {

struct LogprobInputs {
  int T, V;
  float temp;
  std::vector<bf16> logits;
  std::vector<int32_t> targets;
  std::vector<float> coef;
  bf16& at(int t, int v) { return logits[size_t(t) * V + v]; }
  bf16 at(int t, int v) const { return logits[size_t(t) * V + v]; }
};

// Logits uniform in [-scale, scale); row t % 3 == 1 is confidently right (the
// target gets +16), row t % 3 == 2 confidently wrong (another token gets +16).
inline LogprobInputs make_logprob_inputs(int T, int V, float temp, uint64_t seed, float scale = 8.0f) {
  LogprobInputs in{T, V, temp, random_bf16(size_t(T) * V, seed, scale), std::vector<int32_t>(T),
                   random_f32(T, seed + 1, 2.0f)};
  for (int t = 0; t < T; ++t) {
    in.targets[t] = static_cast<int32_t>(counter_hash(seed + 2, t) % uint64_t(V));
    if (t % 3 == 1) in.at(t, in.targets[t]) = round_bf16(16.0f);
    if (t % 3 == 2) in.at(t, (in.targets[t] + 1) % V) = round_bf16(16.0f);
  }
  return in;
}

// Rows whose exact logprob and entropy are (nearly) 0, where rounding picks their
// signs (SPEC.md §5.10 v2, signs): the target holds all the mass. Every finite bf16
// as the one logit of a vocabulary of one, then as the leader of (x, x − 24, x − 48)
// in a vocabulary of three, at temperature 1.
inline std::vector<LogprobInputs> sign_probe_inputs() {
  std::vector<bf16> finite;
  for (uint32_t b = 0; b < 0x10000u; ++b)
    if ((b & 0x7f80u) != 0x7f80u) finite.push_back(bf16{uint16_t(b)});
  const int T = static_cast<int>(finite.size());
  LogprobInputs one{T, 1, 1.0f, finite, std::vector<int32_t>(T, 0), std::vector<float>(T, 1.0f)};
  LogprobInputs three{T, 3, 1.0f, std::vector<bf16>(size_t(T) * 3), std::vector<int32_t>(T, 0),
                      std::vector<float>(T, 1.0f)};
  for (int t = 0; t < T; ++t) {
    const float x = widen(finite[t]);
    three.at(t, 0) = finite[t];
    three.at(t, 1) = round_bf16(x - 24.0f);
    three.at(t, 2) = round_bf16(x - 48.0f);
  }
  return {one, three};
}

struct LogprobOutputs {
  std::vector<float> logprob, entropy, row_max, row_sum;
  std::vector<bf16> dlogits;
};

// The CPU reference's forward (with entropy) and backward.
inline LogprobOutputs reference_logprob(const Knobs& kn, const LogprobInputs& in) {
  LogprobOutputs o{std::vector<float>(in.T), std::vector<float>(in.T), std::vector<float>(in.T),
                   std::vector<float>(in.T), std::vector<bf16>(size_t(in.T) * in.V)};
  ref::logprob_fwd(kn, in.logits.data(), in.targets.data(), in.T, in.V, in.temp, o.logprob.data(), o.row_max.data(),
                   o.row_sum.data(), o.entropy.data());
  ref::logprob_bwd(kn, in.logits.data(), in.targets.data(), in.coef.data(), o.row_max.data(), o.row_sum.data(), in.T,
                   in.V, in.temp, o.dlogits.data());
  return o;
}

}  // namespace bp::test
