// The loss the backward differentiates, L = Σ_r c_r·logprob_r (SPEC.md §6.4): its
// coefficients are decided here, once, for every model (bit-defined and float64).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace bp::ref {

// c for target row r (rows numbered over the batch: sequence by sequence, t
// increasing, only t < len−1): counter_uniform(seed, r), uniform in [−1, 1).
float loss_coef(uint64_t seed, uint64_t row);

// The coefficients of one backward: generated from a seed (loss_coef), or explicit
// fp32 values, one per target of each sequence, used as given (a trainer's
// advantages). Every model takes this one value, so a program never has to thread a
// seed and a vector side by side.
class LossCoefficients {
 public:
  static LossCoefficients generated(uint64_t seed);
  // values[s][t]: the coefficient of sequence s's target t (t < len_s − 1). Every
  // value must be finite (std::invalid_argument otherwise). `origin` says where they
  // came from, for describe() ("tokens.json, sha256 …").
  static LossCoefficients explicit_values(std::vector<std::vector<float>> values, std::string origin = "");

  // The coefficients of the batch `seqs`, per sequence (c[s][t], t < len_s − 1):
  // the one place where the coefficient of a row is decided. Explicit values must
  // have the batch's shape: std::invalid_argument naming the sequence otherwise.
  std::vector<std::vector<float>> for_batch(const std::vector<std::vector<int32_t>>& seqs) const;

  bool is_explicit() const { return explicit_; }
  uint64_t seed() const { return seed_; }  // generated only
  // "seed 7 (reference/model/loss.h loss_coef)" or "explicit, from <origin>".
  std::string describe() const;

 private:
  LossCoefficients() = default;
  bool explicit_ = false;
  uint64_t seed_ = 0;
  std::vector<std::vector<float>> values_;
  std::string origin_;
};

}  // namespace bp::ref
