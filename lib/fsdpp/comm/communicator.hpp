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
//   all_to_all_v:   per peer p, send [send_counts[p]] from send + send_displs[p] to p, and recv
//                   [recv_counts[p]] from p into recv + recv_displs[p] (elements; AllToAllCounts below). Not in
//                   place. Every rank's recv_counts[p] must equal peer p's send_counts[rank()].
//
// The public operations are not virtual: each one first goes through issue(), which numbers it on this
// communicator, counts its traffic and records it in the flight recorder (observe/flight_recorder.hpp), and only
// then hands it to the backend's start_*/run_* with the ticket the backend reports its start and end with. One
// place for that, whatever the backend.
#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/tensor/bf16.hpp"
#include "fsdpp/tensor/dtype.hpp"

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

enum class CommBackend { mpi, nccl };
CommBackend parse_comm_backend(const std::string& text);  // "mpi" | "nccl"
const char* comm_backend_name(CommBackend backend);

// Bytes a flat ring sends from group rank `rank` to rank + 1 for one collective of `count` elements per rank on
// `ranks` ranks: all_gather and reduce_scatter (ranks - 1) blocks, all_reduce 2 (ranks - 1) / ranks of the
// buffer, broadcast the buffer unless the next rank is the root. fsdpp's MPI reduce-scatter ring passes f32
// partial sums after its first hop when reducing bf16 (mpi_algorithms.cpp), so those hops count 4 bytes.
std::uint64_t ring_bytes_sent(CollectiveOp op, std::size_t count, DType dtype, int ranks, int rank, int root,
                              CommBackend backend);

enum class ReduceOp { sum, avg, max };
const char* reduce_op_name(ReduceOp op);

// Reduce-scatter scaling, as FSDP's gradient reduction needs it: out = post_scale * op_i(pre_scale * in_i),
// where avg divides the sum by size(). bf16 inputs are accumulated in f32.
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::sum;  // sum or avg
  double pre_scale = 1.0;
  double post_scale = 1.0;
};

// The per-peer layout of one all_to_all_v: four arrays of size() elements each, owned by the caller, which must
// keep them alive (and unchanged) until the collective completes: an asynchronous MPI exchange reads them on the
// communication thread. Pointers rather than vectors so a caller that exchanges every step allocates nothing.
struct AllToAllCounts {
  const std::size_t* send_counts = nullptr;
  const std::size_t* send_displs = nullptr;
  const std::size_t* recv_counts = nullptr;
  const std::size_t* recv_displs = nullptr;
};

// Elements this rank sends in all, and bytes it sends to the other ranks (what the traffic counters add up for
// an all_to_all_v: each peer's block goes straight to that peer, not around a ring).
std::size_t all_to_all_send_total(const AllToAllCounts& counts, int ranks);
std::uint64_t all_to_all_bytes_to_peers(const AllToAllCounts& counts, int ranks, int rank, DType dtype);

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
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual CommBackend backend() const = 0;
  virtual std::string describe() const = 0;  // backend, algorithms, group size: for logs and benchmarks
  // What the group is, for messages such as the collective watchdog's: the mesh dimension ("dp_shard").
  const std::string& label() const { return label_; }
  void set_label(std::string label);
  // This communicator in the flight recorder's registry, and the collectives issued on it so far.
  std::uint32_t flight_id() const { return flight_id_; }
  std::uint64_t issued() const { return issued_.load(std::memory_order_relaxed); }
  // True when a collective is ordered after the device work issued before it by the backend itself (NCCL waits
  // on an event of Kokkos' stream), so callers need no Kokkos::fence() first; false when the collective reads
  // the buffers from the host or another thread (MPI), which must see finished kernels.
  virtual bool stream_ordered() const { return false; }

  WorkHandle all_gather_async(const void* send, void* recv, std::size_t count, DType dtype);
  WorkHandle reduce_scatter_async(const void* send, void* recv, std::size_t count, DType dtype,
                                  ReduceScatterOptions options = {});
  WorkHandle all_reduce_async(void* buf, std::size_t count, DType dtype, ReduceOp op);
  WorkHandle barrier_async();
  WorkHandle all_to_all_v_async(const void* send, void* recv, const AllToAllCounts& counts, DType dtype);

  // Point to point (a pipeline's activations and gradients): `count` elements to, or from, group rank `peer`.
  // Messages between two ranks match in the order they are posted: NCCL has no tags, and its sends may wait for
  // their receive on a stream that runs one operation after another, so callers post in an order both ends agree
  // on (parallel/pipeline_messages.hpp); MPI matches `tag` too, which NCCL ignores. The send's buffer must stay
  // unchanged, and the receive's unread, until wait().
  WorkHandle send_async(const void* buf, std::size_t count, DType dtype, int peer, int tag);
  WorkHandle receive_async(void* buf, std::size_t count, DType dtype, int peer, int tag);

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype);
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceScatterOptions options = {});
  void all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op);
  void broadcast(void* buf, std::size_t count, DType dtype, int root);
  void barrier();
  void all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype);

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
  template <class T> void all_to_all_v(const T* send, T* recv, const AllToAllCounts& counts) {
    all_to_all_v(send, recv, counts, dtype_of_v<T>);
  }

 protected:
  // Registers with the flight recorder under `backend`'s name.
  explicit Communicator(CommBackend backend);
  // The members' world ranks, in group order, for the flight recorder and the traffic counters.
  void set_members(std::vector<int> world_ranks);

  // The backends. The asynchronous forms start the collective; the blocking ones may skip the asynchronous
  // machinery (the default waits on the asynchronous form). Either reports the ticket's start and end:
  // a CollectiveWatchdog::Scope (watchdog.hpp) for collectives the host runs, the watchdog's device tracking
  // (DeviceCompletion) for NCCL.
  virtual WorkHandle start_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                                      const CollectiveTicket& ticket) = 0;
  virtual WorkHandle start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                          ReduceScatterOptions options, const CollectiveTicket& ticket) = 0;
  virtual WorkHandle start_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op,
                                      const CollectiveTicket& ticket) = 0;
  virtual WorkHandle start_broadcast(void* buf, std::size_t count, DType dtype, int root,
                                     const CollectiveTicket& ticket) = 0;
  virtual WorkHandle start_barrier(const CollectiveTicket& ticket) = 0;
  // Backends without messages (a planning mesh) keep these defaults, which refuse.
  virtual WorkHandle start_send(const void* buf, std::size_t count, DType dtype, int peer, int tag,
                                const CollectiveTicket& ticket);
  virtual WorkHandle start_receive(void* buf, std::size_t count, DType dtype, int peer, int tag,
                                   const CollectiveTicket& ticket);
  // Backends without an all-to-all (a planning mesh) keep this default, which refuses.
  virtual WorkHandle start_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                                        const CollectiveTicket& ticket);
  virtual void run_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                              const CollectiveTicket& ticket) {
    start_all_gather(send, recv, count, dtype, ticket)->wait();
  }
  virtual void run_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                  ReduceScatterOptions options, const CollectiveTicket& ticket) {
    start_reduce_scatter(send, recv, count, dtype, options, ticket)->wait();
  }
  virtual void run_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op, const CollectiveTicket& ticket) {
    start_all_reduce(buf, count, dtype, op, ticket)->wait();
  }
  virtual void run_broadcast(void* buf, std::size_t count, DType dtype, int root, const CollectiveTicket& ticket) {
    start_broadcast(buf, count, dtype, root, ticket)->wait();
  }
  virtual void run_barrier(const CollectiveTicket& ticket) { start_barrier(ticket)->wait(); }
  virtual void run_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                                const CollectiveTicket& ticket) {
    start_all_to_all_v(send, recv, counts, dtype, ticket)->wait();
  }

 private:
  // Numbers, counts and records one collective; nullopt when a test's fault switch makes this rank skip it
  // (observe/collective_faults.hpp).
  // `bytes_out`: the bytes counted as sent to other ranks; by default ring_bytes_sent.
  std::optional<CollectiveTicket> issue(CollectiveOp op, std::size_t count, DType dtype, int root,
                                        std::optional<std::uint64_t> bytes_out);
  template <class Start>
  WorkHandle issue_async(CollectiveOp op, std::size_t count, DType dtype, int root, Start&& start,
                         std::optional<std::uint64_t> bytes_out = std::nullopt);
  template <class Run>
  void issue_blocking(CollectiveOp op, std::size_t count, DType dtype, int root, Run&& run,
                      std::optional<std::uint64_t> bytes_out = std::nullopt);

  std::string label_ = "a group";
  std::uint32_t flight_id_ = 0;
  std::atomic<std::uint64_t> issued_{0};
};

}  // namespace fsdpp
