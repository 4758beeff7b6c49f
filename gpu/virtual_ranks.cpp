#include "gpu/virtual_ranks.h"

#include "gpu/cuda_backend.h"
#include "optimized/cuda/common.h"
#include "program/layouts/rank_program.h"
#include "program/layouts/rank_runs.h"

template class bp::layouts::RankProgram<bp::gpu::CudaBackend>;

namespace bp::gpu {
namespace {

using RankProgram = layouts::RankProgram<CudaBackend>;

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
std::vector<layouts::RankResult> run_virtual(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                             const layouts::Layout& layout, Program&& program) {
  return layouts::run_ranks(cfg, weights, knobs, layout, [&](int rank, layouts::RankComms& comms) {
    const RankStream stream;
    RankProgram model(cfg, weights, knobs, layout, rank, comms, CudaBackend(stream.get()));
    return program(model);
  });
}

}  // namespace

program::ForwardResult sharded_forward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                       const layouts::Layout& layout, const std::vector<std::vector<int32_t>>& seqs,
                                       const program::Path& path, const program::ForwardOptions& opt) {
  const auto ranks =
      run_virtual(cfg, weights, knobs, layout, [&](RankProgram& m) { return m.forward(seqs, path, opt); });
  return layouts::assemble_forward(ranks, seqs, opt);
}

program::BackwardResult sharded_backward(const ModelConfig& cfg, const Weights& weights, const Knobs& knobs,
                                         const layouts::Layout& layout,
                                         const std::vector<std::vector<int32_t>>& seqs,
                                         const ref::LossCoefficients& coefs, float temperature) {
  const auto ranks =
      run_virtual(cfg, weights, knobs, layout, [&](RankProgram& m) { return m.backward(seqs, coefs, temperature); });
  return layouts::assemble_backward(ranks, weights, seqs, coefs);
}

}  // namespace bp::gpu
