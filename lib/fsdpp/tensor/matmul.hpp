#pragma once
// Matrix products go through here and nowhere else: OpenBLAS (cblas) in host builds, cuBLAS when Kokkos
// runs on CUDA. Row-major throughout; leading dimensions are in elements. The rest of the code never knows
// which library ran.
#include <cstdint>
#include <string>

namespace fsdpp {

enum class Trans { N, T };

// C (M,N) = alpha * op(A) * op(B) + beta * C, with op(A) (M,K) and op(B) (K,N).
template <class T>
void gemm(Trans trans_a, Trans trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
          T beta, T* C, int ldc);

// `batch` independent products; matrix i of A starts at A + i * stride_a (likewise B, C).
template <class T>
void gemm_batched(Trans trans_a, Trans trans_b, int M, int N, int K, T alpha, const T* A, int lda,
                  std::int64_t stride_a, const T* B, int ldb, std::int64_t stride_b, T beta, T* C, int ldc,
                  std::int64_t stride_c, int batch);

// Threads the BLAS library may use on this rank; returns what it reports using.
int set_blas_threads(int threads);
int blas_threads();  // 0 where the library does not say (cuBLAS)
std::string matmul_backend();  // "OpenBLAS (cblas)" or "cuBLAS"

// Median GFLOP/s of an n x n x n single-precision product over `repeats` runs: the peak MFU is quoted against.
double measure_sgemm_gflops(int n, int repeats);

}  // namespace fsdpp
