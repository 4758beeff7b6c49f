// The `nccl` implementation in a build with NCCL.
#include "harness/engine/nccl_implementation.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "harness/engine/cases.h"
#include "harness/io/errors.h"
#include "optimized/cuda/common.h"
#include "gpu/nccl/real_ranks.h"

namespace bp::harness {
namespace {

// The command that names a case; a follower finds it among its own cases.
constexpr const char* kRunPrefix = "run ";
constexpr const char* kDone = "done";

class NcclRankSession final : public RankSession {
 public:
  explicit NcclRankSession(const nccl::RankIdentity& me) : ranks_(me) {}

  int rank() const override { return ranks_.rank(); }
  int world() const override { return ranks_.world(); }
  std::string launcher() const override { return ranks_.identity().launcher; }
  std::string nccl_version() const override { return nccl::nccl_version_text(); }
  std::vector<GpuIdentity> gpu_identities() override {
    // The fields joined by '\0' (which no C string holds), split again on arrival.
    const GpuIdentity me = gpu_identity().value();  // a build with NCCL has CUDA
    std::vector<GpuIdentity> all;
    for (const std::string& text : ranks_.all_gather_text(me.name + '\0' + me.driver + '\0' + me.runtime)) {
      std::vector<std::string> f(1);
      for (const char c : text)
        if (c) f.back() += c;
        else f.emplace_back();
      f.resize(3);  // never out of bounds, whatever a peer sent
      all.push_back({f[0], f[1], f[2]});
    }
    return all;
  }

  void check_same(const std::vector<std::pair<std::string, std::string>>& fields) override {
    try {
      ranks_.check_same(fields);
    } catch (const nccl::SetupMismatch& e) {
      throw io::BadInput("ranks", "", e.what());
    }
  }

  void send_case(const std::string& case_id) override {
    if (!ranks_.broken()) guarded([&] { ranks_.send_command(kRunPrefix + case_id); });
  }
  std::string next_case() override {
    const std::string c = ranks_.next_command();
    if (c == kDone) return "";
    if (c.rfind(kRunPrefix, 0) != 0) throw std::runtime_error("rank 0 sent an unknown command");
    return c.substr(std::string(kRunPrefix).size());
  }
  void send_done() override {
    if (!ranks_.broken()) ranks_.send_command(kDone);
  }

  bool broken() const override { return ranks_.broken().has_value(); }

  GpuCaseResult run(const GpuCaseInput& in) override {
    const ModelConfig& cfg = in.model.model.config;
    const Knobs& kn = in.model.contract.knobs;
    GpuCaseResult r;
    guarded([&] {
      auto fwd = ranks_.forward(cfg, in.model.weights, kn, in.layout, in.seqs, in.path, in.options);
      std::optional<nccl::RankZeroResult<program::BackwardResult>> bwd;
      if (in.grads)
        bwd = ranks_.backward(cfg, in.model.weights, kn, in.layout, in.seqs, in.coefs, in.options.temperature);
      if (!fwd) return;
      r.forward = std::move(fwd->result);
      add_cost(fwd->cost, r);
      if (bwd) {
        r.backward = std::move(bwd->result);
        add_cost(bwd->cost, r);
      }
    });
    return r;
  }

 private:
  // The forward's and the backward's cost, together.
  static void add_cost(const nccl::CaseCost& c, GpuCaseResult& r) {
    r.ranks = c.ranks;
    r.peak_device_bytes = std::max(r.peak_device_bytes, c.peak_device_bytes);
    for (const auto& [kind, t] : c.traffic) {
      auto it = std::find_if(r.communication.begin(), r.communication.end(),
                             [&](const CollectiveTraffic& x) { return x.collective == kind; });
      if (it == r.communication.end()) it = r.communication.insert(r.communication.end(), {kind, 0, 0});
      it->calls += t.calls;
      it->bytes += t.bytes;
    }
  }
  // A rank's failure is the case's, reported as an error; the sweep goes on.
  template <class F>
  static void guarded(F&& f) {
    try {
      f();
    } catch (const nccl::RankFailure& e) {
      throw CaseFailed(e.what());
    }
  }

  nccl::RealRanks ranks_;
};

}  // namespace

void RankSession::leave_now(int exit_code) {
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

const char* nccl_implementation_summary() {
  return "the layouts on real ranks: one process per GPU, collectives over NCCL (started by bitparity on this node, "
         "or by mpirun/srun/torchrun; cases that need more GPUs than there are exit 125: cannot test here)";
}

int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::optional<std::string> nccl_unavailable_reason() {
  if (const std::string why = cuda::no_hopper_reason(); !why.empty()) return why;
  return std::nullopt;
}

int launch_ranks(int world, const std::vector<std::string>& args) { return nccl::launch_local_ranks(world, args); }

std::unique_ptr<RankSession> RankSession::join() {
  std::optional<nccl::RankIdentity> me;
  try {
    (void)nccl::collective_timeout();  // refused before any rank starts, not at a rank's first wait
    me = nccl::rank_identity_from_env();
  } catch (const std::invalid_argument& e) {
    throw io::BadInput("environment", "", e.what());
  }
  if (!me) return nullptr;
  if (const auto why = nccl_unavailable_reason()) {
    if (me->rank == 0) return nullptr;
    throw IdleRank("rank " + std::to_string(me->rank) + " of " + std::to_string(me->world) + " (started by " +
                   me->launcher + "): " + *why + "; rank 0 runs the cases that need no GPU");
  }
  try {
    return std::make_unique<NcclRankSession>(*me);
  } catch (const std::invalid_argument& e) {  // no rendezvous address given
    throw io::BadInput("environment", "", e.what());
  }
}

}  // namespace bp::harness
