// A rank's result as bytes, for ranks in other processes (real ranks,
// gpu/nccl/): they send their shares to rank 0, which puts them together
// (rank_runs.h). Native byte order: every rank of a run is the same binary on
// the same kind of host (their start check, gpu/nccl/real_ranks.h).
#pragma once
#include "program/layouts/comm.h"
#include "program/layouts/rank_result.h"

namespace bp::layouts {

Bytes to_bytes(const RankResult& r);
// Throws std::runtime_error on bytes that are not a whole RankResult.
RankResult rank_result_from_bytes(const Bytes& b);

}  // namespace bp::layouts
