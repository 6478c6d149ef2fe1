#include "fsdpp/comm/make_communicator.hpp"

#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/runtime/error.hpp"
#ifdef FSDPP_HAVE_CUDA
#include "fsdpp/comm/nccl_communicator.hpp"
#endif

#include <Kokkos_Core.hpp>

namespace fsdpp {

CommBackend parse_comm_backend(const std::string& text) {
  if (text == "mpi") return CommBackend::mpi;
  if (text == "nccl") return CommBackend::nccl;
  throw UsageError(fmt::format("unknown communicator backend '{}': expected 'mpi' or 'nccl'", text));
}

const char* comm_backend_name(CommBackend backend) { return backend == CommBackend::nccl ? "nccl" : "mpi"; }

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

bool backend_available(CommBackend backend) {
#ifdef FSDPP_HAVE_CUDA
  (void)backend;
  return true;
#else
  return backend == CommBackend::mpi;
#endif
}

std::unique_ptr<Communicator> make_communicator(CommBackend backend, MPI_Comm group) {
  switch (backend) {
    case CommBackend::mpi: return std::make_unique<MpiCommunicator>(group);
    case CommBackend::nccl:
#ifdef FSDPP_HAVE_CUDA
    {
      auto nccl = std::make_unique<NcclCommunicator>(group);
#if defined(KOKKOS_ENABLE_CUDA)
      // Collectives wait on an event recorded on the stream fsdpp's kernels run on, and kernels issued after a
      // Work::wait() wait on the collective's completion event: ordered on the device, no global fence.
      // Compile-checked only; not yet run on a GPU.
      if (Kokkos::is_initialized()) nccl->set_compute_stream(Kokkos::Cuda().cuda_stream());
#endif
      return nccl;
    }
#else
      throw UsageError("communicator backend 'nccl' is not in this build: fsdpp was configured without CUDA/NCCL. "
                       "Rebuild with -DFSDPP_ENABLE_CUDA=ON on a machine with the CUDA toolkit and NCCL, "
                       "or use backend 'mpi'");
#endif
  }
  throw Error("unknown communicator backend");
}

}  // namespace fsdpp
