// Whether this build computes TF32 natively (tensor cores on GPU builds) or emulates it. Apart from matmul.cpp
// because the deck's default for matmul.tf32 needs it, and the deck parser (and its fuzzer) must link without
// BLAS or cuBLAS.
#include "fsdpp/tensor/matmul.hpp"

#include <Kokkos_Macros.hpp>

namespace fsdpp {

bool tf32_is_native() {
#if defined(KOKKOS_ENABLE_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace fsdpp
