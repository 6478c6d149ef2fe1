// The three CUDA driver API functions Kokkos 4.x calls (Kokkos_Cuda_Instance.cpp, when it adopts a stream),
// defined here and forwarded to the NVIDIA driver's libcuda.so.1, loaded with dlopen on first use.
//
// Why: Kokkos' CMake target links CUDA::cuda_driver, so a GPU build of fsdpp would otherwise need
// libcuda.so.1 just to be loaded, and on a machine without the NVIDIA driver (a login node, the build
// machines) even `fsdpp --version` would die in the dynamic loader ("libcuda.so.1: cannot open shared object
// file", exit 127). With these definitions in the executable and --as-needed on its link line
// (lib/CMakeLists.txt), libcuda.so.1 is no longer a load-time dependency; libcudart and NCCL load the driver
// themselves when a GPU is used. Without a driver these functions return CUDA_ERROR_STUB_LIBRARY, which
// Kokkos would report; fsdpp never reaches them there (no device is started without a GPU).
//
// The types are spelled as the ABI has them (CUresult and CUdevice are ints, contexts and streams pointers)
// instead of including cuda.h, whose macros rename these very functions.
#include <dlfcn.h>

#include <mutex>

namespace {

constexpr int kCudaErrorStubLibrary = 34;  // CUDA_ERROR_STUB_LIBRARY

void* driver() {
  static void* handle = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL); });
  return handle;
}

template <class Fn> Fn symbol(const char* name) {
  void* lib = driver();
  return lib ? reinterpret_cast<Fn>(dlsym(lib, name)) : nullptr;
}

}  // namespace

extern "C" {

int cuCtxGetDevice(int* device) {
  static const auto fn = symbol<int (*)(int*)>("cuCtxGetDevice");
  return fn ? fn(device) : kCudaErrorStubLibrary;
}

int cuCtxPushCurrent_v2(void* context) {
  static const auto fn = symbol<int (*)(void*)>("cuCtxPushCurrent_v2");
  return fn ? fn(context) : kCudaErrorStubLibrary;
}

int cuStreamGetCtx(void* stream, void** context) {
  static const auto fn = symbol<int (*)(void*, void**)>("cuStreamGetCtx");
  return fn ? fn(stream, context) : kCudaErrorStubLibrary;
}

}  // extern "C"

namespace fsdpp {
// Referenced from runtime.cpp, so that the linker takes this object (and its definitions above) from the
// static library before it reaches Kokkos' archive, which would otherwise pull libcuda.so.1 in for them.
int cuda_driver_shim_anchor() { return 0; }
}  // namespace fsdpp
