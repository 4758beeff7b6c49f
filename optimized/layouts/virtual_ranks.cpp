#include "optimized/layouts/virtual_ranks.h"

#include "optimized/cuda/common.h"
#include "optimized/model/cuda_backend.h"
#include "program/layouts/rank_program.h"
#include "program/layouts/rank_runs.h"

template class bp::layouts::RankProgram<bp::cuda::CudaBackend>;

namespace bp::cuda::layouts {
namespace {

using bp::layouts::RankComms;
using bp::layouts::RankResult;
using RankProgram = bp::layouts::RankProgram<CudaBackend>;

// A rank's own stream, so that the ranks' threads do not serialise on one; it
// goes once its queued work (the model's buffer frees last) is done.
class RankStream {
 public:
  RankStream() { BP_CUDA_CHECK(cudaStreamCreate(&stream_)); }
  ~RankStream() {
    cudaStreamSynchronize(stream_);  // no throw from a destructor
    cudaStreamDestroy(stream_);
  }
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Every rank builds its model on its own stream and runs `program` on it.
template <class Program>
std::vector<RankResult> run_virtual(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                    const Layout& layout, Program&& program) {
  return bp::layouts::run_ranks(cfg, weights, knobs, layout, [&](int rank, RankComms& comms) {
    const RankStream stream;
    RankProgram model(cfg, weights, knobs, layout, rank, comms, CudaBackend(stream.get()));
    return program(model);
  });
}

}  // namespace

ref::ForwardResult forward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, const Layout& layout,
                           const std::vector<std::vector<int32_t>>& seqs, const ref::Path& path,
                           const ref::ForwardOptions& opt) {
  const auto ranks =
      run_virtual(cfg, weights, knobs, layout, [&](RankProgram& m) { return m.forward(seqs, path, opt); });
  return bp::layouts::assemble_forward(ranks, seqs, opt);
}

ref::BackwardResult backward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs, const Layout& layout,
                             const std::vector<std::vector<int32_t>>& seqs, const ref::LossCoefficients& coefs,
                             float temperature) {
  const auto ranks = run_virtual(cfg, weights, knobs, layout,
                                 [&](RankProgram& m) { return m.backward(seqs, coefs, temperature); });
  return bp::layouts::assemble_backward(ranks, weights, seqs, coefs);
}

}  // namespace bp::cuda::layouts
