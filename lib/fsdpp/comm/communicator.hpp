#pragma once
// Communicator: the collectives of one group of ranks (one DeviceMesh dimension), behind one interface with a
// backend per kind of memory:
//   MpiCommunicator  — host memory, Open MPI (comm/mpi_communicator.hpp)
//   NcclCommunicator — device memory, NCCL on its own CUDA stream (comm/nccl_communicator.hpp)
// Every operation has an asynchronous form returning a Work handle, and a blocking form that starts and
// waits. Counts are size_t: they may exceed 2^31 elements (backends chunk what their library cannot take).
// Buffer layouts, with n = size() ranks and `count` elements per rank:
//   all_gather:     send [count]     -> recv [n * count], rank r's block at r * count.
//                   In place when send == recv + rank() * count.
//   reduce_scatter: send [n * count] -> recv [count], block rank() of the reduction over ranks.
//   all_reduce:     buf [count], in place.   broadcast: buf [count], in place, from `root`.
#include "fsdpp/tensor/bf16.hpp"
#include "fsdpp/tensor/dtype.hpp"

#include <cstddef>
#include <memory>
#include <string>

namespace fsdpp {

enum class CommBackend { mpi, nccl };
CommBackend parse_comm_backend(const std::string& text);  // "mpi" | "nccl"
const char* comm_backend_name(CommBackend backend);

enum class ReduceOp { sum, avg, max };
const char* reduce_op_name(ReduceOp op);

// Reduce-scatter scaling, as FSDP's gradient reduction needs it: out = post_scale * op_i(pre_scale * in_i),
// where avg divides the sum by size(). bf16 inputs are accumulated in f32.
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::sum;  // sum or avg
  double pre_scale = 1.0;
  double post_scale = 1.0;
};

// A started collective. wait() returns once the result may be used (on the host for MPI; by work issued
// afterwards on the compute stream for NCCL) and rethrows the collective's error, if it failed.
// Destroying a handle that was not waited on waits, so buffers never outlive their collective.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};
using WorkHandle = std::unique_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual CommBackend backend() const = 0;
  virtual std::string describe() const = 0;  // backend, algorithms, group size: for logs and benchmarks
  // What the group is, for messages such as the collective watchdog's: the mesh dimension ("dp_shard").
  const std::string& label() const { return label_; }
  void set_label(std::string label) { label_ = std::move(label); }
  // True when a collective is ordered after the device work issued before it by the backend itself (NCCL waits
  // on an event of Kokkos' stream), so callers need no Kokkos::fence() first; false when the collective reads
  // the buffers from the host or another thread (MPI), which must see finished kernels.
  virtual bool stream_ordered() const { return false; }

  virtual WorkHandle all_gather_async(const void* send, void* recv, std::size_t count, DType dtype) = 0;
  virtual WorkHandle reduce_scatter_async(const void* send, void* recv, std::size_t count, DType dtype,
                                          ReduceScatterOptions options = {}) = 0;
  virtual WorkHandle all_reduce_async(void* buf, std::size_t count, DType dtype, ReduceOp op) = 0;
  virtual WorkHandle broadcast_async(void* buf, std::size_t count, DType dtype, int root) = 0;
  virtual WorkHandle barrier_async() = 0;

  // Blocking forms. Backends may override them to skip the asynchronous machinery.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
    all_gather_async(send, recv, count, dtype)->wait();
  }
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                              ReduceScatterOptions options = {}) {
    reduce_scatter_async(send, recv, count, dtype, options)->wait();
  }
  virtual void all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
    all_reduce_async(buf, count, dtype, op)->wait();
  }
  virtual void broadcast(void* buf, std::size_t count, DType dtype, int root) {
    broadcast_async(buf, count, dtype, root)->wait();
  }
  virtual void barrier() { barrier_async()->wait(); }

  // Typed conveniences: the dtype follows from the element type.
  template <class T> void all_gather(const T* send, T* recv, std::size_t count) {
    all_gather(send, recv, count, dtype_of_v<T>);
  }
  template <class T> void reduce_scatter(const T* send, T* recv, std::size_t count, ReduceScatterOptions o = {}) {
    reduce_scatter(send, recv, count, dtype_of_v<T>, o);
  }
  template <class T> void all_reduce(T* buf, std::size_t count, ReduceOp op) {
    all_reduce(buf, count, dtype_of_v<T>, op);
  }
  template <class T> void broadcast(T* buf, std::size_t count, int root) {
    broadcast(buf, count, dtype_of_v<T>, root);
  }

 private:
  std::string label_ = "a group";
};

}  // namespace fsdpp
