#include "reference/model/loss.h"

#include <cmath>
#include <stdexcept>

#include "reference/common/rng.h"

namespace bp::ref {

float loss_coef(uint64_t seed, uint64_t row) { return counter_uniform(seed, row); }

LossCoefficients LossCoefficients::generated(uint64_t seed) {
  LossCoefficients c;
  c.seed_ = seed;
  return c;
}

LossCoefficients LossCoefficients::explicit_values(std::vector<std::vector<float>> values, std::string origin) {
  for (size_t s = 0; s < values.size(); ++s)
    for (size_t t = 0; t < values[s].size(); ++t)
      if (!std::isfinite(values[s][t]))
        throw std::invalid_argument("loss coefficient [" + std::to_string(s) + "][" + std::to_string(t) +
                                    "] is not finite");
  LossCoefficients c;
  c.explicit_ = true;
  c.values_ = std::move(values);
  c.origin_ = std::move(origin);
  return c;
}

std::vector<std::vector<float>> LossCoefficients::for_batch(const std::vector<std::vector<int32_t>>& seqs) const {
  auto targets = [](const std::vector<int32_t>& s) { return s.empty() ? size_t{0} : s.size() - 1; };
  if (explicit_) {
    if (values_.size() != seqs.size())
      throw std::invalid_argument("the loss coefficients are given for " + std::to_string(values_.size()) +
                                  " sequences; the batch has " + std::to_string(seqs.size()));
    for (size_t s = 0; s < seqs.size(); ++s)
      if (values_[s].size() != targets(seqs[s]))
        throw std::invalid_argument("the loss coefficients of sequence " + std::to_string(s) + " are " +
                                    std::to_string(values_[s].size()) + " values; its " +
                                    std::to_string(seqs[s].size()) + " tokens have " +
                                    std::to_string(targets(seqs[s])) + " targets");
    return values_;
  }
  std::vector<std::vector<float>> c;
  uint64_t row = 0;
  for (const auto& s : seqs) {
    c.emplace_back();
    for (size_t t = 0; t < targets(s); ++t) c.back().push_back(loss_coef(seed_, row++));
  }
  return c;
}

std::string LossCoefficients::describe() const {
  if (!explicit_) return "seed " + std::to_string(seed_) + " (reference/model/loss.h loss_coef)";
  return origin_.empty() ? "explicit" : "explicit, from " + origin_;
}

}  // namespace bp::ref
