// The loss the backward differentiates, L = Σ_r c_r·logprob_r (SPEC.md §6.4): its
// coefficients are defined here, once, for every model (bit-defined and float64).
#pragma once
#include <cstdint>

namespace bp::ref {

// c for target row r (rows numbered over the batch: sequence by sequence, t
// increasing, only t < len−1): counter_uniform(seed, r), uniform in [−1, 1).
float loss_coef(uint64_t seed, uint64_t row);

}  // namespace bp::ref
