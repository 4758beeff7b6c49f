// Emulated ranks: one thread per rank on the CPU, collectives through shared
// memory. The implementation of comm.h the reference runs; the rank program does
// not know which implementation it talks to.
#pragma once
#include <functional>
#include <stdexcept>

#include "program/layouts/comm.h"
#include "program/layouts/layout.h"

namespace bp::layouts {

// Runs body(rank, comms) on layout.world() threads, rank = (e·cp + c)·tp + t, and
// returns when all have finished. If a rank throws, the others are released from
// their collectives and the first rank's exception (lowest rank) is rethrown. If a
// rank's thread cannot start (the process's thread or address-space limit), the
// started ranks are released and joined and RanksNotStarted is thrown: the run
// failed, the process goes on.
class RanksNotStarted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
void run_emulated(const Layout& layout, const std::function<void(int rank, RankComms& comms)>& body);

}  // namespace bp::layouts
