#pragma once
// NcclCommunicator: the Communicator for device memory, one NCCL communicator per mesh-dimension group
// (docs/stack-notes.md §3.1-3.3). Collectives run on a stream the communicator owns, so they can overlap compute:
//   - before a collective, the comm stream waits on an event recorded on the compute stream, so the
//     collective reads what earlier compute wrote;
//   - Work::wait() makes the compute stream wait on the collective's completion event. The host does not
//     block; the blocking forms (all_gather(), ...) do.
// The compute stream is the legacy default stream unless set_compute_stream() names another; make_communicator
// names Kokkos' default CUDA instance's stream (Kokkos::Cuda().cuda_stream()), which every fsdpp kernel runs
// on, so callers need no global Kokkos::fence() before a collective (stream_ordered()).
// NOT RUN ON A GPU YET: this ordering was compile-checked only (CUDA 13, Kokkos 4.6.01, no GPU on the build
// machines); tests/gpu/run is the first thing to run on one.
// An asynchronous NCCL failure (a dead peer, a network error) cannot be recovered from: it is printed, the
// NCCL communicator is aborted and the job is ended through abort_job (runtime/fatal.hpp: flight records
// dumped, then MPI_Abort), rather than left to hang. Every collective is handed to the collective watchdog
// (observe/watchdog.hpp), which polls its events and ncclCommGetAsyncError and aborts a collective that outlasts
// comm.timeout_s, and which marks its start and end in the flight recorder.
// Work handles must be waited on or destroyed before their communicator.
#include "fsdpp/comm/communicator.hpp"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>

namespace fsdpp {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `group`, which stays owned by the caller. The current CUDA device must already be set.
  // Throws UsageError when this process sees no CUDA GPU.
  explicit NcclCommunicator(MPI_Comm group);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommBackend backend() const override { return CommBackend::nccl; }
  bool stream_ordered() const override { return true; }
  std::string describe() const override;

  // Affects collectives started afterwards; handles already returned keep the stream they were started with.
  void set_compute_stream(cudaStream_t stream) { compute_ = stream; }

 protected:
  WorkHandle start_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                              const CollectiveTicket& ticket) override;
  WorkHandle start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                  ReduceScatterOptions options, const CollectiveTicket& ticket) override;
  WorkHandle start_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op,
                              const CollectiveTicket& ticket) override;
  WorkHandle start_broadcast(void* buf, std::size_t count, DType dtype, int root, const CollectiveTicket& ticket) override;
  WorkHandle start_barrier(const CollectiveTicket& ticket) override;
  // A grouped ncclSend/ncclRecv per peer (ncclGroupStart/End), on the communicator's stream.
  WorkHandle start_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                                const CollectiveTicket& ticket) override;

  // ncclSend / ncclRecv on the communicator's stream (`tag` unused: messages match in posting order).
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
  template <class Enqueue> WorkHandle launch(const CollectiveTicket& ticket, Enqueue&& enqueue);
  void release() noexcept;

  int rank_ = 0;
  int size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_ = nullptr;  // nullptr: the legacy default stream
  cudaEvent_t ready_ = nullptr;     // reused: cudaStreamWaitEvent captures the event's state when it is called
  int* barrier_buf_ = nullptr;      // one device int, all-reduced by barrier()
  std::shared_ptr<std::atomic<bool>> aborted_;  // ncclCommAbort ran (once, whoever called it)
};

}  // namespace fsdpp
