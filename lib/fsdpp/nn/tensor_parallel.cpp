#include "fsdpp/nn/tensor_parallel.hpp"

#include "fsdpp/nn/language_model.hpp"

#include "fsdpp/runtime/error.hpp"

#include <chrono>

namespace fsdpp {

TensorParallelGroup::TensorParallelGroup(int ranks, int rank, Communicator* comm)
    : ranks_(ranks), rank_(rank), comm_(comm) {
  FSDPP_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "tensor-parallel rank {} of {}", rank, ranks);
  FSDPP_CHECK(ranks == 1 || comm != nullptr, "a tensor-parallel group of {} ranks needs a communicator", ranks);
}

void TensorParallelGroup::all_reduce(const View1<float>& buf, std::size_t count, ReduceOp op) {
  if (!active()) return;
  FSDPP_CHECK(count <= buf.extent(0), "tensor-parallel all-reduce of {} elements from a buffer of {}", count,
              buf.extent(0));
  const auto t0 = std::chrono::steady_clock::now();
  // MPI reads the buffer from the host: the kernels that wrote it must have finished. NCCL orders itself.
  if (!comm_->stream_ordered()) Kokkos::fence();
  comm_->all_reduce(buf.data(), count, op);
  stats_.all_reduces += 1;
  stats_.bytes += static_cast<std::int64_t>(count) * 4;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void LanguageModel::apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) {
  FSDPP_REQUIRE(!tp || !tp->active(), "mesh.tp is {}, but {} has no tensor-parallel plan: use mesh.tp: 1 for it",
                tp->ranks(), describe());
}

}  // namespace fsdpp
