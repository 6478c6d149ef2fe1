#pragma once
// The host collective algorithms behind MpiCommunicator. Plain C++ loops, not Kokkos kernels: they run on the
// communicator's own thread over host buffers, and Kokkos execution spaces are not safe to enter from a
// second thread while the main thread computes.
#include "fsdpp/comm/communicator.hpp"

#include <mpi.h>

#include <vector>

namespace fsdpp::mpi_algorithms {

struct Context {
  MPI_Comm comm;
  int rank;
  int size;
  std::size_t segment_bytes;
  std::size_t max_message_elements;
  std::vector<unsigned char>* scratch;
};

// MPI datatype carrying one element of `dtype` (bf16 travels as 16-bit integers: MPI has no bf16).
MPI_Datatype wire_type(DType dtype);

void all_gather_native(const Context& c, const void* send, void* recv, std::size_t count, DType dtype);
void all_gather_ring(const Context& c, const void* send, void* recv, std::size_t count, DType dtype);

// out = post * sum_i(pre * in_i), over blocks of `count`; `post` already includes 1/size for averages.
void reduce_scatter_native(const Context& c, const void* send, void* recv, std::size_t count, DType dtype,
                           double pre, double post);
void reduce_scatter_ring(const Context& c, const void* send, void* recv, std::size_t count, DType dtype,
                         double pre, double post);

void all_reduce_native(const Context& c, void* buf, std::size_t count, DType dtype, ReduceOp op);
// Sum/avg as a ring reduce-scatter then all-gather, in place; the few elements past the last whole block of
// size() go through all_reduce_native.
void all_reduce_ring(const Context& c, void* buf, std::size_t count, DType dtype, ReduceOp op);
void broadcast_native(const Context& c, void* buf, std::size_t count, DType dtype, int root);

}  // namespace fsdpp::mpi_algorithms
