// The `nccl` implementation of the case engine: a case's layout on real ranks,
// one process per GPU, collectives over NCCL (gpu/nccl/real_ranks.h).
//
// Every rank process runs the same `bitparity sweep`: rank 0 leads (runs the
// sweep, sends each nccl case to the others, writes the reports); the others
// follow (CaseEngine::follow_rank_zero). Who starts the processes:
//   - nobody yet (a plain `bitparity sweep --implementation nccl`): the sweep
//     starts one rank per GPU it needs on this node (launch_ranks) and waits;
//   - bitparity's own launcher, mpirun/srun or torchrun: the process is a rank
//     (RankSession::join).
// A build without NCCL, or a machine without GPUs, makes the nccl cases skip
// (cannot test here), as the cuda implementation does.
#pragma once
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "harness/engine/cuda_implementation.h"

namespace bp::harness {

// What `bitparity list` says of the nccl implementation in this build.
const char* nccl_implementation_summary();

// Why this process can run no nccl case (no NCCL in the build, no GPU), or nullopt.
std::optional<std::string> nccl_unavailable_reason();

// For a process not started as a rank: starts `world` rank processes of this
// binary with `args` (argv[1..]) on this node and returns rank 0's exit code.
int launch_ranks(int world, const std::vector<std::string>& args);

// The GPUs this node's ranks may use (0 without CUDA or NCCL).
int visible_gpus();

// Thrown by RankSession::join on a rank other than 0 that a launcher started where
// real ranks cannot run: rank 0 runs the plan's other cases, this rank has none.
class IdleRank : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RankSession {
 public:
  // This process's rank session, when a launcher started it as one (nullptr
  // otherwise). Launchers (srun, torchrun, mpirun) set their variables on CPU nodes
  // too: where real ranks cannot run here (no GPU, no NCCL in this build), rank 0
  // gets nullptr, runs the plan's other cases and skips its nccl cases with the
  // reason, and the other ranks get IdleRank. Throws io::BadInput for
  // contradictory launcher variables.
  static std::unique_ptr<RankSession> join();
  virtual ~RankSession() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;
  bool leader() const { return rank() == 0; }
  virtual std::string launcher() const = 0;  // who started the ranks ("bitparity", "torchrun", …)
  virtual std::string nccl_version() const = 0;
  // Every rank's GPU (gpu_identity()), in rank order, for rank 0's report: the ranks
  // may be on different hosts. Called by every rank, at the same point.
  virtual std::vector<GpuIdentity> gpu_identities() = 0;

  // Every rank, in order: throws io::BadInput naming the first field (e.g.
  // "binary", "plan") in which a rank differs from rank 0.
  virtual void check_same(const std::vector<std::pair<std::string, std::string>>& fields) = 0;

  // Rank 0 names the case to the others (send_case) and all run it (run): rank 0
  // gets the result; the others an empty one. A rank's failure throws CaseFailed
  // naming the rank on rank 0, and on the others ends their service.
  virtual void send_case(const std::string& case_id) = 0;
  virtual std::string next_case() = 0;  // a follower's wait: "" when rank 0 is done
  virtual void send_done() = 0;         // rank 0: no more cases
  virtual GpuCaseResult run(const GpuCaseInput& in) = 0;

  // After a rank failed, this process's GPU may still hold a kernel waiting on the
  // dead peer, and tearing CUDA down would wait for it: the caller leaves with
  // leave_now once its reports are written.
  virtual bool broken() const = 0;
  [[noreturn]] static void leave_now(int exit_code);
};

}  // namespace bp::harness
