// Real ranks: the layouts' rank program (program/layouts/rank_program.h) run by
// one process per GPU, collectives over NCCL — the third execution of the same
// program, after emulated CPU ranks and virtual ranks on one GPU, with the same
// results bit for bit (SPEC.md §7).
//
// Every process of the world holds a RealRanks. Rank 0 leads: it decides what runs
// and sends each case as a command; the others follow (receive the command, run
// their part, send their share to rank 0). A case's layout may use fewer ranks
// than the world; the others take part in its communicator splits only.
// A failure on any rank aborts every communicator (this rank's at once, the
// others' through the launcher's relay or their deadlines) and every later case
// fails fast: RankFailure, naming the rank where it is known.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpu/nccl/nccl_comm.h"
#include "gpu/nccl/rank_launch.h"
#include "program/layouts/layout.h"
#include "program/path.h"
#include "program/results.h"
#include "reference/contract/contract.h"
#include "reference/model/config.h"
#include "reference/model/weights.h"

namespace bp::nccl {

// The ranks do not run the same thing: the field where a rank differs from rank 0.
class SetupMismatch : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// What a case cost on the ranks: NCCL traffic summed over the ranks (every
// communicator of the case), the largest peak of device memory (the pool's, as
// the cuda implementation reports it), the number of ranks.
struct CaseCost {
  TrafficByKind traffic;
  uint64_t peak_device_bytes = 0;
  int ranks = 0;
};

template <class Result>
struct RankZeroResult {
  Result result;
  CaseCost cost;
};

class RealRanks {
 public:
  // Joins the world: this rank's GPU (local_rank), a stream, the world
  // communicator; listens to the launcher's relay. Throws RankFailure.
  explicit RealRanks(const RankIdentity& me);
  ~RealRanks();
  RealRanks(const RealRanks&) = delete;
  RealRanks& operator=(const RealRanks&) = delete;

  const RankIdentity& identity() const { return me_; }
  int rank() const { return me_.rank; }
  int world() const { return me_.world; }
  bool leader() const { return me_.rank == 0; }

  // Every rank, in the same order: throws SetupMismatch naming the first field
  // (name → value, e.g. "binary" → its digest) where some rank differs from rank 0.
  void check_same(const std::vector<std::pair<std::string, std::string>>& fields);
  // Every rank's `mine`, in rank order, on every rank (all call it, in the same order).
  std::vector<std::string> all_gather_text(const std::string& mine);

  // Rank 0's word to the others (a command), and the others' wait for it (no deadline).
  void send_command(const std::string& text);
  std::string next_command();

  // Why no further case can run (a rank failed), once one has.
  const std::optional<std::string>& broken() const { return broken_; }

  // One case, called by every rank of the world with the same arguments. Rank 0
  // gets the assembled result (as host::Model's) and its cost; the others nullopt.
  std::optional<RankZeroResult<program::ForwardResult>> forward(const ModelConfig& cfg, const Weights& weights,
                                                            const Knobs& knobs, const layouts::Layout& layout,
                                                            const std::vector<std::vector<int32_t>>& seqs,
                                                            const program::Path& path, const program::ForwardOptions& opt);
  std::optional<RankZeroResult<program::BackwardResult>> backward(const ModelConfig& cfg, const Weights& weights,
                                                              const Knobs& knobs, const layouts::Layout& layout,
                                                              const std::vector<std::vector<int32_t>>& seqs,
                                                              const ref::LossCoefficients& coefs, float temperature);

 private:
  struct Groups;
  struct Shares;
  template <class Body>
  Shares run(const layouts::Layout& layout, const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
             Body&& body);
  Groups& groups(const layouts::Layout& layout);
  [[noreturn]] void fail(const std::string& why);

  RankIdentity me_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<NcclComm> world_;
  std::map<std::string, std::unique_ptr<Groups>> groups_;  // by layout name
  std::optional<std::string> broken_;
  int cases_run_ = 0;  // this rank's cases so far (the fault tests count them)
};

}  // namespace bp::nccl
