#include "program/path.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace bp::program {

std::vector<std::vector<PathPiece>> path_steps(const std::vector<std::vector<int32_t>>& seqs,
                                                       const Path& path, int64_t max_positions) {
  const size_t B = seqs.size();
  for (size_t s = 0; s < B; ++s) {
    if (seqs[s].empty()) throw std::invalid_argument("model: empty sequence " + std::to_string(s));
    if (static_cast<int64_t>(seqs[s].size()) > max_positions)
      throw std::invalid_argument("model: sequence " + std::to_string(s) + " longer than max_position_embeddings");
  }
  auto len = [&](size_t s) { return static_cast<int>(seqs[s].size()); };
  std::vector<std::vector<PathPiece>> steps;
  switch (path.kind) {
    case Path::Kind::Extend:
      for (size_t s = 0; s < B; ++s) steps.push_back({{static_cast<int>(s), 0, len(s)}});
      break;
    case Path::Kind::Ragged: {
      std::vector<PathPiece> ps;
      for (size_t s = 0; s < B; ++s) ps.push_back({static_cast<int>(s), 0, len(s)});
      steps.push_back(std::move(ps));
      break;
    }
    case Path::Kind::Chunked: {
      if (path.chunks.empty()) throw std::invalid_argument("model: chunked path without chunks");
      for (int c : path.chunks)
        if (c < 1) throw std::invalid_argument("model: chunk size < 1");
      for (size_t s = 0; s < B; ++s)
        for (int p = 0, j = 0; p < len(s); j = (j + 1) % static_cast<int>(path.chunks.size())) {
          const int n = std::min(path.chunks[static_cast<size_t>(j)], len(s) - p);
          steps.push_back({{static_cast<int>(s), p, n}});
          p += n;
        }
      break;
    }
    case Path::Kind::Decode: {
      int longest = 0;
      for (size_t s = 0; s < B; ++s) longest = std::max(longest, len(s));
      for (int p = 0; p < longest; ++p) {
        std::vector<PathPiece> ps;
        for (size_t s = 0; s < B; ++s)
          if (p < len(s)) ps.push_back({static_cast<int>(s), p, 1});
        steps.push_back(std::move(ps));
      }
      break;
    }
  }
  return steps;
}

}  // namespace bp::program
