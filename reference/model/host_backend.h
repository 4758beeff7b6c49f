// Where the model program (qwen3_program.h) keeps its tensors and runs its ops:
// here the reference's, on host vectors. optimized/model/cuda_backend.h is the
// same interface on a GPU, so that both run one program, op for op.
//
// A backend provides
//   Buf<T>                 owning tensor storage: data(), size(), movable
//   Resident<T>            a read-only copy of host data in backend memory (here a
//                          view: the host vector must outlive it)
//   zeros<T>(n)            a Buf of n +0 elements
//   clone(buf)             a copy
//   resident(host vector)  a Resident
//   to_host(p, n)          n elements at backend pointer p, on the host
//   take(buf)              a whole Buf on the host
//   copy(dst, src, n)      within backend memory
//   gather_rows / scatter_rows, add_f32 (below)
//   every op the model calls (BP_MODEL_OPS), under its reference name and arguments.
#pragma once
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "reference/numerics/fp.h"
#include "reference/ops/attention.h"
#include "reference/ops/embedding.h"
#include "reference/ops/linear.h"
#include "reference/ops/logprob.h"
#include "reference/ops/moe_experts.h"
#include "reference/ops/moe_router.h"
#include "reference/ops/residual.h"
#include "reference/ops/rmsnorm.h"
#include "reference/ops/rope.h"
#include "reference/ops/swiglu.h"

// The ops the model program calls; each backend forwards them to its own twins.
#define BP_MODEL_OPS(X)                                                                                              \
  X(embedding_fwd) X(embedding_bwd) X(rmsnorm_fwd) X(rmsnorm_bwd) X(linear_fwd) X(linear_dgrad) X(linear_dgrad_acc) \
  X(linear_wgrad) X(rope_fwd) X(rope_bwd) X(attention_fwd) X(attention_bwd) X(residual_fwd) X(sum_round)            \
  X(router_fwd) X(moe_experts_fwd) X(moe_combine_fwd) X(moe_layer_bwd) X(mlp_hidden_fwd) X(mlp_bwd)                 \
  X(logprob_fwd) X(logprob_bwd)

namespace bp::ref {

struct HostBackend {
  template <class T>
  using Buf = std::vector<T>;
  template <class T>
  struct Resident {
    const T* ptr;
    const T* data() const { return ptr; }
  };

  template <class T>
  Buf<T> zeros(size_t n) const {
    return Buf<T>(n);
  }
  template <class T>
  Buf<T> clone(const Buf<T>& b) const {
    return b;
  }
  template <class T>
  Resident<T> resident(const std::vector<T>& host) const {
    return {host.data()};
  }
  template <class T>
  std::vector<T> to_host(const T* p, size_t n) const {
    return std::vector<T>(p, p + n);
  }
  // The whole buffer on the host (here: the buffer itself).
  template <class T>
  std::vector<T> take(Buf<T>&& b) const {
    return std::move(b);
  }
  template <class T>
  void copy(T* dst, const T* src, size_t n) const {
    std::copy_n(src, n, dst);
  }
  // dst row i = src row rows[i] (rows of `width` elements).
  template <class T>
  void gather_rows(const T* src, size_t width, const std::vector<int>& rows, T* dst) const {
    for (size_t i = 0; i < rows.size(); ++i) std::copy_n(src + static_cast<size_t>(rows[i]) * width, width, dst + i * width);
  }
  // dst row rows[i] = src row i.
  template <class T>
  void scatter_rows(const T* src, size_t width, const std::vector<int>& rows, T* dst) const {
    for (size_t i = 0; i < rows.size(); ++i) std::copy_n(src + i * width, width, dst + static_cast<size_t>(rows[i]) * width);
  }
  // acc[i] = acc[i] + x[i], one fp32 addition each (a tied embedding's two gradients).
  void add_f32(float* acc, const float* x, size_t n) const {
    for (size_t i = 0; i < n; ++i) acc[i] = add_rn(acc[i], x[i]);
  }

#define BP_HOST_OP(op)                         \
  template <class... A>                        \
  decltype(auto) op(A&&... a) const {          \
    return ::bp::ref::op(std::forward<A>(a)...); \
  }
  BP_MODEL_OPS(BP_HOST_OP)
#undef BP_HOST_OP
};

}  // namespace bp::ref
