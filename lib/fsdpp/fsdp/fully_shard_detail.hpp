#pragma once
// What fully_shard.cpp and fully_shard_gradients.cpp share and nothing else uses: the state of one root's groups
// (FsdpContext), the small kernels and helpers of both, and the transient-buffer templates that report every
// byte as a memory event.
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/runtime/timers.hpp"

#include <chrono>
#include <deque>
#include <memory>
#include <type_traits>
#include <vector>

namespace fsdpp {

struct FsdpContext {
  std::vector<FsdpGroup*> groups;         // every group under the root, in module-tree order (root first)
  std::vector<FsdpGroup*> forward_order;  // groups in the order their forward finished this iteration
  bool in_backward = false;
  FsdpStats stats;
  std::vector<std::shared_ptr<FsdpMemoryListener>> listeners;
  // The root's FullyShardOptions, for every group under it.
  bool overlap_reduction = true;
  int forward_prefetch = 1, backward_prefetch = 1;
  // Gradient reductions in flight, oldest first: at most one all-reduce (front) and one reduce-scatter. They
  // complete only at fixed hook points (never on polling), so every rank issues the same collectives in the
  // same order, the dry run sees the same memory events, and `shard += reduced` keeps its order.
  struct Entry {
    FsdpGroup* group;
    FsdpGroup::PendingReduction reduction;
  };
  std::deque<Entry> pending;
  int next_collective_id = 0;  // names the collectives in schedule events (issue, then wait)

  // In a unit's post-backward, before it issues its own reduction: the all-reduce in flight completes, then
  // the reduce-scatter in flight (which may issue its all-reduce). FSDP2 waits for the previous
  // reduce-scatter there too; its buffers are the ones the new reduce-scatter takes from the pool.
  void advance() {
    using Stage = FsdpGroup::PendingReduction::Stage;
    if (!pending.empty() && pending.front().reduction.stage == Stage::all_reduce) {
      pending.front().group->complete_all_reduce(pending.front().reduction);
      pending.pop_front();
    }
    if (!pending.empty() && pending.front().reduction.stage == Stage::reduce_scatter) {
      Entry& e = pending.front();
      e.group->complete_reduce_scatter(e.reduction);
      if (e.reduction.stage == Stage::reduce_scatter) pending.pop_front();  // done: no all-reduce followed
    }
  }
  void drain() {
    while (!pending.empty()) advance();
  }
};

namespace fsdp_detail {

// Rounds a tensor to `dtype` in place (the casts of MixedPrecisionPolicy, computed in f32).
inline void round_to(const View1<float>& x, DType dtype) {
  if (dtype != DType::bf16 || x.extent(0) == 0) return;
  const auto v = x;
  Kokkos::parallel_for("fsdpp::fsdp_round_bf16", Kokkos::RangePolicy<ExecSpace>(0, x.extent(0)),
                       KOKKOS_LAMBDA(const std::size_t i) { v(i) = bf16::from_float(v(i)).to_float(); });
}

// dst[j] += src[j] on the host: accumulating reduced gradients into CPU-offloaded shards. (A free function:
// nvcc refuses an extended lambda in a private member function.)
inline void add_on_host(float* dst, const float* src, std::int64_t n) {
  for_each_index("fsdpp::offload_accumulate_grad", true, n, KOKKOS_LAMBDA(const std::int64_t j) { dst[j] += src[j]; });
}

// Before a collective reads what kernels wrote: a host fence for backends that read on the host or another
// thread (MPI); nothing for stream-ordered ones (NCCL on Kokkos' stream orders itself with CUDA events).
inline void fence_for(const Communicator& comm) {
  if (!comm.stream_ordered()) Kokkos::fence();
}

// A pooled buffer that must start at zero (whole gradients, the partial reduction): the block is reused, so
// it is cleared on the stream, without a fence.
template <class T> inline void fill_zero(const View1<T>& x) {
  if (x.extent(0) == 0) return;
  const auto v = x;
  Kokkos::parallel_for("fsdpp::fsdp_zero_pooled", Kokkos::RangePolicy<ExecSpace>(0, x.extent(0)),
                       KOKKOS_LAMBDA(const std::size_t i) { v(i) = T(); });
}

template <class T> constexpr DType dtype_v = std::is_same_v<T, bf16> ? DType::bf16 : DType::f32;

}  // namespace fsdp_detail

// ---------------------------------------------------------------------------------------------------------
// Transient buffers: allocated and freed only here, so that every byte is reported as an event.

template <class T>
void FsdpGroup::allocate(Tracked<T>& buffer, FsdpBuffer kind, std::int64_t count, const std::string& label, bool zeroed) {
  buffer.bytes = count * static_cast<std::int64_t>(sizeof(T));
  // From the pool (dry: its rule only): after the first step every request finds a free block.
  buffer.block = pool_->take(buffer.bytes, label);
  if (!dry_) {
    buffer.view = View1<T>(reinterpret_cast<T*>(buffer.block.storage.data()), static_cast<std::size_t>(count));
    if (zeroed) fsdp_detail::fill_zero(buffer.view);
  }
  note(kind, buffer.bytes);
}

template <class T> void FsdpGroup::release(Tracked<T>& buffer, FsdpBuffer kind) {
  const std::int64_t bytes = buffer.bytes;
  // Back to the pool. Kernels still queued on the stream may read the block; the next user's kernels are
  // queued after them on the same stream, and collectives fence (fence_for) before they touch it.
  pool_->give_back(std::move(buffer.block));
  buffer = Tracked<T>();
  if (bytes) note(kind, -bytes);
}

// The piece batches that copy between whole tensors (f32) and the flat buffers of the collectives (T).
template <class T> PieceBatch<T, float>& FsdpGroup::copy_in() {
  if constexpr (std::is_same_v<T, bf16>) return pieces_to_bf16_;
  else return pieces_f32_;
}

template <class T> PieceBatch<float, T>& FsdpGroup::copy_out() {
  if constexpr (std::is_same_v<T, bf16>) return pieces_from_bf16_;
  else return pieces_f32_;
}

}  // namespace fsdpp
