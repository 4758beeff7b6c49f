// The `cuda` implementation in a build without CUDA (BITPARITY_CUDA=OFF or no nvcc).
#include "harness/engine/cuda_implementation.h"

namespace bp::harness {

namespace {

[[noreturn]] void no_cuda() { throw CannotTest(*cuda_unavailable_reason()); }

}  // namespace

const char* cuda_implementation_summary() {
  return "not available in this build (its cases exit 125: cannot test here)";
}

std::optional<std::string> cuda_unavailable_reason() {
  return "no CUDA in this build of bitparity (BITPARITY_CUDA=OFF or no nvcc)";
}

// Never reached: cuda_unavailable_reason() refuses first.
std::optional<std::string> cuda_model_problem(const ModelConfig&) { return std::nullopt; }

std::optional<GpuIdentity> gpu_identity() { return std::nullopt; }  // no GPU is used without CUDA

struct GpuRunner::Kept {};  // never made: nothing is uploaded without CUDA

GpuRunner::GpuRunner() = default;
GpuRunner::~GpuRunner() = default;

void GpuRunner::prepare(const GpuModelSource&, const layouts::Layout&) { no_cuda(); }
void GpuRunner::release() {}  // nothing was kept

GpuCaseResult GpuRunner::run(const GpuCaseInput&) { no_cuda(); }

}  // namespace bp::harness
