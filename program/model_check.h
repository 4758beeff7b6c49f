// The checks every execution of the model makes before it runs (the unsharded
// program and every layout's ranks alike), so that they refuse the same inputs
// with the same message.
#pragma once
#include "reference/contract/contract.h"
#include "reference/model/config.h"
#include "reference/model/weights.h"

namespace bp::program {

// std::invalid_argument ("model: …") for invalid knobs, a missing weight or one of
// the wrong shape, or a head geometry the ops cannot run.
void check_model(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs);

}  // namespace bp::program
