#include "fsdpp/tensor/matmul.hpp"

#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/types.hpp"

#include <Kokkos_Core.hpp>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <type_traits>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#endif

namespace fsdpp {
namespace {

#if defined(KOKKOS_ENABLE_CUDA)
// One handle per process, bound to Kokkos's default stream so products are ordered with the kernels.
cublasHandle_t cublas_handle() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    FSDPP_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed: is a GPU visible to this rank?");
    cublasSetStream(h, Kokkos::Cuda().cuda_stream());
    return h;
  }();
  return handle;
}
cublasOperation_t op(Trans t) { return t == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N; }
void check(cublasStatus_t status, const char* call) {
  FSDPP_CHECK(status == CUBLAS_STATUS_SUCCESS, "{} failed with cuBLAS status {}", call, static_cast<int>(status));
}
// cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so the
// operands swap places and M, N swap roles.
template <class T> void device_gemm(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda,
                                    const T* B, int ldb, T beta, T* C, int ldc) {
  if constexpr (std::is_same_v<T, float>)
    check(cublasSgemm(cublas_handle(), op(tb), op(ta), N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc), "cublasSgemm");
  else
    check(cublasDgemm(cublas_handle(), op(tb), op(ta), N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc), "cublasDgemm");
}
template <class T> void device_gemm_batched(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda,
                                            std::int64_t sa, const T* B, int ldb, std::int64_t sb, T beta, T* C,
                                            int ldc, std::int64_t sc, int batch) {
  if constexpr (std::is_same_v<T, float>)
    check(cublasSgemmStridedBatched(cublas_handle(), op(tb), op(ta), N, M, K, &alpha, B, ldb, sb, A, lda, sa, &beta,
                                    C, ldc, sc, batch), "cublasSgemmStridedBatched");
  else
    check(cublasDgemmStridedBatched(cublas_handle(), op(tb), op(ta), N, M, K, &alpha, B, ldb, sb, A, lda, sa, &beta,
                                    C, ldc, sc, batch), "cublasDgemmStridedBatched");
}
#else
CBLAS_TRANSPOSE op(Trans t) { return t == Trans::T ? CblasTrans : CblasNoTrans; }
template <class T> void host_gemm(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
                                  int ldb, T beta, T* C, int ldc) {
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, op(ta), op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    cblas_dgemm(CblasRowMajor, op(ta), op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#endif

}  // namespace

template <class T>
void gemm(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta, T* C,
          int ldc) {
  if (M == 0 || N == 0) return;
#if defined(KOKKOS_ENABLE_CUDA)
  device_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
  host_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

template <class T>
void gemm_batched(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda, std::int64_t sa, const T* B,
                  int ldb, std::int64_t sb, T beta, T* C, int ldc, std::int64_t sc, int batch) {
  if (M == 0 || N == 0 || batch == 0) return;
#if defined(KOKKOS_ENABLE_CUDA)
  device_gemm_batched(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
#else
  // OpenBLAS 0.3.21 has no batched interface; the products here are large enough (T x T x head size) that a
  // loop costs little next to the arithmetic.
  for (int i = 0; i < batch; ++i)
    host_gemm(ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
#endif
}

template void gemm<float>(Trans, Trans, int, int, int, float, const float*, int, const float*, int, float, float*, int);
template void gemm<double>(Trans, Trans, int, int, int, double, const double*, int, const double*, int, double, double*, int);
template void gemm_batched<float>(Trans, Trans, int, int, int, float, const float*, int, std::int64_t, const float*, int,
                                  std::int64_t, float, float*, int, std::int64_t, int);
template void gemm_batched<double>(Trans, Trans, int, int, int, double, const double*, int, std::int64_t, const double*,
                                   int, std::int64_t, double, double*, int, std::int64_t, int);

int set_blas_threads(int threads) {
#if defined(KOKKOS_ENABLE_CUDA)
  (void)threads;
  return 0;
#else
  openblas_set_num_threads(threads);
  return openblas_get_num_threads();
#endif
}

double measure_sgemm_gflops(int n, int repeats) {
  View1<float> a = uninitialized<float>("sgemm_peak.a", static_cast<std::size_t>(n) * n);
  View1<float> b = uninitialized<float>("sgemm_peak.b", static_cast<std::size_t>(n) * n);
  View1<float> c = uninitialized<float>("sgemm_peak.c", static_cast<std::size_t>(n) * n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  std::vector<double> seconds;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run warms caches and BLAS buffers
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    gemm<float>(Trans::N, Trans::N, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    Kokkos::fence();
    if (r > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * n * static_cast<double>(n) * n / seconds[seconds.size() / 2] / 1e9;
}

int blas_threads() {
#if defined(KOKKOS_ENABLE_CUDA)
  return 0;
#else
  return openblas_get_num_threads();
#endif
}

std::string matmul_backend() {
#if defined(KOKKOS_ENABLE_CUDA)
  return "cuBLAS";
#else
  return "OpenBLAS (cblas)";
#endif
}

}  // namespace fsdpp
