// Data movement and elementwise arithmetic the model and rank programs need
// beside the ops (host/backend.h has the host versions): row
// gathers, scatters and copies by host lists of row indices, an elementwise fp32
// addition and rounding, and the layouts' reductions of rank or chunk partials.
// Asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "reference/numerics/bf16.h"
#include "reference/numerics/reduce.h"

namespace bp::cuda {

// dst row i = src row rows[i] (rows of `width` elements). T: bf16, float, int.
template <class T>
void gather_rows(const T* src, size_t width, const std::vector<int>& rows, T* dst, cudaStream_t stream = 0);

// dst row rows[i] = src row i.
template <class T>
void scatter_rows(const T* src, size_t width, const std::vector<int>& rows, T* dst, cudaStream_t stream = 0);

// dst row dst_rows[i] = src row src_rows[i] (lists of equal length, no repeated destination).
template <class T>
void copy_rows(const T* src, size_t width, const std::vector<int>& src_rows, T* dst, const std::vector<int>& dst_rows,
               cudaStream_t stream = 0);

// acc[i] = acc[i] + x[i], one fp32 addition each (round to nearest even).
void add_f32(float* acc, const float* x, size_t n, cudaStream_t stream = 0);

// out[i] = round_bf16(x[i]).
void round_to_bf16(const float* x, bf16* out, size_t n, cudaStream_t stream = 0);

// out[i] = sum_partials(how) over the partials base[offsets[j] + i], j in order
// (reference/numerics/reduce.h), one thread per element: the host's order exactly.
void reduce_partials(const float* base, const std::vector<size_t>& offsets, size_t n, PartialSum how, float* out,
                     cudaStream_t stream = 0);

}  // namespace bp::cuda
