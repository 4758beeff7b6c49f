// The reference's compute backend (program/backend.h): host vectors and the ops
// of reference/ops, so that the programs run on the CPU exactly as SPEC.md defines.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "program/backend.h"
#include "program/layouts/comm.h"
#include "program/run_control.h"
#include "reference/numerics/bf16.h"
#include "reference/numerics/fp.h"
#include "reference/numerics/reduce.h"
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

namespace bp::host {

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
  Buf<T> unset(size_t n) const {  // host vectors start at +0 anyway
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
  Resident<T> resident(std::span<const T> host) const {
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
  // dst row dst_rows[i] = src row src_rows[i] (lists of equal length).
  template <class T>
  void copy_rows(const T* src, size_t width, const std::vector<int>& src_rows, T* dst,
                 const std::vector<int>& dst_rows) const {
    for (size_t i = 0; i < src_rows.size(); ++i) {
      const size_t from = static_cast<size_t>(src_rows[i]) * width, to = static_cast<size_t>(dst_rows[i]) * width;
      std::copy_n(src + from, width, dst + to);
    }
  }
  // acc[i] = acc[i] + x[i], one fp32 addition each (a tied embedding's two gradients).
  void add_f32(float* acc, const float* x, size_t n) const {
    for (size_t i = 0; i < n; ++i) acc[i] = add_rn(acc[i], x[i]);
  }
  // out[i] = round_bf16(x[i]).
  void round_to_bf16(const float* x, bf16* out, size_t n) const {
    for (size_t i = 0; i < n; ++i) out[i] = round_bf16(x[i]);
  }
  // out[i] = sum_partials(how) over the partials base[offsets[j] + i], j in order
  // (numerics/reduce.h): the layouts' reductions of rank or chunk partials.
  void reduce_partials(const float* base, const std::vector<size_t>& offsets, size_t n, PartialSum how,
                       float* out) const {
    const int P = static_cast<int>(offsets.size());
#pragma omp parallel for schedule(static) if (n * offsets.size() > (size_t{1} << 16))
    for (size_t i = 0; i < n; ++i)
      out[i] = sum_partials(how, P, i, n, [&](int j) { return base[offsets[static_cast<size_t>(j)] + i]; });
  }

  // Every rank's n elements at `mine` (any n), concatenated in rank order.
  template <class T>
  layouts::Gathered<Buf<T>> all_gather(layouts::Comm& comm, const T* mine, size_t n) const {
    return concat<T>(comm.all_gather(std::as_bytes(std::span<const T>(mine, n))));
  }
  // `send` holds counts[r] elements for rank r, in rank order; what every rank
  // sent here, concatenated in rank order.
  template <class T>
  layouts::Gathered<Buf<T>> all_to_all(layouts::Comm& comm, const T* send, const std::vector<size_t>& counts) const {
    std::vector<layouts::Bytes> pieces;
    for (size_t r = 0, at = 0; r < counts.size(); at += counts[r++])
      pieces.push_back(layouts::to_bytes(std::span<const T>(send + at, counts[r])));
    return concat<T>(comm.all_to_all(pieces));
  }

  // Every op first checks for a requested cancellation (program/run_control.h).
#define BP_HOST_OP(op)                           \
  template <class... A>                          \
  decltype(auto) op(A&&... a) const {            \
    program::run_control::check();                        \
    return ::bp::ref::op(std::forward<A>(a)...); \
  }
  BP_PROGRAM_OPS(BP_HOST_OP)
#undef BP_HOST_OP

 private:
  template <class T>
  static layouts::Gathered<Buf<T>> concat(const std::vector<layouts::Bytes>& pieces) {
    layouts::Gathered<Buf<T>> g;
    g.offset.push_back(0);
    for (const layouts::Bytes& b : pieces) g.offset.push_back(g.offset.back() + b.size() / sizeof(T));
    g.data.resize(g.offset.back());
    for (size_t r = 0; r < pieces.size(); ++r)
      if (!pieces[r].empty()) std::memcpy(g.data.data() + g.offset[r], pieces[r].data(), pieces[r].size());
    return g;
  }
};

}  // namespace bp::host
