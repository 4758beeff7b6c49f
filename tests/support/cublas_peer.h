// cuBLAS as the non-bit-defined peer of linear (SPEC.md §3: a speed peer and a
// negative control, never part of the bit-defined path), bf16 inputs, fp32 compute:
// row-major y[T][N] = x[T][K] · w[N][K]ᵀ (output fp32 or bf16), and the two
// gradients linear_dgrad and linear_wgrad compute.
#pragma once
#include <cublas_v2.h>

#include <stdexcept>
#include <string>

namespace bp::test {

class CublasPeer {
 public:
  CublasPeer() { check(cublasCreate(&handle_), "cublasCreate"); }
  ~CublasPeer() { cublasDestroy(handle_); }
  CublasPeer(const CublasPeer&) = delete;
  CublasPeer& operator=(const CublasPeer&) = delete;

  void set_stream(cudaStream_t s) { check(cublasSetStream(handle_, s), "cublasSetStream"); }

  // cuBLAS is column-major: row-major y is the N × T matrix yᵀ = op(w) · x', where
  // w's storage is a K × N column-major matrix (op = transpose) and x's storage is
  // x' = xᵀ, K × T. Asynchronous on the handle's stream.
  void forward(const void* x, const void* w, void* y, cudaDataType_t y_type, int T, int K, int N) {
    const float alpha = 1.0f, beta = 0.0f;
    check(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K,
                       &beta, y, y_type, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }
  // dx[T][K] (bf16) = dy[T][N] · w[N][K]: column-major dxᵀ (K × T) = w' (K × N) · dy' (N × T).
  void dgrad(const void* dy, const void* w, void* dx, int T, int K, int N) {
    const float alpha = 1.0f, beta = 0.0f;
    check(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, K, T, N, &alpha, w, CUDA_R_16BF, K, dy, CUDA_R_16BF, N,
                       &beta, dx, CUDA_R_16BF, K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (dgrad)");
  }
  // dw[N][K] (fp32) = dy[T][N]ᵀ · x[T][K]: column-major dwᵀ (K × N) = x' (K × T) · op_T(dy' (N × T)).
  void wgrad(const void* dy, const void* x, float* dw, int T, int K, int N) {
    const float alpha = 1.0f, beta = 0.0f;
    check(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_T, K, N, T, &alpha, x, CUDA_R_16BF, K, dy, CUDA_R_16BF, N,
                       &beta, dw, CUDA_R_32F, K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (wgrad)");
  }

 private:
  static void check(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + " failed: status " + std::to_string(st));
  }
  cublasHandle_t handle_{};
};

}  // namespace bp::test
