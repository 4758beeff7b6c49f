// The projection GEMMs of Qwen3-0.6B and Qwen3-30B-A3B (fixtures/models/*/config.json),
// shared by the GPU linear tests and bench/bench_linear. K is the input width, N
// the output width; row-parallel projections (o_proj, down_proj) reduce over K in
// tp_tree_width chunks, the others in one chain.
#pragma once
#include <vector>

namespace bp::test {

struct LinearShape {
  const char* model;
  const char* proj;
  int K, N;
  bool row_parallel;  // k_chunks = tp_tree_width in the model
};

inline const std::vector<LinearShape>& qwen3_linear_shapes() {
  static const std::vector<LinearShape> shapes = {
      // Qwen3-0.6B: hidden 1024, 16 q / 8 kv heads of 128, intermediate 3072.
      {"qwen3-0.6b", "q_proj", 1024, 2048, false},
      {"qwen3-0.6b", "kv_proj", 1024, 1024, false},
      {"qwen3-0.6b", "o_proj", 2048, 1024, true},
      {"qwen3-0.6b", "gate_up_proj", 1024, 3072, false},
      {"qwen3-0.6b", "down_proj", 3072, 1024, true},
      // Qwen3-30B-A3B: hidden 2048, 32 q / 4 kv heads of 128, moe_intermediate 768.
      {"qwen3-30b-a3b", "q_proj", 2048, 4096, false},
      {"qwen3-30b-a3b", "kv_proj", 2048, 512, false},
      {"qwen3-30b-a3b", "o_proj", 4096, 2048, true},
      {"qwen3-30b-a3b", "expert_gate_up", 2048, 768, false},
      {"qwen3-30b-a3b", "expert_down", 768, 2048, true},
  };
  return shapes;
}

// lm_head (vocab 151936) of each model: forward only.
inline const std::vector<LinearShape>& qwen3_lm_heads() {
  static const std::vector<LinearShape> shapes = {
      {"qwen3-0.6b", "lm_head", 1024, 151936, false},
      {"qwen3-30b-a3b", "lm_head", 2048, 151936, false},
  };
  return shapes;
}

}  // namespace bp::test
