#include "fsdpp/nn/tensor_parallel.hpp"

#include "fsdpp/nn/language_model.hpp"

#include "fsdpp/runtime/error.hpp"

#include <chrono>

namespace fsdpp {

TensorParallelGroup::TensorParallelGroup(int ranks, int rank, Communicator* comm, bool sequence_parallel)
    : ranks_(ranks), rank_(rank), sequence_parallel_(sequence_parallel && ranks > 1), comm_(comm) {
  FSDPP_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "tensor-parallel rank {} of {}", rank, ranks);
  FSDPP_CHECK(ranks == 1 || comm != nullptr, "a tensor-parallel group of {} ranks needs a communicator", ranks);
}

View1<float> TensorParallelGroup::own_block(const View1<float>& buf, std::size_t count) const {
  const std::size_t first = static_cast<std::size_t>(rank_) * count;
  FSDPP_CHECK(first + count <= buf.extent(0), "block {} of {} elements from a buffer of {}", rank_, count, buf.extent(0));
  return Kokkos::subview(buf, std::make_pair(first, first + count));
}

template <class Op> void TensorParallelGroup::run(std::int64_t& counter, std::size_t bytes, const Op& op) {
  const auto t0 = std::chrono::steady_clock::now();
  // MPI reads the buffers from the host: the kernels that wrote them must have finished. NCCL orders itself.
  if (!comm_->stream_ordered()) Kokkos::fence();
  op();
  counter += 1;
  stats_.bytes += static_cast<std::int64_t>(bytes);
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void TensorParallelGroup::all_reduce(const View1<float>& buf, std::size_t count, ReduceOp op) {
  if (!active()) return;
  FSDPP_CHECK(count <= buf.extent(0), "tensor-parallel all-reduce of {} elements from a buffer of {}", count,
              buf.extent(0));
  run(stats_.all_reduces, count * 4, [&] { comm_->all_reduce(buf.data(), count, op); });
}

void TensorParallelGroup::all_gather(const View1<float>& buf, std::size_t count) {
  if (!active()) return;
  const View1<float> mine = own_block(buf, count);
  run(stats_.all_gathers, count * 4 * static_cast<std::size_t>(ranks_),
      [&] { comm_->all_gather(mine.data(), buf.data(), count); });
}

void TensorParallelGroup::reduce_scatter(const View1<float>& full, const View1<float>& local, std::size_t count) {
  if (!active()) return;
  FSDPP_CHECK(full.extent(0) >= count * static_cast<std::size_t>(ranks_) && local.extent(0) >= count,
              "tensor-parallel reduce-scatter of {} x {} elements from {} into {}", ranks_, count, full.extent(0),
              local.extent(0));
  run(stats_.reduce_scatters, count * 4 * static_cast<std::size_t>(ranks_),
      [&] { comm_->reduce_scatter(full.data(), local.data(), count); });
}

void LanguageModel::apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) {
  FSDPP_REQUIRE(!tp || !tp->active(), "mesh.tp is {}, but {} has no tensor-parallel plan: use mesh.tp: 1 for it",
                tp->ranks(), describe());
}

}  // namespace fsdpp
