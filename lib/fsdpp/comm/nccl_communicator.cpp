#include "fsdpp/comm/nccl_communicator.hpp"

#include "fsdpp/comm/group_members.hpp"
#include "fsdpp/runtime/build_info.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/fatal.hpp"
#include "fsdpp/observe/watchdog.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <thread>
#include <utility>

// ncclAvg and ncclRedOpCreatePreMulSum carry FSDP's gradient averaging; older NCCL would need a scaling kernel.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 11, 0)
#error "fsdpp needs NCCL 2.11 or newer"
#endif

namespace fsdpp {
namespace {

const char* nccl_last_error() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  return ncclGetLastError(nullptr);
#else
  return "no detail before NCCL 2.13";
#endif
}

[[noreturn]] void throw_nccl_error(const char* call, ncclResult_t rc, const char* file, int line) {
  std::string message = fmt::format("{} failed: {} ({})", call, ncclGetErrorString(rc), nccl_last_error());
  if (rc == ncclUnhandledCudaError)  // NCCL's own text does not say which CUDA error it hit
    message += fmt::format("; last CUDA error: {}", cudaGetErrorString(cudaPeekAtLastError()));
  throw Error(located(file, line, message));
}

[[noreturn]] void throw_cuda_error(const char* call, cudaError_t rc, const char* file, int line) {
  throw Error(located(file, line, fmt::format("{} failed: {}", call, cudaGetErrorString(rc))));
}

}  // namespace
}  // namespace fsdpp

#define NCCL_CHECK(call)                                                                               \
  do {                                                                                                 \
    const ncclResult_t fsdpp_nccl_rc_ = (call);                                                        \
    if (fsdpp_nccl_rc_ != ncclSuccess) ::fsdpp::throw_nccl_error(#call, fsdpp_nccl_rc_, __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK(call)                                                                               \
  do {                                                                                                 \
    const cudaError_t fsdpp_cuda_rc_ = (call);                                                         \
    if (fsdpp_cuda_rc_ != cudaSuccess) ::fsdpp::throw_cuda_error(#call, fsdpp_cuda_rc_, __FILE__, __LINE__); \
  } while (0)

namespace fsdpp {
namespace {

const char* async_error_text(ncclComm_t comm) {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm, &async);
  const ncclResult_t error = rc != ncclSuccess ? rc : async;
  return error == ncclSuccess ? nullptr : ncclGetErrorString(error);
}

// One collective on the comm stream as the watchdog and the Work handle observe it: an event recorded before it
// and one after it, and the communicator, for its asynchronous errors. Shared by the handle and the watchdog
// (observe/watchdog.hpp), so the events live as long as either looks at them.
class NcclCompletion final : public DeviceCompletion {
 public:
  NcclCompletion(ncclComm_t comm, std::shared_ptr<std::atomic<bool>> aborted) : comm_(comm), aborted_(std::move(aborted)) {
    CUDA_CHECK(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~NcclCompletion() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(done_);
  }
  NcclCompletion(const NcclCompletion&) = delete;
  NcclCompletion& operator=(const NcclCompletion&) = delete;

  cudaEvent_t start_event() const { return start_; }
  cudaEvent_t done_event() const { return done_; }

  // The done event first: once it has fired the communicator is not needed (and may be gone).
  Progress poll(std::string& error) override {
    if (finished(done_, error)) return Progress::done;
    if (!error.empty()) return Progress::failed;
    if (const char* async = async_error_text(comm_)) {
      error = fmt::format("{} ({})", async, nccl_last_error());
      return Progress::failed;
    }
    return finished(start_, error) ? Progress::running : Progress::queued;
  }

  // Once per communicator, whoever comes first (the watchdog, a failing wait, teardown).
  void abort() override {
    if (!aborted_->exchange(true)) ncclCommAbort(comm_);
  }

 private:
  static bool finished(cudaEvent_t event, std::string& error) {
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) error = fmt::format("cudaEventQuery failed: {}", cudaGetErrorString(rc));
    return false;
  }

  ncclComm_t comm_;
  std::shared_ptr<std::atomic<bool>> aborted_;
  cudaEvent_t start_ = nullptr, done_ = nullptr;
};

// An asynchronous failure means a peer or the network failed mid-collective: the other ranks are stuck in NCCL
// kernels, so neither an exception nor ncclCommDestroy (which can block) would end the job. Abort instead, with
// the flight recorder's dumps (runtime/fatal.hpp).
[[noreturn]] void abort_on_failure(NcclCompletion& completion, const CollectiveTicket& ticket, const std::string& error) {
  completion.abort();
  abort_job(fmt::format("NCCL: {} failed: {}. Aborting the job", describe_collective(ticket), error));
}

// The handle of one collective; its completion exists before the collective is enqueued, so that no
// collective is ever in flight without a handle that waits for it.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCompletion> completion, cudaStream_t compute, const CollectiveTicket& ticket)
      : completion_(std::move(completion)), compute_(compute), ticket_(ticket) {}
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  ~NcclWork() override {
    if (!waited_) {
      try {
        wait();
      } catch (const std::exception& e) {  // a destructor must not throw; the job cannot continue either
        abort_job(e.what());
      }
    }
  }

  void wait() override {
    check();
    CUDA_CHECK(cudaStreamWaitEvent(compute_, completion_->done_event(), 0));
    waited_ = true;
  }

  bool is_completed() override { return check() == DeviceCompletion::Progress::done; }

  // Blocks the host. Polls rather than cudaEventSynchronize, which would hang forever on a failed peer; the
  // watchdog ends a wait that outlasts comm.timeout_s.
  void synchronize() {
    const auto start = std::chrono::steady_clock::now();
    while (!is_completed()) {
      // Small collectives finish in microseconds: yield at first, then back off to spare the CPU.
      if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    FlightRecorder::completed(ticket_);
    waited_ = true;  // complete, so work on any stream already sees the result
  }

 private:
  DeviceCompletion::Progress check() {
    std::string error;
    const DeviceCompletion::Progress progress = completion_->poll(error);
    if (progress == DeviceCompletion::Progress::failed) abort_on_failure(*completion_, ticket_, error);
    return progress;
  }

  std::shared_ptr<NcclCompletion> completion_;
  cudaStream_t compute_;
  CollectiveTicket ticket_;
  bool waited_ = false;
};

// The blocking forms are built on the asynchronous ones, whose handles are always NcclWork.
void wait_on_host(WorkHandle work) { static_cast<NcclWork&>(*work).synchronize(); }

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::i64: return ncclInt64;
    case DType::bytes: return ncclUint8;
  }
  throw Error(fmt::format("unknown dtype {}", static_cast<int>(dtype)));
}

void require_arithmetic(DType dtype, const char* op) {
  FSDPP_CHECK(dtype_is_arithmetic(dtype), "{}: cannot reduce raw bytes (dtype {})", op, dtype_name(dtype));
}

// NCCL given a host pointer fails deep inside a kernel with an illegal address; say what to do instead.
void require_device_memory(const void* ptr, std::size_t count, const char* op, const char* what) {
  if (count == 0) return;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer is host memory; do not leave the error for the next CUDA call
    attributes.type = cudaMemoryTypeUnregistered;
  }
  FSDPP_CHECK(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
              "{}: the {} is not CUDA device memory. The NCCL backend needs device memory; use the "
              "'mpi' communicator backend for host buffers",
              op, what);
}

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm group)
    : Communicator(CommBackend::nccl), aborted_(std::make_shared<std::atomic<bool>>(false)) {
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0) {
    cudaGetLastError();
    throw UsageError(fmt::format(
        "NCCL backend needs a CUDA GPU, but this process sees none ({}). On CPU-only machines use the 'mpi' "
        "communicator backend",
        rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices"));
  }
  FSDPP_MPI_CHECK(MPI_Comm_rank(group, &rank_));
  FSDPP_MPI_CHECK(MPI_Comm_size(group, &size_));

  try {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&barrier_buf_), sizeof *barrier_buf_));
    CUDA_CHECK(cudaMemsetAsync(barrier_buf_, 0, sizeof *barrier_buf_, stream_));

    // The id is an opaque blob: rank 0 makes it, MPI carries it (docs/stack-notes.md §3.1).
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    FSDPP_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, group));
    NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
    set_members(world_ranks_of(group));
  } catch (...) {
    release();
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() { release(); }

void NcclCommunicator::release() noexcept {
  bool healthy = true;
  if (comm_) {
    CollectiveWatchdog::forget_communicator(flight_id());  // it must not poll this communicator once it is gone
    // Poll rather than cudaStreamSynchronize: a peer failing now must not turn teardown into a hang.
    while (healthy && cudaStreamQuery(stream_) == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      healthy = ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async == ncclSuccess;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (healthy) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
      ncclCommFinalize(comm_);  // flushes outstanding operations so Destroy releases cleanly
#endif
      ncclCommDestroy(comm_);
    } else if (!aborted_->exchange(true)) {
      ncclCommAbort(comm_);  // Finalize/Destroy could block forever on a failed communicator
    }
    comm_ = nullptr;
  }
  if (stream_ && healthy) cudaStreamSynchronize(stream_);  // the barrier buffer may still be in use
  if (barrier_buf_) cudaFree(barrier_buf_);
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
  barrier_buf_ = nullptr;
  ready_ = nullptr;
  stream_ = nullptr;
}

std::string NcclCommunicator::describe() const {
  return fmt::format("nccl (size {}, NCCL {})", size_, nccl_library_version());
}

template <class Enqueue> WorkHandle NcclCommunicator::launch(const CollectiveTicket& ticket, Enqueue&& enqueue) {
  auto completion = std::make_shared<NcclCompletion>(comm_, aborted_);
  auto work = std::make_unique<NcclWork>(completion, compute_, ticket);
  CUDA_CHECK(cudaEventRecord(ready_, compute_));  // the collective must see what compute wrote so far
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  CUDA_CHECK(cudaEventRecord(completion->start_event(), stream_));
  std::forward<Enqueue>(enqueue)();
  CUDA_CHECK(cudaEventRecord(completion->done_event(), stream_));
  CollectiveWatchdog::watch_device(ticket, completion);  // its start and end in the flight record; its timeout
  return work;
}

WorkHandle NcclCommunicator::start_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                                              const CollectiveTicket& ticket) {
  require_device_memory(send, count, "all_gather", "send buffer");
  require_device_memory(recv, count, "all_gather", "receive buffer");
  return launch(ticket, [&] { NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_)); });
}

WorkHandle NcclCommunicator::start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                                  ReduceScatterOptions options, const CollectiveTicket& ticket) {
  require_arithmetic(dtype, "reduce_scatter");
  FSDPP_CHECK(options.op == ReduceOp::sum || options.op == ReduceOp::avg,
              "reduce_scatter supports sum and avg, not {}", reduce_op_name(options.op));
  require_device_memory(send, count, "reduce_scatter", "send buffer");
  require_device_memory(recv, count, "reduce_scatter", "receive buffer");

  const ncclDataType_t type = nccl_type(dtype);
  const double scale = options.pre_scale * options.post_scale;
  if (scale == 1.0) {
    const ncclRedOp_t op = options.op == ReduceOp::avg ? ncclAvg : ncclSum;
    return launch(ticket, [&] { NCCL_CHECK(ncclReduceScatter(send, recv, count, type, op, comm_, stream_)); });
  }
  // post * sum(pre * x) == sum(pre * post * x): one pre-multiplied sum, no extra scaling pass.
  const double factor = options.op == ReduceOp::avg ? scale / size_ : scale;
  float f32 = static_cast<float>(factor);
  double f64 = factor;
  std::uint16_t bf16_bits = bf16::from_float(f32).bits;
  void* scalar = dtype == DType::f64 ? static_cast<void*>(&f64)
                 : dtype == DType::bf16 ? static_cast<void*>(&bf16_bits)
                                        : static_cast<void*>(&f32);
  ncclRedOp_t op;
  NCCL_CHECK(ncclRedOpCreatePreMulSum(&op, scalar, type, ncclScalarHostImmediate, comm_));
  // NCCL allows destroying the op as soon as the call that uses it has returned, i.e. once it is enqueued.
  struct OpGuard {
    ncclRedOp_t op;
    ncclComm_t comm;
    ~OpGuard() { ncclRedOpDestroy(op, comm); }
  } guard{op, comm_};
  return launch(ticket, [&] { NCCL_CHECK(ncclReduceScatter(send, recv, count, type, op, comm_, stream_)); });
}

WorkHandle NcclCommunicator::start_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op,
                                              const CollectiveTicket& ticket) {
  require_arithmetic(dtype, "all_reduce");
  require_device_memory(buf, count, "all_reduce", "buffer");
  const ncclRedOp_t nccl_op = op == ReduceOp::avg ? ncclAvg : op == ReduceOp::max ? ncclMax : ncclSum;
  return launch(ticket,
                [&] { NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op, comm_, stream_)); });
}

WorkHandle NcclCommunicator::start_broadcast(void* buf, std::size_t count, DType dtype, int root,
                                             const CollectiveTicket& ticket) {
  FSDPP_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group of {}", root, size_);
  require_device_memory(buf, count, "broadcast", "buffer");
  return launch(ticket, [&] { NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, stream_)); });
}

// NCCL has no barrier; an all-reduce cannot complete anywhere before every rank has joined it.
WorkHandle NcclCommunicator::start_barrier(const CollectiveTicket& ticket) {
  return launch(ticket, [&] {
    NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream_));
  });
}

// NCCL reads the counts while enqueuing, so the caller's arrays need only outlive this call. Zero-count peers
// post nothing; NCCL matches each pair's send and receive inside the group, self included.
WorkHandle NcclCommunicator::start_send(const void* buf, std::size_t count, DType dtype, int peer, int tag,
                                         const CollectiveTicket& ticket) {
  (void)tag;
  require_device_memory(buf, count, "send", "buffer");
  return launch(ticket, [&] { NCCL_CHECK(ncclSend(buf, count, nccl_type(dtype), peer, comm_, stream_)); });
}

WorkHandle NcclCommunicator::start_receive(void* buf, std::size_t count, DType dtype, int peer, int tag,
                                            const CollectiveTicket& ticket) {
  (void)tag;
  require_device_memory(buf, count, "receive", "buffer");
  return launch(ticket, [&] { NCCL_CHECK(ncclRecv(buf, count, nccl_type(dtype), peer, comm_, stream_)); });
}

WorkHandle NcclCommunicator::start_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                                                const CollectiveTicket& ticket) {
  const std::size_t elem = dtype_size(dtype);
  std::size_t received = 0;
  for (int p = 0; p < size_; ++p) received += counts.recv_counts[p];
  require_device_memory(send, all_to_all_send_total(counts, size_), "all_to_all_v", "send buffer");
  require_device_memory(recv, received, "all_to_all_v", "receive buffer");
  const ncclDataType_t type = nccl_type(dtype);
  return launch(ticket, [&] {
    NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      if (counts.send_counts[p] > 0)
        NCCL_CHECK(ncclSend(static_cast<const unsigned char*>(send) + counts.send_displs[p] * elem,
                            counts.send_counts[p], type, p, comm_, stream_));
      if (counts.recv_counts[p] > 0)
        NCCL_CHECK(ncclRecv(static_cast<unsigned char*>(recv) + counts.recv_displs[p] * elem, counts.recv_counts[p],
                            type, p, comm_, stream_));
    }
    NCCL_CHECK(ncclGroupEnd());
  });
}

void NcclCommunicator::run_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                                        const CollectiveTicket& ticket) {
  wait_on_host(start_all_to_all_v(send, recv, counts, dtype, ticket));
}

void NcclCommunicator::run_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                                      const CollectiveTicket& ticket) {
  wait_on_host(start_all_gather(send, recv, count, dtype, ticket));
}

void NcclCommunicator::run_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                          ReduceScatterOptions options, const CollectiveTicket& ticket) {
  wait_on_host(start_reduce_scatter(send, recv, count, dtype, options, ticket));
}

void NcclCommunicator::run_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op,
                                      const CollectiveTicket& ticket) {
  wait_on_host(start_all_reduce(buf, count, dtype, op, ticket));
}

void NcclCommunicator::run_broadcast(void* buf, std::size_t count, DType dtype, int root,
                                     const CollectiveTicket& ticket) {
  wait_on_host(start_broadcast(buf, count, dtype, root, ticket));
}

void NcclCommunicator::run_barrier(const CollectiveTicket& ticket) { wait_on_host(start_barrier(ticket)); }

}  // namespace fsdpp
