// The `nccl` implementation in a build without NCCL (or without CUDA).
#include <cstdlib>
#include <stdexcept>

#include "harness/engine/nccl_implementation.h"

namespace bp::harness {

const char* nccl_implementation_summary() {
  return "not available in this build: no NCCL (its cases exit 125: cannot test here)";
}

std::optional<std::string> nccl_unavailable_reason() { return "no NCCL in this build of bitparity"; }

int visible_gpus() { return 0; }

int launch_ranks(int, const std::vector<std::string>&) {
  throw std::logic_error("launch_ranks in a build without NCCL");
}

void RankSession::leave_now(int exit_code) { std::exit(exit_code); }

// Without NCCL no process is a rank: its nccl cases skip.
std::unique_ptr<RankSession> RankSession::join() { return nullptr; }

}  // namespace bp::harness
