// bp::cuda logprob (stages, forward, backward) against the CPU reference, bit for bit.
#include <algorithm>
#include <cmath>

#include "optimized/cuda/logprob.h"
#include "reference/ops/logprob.h"
#include "tests/optimized/cuda_op_test.h"
#include "tests/support/logprob_cases.h"

namespace bp::test {
namespace {

constexpr int kQwenVocab = 151936;

using Inputs = LogprobInputs;
using Outputs = LogprobOutputs;
Inputs make_inputs(int T, int V, float temp, uint64_t seed) { return make_logprob_inputs(T, V, temp, seed); }
Outputs cpu_run(const Knobs& kn, const Inputs& in) { return reference_logprob(kn, in); }

struct DeviceInputs {
  DeviceBuffer<bf16> logits;
  DeviceBuffer<int32_t> targets;
  DeviceBuffer<float> coef;
  explicit DeviceInputs(const Inputs& in) : logits(in.logits), targets(in.targets), coef(in.coef) {}
};

struct DeviceOutputs {
  DeviceBuffer<float> logprob, entropy, row_max, row_sum;
  DeviceBuffer<bf16> dlogits;
  explicit DeviceOutputs(const Inputs& in)
      : logprob(poisoned<float>(in.T)),
        entropy(poisoned<float>(in.T)),
        row_max(poisoned<float>(in.T)),
        row_sum(poisoned<float>(in.T)),
        dlogits(poisoned<bf16>(size_t(in.T) * in.V)) {}
  Outputs download() const {
    return {logprob.download(), entropy.download(), row_max.download(), row_sum.download(), dlogits.download()};
  }
};

// The backward reads the reference's M and S, so forward and backward are each
// checked alone.
Outputs gpu_run(const Knobs& kn, const Inputs& in, const Outputs& cpu) {
  const DeviceInputs d(in);
  DeviceOutputs o(in);
  cuda::logprob_fwd(kn, d.logits.get(), d.targets.get(), in.T, in.V, in.temp, o.logprob.get(), o.row_max.get(),
                    o.row_sum.get(), o.entropy.get());
  const DeviceBuffer<float> M(cpu.row_max), S(cpu.row_sum);
  cuda::logprob_bwd(kn, d.logits.get(), d.targets.get(), d.coef.get(), M.get(), S.get(), in.T, in.V, in.temp,
                    o.dlogits.get());
  return o.download();
}

void expect_same(const Outputs& want, const Outputs& got, const std::string& where) {
  EXPECT_TRUE(same_bits(want.logprob, got.logprob)) << "logprob " << where;
  EXPECT_TRUE(same_bits(want.entropy, got.entropy)) << "entropy " << where;
  EXPECT_TRUE(same_bits(want.row_max, got.row_max)) << "row max " << where;
  EXPECT_TRUE(same_bits(want.row_sum, got.row_sum)) << "row sum " << where;
  EXPECT_TRUE(same_bits(want.dlogits, got.dlogits)) << "dlogits " << where;
}

void expect_matches(const Knobs& kn, const Inputs& in, const std::string& what) {
  const Outputs want = cpu_run(kn, in);
  expect_same(want, gpu_run(kn, in, want), what + " T=" + std::to_string(in.T) + " V=" + std::to_string(in.V));
}

using LogprobGpu = ContractTest;

// Qwen3's vocabulary (chunks of 18992: a block per chunk), at temperature 1 and 0.7.
TEST_P(LogprobGpu, RealVocabMatchesReference) {
  for (float temp : {1.0f, 0.7f}) expect_matches(knobs(), make_inputs(48, kQwenVocab, temp, 1), "real vocab");
}

// Many rows; chunks of 40 (5 runs: a warp per chunk) and of 2048 (one run per lane).
TEST_P(LogprobGpu, ManyRowsMatchReference) {
  expect_matches(knobs(), make_inputs(4096, 8 * 40, 1.0f, 2), "warp chunks");
  expect_matches(knobs(), make_inputs(512, 8 * 2048, 0.7f, 3), "block chunks");
  expect_matches(knobs(), make_inputs(1, 8 * 5, 1.0f, 4), "one row");
}

// Rows whose exact logprob and entropy are about 0 (their signs set by rounding,
// and under v3 by the clamp): every contract's bits, every finite logit.
TEST_P(LogprobGpu, SignProbeRowsMatchReference) {
  for (const Inputs& in : sign_probe_inputs()) expect_matches(knobs(), in, "sign probe");
}

TEST_P(LogprobGpu, RepeatedRunsGiveSameBits) {
  const Inputs in = make_inputs(16, kQwenVocab, 0.7f, 5);
  const Outputs cpu = cpu_run(knobs(), in);
  const Outputs a = gpu_run(knobs(), in, cpu), b = gpu_run(knobs(), in, cpu);
  EXPECT_TRUE(identical(a.logprob, b.logprob) && identical(a.entropy, b.entropy) && identical(a.row_sum, b.row_sum) &&
              identical(a.dlogits, b.dlogits));
}

// Vocabularies that are not multiples of C (SPEC.md §2.4.1: chunks of ⌈V/C⌉, the
// last short or empty): 300, 211, 9 (chunks 5-7 empty), 3, and Qwen3's resized to
// its tokenizer (151669: chunks of 18959, the last 18956).
TEST_P(LogprobGpu, OddVocabMatchesReference) {
  for (const int V : {300, 211, 9, 3, 151669})
    for (float temp : {1.0f, 0.7f}) expect_matches(knobs(), make_inputs(24, V, temp, 10 + V), "odd vocab");
}

// R vocab-parallel ranks (each C/R whole chunks, read in place with row stride V)
// through the GPU stages and combines give the reference's whole-row bits; for an
// odd vocabulary the padded one's slices (Megatron's), the last rank's tail absent.
TEST_P(LogprobGpu, VocabParallelStagesMatchReference) {
  for (const int V : {kQwenVocab, 151669, 300}) {
  const Knobs& kn = knobs();
  const Inputs in = make_inputs(6, V, 0.7f, 6);
  const Outputs want = cpu_run(kn, in);
  const int T = in.T, C = kn.tp_tree_width, chunk = (in.V + C - 1) / C;
  const DeviceInputs d(in);
  for (int ranks : {1, 2, 4, 8}) {
    const int per_rank = C / ranks, width = per_rank * chunk;
    std::vector<int> len(ranks);  // rank r's logits: [r·width, min((r+1)·width, V))
    for (int r = 0; r < ranks; ++r) len[r] = std::clamp(in.V - r * width, 0, width);
    DeviceBuffer<float> chunk_max(size_t(T) * C), chunk_sum(size_t(T) * C), chunk_tsum(size_t(T) * C), x_target(T);
    DeviceOutputs o(in);
    if (kn.log_softmax == LogSoftmax::kOnePass) {  // v2: one stage, one gather of chunk states
      for (int r = 0; r < ranks; ++r) {
        const bf16* slice = d.logits.get() + size_t(r) * width;
        cuda::logprob_chunk_states(kn, slice, in.V, T, len[r], chunk, per_rank, in.temp, chunk_max.get() + r * per_rank,
                                   chunk_sum.get() + r * per_rank, chunk_tsum.get() + r * per_rank, C);
        cuda::logprob_target_logit(kn, slice, in.V, T, r * width, len[r], d.targets.get(), in.temp, x_target.get());
      }
      cuda::logprob_merge_states(kn, chunk_max.get(), chunk_sum.get(), chunk_tsum.get(), x_target.get(), T,
                                 o.row_max.get(), o.row_sum.get(), o.logprob.get(), o.entropy.get());
    } else {
      for (int r = 0; r < ranks; ++r)
        cuda::logprob_chunk_max(kn, d.logits.get() + size_t(r) * width, in.V, T, len[r], chunk, per_rank, in.temp,
                                chunk_max.get() + r * per_rank, C);
      cuda::logprob_row_max(kn, chunk_max.get(), T, o.row_max.get());
      for (int r = 0; r < ranks; ++r) {
        const bf16* slice = d.logits.get() + size_t(r) * width;
        cuda::logprob_chunk_sums(kn, slice, in.V, T, len[r], chunk, per_rank, in.temp, o.row_max.get(),
                                 chunk_sum.get() + r * per_rank, chunk_tsum.get() + r * per_rank, C);
        cuda::logprob_target_logit(kn, slice, in.V, T, r * width, len[r], d.targets.get(), in.temp, x_target.get());
      }
      cuda::logprob_combine(kn, chunk_sum.get(), chunk_tsum.get(), x_target.get(), o.row_max.get(), T,
                            o.row_sum.get(), o.logprob.get(), o.entropy.get());
    }
    const DeviceBuffer<float> M(want.row_max), S(want.row_sum);
    for (int r = 0; r < ranks; ++r)
      cuda::logprob_bwd_slice(kn, d.logits.get() + size_t(r) * width, in.V, T, r * width, len[r], d.targets.get(),
                              d.coef.get(), M.get(), S.get(), in.temp, o.dlogits.get() + size_t(r) * width);
    expect_same(want, o.download(), "V " + std::to_string(V) + ", " + std::to_string(ranks) + " ranks");
  }
  }
}

// Masked (−Inf) entries and a masked target, a NaN logit, an all −Inf row, a +Inf
// logit, a logit that overflows in ÷ temp, rows whose maximum is a zero, a row of
// logits near 2^40: each row as the reference has it.
TEST_P(LogprobGpu, NonFiniteRowsMatchReference) {
  for (float temp : {1.0f, 0.25f}) {
    Inputs in = make_inputs(10, 8 * 512, temp, 7);
    for (int v = 0; v < in.V; v += 3) in.at(0, v) = bf16{0xff80};
    in.targets[0] = 3;
    in.at(1, 17) = bf16{0xffc1};
    for (int v = 0; v < in.V; ++v) in.at(2, v) = bf16{0xff80};
    in.at(3, 100) = bf16{0x7f80};
    in.at(4, 5) = bf16{0x7f7f};  // the largest bf16: ÷ 0.25 overflows
    in.at(5, 9).bits = 0x8000;   // −0 beside +0
    in.at(5, 10).bits = 0x0000;
    in.at(6, 11).bits = 0x0001;  // a subnormal
    // Rows 7 and 8 negative but for zeros: M = −0 (one −0 in chunk 0) and M = +0 (−0
    // and +0 in the same pack of chunk 2), where a maximum's zero sign is all that differs.
    for (int t : {7, 8})
      for (int v = 0; v < in.V; ++v) in.at(t, v).bits |= 0x8000;
    in.at(7, 3).bits = 0x8000;
    in.at(8, 2 * 512 + 4).bits = 0x8000;
    in.at(8, 2 * 512 + 5).bits = 0x0000;
    // Row 9 about 2^37 times larger: R(m·c) is off m·c by up to 2^15, so the maximum's
    // own exponent may pass 128 (exp2_poly's +Inf) or fall below −125.
    for (int v = 0; v < in.V; ++v) in.at(9, v).bits += 37 << 7;
    expect_matches(knobs(), in, "non-finite rows, temp " + std::to_string(temp));
  }
}

// Bad arguments: the reference's exception and message, nothing written.
TEST_P(LogprobGpu, RefusesBadArguments) {
  const Knobs& kn = knobs();
  struct Bad {
    const char* what;
    int V;
    float temp;
    int32_t target;
  };
  for (const Bad& bad : {Bad{"target >= V", 64, 1.0f, 64}, Bad{"target < 0", 64, 1.0f, -1},
                         Bad{"zero temperature", 64, 0.0f, 0},
                         Bad{"infinite temperature", 64, INFINITY, 0}, Bad{"NaN temperature", 64, NAN, 0}}) {
    Inputs in = make_inputs(3, bad.V, bad.temp, 8);
    in.targets[1] = bad.target;
    std::string want;
    try {
      cpu_run(kn, in);
    } catch (const std::invalid_argument& e) {
      want = e.what();
    }
    ASSERT_FALSE(want.empty()) << bad.what;
    const DeviceInputs d(in);
    DeviceOutputs o(in);
    const Outputs before = o.download();
    try {
      cuda::logprob_fwd(kn, d.logits.get(), d.targets.get(), in.T, in.V, in.temp, o.logprob.get(), o.row_max.get(),
                        o.row_sum.get(), o.entropy.get());
      ADD_FAILURE() << bad.what << ": forward accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(want, e.what()) << bad.what;
    }
    try {
      cuda::logprob_bwd(kn, d.logits.get(), d.targets.get(), d.coef.get(), o.row_max.get(), o.row_sum.get(), in.T, in.V,
                        in.temp, o.dlogits.get());
      ADD_FAILURE() << bad.what << ": backward accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(want, e.what()) << bad.what;
    }
    const Outputs after = o.download();
    EXPECT_TRUE(identical(before.logprob, after.logprob) && identical(before.row_max, after.row_max) &&
                identical(before.dlogits, after.dlogits))
        << bad.what << ": written before the refusal";
  }
  float x = 0;
  EXPECT_THROW(cuda::logprob_combine(kn, &x, nullptr, &x, &x, 1, &x, &x, &x), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Contracts, LogprobGpu, BP_ALL_CONTRACTS);

}  // namespace
}  // namespace bp::test
