#include "fsdpp/comm/nccl_communicator.hpp"

#include "fsdpp/runtime/build_info.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

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

// An async error means a peer or the network failed mid-collective: the other ranks are stuck in NCCL
// kernels, so neither an exception nor ncclCommDestroy (which can block) would end the job. Abort instead.
void abort_on_async_error(ncclComm_t comm, int world_rank) {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm, &async);
  const ncclResult_t error = rc != ncclSuccess ? rc : async;
  if (error == ncclSuccess) return;
  std::fprintf(stderr, "[rank %d] NCCL async error: %s (%s)\n", world_rank, ncclGetErrorString(error),
               nccl_last_error());
  ncclCommAbort(comm);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// Owns one completion event; created before the collective is enqueued, so that no collective is ever in
// flight without a handle that waits for it.
class NcclWork final : public Work {
 public:
  NcclWork(ncclComm_t comm, cudaStream_t compute, int world_rank)
      : comm_(comm), compute_(compute), world_rank_(world_rank) {
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  ~NcclWork() override {
    if (!waited_) {
      try {
        wait();
      } catch (const std::exception& e) {  // a destructor must not throw; the job cannot continue either
        std::fprintf(stderr, "[rank %d] %s\n", world_rank_, e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    cudaEventDestroy(done_);
  }

  cudaEvent_t done() const { return done_; }

  void wait() override {
    abort_on_async_error(comm_, world_rank_);
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    waited_ = true;
  }

  bool is_completed() override {
    const cudaError_t rc = cudaEventQuery(done_);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) throw_cuda_error("cudaEventQuery", rc, __FILE__, __LINE__);
    abort_on_async_error(comm_, world_rank_);
    return false;
  }

  // Blocks the host. Polls rather than cudaEventSynchronize, which would hang forever on a failed peer.
  void synchronize() {
    const auto start = std::chrono::steady_clock::now();
    while (!is_completed()) {
      // Small collectives finish in microseconds: yield at first, then back off to spare the CPU.
      if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    waited_ = true;  // complete, so work on any stream already sees the result
  }

 private:
  ncclComm_t comm_;
  cudaStream_t compute_;
  int world_rank_;
  cudaEvent_t done_ = nullptr;
  bool waited_ = false;
};

// The blocking forms are built on the asynchronous ones, whose handles are always NcclWork.
void wait_on_host(WorkHandle work) { static_cast<NcclWork&>(*work).synchronize(); }

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
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

NcclCommunicator::NcclCommunicator(MPI_Comm group) {
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
  FSDPP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));

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
  } catch (...) {
    release();
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() { release(); }

void NcclCommunicator::release() noexcept {
  bool healthy = true;
  if (comm_) {
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
    } else {
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

template <class Enqueue> WorkHandle NcclCommunicator::launch(Enqueue&& enqueue) {
  auto work = std::make_unique<NcclWork>(comm_, compute_, world_rank_);
  CUDA_CHECK(cudaEventRecord(ready_, compute_));  // the collective must see what compute wrote so far
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  std::forward<Enqueue>(enqueue)();
  CUDA_CHECK(cudaEventRecord(work->done(), stream_));
  return work;
}

WorkHandle NcclCommunicator::all_gather_async(const void* send, void* recv, std::size_t count, DType dtype) {
  require_device_memory(send, count, "all_gather", "send buffer");
  require_device_memory(recv, count, "all_gather", "receive buffer");
  return launch([&] { NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_)); });
}

WorkHandle NcclCommunicator::reduce_scatter_async(const void* send, void* recv, std::size_t count, DType dtype,
                                                  ReduceScatterOptions options) {
  require_arithmetic(dtype, "reduce_scatter");
  FSDPP_CHECK(options.op == ReduceOp::sum || options.op == ReduceOp::avg,
              "reduce_scatter supports sum and avg, not {}", reduce_op_name(options.op));
  require_device_memory(send, count, "reduce_scatter", "send buffer");
  require_device_memory(recv, count, "reduce_scatter", "receive buffer");

  const ncclDataType_t type = nccl_type(dtype);
  const double scale = options.pre_scale * options.post_scale;
  if (scale == 1.0) {
    const ncclRedOp_t op = options.op == ReduceOp::avg ? ncclAvg : ncclSum;
    return launch([&] { NCCL_CHECK(ncclReduceScatter(send, recv, count, type, op, comm_, stream_)); });
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
  return launch([&] { NCCL_CHECK(ncclReduceScatter(send, recv, count, type, op, comm_, stream_)); });
}

WorkHandle NcclCommunicator::all_reduce_async(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  require_arithmetic(dtype, "all_reduce");
  require_device_memory(buf, count, "all_reduce", "buffer");
  const ncclRedOp_t nccl_op = op == ReduceOp::avg ? ncclAvg : op == ReduceOp::max ? ncclMax : ncclSum;
  return launch([&] { NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op, comm_, stream_)); });
}

WorkHandle NcclCommunicator::broadcast_async(void* buf, std::size_t count, DType dtype, int root) {
  FSDPP_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group of {}", root, size_);
  require_device_memory(buf, count, "broadcast", "buffer");
  return launch([&] { NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, stream_)); });
}

// NCCL has no barrier; an all-reduce cannot complete anywhere before every rank has joined it.
WorkHandle NcclCommunicator::barrier_async() {
  return launch([&] { NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream_)); });
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
  wait_on_host(all_gather_async(send, recv, count, dtype));
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                      ReduceScatterOptions options) {
  wait_on_host(reduce_scatter_async(send, recv, count, dtype, options));
}

void NcclCommunicator::all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  wait_on_host(all_reduce_async(buf, count, dtype, op));
}

void NcclCommunicator::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  wait_on_host(broadcast_async(buf, count, dtype, root));
}

void NcclCommunicator::barrier() { wait_on_host(barrier_async()); }

}  // namespace fsdpp
