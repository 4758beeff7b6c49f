#include "reference/model/loss.h"

#include "reference/common/rng.h"

namespace bp::ref {

float loss_coef(uint64_t seed, uint64_t row) { return counter_uniform(seed, row); }

}  // namespace bp::ref
