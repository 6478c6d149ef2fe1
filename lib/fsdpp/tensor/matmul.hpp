#pragma once
// Matrix products go through here and nowhere else: OpenBLAS (cblas) in host builds, cuBLAS when Kokkos
// runs on CUDA. Row-major throughout; leading dimensions are in elements. The rest of the code never knows
// which library ran, nor in which precision: that is a property of this entry point (set_gemm_precision),
// so every float product (linear layers, attention, lm_head, forward and backward) follows one setting.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdpp {

enum class Trans { N, T };

// How gemm<float> and gemm_batched<float> compute; double products are always exact.
//   f32   IEEE single products and sums (bitwise what the BLAS gives).
//   tf32  inputs rounded to 10 mantissa bits (TF32), f32 accumulation. GPU builds: cuBLAS tensor-op math
//         (CUBLAS_TF32_TENSOR_OP_MATH). Host builds emulate it, rounding the inputs to nearest-even TF32
//         values before OpenBLAS's sgemm: the same numbers, but slower than f32, not faster.
//   bf16  inputs rounded to bf16, f32 accumulation. GPU builds: cublasGemmEx with bf16 A/B, f32 C,
//         CUBLAS_COMPUTE_32F (tensor cores). Host builds round the inputs to bf16 values and run sgemm: a
//         product of two bf16 values is exact in f32, so this is the same math as a bf16 GEMM with f32
//         accumulation. (Debian 12's OpenBLAS 0.3.21 declares cblas_sbgemm in cblas.h but is built without
//         it: libopenblas.so.0 exports no sbgemm symbol.)
// The rounded inputs are packed in K-panels into scratch buffers that grow to the largest panel seen and are
// then reused, so a training step allocates nothing once the first step has run.
enum class GemmPrecision { f32, tf32, bf16 };

void set_gemm_precision(GemmPrecision precision);  // process-wide; not thread-safe against running products
GemmPrecision gemm_precision();
std::string_view gemm_precision_name(GemmPrecision precision);  // "f32", "tf32", "bf16"
// One line for banners: the precision and how this build computes it, e.g.
// "bf16 (inputs rounded to bf16, f32 accumulation, OpenBLAS sgemm)".
std::string gemm_precision_description(GemmPrecision precision);
// Whether TF32 runs natively (tensor cores, GPU builds); host builds only emulate it.
bool tf32_is_native();
// Frees the packing scratch of rounded (bf16, emulated tf32) products; the next such product grows it again.
void release_gemm_scratch();

// Sets a precision for a scope and restores the previous one on exit (train(), tests, benchmarks).
class ScopedGemmPrecision {
 public:
  explicit ScopedGemmPrecision(GemmPrecision precision) : previous_(gemm_precision()) {
    set_gemm_precision(precision);
  }
  // The packing scratch of rounded products goes too: what one run grew, the next (another deck in the same
  // process, or a test) must not inherit as live memory.
  ~ScopedGemmPrecision() {
    set_gemm_precision(previous_);
    release_gemm_scratch();
  }
  ScopedGemmPrecision(const ScopedGemmPrecision&) = delete;
  ScopedGemmPrecision& operator=(const ScopedGemmPrecision&) = delete;

 private:
  GemmPrecision previous_;
};

// Fixed row blocks: with rows > 0, a product whose op(A) is A itself and whose M is a multiple of `rows` (above it)
// runs as M / rows products of `rows` rows. OpenBLAS rounds a row differently depending on how many rows the call
// holds (0.3.21, Zen kernels, one thread: splitting M into pieces changes 3-13% of the elements at every shape
// tried), so reproducible mode's token chunks (train.reproducible_chunks) fix the rows of every token product this
// way, and a row's bits no longer depend on how many of a sequence's tokens a rank holds (mesh.cp). 0: off.
void set_gemm_row_block(int rows);  // process-wide, like set_gemm_precision
int gemm_row_block();
class ScopedGemmRowBlock {
 public:
  explicit ScopedGemmRowBlock(int rows) : previous_(gemm_row_block()) { set_gemm_row_block(rows); }
  ~ScopedGemmRowBlock() { set_gemm_row_block(previous_); }
  ScopedGemmRowBlock(const ScopedGemmRowBlock&) = delete;
  ScopedGemmRowBlock& operator=(const ScopedGemmRowBlock&) = delete;

 private:
  int previous_;
};

// C (M,N) = alpha * op(A) * op(B) + beta * C, with op(A) (M,K) and op(B) (K,N).
template <class T>
void gemm(Trans trans_a, Trans trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
          T beta, T* C, int ldc);

// `batch` independent products; matrix i of A starts at A + i * stride_a (likewise B, C).
template <class T>
void gemm_batched(Trans trans_a, Trans trans_b, int M, int N, int K, T alpha, const T* A, int lda,
                  std::int64_t stride_a, const T* B, int ldb, std::int64_t stride_b, T beta, T* C, int ldc,
                  std::int64_t stride_c, int batch);

// The BLAS threads of a rank that shares this node's cores with `ranks_on_node - 1` others: OpenBLAS starts a thread
// per core in every rank, and ranks sharing a node would thrash (docs/stack-notes.md), so unless
// OPENBLAS_NUM_THREADS chooses, a rank takes the node's cores divided by `ranks_on_node`. The one rule: the run sets
// it (configure_blas_threads), `fsdpp plan --machine` predicts with it.
int default_blas_threads(int ranks_on_node);
// Sets this rank's BLAS threads by that rule. Call once the device has started (app/main.cpp,
// tests/mpi_test_main.cpp); returns the threads in use.
int configure_blas_threads(int ranks_on_node);
// Threads the BLAS library may use on this rank; returns what it reports using.
int set_blas_threads(int threads);
int blas_threads();  // 0 where the library does not say (cuBLAS)
std::string matmul_backend();  // "OpenBLAS (cblas)" or "cuBLAS"
std::string blas_description();  // OpenBLAS's own config string, "OpenBLAS 0.3.21 ..."
// The matrix-product rows of the build table (runtime/build_info.hpp): BLAS, and the GEMM precisions this build offers.
std::vector<std::pair<std::string, std::string>> matmul_build_info();

// Exactly `threads` BLAS threads for a scope (0: keep the current count), the previous count back on exit.
// OpenBLAS's products round differently on different thread counts (OpenBLAS 0.3.21, Haswell kernels: sgemm with
// M 64 and N or K 192 differs in 14 to 29% of its elements between 1 and 2 threads; below its threading size, as at
// M 16, it does not), so reproducible mode runs its GEMMs with 1 (train/trainer.cpp).
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int threads) : previous_(blas_threads()) {
    if (threads > 0) set_blas_threads(threads);
  }
  ~ScopedBlasThreads() {
    if (previous_ > 0) set_blas_threads(previous_);
  }
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;

 private:
  int previous_;
};

// Median GFLOP/s of an n x n x n single-precision product over `repeats` runs: the peak MFU is quoted against.
// Always f32, whatever the precision set.
double measure_sgemm_gflops(int n, int repeats);

// Median GFLOP/s of gemm<float>(N, T) with out (M,N) = inp (M,K) . weight (N,K)^T, a linear layer's forward
// shape, in `precision` (rounding of the inputs included: it is part of what a caller pays).
double measure_gemm_gflops(int M, int N, int K, GemmPrecision precision, int repeats);

}  // namespace fsdpp
