#pragma once
// MpiCommunicator: collectives on host memory over one MPI communicator (a duplicate, so fsdpp's traffic
// never matches a user's messages on the same group).
//
// Algorithms were chosen by measuring (tests/bench/run collectives); each stays selectable so the choice can
// be re-measured on another machine:
//   all_gather     native: MPI_Allgather            | ring: MPI_Sendrecv around the ring
//   reduce_scatter ring:   segmented MPI_Isend/Irecv ring with a fused local add (default: Open MPI 4.1's
//                          MPI_Reduce_scatter_block ran at ~1 GB/s at every size on our machines)
//                  | native: MPI_Reduce_scatter_block
//   all_reduce     ring: the reduce-scatter ring, then MPI_Allgather, for buffers of at least
//                  ring_all_reduce_min_bytes (measured: at 64 MiB MPI_Allreduce ran 2.5 GB/s, the ring 7; at 32 MiB and
//                  below MPI_Allreduce was as fast or faster once the runtime's malloc tuning recycles its buffers)
//                  | native: MPI_Allreduce (max always uses it)
//   all_to_all_v   MPI_Alltoallv when every count and displacement fits an int (and max_message_elements);
//                  otherwise every peer's block as MPI_Isend/Irecv pieces of at most max_message_elements
// Environment: FSDPP_MPI_ALLGATHER=native|ring, FSDPP_MPI_REDUCE_SCATTER=ring|native,
//              FSDPP_MPI_ALLREDUCE=ring|native, FSDPP_MPI_ALLREDUCE_RING_MIN_BYTES=<bytes>,
//              FSDPP_MPI_SEGMENT_BYTES=<bytes of one ring message>.
#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/comm/ordered_executor.hpp"

#include <mpi.h>

#include <climits>
#include <vector>

namespace fsdpp {

struct MpiAlgorithms {
  enum class AllGather { native, ring };
  enum class ReduceScatter { native, ring };
  enum class AllReduce { native, ring };
  AllGather all_gather = AllGather::native;
  ReduceScatter reduce_scatter = ReduceScatter::ring;
  AllReduce all_reduce = AllReduce::ring;
  std::size_t ring_all_reduce_min_bytes = std::size_t{48} << 20;
  std::size_t segment_bytes = std::size_t{1} << 20;
  // Largest element count handed to one MPI call; lower it only to test the >2^31 path on small buffers.
  std::size_t max_message_elements = INT_MAX;

  static MpiAlgorithms from_environment();
  std::string describe() const;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm group, MpiAlgorithms algorithms = MpiAlgorithms::from_environment());
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommBackend backend() const override { return CommBackend::mpi; }
  std::string describe() const override;
  const MpiAlgorithms& algorithms() const { return algorithms_; }
  void set_algorithms(const MpiAlgorithms& algorithms) { algorithms_ = algorithms; }
  bool asynchronous() const { return executor_.threaded(); }

 protected:
  WorkHandle start_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                              const CollectiveTicket& ticket) override;
  WorkHandle start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                  ReduceScatterOptions options, const CollectiveTicket& ticket) override;
  WorkHandle start_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op,
                              const CollectiveTicket& ticket) override;
  WorkHandle start_broadcast(void* buf, std::size_t count, DType dtype, int root, const CollectiveTicket& ticket) override;
  WorkHandle start_barrier(const CollectiveTicket& ticket) override;
  WorkHandle start_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                                const CollectiveTicket& ticket) override;
  // MPI_Isend / MPI_Irecv of bytes from the calling thread, in pieces of at most max_message_elements elements.
  WorkHandle start_send(const void* buf, std::size_t count, DType dtype, int peer, int tag,
                        const CollectiveTicket& ticket) override;
  WorkHandle start_receive(void* buf, std::size_t count, DType dtype, int peer, int tag,
                           const CollectiveTicket& ticket) override;

  void run_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                      const CollectiveTicket& ticket) override;
  void run_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceScatterOptions options,
                          const CollectiveTicket& ticket) override;
  void run_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op, const CollectiveTicket& ticket) override;
  void run_broadcast(void* buf, std::size_t count, DType dtype, int root, const CollectiveTicket& ticket) override;
  void run_barrier(const CollectiveTicket& ticket) override;
  void run_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                        const CollectiveTicket& ticket) override;

 private:
  // Run on whichever thread executes the collective, inside a CollectiveWatchdog::Scope (start, end, watchdog).
  void do_all_gather(const void* send, void* recv, std::size_t count, DType dtype, const CollectiveTicket& t);
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceScatterOptions o,
                         const CollectiveTicket& t);
  void do_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op, const CollectiveTicket& t);
  void do_broadcast(void* buf, std::size_t count, DType dtype, int root, const CollectiveTicket& t);
  void do_barrier(const CollectiveTicket& t);
  void do_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                       const CollectiveTicket& t);
  WorkHandle start(std::function<void()> task);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MpiAlgorithms algorithms_;
  // Scratch reused across calls (only the executing collective touches it): allocating tens of MiB per call
  // would cost page faults comparable to the transfer itself.
  std::vector<unsigned char> scratch_;
  std::vector<int> alltoall_ints_;            // MPI_Alltoallv's int counts and displacements, 4 x size
  std::vector<MPI_Request> alltoall_requests_;  // the pieces of a large all_to_all_v
  OrderedExecutor executor_;
};

}  // namespace fsdpp
