#include "fsdpp/tensor/matmul.hpp"

#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/bf16.hpp"
#include "fsdpp/tensor/types.hpp"

#include <Kokkos_Core.hpp>
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#endif

namespace fsdpp {

namespace gemm_detail {

// What a rounded product's inputs are packed as: bf16 storage for cublasGemmEx on GPUs; on hosts, floats
// holding the rounded values, for sgemm.
#if defined(KOKKOS_ENABLE_CUDA)
using Packed = bf16;
#else
using Packed = float;
#endif

// Copies `batch` rows x cols blocks (row-major, leading dimension ld, block i at src + i * stride) into dst,
// contiguous (leading dimension cols, block i at dst + i * rows * cols), rounding each value for `precision`.
// A free function with external linkage: nvcc needs that of a KOKKOS_LAMBDA's enclosing function.
void pack_rounded(GemmPrecision precision, const float* src, int rows, int cols, int ld, std::int64_t stride,
                  int batch, Packed* dst) {
  const std::int64_t per_block = std::int64_t(rows) * cols;
#if defined(KOKKOS_ENABLE_CUDA)
  // GPUs do TF32 in cuBLAS: only bf16 is packed. One thread per element, neighbours on neighbouring columns.
  (void)precision;
  Kokkos::parallel_for(
      "fsdpp::gemm_pack_bf16", Kokkos::RangePolicy<ExecSpace>(0, per_block * batch),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t b = i / per_block, in_block = i - b * per_block;
        const std::int64_t r = in_block / cols, c = in_block - r * cols;
        dst[i] = bf16::from_float(src[b * stride + r * ld + c]);
      });
#else
  // One iteration per row, its columns in a division-free inner loop: per-element index arithmetic would cost
  // more than the rounding.
  const bool tf32 = precision == GemmPrecision::tf32;
  Kokkos::parallel_for(
      "fsdpp::gemm_pack_rounded_rows", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(batch) * rows),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t b = row / rows, r = row - b * rows;
        const float* in = src + b * stride + r * ld;
        Packed* out = dst + b * per_block + r * cols;
        if (tf32)
          for (int c = 0; c < cols; ++c) out[c] = round_to_tf32(in[c]);
        else
          for (int c = 0; c < cols; ++c) out[c] = round_to_bf16(in[c]);
      });
#endif
}

}  // namespace gemm_detail

namespace {

using gemm_detail::Packed;

GemmPrecision g_precision = GemmPrecision::f32;
int g_row_block = 0;  // set_gemm_row_block

// Rounded products run over K in panels of this width, so the packed copies of the inputs stay bounded at
// (M + N) x kPanelK per batch entry: lm_head's backward would otherwise pack its whole (B*T, V) gradient.
// OpenBLAS blocks K at a few hundred itself, so the split costs it little; the partial sums stay f32 in C.
constexpr int kPanelK = 512;

// Scratch for the packed A and B panels: grows to the largest panel seen, then is reused. Released at
// Kokkos::finalize (a View must not outlive Kokkos).
View1<Packed> g_packed[2];  // the scratch buffers of packed_scratch

Packed* packed_scratch(int which, std::size_t elements) {
  View1<Packed>* buffers = g_packed;
  static bool release_hooked = false;
  if (buffers[which].extent(0) < elements) {
    buffers[which] = View1<Packed>();  // free first: the old and new buffer need not coexist
    buffers[which] = uninitialized<Packed>(which == 0 ? "fsdpp::gemm_packed_a" : "fsdpp::gemm_packed_b", elements);
    if (!release_hooked) {
      Kokkos::push_finalize_hook([] {
        release_gemm_scratch();
        release_hooked = false;
      });
      release_hooked = true;
    }
  }
  return buffers[which].data();
}

// Where the K-panel [k0, k0 + kb) of op(X) lies in the stored row-major X: `offset` elements in, a rows x cols
// block with leading dimension ld. op(A) is (M,K): its panel is columns of A, or rows of a transposed A.
// op(B) is (K,N): rows of B, or columns of a transposed B.
struct Panel {
  std::int64_t offset;
  int rows, cols, ld;
};
Panel a_panel(Trans ta, int M, int k0, int kb, int lda) {
  return ta == Trans::N ? Panel{k0, M, kb, lda} : Panel{std::int64_t(k0) * lda, kb, M, lda};
}
Panel b_panel(Trans tb, int N, int k0, int kb, int ldb) {
  return tb == Trans::N ? Panel{std::int64_t(k0) * ldb, kb, N, ldb} : Panel{k0, N, kb, ldb};
}

#if defined(KOKKOS_ENABLE_CUDA)
// One handle per process, bound to Kokkos's default stream so products are ordered with the kernels.
cublasHandle_t cublas_handle() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    FSDPP_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed: is a GPU visible to this rank?");
    cublasSetStream(h, Kokkos::Cuda().cuda_stream());
    // Deterministic products (train.reproducible relies on it; docs/reproducible.md): no atomics in any
    // routine (cuBLAS's default, stated so that nothing turns it on), one stream, so the default workspace
    // configuration keeps results bitwise run to run for one toolkit and GPU model.
    cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED);
    return h;
  }();
  return handle;
}
cublasOperation_t op(Trans t) { return t == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N; }
void check(cublasStatus_t status, const char* call) {
  FSDPP_CHECK(status == CUBLAS_STATUS_SUCCESS, "{} failed with cuBLAS status {}", call, static_cast<int>(status));
}
// TF32 is a cuBLAS math mode: set before each single-precision call (cheap, host-side), so the handle
// always matches the precision in force. Double products ignore it.
void apply_math_mode() {
  check(cublasSetMathMode(cublas_handle(),
                          g_precision == GemmPrecision::tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
        "cublasSetMathMode");
}
// cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so the
// operands swap places and M, N swap roles.
template <class T> void device_gemm(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda,
                                    const T* B, int ldb, T beta, T* C, int ldc) {
  if constexpr (std::is_same_v<T, float>) {
    apply_math_mode();
    check(cublasSgemm(cublas_handle(), op(tb), op(ta), N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc), "cublasSgemm");
  } else {
    check(cublasDgemm(cublas_handle(), op(tb), op(ta), N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc), "cublasDgemm");
  }
}
template <class T> void device_gemm_batched(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda,
                                            std::int64_t sa, const T* B, int ldb, std::int64_t sb, T beta, T* C,
                                            int ldc, std::int64_t sc, int batch) {
  if constexpr (std::is_same_v<T, float>) {
    apply_math_mode();
    check(cublasSgemmStridedBatched(cublas_handle(), op(tb), op(ta), N, M, K, &alpha, B, ldb, sb, A, lda, sa, &beta,
                                    C, ldc, sc, batch), "cublasSgemmStridedBatched");
  } else {
    check(cublasDgemmStridedBatched(cublas_handle(), op(tb), op(ta), N, M, K, &alpha, B, ldb, sb, A, lda, sa, &beta,
                                    C, ldc, sc, batch), "cublasDgemmStridedBatched");
  }
}
#else
CBLAS_TRANSPOSE op(Trans t) { return t == Trans::T ? CblasTrans : CblasNoTrans; }
// One row (a decode step's matrix-vector products): gemv. OpenBLAS 0.3.21 runs such a product through its packed
// GEMM kernels, which copy the whole weight matrix each call: measured 4-6x slower than sgemv at GPT-2 shapes
// (C 256, OC 256..4096, one thread; later OpenBLAS releases forward it to gemv themselves). K = 0 stays with gemm,
// which still scales C by beta.
template <class T> bool one_row_gemv(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
                                     int ldb, T beta, T* C) {
  if (M != 1 || K == 0) return false;
  const int inc_a = ta == Trans::N ? 1 : lda;  // op(A) is one row: A's row, or A's column
  // C = op(B)^T a: B (N, K) as stored when op(B) = B^T, else B (K, N) read transposed.
  const CBLAS_TRANSPOSE t = tb == Trans::T ? CblasNoTrans : CblasTrans;
  const int rows = tb == Trans::T ? N : K, cols = tb == Trans::T ? K : N;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemv(CblasRowMajor, t, rows, cols, alpha, B, ldb, A, inc_a, beta, C, 1);
  else
    cblas_dgemv(CblasRowMajor, t, rows, cols, alpha, B, ldb, A, inc_a, beta, C, 1);
  return true;
}

template <class T> void host_gemm(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
                                  int ldb, T beta, T* C, int ldc) {
  if (one_row_gemv(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C)) return;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, op(ta), op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    cblas_dgemm(CblasRowMajor, op(ta), op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#endif

// The product of packed (rounded) panels, f32 accumulation into C: a packed A block is (rows x lda_p) with
// stride sa_p between batch entries, likewise B.
void packed_product(Trans ta, Trans tb, int M, int N, int kb, float alpha, const Packed* a, int lda_p,
                    std::int64_t sa_p, const Packed* b, int ldb_p, std::int64_t sb_p, float beta, float* C, int ldc,
                    std::int64_t sc, int batch) {
#if defined(KOKKOS_ENABLE_CUDA)
  // Column-major swap as in device_gemm. bf16 A and B, f32 C, f32 compute: tensor cores with f32 accumulation.
  check(cublasGemmStridedBatchedEx(cublas_handle(), op(tb), op(ta), N, M, kb, &alpha, b, CUDA_R_16BF, ldb_p, sb_p, a,
                                   CUDA_R_16BF, lda_p, sa_p, &beta, C, CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx (bf16 inputs, f32 accumulation)");
#else
  for (int i = 0; i < batch; ++i)
    cblas_sgemm(CblasRowMajor, op(ta), op(tb), M, N, kb, alpha, a + i * sa_p, lda_p, b + i * sb_p, ldb_p, beta,
                C + i * sc, ldc);
#endif
}

// Whether float products go through packed, rounded inputs: bf16 everywhere; tf32 only on hosts (cuBLAS
// does TF32 itself through its math mode).
bool packs_inputs() {
#if defined(KOKKOS_ENABLE_CUDA)
  return g_precision == GemmPrecision::bf16;
#else
  return g_precision != GemmPrecision::f32;
#endif
}

// gemm_batched<float> with the inputs rounded for g_precision, K-panel by K-panel: each panel of op(A) and
// op(B) is packed (rounded) into scratch, and the panel products accumulate in C (beta only on the first).
void rounded_gemm_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
                          std::int64_t sa, const float* B, int ldb, std::int64_t sb, float beta, float* C, int ldc,
                          std::int64_t sc, int batch) {
  for (int k0 = 0; k0 < K; k0 += kPanelK) {
    const int kb = std::min(kPanelK, K - k0);
    const Panel pa = a_panel(ta, M, k0, kb, lda), pb = b_panel(tb, N, k0, kb, ldb);
    const std::int64_t a_block = std::int64_t(pa.rows) * pa.cols, b_block = std::int64_t(pb.rows) * pb.cols;
    Packed* a = packed_scratch(0, static_cast<std::size_t>(a_block * batch));
    Packed* b = packed_scratch(1, static_cast<std::size_t>(b_block * batch));
    gemm_detail::pack_rounded(g_precision, A + pa.offset, pa.rows, pa.cols, pa.ld, sa, batch, a);
    gemm_detail::pack_rounded(g_precision, B + pb.offset, pb.rows, pb.cols, pb.ld, sb, batch, b);
    packed_product(ta, tb, M, N, kb, alpha, a, pa.cols, a_block, b, pb.cols, b_block, k0 == 0 ? beta : 1.0f, C, ldc,
                   sc, batch);
  }
}

}  // namespace

template <class T>
void gemm(Trans ta, Trans tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta, T* C,
          int ldc) {
  if (M == 0 || N == 0) return;
  if (g_row_block > 0 && ta == Trans::N && M > g_row_block && M % g_row_block == 0) {
    for (int r = 0; r < M; r += g_row_block)
      gemm<T>(ta, tb, g_row_block, N, K, alpha, A + std::int64_t{r} * lda, lda, B, ldb, beta,
              C + std::int64_t{r} * ldc, ldc);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (K > 0 && packs_inputs())
      return rounded_gemm_batched(ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
  }
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
  if constexpr (std::is_same_v<T, float>) {
    if (K > 0 && packs_inputs())
      return rounded_gemm_batched(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
  }
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

int default_blas_threads(int ranks_on_node) {
  if (std::getenv("OPENBLAS_NUM_THREADS")) return blas_threads();  // the user chose (OpenBLAS read it at start)
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, ranks_on_node));
}

int configure_blas_threads(int ranks_on_node) {
  if (std::getenv("OPENBLAS_NUM_THREADS")) return blas_threads();
  return set_blas_threads(default_blas_threads(ranks_on_node));
}

int set_blas_threads(int threads) {
#if defined(KOKKOS_ENABLE_CUDA)
  (void)threads;
  return 0;
#else
  openblas_set_num_threads(threads);
  return openblas_get_num_threads();
#endif
}

void set_gemm_precision(GemmPrecision precision) { g_precision = precision; }

void release_gemm_scratch() {
  g_packed[0] = View1<Packed>();
  g_packed[1] = View1<Packed>();
}
GemmPrecision gemm_precision() { return g_precision; }
void set_gemm_row_block(int rows) { g_row_block = rows; }
int gemm_row_block() { return g_row_block; }

std::string_view gemm_precision_name(GemmPrecision precision) {
  switch (precision) {
    case GemmPrecision::f32: return "f32";
    case GemmPrecision::tf32: return "tf32";
    case GemmPrecision::bf16: return "bf16";
  }
  return "?";
}

std::string gemm_precision_description(GemmPrecision precision) {
#if defined(KOKKOS_ENABLE_CUDA)
  switch (precision) {
    case GemmPrecision::f32: return "f32 (cuBLAS default math, no tensor cores)";
    case GemmPrecision::tf32: return "tf32 (cuBLAS TF32 tensor-op math, f32 accumulation)";
    case GemmPrecision::bf16: return "bf16 (cublasGemmEx: bf16 inputs, f32 accumulation)";
  }
#else
  switch (precision) {
    case GemmPrecision::f32: return "f32 (OpenBLAS sgemm)";
    case GemmPrecision::tf32: return "tf32 (emulated: inputs rounded to TF32, f32 accumulation, OpenBLAS sgemm)";
    case GemmPrecision::bf16: return "bf16 (inputs rounded to bf16, f32 accumulation, OpenBLAS sgemm)";
  }
#endif
  return "?";
}

double measure_gemm_gflops(int M, int N, int K, GemmPrecision precision, int repeats) {
  const ScopedGemmPrecision scoped(precision);
  View1<float> inp = uninitialized<float>("gemm_rate.inp", static_cast<std::size_t>(M) * K);
  View1<float> weight = uninitialized<float>("gemm_rate.weight", static_cast<std::size_t>(N) * K);
  View1<float> out = uninitialized<float>("gemm_rate.out", static_cast<std::size_t>(M) * N);
  Kokkos::deep_copy(inp, 0.5f);
  Kokkos::deep_copy(weight, 0.25f);
  std::vector<double> seconds;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run warms caches, BLAS buffers and the packing scratch
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    gemm<float>(Trans::N, Trans::T, M, N, K, 1.0f, inp.data(), K, weight.data(), K, 0.0f, out.data(), N);
    Kokkos::fence();
    if (r > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * M * static_cast<double>(N) * K / seconds[seconds.size() / 2] / 1e9;
}

double measure_sgemm_gflops(int n, int repeats) {
  const ScopedGemmPrecision exact(GemmPrecision::f32);
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

std::string blas_description() {
  std::string config = openblas_get_config();
  while (!config.empty() && config.back() == ' ') config.pop_back();
  return config;  // begins with "OpenBLAS <version>"
}

std::vector<std::pair<std::string, std::string>> matmul_build_info() {
  // The GEMM precisions this build offers (deck: matmul.precision, matmul.tf32); the run banner names the one in use.
  return {{"BLAS", blas_description()},
          {"GEMM", fmt::format("{}: f32, tf32{}, bf16 (bf16 inputs, f32 accumulation)", matmul_backend(),
                               tf32_is_native() ? " (tensor cores)" : " (emulated)")}};
}

}  // namespace fsdpp
