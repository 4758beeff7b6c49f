#include "gpu/nccl/real_ranks.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "optimized/cuda/common.h"
#include "gpu/nccl/nccl_backend.h"
#include "program/layouts/rank_program.h"
#include "program/layouts/rank_result_bytes.h"
#include "program/layouts/rank_runs.h"
#include "program/model_check.h"

template class bp::layouts::RankProgram<bp::nccl::NcclBackend>;

namespace bp::nccl {

using layouts::Layout;
using layouts::RankComms;
using layouts::RankResult;
using RankProgram = layouts::RankProgram<NcclBackend>;

// A layout's communicators on this rank: the case's ranks, and its tp, cp and
// plane groups (layout.h's grid), made once per layout by splits.
struct RealRanks::Groups {
  std::unique_ptr<NcclComm> members, tp, cp, plane;
  void abort() {
    for (auto* c : {&members, &tp, &cp, &plane})
      if (*c) (*c)->abort();
  }
  void release_staging() {
    for (auto* c : {&members, &tp, &cp, &plane})
      if (*c) (*c)->release_staging();
  }
};

// The ranks' results and cost, gathered on rank 0 (empty elsewhere).
struct RealRanks::Shares {
  std::vector<RankResult> results;
  CaseCost cost;
};

namespace {

constexpr const char* kTrafficKinds[] = {"all_gather", "all_to_all", "all_reduce", "broadcast", "gather"};

// A rank's share on the wire: its peak, its traffic per kind, then its result.
layouts::Bytes envelope(const RankResult& r, uint64_t peak, const TrafficByKind& traffic) {
  std::vector<uint64_t> head{peak};
  for (const char* k : kTrafficKinds) {
    const auto it = traffic.find(k);
    head.push_back(it == traffic.end() ? 0 : it->second.calls);
    head.push_back(it == traffic.end() ? 0 : it->second.bytes);
  }
  layouts::Bytes out(head.size() * sizeof(uint64_t));
  std::memcpy(out.data(), head.data(), out.size());
  const layouts::Bytes body = layouts::to_bytes(r);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

RankResult open_envelope(const layouts::Bytes& b, CaseCost& cost) {
  constexpr size_t kHead = 1 + 2 * std::size(kTrafficKinds);
  if (b.size() < kHead * sizeof(uint64_t)) throw std::runtime_error("a rank's share is truncated");
  uint64_t head[kHead];
  std::memcpy(head, b.data(), sizeof head);
  cost.peak_device_bytes = std::max(cost.peak_device_bytes, head[0]);
  for (size_t k = 0; k < std::size(kTrafficKinds); ++k) {
    if (!head[1 + 2 * k]) continue;
    Traffic& t = cost.traffic[kTrafficKinds[k]];
    t.calls += head[1 + 2 * k];
    t.bytes += head[2 + 2 * k];
  }
  return layouts::rank_result_from_bytes(layouts::Bytes(b.begin() + sizeof head, b.end()));
}

// The fault tests' hook (tests/multigpu): BP_TEST_FAULT=kill@R:N or throw@R:N
// makes rank R, as it starts its N-th case (from 1), die of SIGKILL or throw.
void inject_test_fault(int rank, int case_number) {
  const char* spec = std::getenv("BP_TEST_FAULT");
  if (!spec) return;
  char kind[8] = {};
  int r = -1, n = -1;
  if (std::sscanf(spec, "%7[a-z]@%d:%d", kind, &r, &n) != 3 || r != rank || n != case_number) return;
  if (std::string(kind) == "kill") ::raise(SIGKILL);
  if (std::string(kind) == "throw") throw std::runtime_error("injected fault (BP_TEST_FAULT=" + std::string(spec) + ")");
}

TrafficByKind sum_traffic(std::initializer_list<const NcclComm*> comms) {
  TrafficByKind sum;
  for (const NcclComm* c : comms)
    for (const auto& [kind, t] : c->traffic()) {
      sum[kind].calls += t.calls;
      sum[kind].bytes += t.bytes;
    }
  return sum;
}

}  // namespace

RealRanks::RealRanks(const RankIdentity& me) : me_(me) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw RankFailure("rank " + std::to_string(me.rank) + ": no CUDA device");
  if (me.local_rank >= devices)
    throw RankFailure("rank " + std::to_string(me.rank) + " is local rank " + std::to_string(me.local_rank) +
                      " of its node, which has " + std::to_string(devices) + " GPUs: one rank per GPU");
  BP_CUDA_CHECK(cudaSetDevice(me.local_rank));
  BP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  listen_to_launcher();
  world_ = NcclComm::init_world(shared_unique_id(me), me.rank, me.world, stream_);
}

RealRanks::~RealRanks() {
  groups_.clear();
  world_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

void RealRanks::fail(const std::string& why) {
  // Told once, by the rank where it started; a relayed failure is not told back.
  if (!abort_requested()) tell_launcher(why);
  request_abort(why);
  for (auto& [name, g] : groups_) g->abort();
  world_->abort();
  broken_ = why;
  throw RankFailure(why);
}

void RealRanks::check_same(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string mine;
  for (const auto& [name, value] : fields) mine += name + '\0' + value + '\0';
  const std::vector<std::string> all = all_gather_text(mine);
  // Every rank reads every rank's values, so all stop alike, naming the first
  // field in which some rank differs from rank 0.
  auto values = [](const std::string& b) {
    std::vector<std::string> v{""};
    for (char c : b)
      if (c == '\0')
        v.emplace_back();
      else
        v.back() += c;
    return v;
  };
  const std::vector<std::string> zero = values(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> theirs = values(all[r]);
    for (size_t f = 0; f < fields.size(); ++f)
      if (2 * f + 1 >= theirs.size() || 2 * f + 1 >= zero.size() || theirs[2 * f + 1] != zero[2 * f + 1])
        throw SetupMismatch("rank " + std::to_string(r) + " runs a different " + fields[f].first + " than rank 0 (" +
                            "every rank must run the same binary, plan and contracts)");
  }
}

std::vector<std::string> RealRanks::all_gather_text(const std::string& mine) {
  std::vector<std::string> all;
  for (const layouts::Bytes& b : world_->all_gather(std::as_bytes(std::span(mine))))
    all.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
  return all;
}

void RealRanks::send_command(const std::string& text) {
  world_->broadcast(layouts::Bytes(reinterpret_cast<const std::byte*>(text.data()),
                                   reinterpret_cast<const std::byte*>(text.data()) + text.size()),
                    0, true);
}

std::string RealRanks::next_command() {
  const layouts::Bytes b = world_->broadcast({}, 0, true);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

RealRanks::Groups& RealRanks::groups(const Layout& layout) {
  auto& g = groups_[layout.name()];
  if (g) return *g;
  g = std::make_unique<Groups>();
  const bool member = me_.rank < layout.world();
  g->members = world_->split(member ? 0 : -1, me_.rank);
  if (member) {
    // The grid of layout.h: rank = (e·cp + c)·tp + t.
    const int T = layout.tp, C = layout.cp, t = me_.rank % T, c = (me_.rank / T) % C, e = me_.rank / (T * C);
    g->tp = g->members->split(e * C + c, t);
    g->cp = g->members->split(e * T + t, c);
    g->plane = g->members->split(t, e * C + c);
  }
  return *g;
}

template <class Body>
RealRanks::Shares RealRanks::run(const Layout& layout, const ModelConfig& cfg, const Weights& weights,
                                 const Knobs& knobs, Body&& body) {
  if (broken_) throw RankFailure("not run: the ranks' communicators were aborted after: " + *broken_);
  if (layout.world() > me_.world)
    throw std::invalid_argument("layout " + layout.name() + " needs " + std::to_string(layout.world()) +
                                " ranks; this world has " + std::to_string(me_.world));
  // Checked alike on every rank before any collective, as run_ranks checks them.
  const std::string why = layouts::shard_check(layout, cfg, knobs);
  if (!why.empty()) throw std::invalid_argument("layout " + layout.name() + ": " + why);
  program::check_model(cfg, weights, knobs);
  Shares out;
  try {
    Groups& g = groups(layout);
    if (!g.members) return out;
    inject_test_fault(me_.rank, ++cases_run_);
    for (NcclComm* c : {g.tp.get(), g.cp.get(), g.plane.get()}) c->clear_traffic();
    // Earlier cases' memory goes back first (each layout's communicators live on).
    for (auto& [name, other] : groups_) other->release_staging();
    cuda::start_case_memory();
    RankComms comms{*g.tp, *g.cp, *g.plane};
    RankProgram program(cfg, weights, knobs, layout, me_.rank, comms, NcclBackend(stream_));
    const RankResult mine = body(program);
    BP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const layouts::Bytes share =
        envelope(mine, cuda::pool_peak_bytes(), sum_traffic({g.tp.get(), g.cp.get(), g.plane.get()}));
    const auto all = g.members->gather(std::as_bytes(std::span(share)), 0);
    if (me_.rank == 0) {
      for (const layouts::Bytes& b : all) out.results.push_back(open_envelope(b, out.cost));
      out.cost.ranks = layout.world();
    }
  } catch (const RankFailure& e) {
    fail(e.what());
  } catch (const std::exception& e) {
    fail("rank " + std::to_string(me_.rank) + ": " + e.what());
  }
  return out;
}

std::optional<RankZeroResult<program::ForwardResult>> RealRanks::forward(
    const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, const Layout& layout,
    const std::vector<std::vector<int32_t>>& seqs, const program::Path& path, const program::ForwardOptions& opt) {
  Shares s = run(layout, cfg, weights, knobs, [&](RankProgram& p) { return p.forward(seqs, path, opt); });
  if (!leader()) return std::nullopt;
  return RankZeroResult<program::ForwardResult>{layouts::assemble_forward(s.results, seqs, opt), s.cost};
}

std::optional<RankZeroResult<program::BackwardResult>> RealRanks::backward(
    const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, const Layout& layout,
    const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs, float temperature) {
  Shares s =
      run(layout, cfg, weights, knobs, [&](RankProgram& p) { return p.backward(seqs, coefs, temperature); });
  if (!leader()) return std::nullopt;
  return RankZeroResult<program::BackwardResult>{layouts::assemble_backward(s.results, weights, seqs, coefs), s.cost};
}

}  // namespace bp::nccl
