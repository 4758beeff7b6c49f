// Integer reductions over fixed blocks, in parallel: part = f(begin, end) for each
// block of `block` elements of [0, n), the parts returned in block order. The blocks
// do not depend on the thread count, so neither does any reduction of the parts
// (the tensor digest's sums, the comparison's equality pass).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace bp {

template <class Part, class F>
std::vector<Part> parallel_blocks(uint64_t n, uint64_t block, F f) {
  const int64_t blocks = static_cast<int64_t>((n + block - 1) / block);
  std::vector<Part> part(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint64_t begin = static_cast<uint64_t>(b) * block;
    part[static_cast<size_t>(b)] = f(begin, std::min(n, begin + block));
  }
  return part;
}

}  // namespace bp
