#pragma once
// CPU offload memory (FSDP2's CPUOffloadPolicy): where offloaded shards, their gradients and the optimizer
// state live, and where the code that touches only them runs.
//
// On CUDA builds the memory is pinned host memory (cudaHostAlloc through Kokkos::CudaHostPinnedSpace): the
// DMA engines copy it asynchronously, and under unified virtual addressing its pointers are valid on the
// device too, so a kernel that must read it (parameter init, the non-finite scan) still works. It is handed
// around as a View1, an unmanaged alias whose owner (an OffloadView1) the holder keeps, so kernels, copies
// and checkpoint I/O take it unchanged; Kokkos' deep_copy between "device" Views copies with
// cudaMemcpyDefault, which reads host pointers correctly.
// On host builds it is ordinary host memory, OffloadView1 is View1, and the host-step code below is the
// same code CI runs.
//
// Elementwise work over offloaded tensors (the optimizer step, gradient accumulation, zeroing, the norm)
// runs on the host execution space over raw pointers: the data is already there, and the device would read
// it across PCIe.
#include "fsdpp/tensor/types.hpp"

#include <string>

namespace fsdpp {

#if defined(KOKKOS_ENABLE_CUDA)
using OffloadSpace = Kokkos::CudaHostPinnedSpace;
#else
using OffloadSpace = Kokkos::HostSpace;
#endif
using HostExecSpace = Kokkos::DefaultHostExecutionSpace;
template <class T> using OffloadView1 = Kokkos::View<T*, Layout, OffloadSpace>;

// Zero-filled offload memory, and the View1 alias that code outside this header passes around.
struct OffloadBuffer {
  OffloadView1<float> memory;  // the owner: keep it as long as `view` is used
  View1<float> view;
};

inline OffloadBuffer offload_buffer(const std::string& label, std::size_t n) {
  OffloadBuffer b;
  b.memory = OffloadView1<float>(label, n);  // zero-filled: padding rows of a shard stay zero
#if defined(KOKKOS_ENABLE_CUDA)
  b.view = View1<float>(b.memory.data(), n);  // unmanaged: `memory` owns it
#else
  b.view = b.memory;
#endif
  return b;
}

// An execution-space instance with its own stream for offload copies (cudaMemcpyAsync beside the compute
// stream); the default instance on host builds. Hold it only while Kokkos is initialized.
inline ExecSpace side_instance() {
#if defined(KOKKOS_ENABLE_CUDA)
  return Kokkos::Experimental::partition_space(ExecSpace(), 1)[0];
#else
  return ExecSpace();
#endif
}

// Run `body(j)` for j in [0, n) where the data lives: on the host for offloaded tensors, on the compute
// space otherwise. `body` must capture raw pointers, not Views, so that the same lambda is valid on both.
template <class Body> void for_each_index(const char* label, bool on_host, std::int64_t n, const Body& body) {
  if (on_host) Kokkos::parallel_for(label, Kokkos::RangePolicy<HostExecSpace>(0, n), body);
  else Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(0, n), body);
}

template <class Body, class Reducer>
void reduce_over_index(const char* label, bool on_host, std::int64_t n, const Body& body, Reducer&& result) {
  if (on_host) Kokkos::parallel_reduce(label, Kokkos::RangePolicy<HostExecSpace>(0, n), body, result);
  else Kokkos::parallel_reduce(label, Kokkos::RangePolicy<ExecSpace>(0, n), body, result);
}

}  // namespace fsdpp
