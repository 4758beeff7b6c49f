// bp::cuda embedding_fwd / embedding_bwd against the CPU reference, bit for bit.
#include "optimized/cuda/embedding.h"
#include "reference/ops/embedding.h"
#include "tests/optimized/cuda_op_test.h"

namespace bp::test {
namespace {

constexpr int kVocab = 151936;  // Qwen3

// Token ids drawn from [0, distinct): few distinct ids make long repeats, so
// every id's tokens span many chunks.
std::vector<int32_t> make_tokens(int T, int distinct, uint64_t seed) {
  std::vector<int32_t> t(T);
  for (int i = 0; i < T; ++i) t[i] = static_cast<int32_t>(counter_hash(seed, i) % distinct);
  return t;
}

std::vector<bf16> gpu_fwd(const Knobs& kn, const std::vector<int32_t>& tokens, const DeviceBuffer<bf16>& table, int V,
                          int H) {
  const int T = static_cast<int>(tokens.size());
  const DeviceBuffer<int32_t> d_tokens(tokens);
  DeviceBuffer<bf16> out = poisoned<bf16>(size_t(T) * H);
  cuda::embedding_fwd(kn, d_tokens.get(), table.get(), out.get(), T, V, H);
  return out.download();
}

std::vector<float> gpu_bwd(const Knobs& kn, const std::vector<int32_t>& tokens, const std::vector<bf16>& dout, int V,
                           int H) {
  const int T = static_cast<int>(tokens.size());
  const DeviceBuffer<int32_t> d_tokens(tokens);
  const DeviceBuffer<bf16> d_dout(dout);
  DeviceBuffer<float> dtable = poisoned<float>(size_t(V) * H);
  cuda::embedding_bwd(kn, d_tokens.get(), d_dout.get(), dtable.get(), T, V, H);
  return dtable.download();
}

std::vector<float> cpu_bwd(const Knobs& kn, const std::vector<int32_t>& tokens, const std::vector<bf16>& dout, int V,
                           int H) {
  std::vector<float> dtable(size_t(V) * H);
  ref::embedding_bwd(kn, tokens.data(), dout.data(), dtable.data(), static_cast<int>(tokens.size()), V, H);
  return dtable;
}

using EmbeddingGpu = ContractTest;

// The Qwen3 vocabulary at hidden 1024 (16-byte rows) and a hidden of 100 (rows
// copied element by element).
TEST_P(EmbeddingGpu, ForwardMatchesReference) {
  for (int H : {1024, 100}) {
    const int T = H == 1024 ? 4096 : 300;
    const std::vector<bf16> table = random_inputs(size_t(kVocab) * H, 1 + H, 1.0f, 100);
    const DeviceBuffer<bf16> d_table(table);
    const std::vector<int32_t> tokens = make_tokens(T, kVocab, 2);
    std::vector<bf16> want(size_t(T) * H);
    ref::embedding_fwd(knobs(), tokens.data(), table.data(), want.data(), T, kVocab, H);
    EXPECT_TRUE(same_bits(want, gpu_fwd(knobs(), tokens, d_table, kVocab, H))) << "H=" << H;
  }
}

// Real shape: 4096 tokens over Qwen3's vocabulary at hidden 2048, many repeats.
TEST_P(EmbeddingGpu, BackwardMatchesReferenceRealShape) {
  const int T = 4096, H = 2048;
  std::vector<int32_t> tokens = make_tokens(T, kVocab, 3);
  for (int t = 0; t < T; t += 3) tokens[t] = 151643;  // a pad/eos id hit in every chunk
  const std::vector<bf16> dout = random_inputs(size_t(T) * H, 4, 1e-2f, 5000);
  const std::vector<float> got = gpu_bwd(knobs(), tokens, dout, kVocab, H);
  EXPECT_TRUE(same_bits(cpu_bwd(knobs(), tokens, dout, kVocab, H), got));
  EXPECT_TRUE(identical(got, gpu_bwd(knobs(), tokens, dout, kVocab, H))) << "a second run gave other bits";
}

// The chunk tree with hits in scattered chunks: T not a multiple of the chunk,
// chunk counts that are not powers of two (up to 313, and 1000 with chunk size 1),
// chunk sizes 1 and 3 (knobs beyond v1), a single token, no tokens, and gradients
// of every exponent (NaN, Inf included).
TEST_P(EmbeddingGpu, BackwardChunkTreeShapes) {
  const int V = 1000, H = 48;
  for (int chunk : {knobs().grad_token_chunk, 1, 3}) {
    Knobs kn = knobs();
    kn.grad_token_chunk = chunk;
    for (int T : {0, 1, 129, 1000, 40000}) {
      if (T > 1000 && chunk < 128) continue;  // the reference's cost grows with T/chunk per element
      for (int distinct : {1, 7, 900}) {
        const std::vector<int32_t> tokens = make_tokens(T, distinct, 5 + T + distinct);
        const std::vector<bf16> dout =
            T % 2 ? random_bit_patterns(size_t(T) * H, 6 + T) : random_inputs(size_t(T) * H, 6 + T, 4.0f, 300);
        EXPECT_TRUE(same_bits(cpu_bwd(kn, tokens, dout, V, H), gpu_bwd(kn, tokens, dout, V, H)))
            << "chunk=" << chunk << " T=" << T << " distinct ids=" << distinct;
      }
    }
  }
}

// Token ids outside [0, V): the reference's exception and message, nothing written.
TEST_P(EmbeddingGpu, RefusesTokenOutsideVocabulary) {
  const int V = 50, H = 16, T = 9;
  const std::vector<bf16> table = random_inputs(size_t(V) * H, 7, 1.0f);
  const DeviceBuffer<bf16> d_table(table);
  const std::vector<bf16> dout = random_inputs(size_t(T) * H, 8, 1.0f);
  for (int32_t bad : {V, -1}) {
    std::vector<int32_t> tokens = make_tokens(T, V, 9);
    tokens[4] = bad;
    std::string want;
    try {
      std::vector<bf16> out(size_t(T) * H);
      ref::embedding_fwd(knobs(), tokens.data(), table.data(), out.data(), T, V, H);
    } catch (const std::invalid_argument& e) {
      want = e.what();
    }
    ASSERT_FALSE(want.empty());
    const DeviceBuffer<int32_t> d_tokens(tokens);
    const DeviceBuffer<bf16> d_dout(dout);
    DeviceBuffer<bf16> out = poisoned<bf16>(size_t(T) * H);
    DeviceBuffer<float> dtable = poisoned<float>(size_t(V) * H);
    const std::vector<bf16> out_before = out.download();
    const std::vector<float> dtable_before = dtable.download();
    try {
      cuda::embedding_fwd(knobs(), d_tokens.get(), d_table.get(), out.get(), T, V, H);
      ADD_FAILURE() << "forward accepted id " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(want, e.what());
    }
    try {
      cuda::embedding_bwd(knobs(), d_tokens.get(), d_dout.get(), dtable.get(), T, V, H);
      ADD_FAILURE() << "backward accepted id " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(want, e.what());
    }
    EXPECT_TRUE(identical(out_before, out.download()) && identical(dtable_before, dtable.download()))
        << "written before the refusal";
  }
}

INSTANTIATE_TEST_SUITE_P(Contracts, EmbeddingGpu, BP_V1_CONTRACTS);

}  // namespace
}  // namespace bp::test
