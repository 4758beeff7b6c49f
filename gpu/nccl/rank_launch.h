// How real ranks come to exist: one process per GPU, started either
// by `bitparity` itself on one node (launch_local_ranks: the parent passes its
// ncclUniqueId to the ranks it spawns and relays a rank's failure to the others),
// or by a cluster's launcher — mpirun/srun (MPI or PMI variables) or torchrun
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) — where NCCL's own
// bootstrap meets at MASTER_ADDR:MASTER_PORT (NCCL_COMM_ID). No transport of our own.
#pragma once
#include <nccl.h>

#include <optional>
#include <string>
#include <vector>

namespace bp::nccl {

struct RankIdentity {
  int rank = 0, world = 1, local_rank = 0;
  std::string launcher;  // "bitparity", "torchrun", "Open MPI", "PMI", "Slurm"
};

// This process's place among the ranks, from the variables its launcher set;
// nullopt when none are set. Throws std::invalid_argument (a usage error) when
// they contradict each other.
std::optional<RankIdentity> rank_identity_from_env();

// The id every rank initialises the world communicator with: the launcher's
// (BP_NCCL_ID) or, under a cluster launcher, NCCL's id of the address in
// NCCL_COMM_ID, set from MASTER_ADDR:MASTER_PORT when absent — MASTER_PORT + 1
// under torchrun, whose agent holds MASTER_PORT — (rank 0 then hosts NCCL's
// bootstrap there). Throws std::invalid_argument when neither is given.
ncclUniqueId shared_unique_id(const RankIdentity& me);

// The launcher: runs this binary with `args` (argv[1..]) as `world` rank
// processes on this node, rank r on GPU r, and waits for them. SIGINT/SIGTERM go
// to rank 0 (which stops the sweep and writes its partial report); a rank that
// fails or dies is announced to the others, which abort their communicators.
// Returns rank 0's exit code (3 if rank 0 died without one).
int launch_local_ranks(int world, const std::vector<std::string>& args);

// Rank side of the launcher's relay (no-ops under other launchers): a thread
// that turns a peer's failure, announced by the launcher, into request_abort.
void listen_to_launcher();
// Tells the launcher that this rank failed (it tells the others).
void tell_launcher(const std::string& failure);

}  // namespace bp::nccl
