// fsdpp_gpu_info: what tests/gpu/run needs to know about the GPU, without Kokkos, MPI or fsdpp:
//   fsdpp_gpu_info            one JSON line: gpu name, bus id, memory, driver, CUDA runtime, NCCL and cuBLAS
//                             versions; exit 2 (with "error" in the JSON) when no usable GPU is visible
//   fsdpp_gpu_info --peak     also the dense GEMM peak measured with cuBLAS, in TFLOP/s: fp32 (cublasSgemm,
//                             TF32 off: CUBLAS_PEDANTIC_MATH) and bf16 (cublasGemmEx, bf16 in and out, fp32
//                             accumulation), each the best of several runs of an n x n x n product (n 8192)
// MFU in tests/gpu/run divides model FLOP/s by these measured peaks, not by datasheet numbers.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>

namespace {

std::string escape(const char* text) {
  std::string out;
  for (const char* c = text; *c; ++c) {
    if (*c == '"' || *c == '\\') out += '\\';
    out += *c;
  }
  return out;
}

std::string version(int code) { return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 10); }

// Best time of `repeats` products after one warm-up, in TFLOP/s; -1 when a call failed.
template <class Gemm> double best_tflops(Gemm gemm, int n, int repeats) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best_ms = 1e30f;
  bool ok = gemm();
  for (int r = 0; r < repeats && ok; ++r) {
    cudaEventRecord(start);
    ok = gemm();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (ms < best_ms) best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!ok || cudaDeviceSynchronize() != cudaSuccess) return -1;
  return 2.0 * n * static_cast<double>(n) * n / (best_ms * 1e-3) / 1e12;
}

}  // namespace

int main(int argc, char** argv) {
  const bool peak = argc > 1 && std::strcmp(argv[1], "--peak") == 0;
  int runtime = 0, driver = 0, nccl = 0, devices = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  ncclGetVersion(&nccl);
  const std::string versions = "\"driver_cuda\":\"" + (driver ? version(driver) : std::string("none")) +
                               "\",\"cuda_runtime\":\"" + version(runtime) + "\",\"nccl\":\"" +
                               std::to_string(nccl / 10000) + "." + std::to_string(nccl % 10000 / 100) + "." +
                               std::to_string(nccl % 100) + "\"";
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0) {
    std::printf("{\"gpu\":null,%s,\"error\":\"no usable GPU: cudaGetDeviceCount: %s\"}\n", versions.c_str(),
                rc != cudaSuccess ? escape(cudaGetErrorString(rc)).c_str() : "0 devices");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  char bus[32] = {0};
  cudaDeviceGetPCIBusId(bus, sizeof bus, 0);
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::printf("{\"gpu\":\"%s\",%s,\"error\":\"cublasCreate failed\"}\n", escape(prop.name).c_str(), versions.c_str());
    return 1;
  }
  int cublas = 0;
  cublasGetVersion(handle, &cublas);
  std::printf("{\"gpu\":\"%s\",\"bus_id\":\"%s\",\"devices\":%d,\"memory_gib\":%.1f,\"sm\":\"%d.%d\",%s,\"cublas\":%d",
              escape(prop.name).c_str(), bus, devices, prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor,
              versions.c_str(), cublas);
  if (peak) {
    const int n = 8192;
    const std::size_t elems = static_cast<std::size_t>(n) * n;
    float *a = nullptr, *b = nullptr, *c = nullptr;
    __nv_bfloat16 *ha = nullptr, *hb = nullptr, *hc = nullptr;
    bool ok = cudaMalloc(&a, elems * 4) == cudaSuccess && cudaMalloc(&b, elems * 4) == cudaSuccess &&
              cudaMalloc(&c, elems * 4) == cudaSuccess && cudaMalloc(&ha, elems * 2) == cudaSuccess &&
              cudaMalloc(&hb, elems * 2) == cudaSuccess && cudaMalloc(&hc, elems * 2) == cudaSuccess;
    double fp32 = -1, bf16 = -1;
    if (ok) {
      cudaMemset(a, 0, elems * 4);  // zeros: the arithmetic is the same, and no NaN/denormal slow paths
      cudaMemset(b, 0, elems * 4);
      cudaMemset(ha, 0, elems * 2);
      cudaMemset(hb, 0, elems * 2);
      const float one = 1.0f, zero = 0.0f;
      cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH);  // strict fp32: no TF32 tensor cores
      fp32 = best_tflops([&] {
        return cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n) ==
               CUBLAS_STATUS_SUCCESS;
      }, n, 5);
      cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
      bf16 = best_tflops([&] {
        return cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, ha, CUDA_R_16BF, n, hb, CUDA_R_16BF, n,
                            &zero, hc, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
               CUBLAS_STATUS_SUCCESS;
      }, n, 10);
    }
    std::printf(",\"peak_fp32_tflops\":%.2f,\"peak_bf16_tflops\":%.2f", fp32, bf16);
    for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c), static_cast<void*>(ha),
                    static_cast<void*>(hb), static_cast<void*>(hc)})
      cudaFree(p);
  }
  std::printf("}\n");
  cublasDestroy(handle);
  return 0;
}
