#include "fsdpp/nn/tensor_parallel.hpp"

#include "fsdpp/nn/kernels/residual.hpp"
#include "fsdpp/nn/kernels/vocab_parallel.hpp"
#include "fsdpp/nn/language_model.hpp"

#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <chrono>

namespace fsdpp {

TensorParallelGroup::TensorParallelGroup(int ranks, int rank, Communicator* comm, bool sequence_parallel,
                                         std::string mesh_dim, bool overlap)
    : ranks_(ranks), rank_(rank), sequence_parallel_(sequence_parallel && ranks > 1), overlap_(overlap),
      mesh_dim_(std::move(mesh_dim)), comm_(comm) {
  FSDPP_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "tensor-parallel rank {} of {}", rank, ranks);
  FSDPP_CHECK(ranks == 1 || comm != nullptr, "a tensor-parallel group of {} ranks needs a communicator", ranks);
}

View1<float> TensorParallelGroup::own_block(const View1<float>& buf, std::size_t count) const {
  const std::size_t first = static_cast<std::size_t>(rank_) * count;
  FSDPP_CHECK(first + count <= buf.extent(0), "block {} of {} elements from a buffer of {}", rank_, count, buf.extent(0));
  return Kokkos::subview(buf, std::make_pair(first, first + count));
}

// The scratch buffers a started collective reads and writes are shared by the blocks: the next collective (and
// the next block's kernels) may only come after its wait().
void TensorParallelGroup::check_none_in_flight(const char* what) const {
  FSDPP_CHECK(in_flight_ == 0, "tensor-parallel {} while {} started collective(s) were not waited: every _async "
              "form's TpPending must be passed to wait() in the backward that started it", what, in_flight_);
}

template <class Op> void TensorParallelGroup::run(std::int64_t& counter, std::size_t bytes, const Op& op) {
  check_none_in_flight("collective");
  const auto t0 = std::chrono::steady_clock::now();
  // MPI reads the buffers from the host: the kernels that wrote them must have finished. NCCL orders itself.
  if (!comm_->stream_ordered()) Kokkos::fence();
  op();
  counter += 1;
  stats_.bytes += static_cast<std::int64_t>(bytes);
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// run()'s first half: the fence (on this thread, before the collective's thread reads the buffers), the counts;
// the time to the collective's start counts as exposed, the rest is wait()'s.
template <class Start>
TpPending TensorParallelGroup::start(std::int64_t& counter, std::size_t bytes, const View1<float>& result,
                                     const Start& begin) {
  check_none_in_flight("collective started");
  const auto t0 = std::chrono::steady_clock::now();
  if (!comm_->stream_ordered()) Kokkos::fence();
  TpPending pending;
  pending.work = begin();
  pending.result = result;
  pending.open = true;
  ++in_flight_;
  counter += 1;
  stats_.bytes += static_cast<std::int64_t>(bytes);
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return pending;
}

// Without overlap (or tp 1) an _async form has already run blocking: only the bookkeeping of a started one.
TpPending TensorParallelGroup::ran_blocking(const View1<float>& result) {
  TpPending pending;
  pending.result = result;
  pending.open = true;
  ++in_flight_;
  return pending;
}

View1<float> TensorParallelGroup::wait(TpPending& pending) {
  FSDPP_CHECK(pending.open, "tensor-parallel wait() on a collective that was not started or was already waited");
  pending.open = false;
  --in_flight_;
  if (pending.work) {
    const auto t0 = std::chrono::steady_clock::now();
    WorkHandle work = std::move(pending.work);
    work->wait();
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return pending.result;
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

TpPending TensorParallelGroup::all_gather_async(const View1<float>& buf, std::size_t count) {
  if (!active() || !overlap_) {
    all_gather(buf, count);
    return ran_blocking(buf);
  }
  const View1<float> mine = own_block(buf, count);
  return start(stats_.all_gathers, count * 4 * static_cast<std::size_t>(ranks_), buf,
               [&] { return comm_->all_gather_async(mine.data(), buf.data(), count, dtype_of_v<float>); });
}

namespace {
void check_reduce_scatter(const View1<float>& full, const View1<float>& local, std::size_t count, int ranks) {
  FSDPP_CHECK(full.extent(0) >= count * static_cast<std::size_t>(ranks) && local.extent(0) >= count,
              "tensor-parallel reduce-scatter of {} x {} elements from {} into {}", ranks, count, full.extent(0),
              local.extent(0));
}
}  // namespace

void TensorParallelGroup::reduce_scatter(const View1<float>& full, const View1<float>& local, std::size_t count) {
  if (!active()) return;
  check_reduce_scatter(full, local, count, ranks_);
  run(stats_.reduce_scatters, count * 4 * static_cast<std::size_t>(ranks_),
      [&] { comm_->reduce_scatter(full.data(), local.data(), count); });
}

void TensorParallelGroup::reduce_row_parallel(const View1<float>& partial, const View1<float>& out, int N, int OC) {
  if (!sequence_parallel_) return all_reduce(partial, static_cast<std::size_t>(N) * OC, ReduceOp::sum);
  reduce_scatter(partial, out, static_cast<std::size_t>(local_rows(N)) * OC);
}

View1<float> TensorParallelGroup::gather_rows(const View1<float>& local, const View1<float>& buffer, int N, int C) {
  if (!sequence_parallel_) return local;
  const std::size_t count = static_cast<std::size_t>(local_rows(N)) * C;
  Kokkos::deep_copy(own_block(buffer, count), Kokkos::subview(local, std::make_pair(std::size_t{0}, count)));
  all_gather(buffer, count);
  return buffer;
}

View1<float> TensorParallelGroup::reduce_region_gradient(const View1<float>& partial, const View1<float>& local, int N,
                                                         int C) {
  if (!sequence_parallel_) {
    all_reduce(partial, static_cast<std::size_t>(N) * C, ReduceOp::sum);
    return partial;
  }
  reduce_scatter(partial, local, static_cast<std::size_t>(local_rows(N)) * C);
  return local;
}

TpPending TensorParallelGroup::reduce_region_gradient_async(const View1<float>& partial, const View1<float>& local,
                                                            int N, int C) {
  if (!active() || !overlap_) return ran_blocking(reduce_region_gradient(partial, local, N, C));
  if (!sequence_parallel_) {
    const std::size_t count = static_cast<std::size_t>(N) * C;
    FSDPP_CHECK(count <= partial.extent(0), "tensor-parallel all-reduce of {} elements from a buffer of {}", count,
                partial.extent(0));
    return start(stats_.all_reduces, count * 4, partial, [&] {
      return comm_->all_reduce_async(partial.data(), count, dtype_of_v<float>, ReduceOp::sum);
    });
  }
  const std::size_t count = static_cast<std::size_t>(local_rows(N)) * C;
  check_reduce_scatter(partial, local, count, ranks_);
  return start(stats_.reduce_scatters, count * 4 * static_cast<std::size_t>(ranks_), local,
               [&] { return comm_->reduce_scatter_async(partial.data(), local.data(), count, dtype_of_v<float>); });
}

void TensorParallelGroup::add_norm_gradients(const View1<float>& partial, const std::vector<Parameter*>& norms) {
  std::size_t total = 0;
  for (const Parameter* p : norms) total += p->grad().extent(0);
  all_reduce(partial, total, ReduceOp::sum);
  std::size_t at = 0;
  for (const Parameter* p : norms) {
    const View1<float>& g = p->grad();
    kernels::accumulate<float>(g, Kokkos::subview(partial, std::make_pair(at, at + g.extent(0))),
                               static_cast<int>(g.extent(0)));
    at += g.extent(0);
  }
}

std::vector<View1<float>> TensorParallelGroup::norm_gradients(const std::vector<Parameter*>& norms,
                                                              const View1<float>& partial, int first_slot) const {
  std::vector<View1<float>> out;
  for (std::size_t i = 0; i < norms.size(); ++i) {
    const View1<float>& grad = norms[i]->grad();
    if (!sequence_parallel_) {
      out.push_back(grad);
      continue;
    }
    const std::size_t n = grad.extent(0), first = (static_cast<std::size_t>(first_slot) + i) * n;
    out.push_back(Kokkos::subview(partial, std::make_pair(first, first + n)));
  }
  return out;
}


int TensorParallelGroup::vocab_offset(int V) const {
  return static_cast<int>(std::min<std::int64_t>(rank_ * chunk_rows(V, ranks_), V));
}

void TensorParallelGroup::vocab_parallel_loss(const View1<float>& logits, const View1<float>& losses,
                                              const View1<float>& stats, const View1<const std::int32_t>& targets,
                                              int N, int Vl, int V, float dloss, bool training) {
  const int v0 = vocab_offset(V);
  kernels::vocab_parallel_row_max<float>(stats, logits, N, Vl);
  all_reduce(stats, static_cast<std::size_t>(N), ReduceOp::max);
  kernels::vocab_parallel_sum_exp<float>(stats, logits, targets, v0, N, Vl);
  const auto n = static_cast<std::size_t>(N);
  all_reduce(Kokkos::subview(stats, std::make_pair(n, 3 * n)), 2 * n, ReduceOp::sum);
  kernels::vocab_parallel_crossentropy_finish<float>(logits, losses, stats, targets, v0, N, Vl, V,
                                                     dloss, training);
}

void LanguageModel::apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) {
  FSDPP_REQUIRE(!tp || !tp->active(), "mesh.tp is {}, but {} has no tensor-parallel plan: use mesh.tp: 1 for it",
                tp->ranks(), describe());
}

}  // namespace fsdpp
