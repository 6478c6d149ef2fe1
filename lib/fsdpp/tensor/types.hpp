#pragma once
// The View types of fsdpp, declared in one place (ExaMiniMD's types.h). Everything is LayoutRight (row-major),
// which matches PyTorch/llm.c's [out, in] weights and HDF5's C order, so checkpoint I/O is a flat copy.
// Tensors are flat 1-D Views; kernels take their shapes as arguments and document them in comments, as
// llm.c does ("inp (B,T,C)"), which lets FSDP swap a parameter's storage without retyping it.
#include <Kokkos_Core.hpp>

#include <cstdint>

// Set when kernels may run on a GPU; host-only code paths (tuned CPU loops) check it.
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL)
#define FSDPP_DEVICE_BUILD 1
#endif

namespace fsdpp {

// A non-negative int64 count or offset of the model's shapes as a View extent or index.
inline std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using HostSpace = Kokkos::HostSpace;
using Layout = Kokkos::LayoutRight;

template <class T> using View1 = Kokkos::View<T*, Layout, MemSpace>;
template <class T> using HostView1 = Kokkos::View<T*, Layout, HostSpace>;
// A View over memory someone else owns (a slice of a flat buffer).
template <class T> using Unmanaged1 = Kokkos::View<T*, Layout, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

using Tokens = View1<std::int32_t>;  // token ids, (B*T)

// An uninitialised device buffer: most buffers are overwritten by the kernel that fills them.
template <class T> View1<T> uninitialized(const std::string& label, std::size_t n) {
  return View1<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
}

// Math shims: Kokkos 3.4 has sqrt/exp/tanh only in Kokkos::Experimental, 4.x only in Kokkos
// (docs/stack-notes.md §2.5).
#if KOKKOS_VERSION >= 30700
namespace kmath = Kokkos;
#else
namespace kmath = Kokkos::Experimental;
#endif

template <class T> KOKKOS_INLINE_FUNCTION T kmax(T a, T b) { return a > b ? a : b; }
template <class T> KOKKOS_INLINE_FUNCTION T kmin(T a, T b) { return a < b ? a : b; }

}  // namespace fsdpp
