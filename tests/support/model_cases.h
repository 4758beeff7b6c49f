// Shared by the model-level suites: the tiny fixtures, seeded token batches and
// bitwise comparison of per-sequence results.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness/io/hf_config.h"
#include "reference/common/rng.h"
#include "support/golden.h"

namespace bp::test {

using Seqs = std::vector<std::vector<int32_t>>;
using Rows = std::vector<std::vector<float>>;

inline ModelConfig load_fixture(const std::string& fixture) {
  return io::load_hf_config(source_path("fixtures/models/" + fixture));
}

// Sequences of the given lengths, token j of sequence i = counter_hash(1000 + i, j) mod vocab.
inline Seqs make_seqs(int64_t vocab, const std::vector<int>& lens) {
  Seqs s;
  for (size_t i = 0; i < lens.size(); ++i) {
    std::vector<int32_t> t;
    for (int j = 0; j < lens[i]; ++j)
      t.push_back(static_cast<int32_t>(counter_hash(1000 + i, static_cast<uint64_t>(j)) % static_cast<uint64_t>(vocab)));
    s.push_back(t);
  }
  return s;
}

inline std::vector<float> flat(const Rows& r) {
  std::vector<float> v;
  for (const auto& x : r) v.insert(v.end(), x.begin(), x.end());
  return v;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace bp::test
