// fully_shard's gradient reductions (fsdp/fully_shard.hpp): each unit's reduce-scatter, the HSDP all-reduce over
// the replicas, no_shard's per-parameter all-reduces, CPU offload's accumulation on the host, and reproducible
// mode's exact integer sums; the queue that completes them in issue order is FsdpContext::pending.
#include "fsdpp/fsdp/fully_shard_detail.hpp"

#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/tensor/exact_words.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/fixed_point.hpp"

#include <algorithm>

namespace fsdpp {

using namespace fsdp_detail;

// ---------------------------------------------------------------------------------------------------------
// Gradients: one reduce-scatter per group in reduce_dtype, then (HSDP) one all-reduce over the replicas. Each is
// issued when the unit's backward ends and completed at fixed points (FsdpContext::advance), in issue order.

template <class T> void FsdpGroup::issue_reduce_scatter() {
  PendingReduction pending;
  pending.all_reduce = requires_all_reduce_;
  pending.site = module_.display_name() + " gradient reduction";
  Tracked<T>& input = [&]() -> Tracked<T>& {
    if constexpr (std::is_same_v<T, bf16>) return pending.in_bf16;
    else return pending.in_f32;
  }();
  Tracked<T>& output = [&]() -> Tracked<T>& {
    if constexpr (std::is_same_v<T, bf16>) return pending.out_bf16;
    else return pending.out_f32;
  }();
  allocate(input, FsdpBuffer::reduce_scatter, layout_.slot * ranks_, module_.display_name() + ".reduce_scatter");
  allocate(output, FsdpBuffer::reduce_scatter, layout_.slot, module_.display_name() + ".reduced");
  // Copy-in: slot q holds chunk q of every gradient (zero-padded); the output is this rank's padded shards.
  if (!dry_) {
    std::vector<View1<float>> whole;
    for (const auto& b : full_grad_) whole.push_back(b.view);
    pack_all_slots(copy_in<T>(), input.view, ranks_, layout_, whole);
  }
  // Packed: the whole gradients can go. Parameter::grad views them too, and would keep them alive through
  // the reduce-scatter (one group's whole gradients more at the step's peak), so it points at the shard now.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i]->use_grad(shard_grad_[i]);
    release(full_grad_[i], FsdpBuffer::unsharded_grads);
  }
  schedule_kernel(layout_.slot * ranks_ * 4 + input.bytes);  // the whole gradients packed into the slots
  pending.id = schedule_issue(CollectiveOp::reduce_scatter, input.bytes, comm_, mesh_.name(mesh_.ndim() - 1));
  if (!dry_) {
    fence_for(comm_);  // the collective reads what the kernels above wrote; nothing writes the buffers until waited
    ReduceScatterOptions o;
    o.op = divide_factor_ > 0 ? ReduceOp::sum : ReduceOp::avg;
    o.post_scale = divide_factor_ > 0 ? 1.0 / divide_factor_ : 1.0;
    pending.work = comm_.reduce_scatter_async(input.view.data(), output.view.data(),
                                              static_cast<std::size_t>(layout_.slot), dtype_v<T>, o);
  }
  if (context_) {
    context_->stats.reduce_scatters++;
    context_->stats.reduce_scatter_bytes += input.bytes;
  }
  context_->pending.push_back({this, std::move(pending)});
}

void FsdpGroup::complete_reduce_scatter(PendingReduction& pending) {
  const auto t0 = std::chrono::steady_clock::now();
  schedule_wait(pending.id);
  if (pending.work) pending.work->wait();
  pending.work.reset();
  context_->stats.reduce_scatter_s += seconds_since(t0);
  if (pending.in_words.bytes) {  // exact reduction: one rank's words are its sum already
    Tracked<std::int64_t>& reduced_words = ranks_ > 1 ? pending.out_words : pending.in_words;
    if (pending.single_backward) {
      // The step's only backward: its words are the step's sum, one unit per data-parallel rank.
      if (ranks_ > 1) release(pending.in_words, FsdpBuffer::reduce_scatter);
      convert_words(reduced_words, FsdpBuffer::reduce_scatter, pending.single_backward);
      return;
    }
    // The accumulator is taken while the unit's word buffers are still out, so that it never takes their
    // (larger) blocks from the pool and holds them through the step.
    accumulate_words(reduced_words.view);
    release(pending.in_words, FsdpBuffer::reduce_scatter);
    release(pending.out_words, FsdpBuffer::reduce_scatter);
    return;
  }
  Tracked<float>& reduced = pending.reduced;
  allocate(reduced, FsdpBuffer::reduced_f32, layout_.slot, module_.display_name() + ".reduced_f32");
  const bool bf16_reduce = pending.in_bf16.bytes > 0;
  schedule_kernel(pending.out_bf16.bytes + pending.out_f32.bytes + reduced.bytes);  // widened to f32
  if (!dry_) {
    if (bf16_reduce) copy_convert(reduced.view, pending.out_bf16.view);
    else copy_convert(reduced.view, pending.out_f32.view);
  }
  if (bf16_reduce) {
    release(pending.in_bf16, FsdpBuffer::reduce_scatter);
    release(pending.out_bf16, FsdpBuffer::reduce_scatter);
  } else {
    release(pending.in_f32, FsdpBuffer::reduce_scatter);
    release(pending.out_f32, FsdpBuffer::reduce_scatter);
  }
  if (reduce_over_replicas(pending)) return;  // the all-reduce is in flight; `reduced` stays with it
  if (!replicate_comm_) accumulate_reduced(reduced.view);
  release(reduced, FsdpBuffer::reduced_f32);
}

// HSDP, after the reduce-scatter: either sum into the partial reduction (all-reduce skipped this micro-batch),
// or issue the all-reduce over the replicas on `reduced` (true).
bool FsdpGroup::reduce_over_replicas(PendingReduction& pending) {
  if (!replicate_comm_) return false;
  const View1<float>& reduced = pending.reduced.view;
  if (!pending.all_reduce) {
    // Sum over micro-batches now, all-reduce once later.
    if (!partial_reduction_.bytes)
      allocate(partial_reduction_, FsdpBuffer::partial_reduction, layout_.slot, "partial_reduction", true);
    if (!dry_) copy_convert(partial_reduction_.view, reduced, true);
    return false;
  }
  if (partial_reduction_.bytes) {
    if (!dry_) copy_convert(reduced, partial_reduction_.view, true);
    release(partial_reduction_, FsdpBuffer::partial_reduction);
  }
  // Default: the mean over shards (reduce-scatter) then over replicas. A custom factor was applied whole in
  // the reduce-scatter, so the replicas are summed.
  pending.id = schedule_issue(CollectiveOp::all_reduce, pending.reduced.bytes, *replicate_comm_, mesh_.name(0));
  if (!dry_) {
    fence_for(*replicate_comm_);
    const FlightSite site(pending.site);
    pending.work = replicate_comm_->all_reduce_async(reduced.data(), reduced.extent(0), DType::f32,
                                                     divide_factor_ > 0 ? ReduceOp::sum : ReduceOp::avg);
  }
  context_->stats.all_reduces++;
  context_->stats.all_reduce_bytes += pending.reduced.bytes;
  pending.stage = PendingReduction::Stage::all_reduce;
  return true;
}

void FsdpGroup::complete_all_reduce(PendingReduction& pending) {
  const auto t0 = std::chrono::steady_clock::now();
  schedule_wait(pending.id);
  if (pending.work) pending.work->wait();
  pending.work.reset();
  for (WorkHandle& w : pending.per_param) w->wait();
  pending.per_param.clear();
  context_->stats.all_reduce_s += seconds_since(t0);
  if (pending.whole.empty()) {  // HSDP: the reduced shard
    accumulate_reduced(pending.reduced.view);
    release(pending.reduced, FsdpBuffer::reduced_f32);
    return;
  }
  // DDP: shard += whole, every parameter in one kernel, after which the whole gradients go back to the pool.
  schedule_kernel(layout_.slot * 4 * 3);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!dry_) pieces_f32_.add(shard_grad_[i].data(), pending.whole[i].view.data(), layout_.piece[i]);
    // Back to the pool, to no one before the accumulation below: nothing else allocates in between.
    release(pending.whole[i], FsdpBuffer::unsharded_grads);
  }
  if (!dry_) pieces_f32_.run(PieceOp::accumulate);
}

// A shard group of one rank: the whole gradients are the shard gradients. Under no_shard (replicas x 1) they
// are all-reduced over the replicas one parameter at a time, in place (DDP without buckets), then added to
// the shards; on one rank alone they are added at once.
void FsdpGroup::issue_whole_gradient_all_reduces() {
  PendingReduction pending;
  pending.stage = PendingReduction::Stage::all_reduce;
  if (replicate_comm_ && !dry_) fence_for(*replicate_comm_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (replicate_comm_)  // one id for the group's per-parameter all-reduces: they are waited for together
      pending.id = schedule_issue(CollectiveOp::all_reduce, full_grad_[i].bytes, *replicate_comm_, mesh_.name(0),
                                  pending.id);
    if (replicate_comm_ && !dry_) {
      const View1<float>& whole = full_grad_[i].view;
      pending.per_param.push_back(replicate_comm_->all_reduce_async(
          whole.data(), whole.extent(0), DType::f32, divide_factor_ > 0 ? ReduceOp::sum : ReduceOp::avg));
    }
    if (replicate_comm_) context_->stats.all_reduce_bytes += full_grad_[i].bytes;
    params_[i]->use_grad(shard_grad_[i]);
    pending.whole.push_back(std::move(full_grad_[i]));
    full_grad_[i] = Tracked<float>();
  }
  if (!replicate_comm_) {
    complete_all_reduce(pending);  // nothing to wait for
    return;
  }
  context_->stats.all_reduces++;
  context_->pending.push_back({this, std::move(pending)});
}

void FsdpGroup::accumulate_reduced(const View1<float>& reduced) {
  if (options_.offload_policy.cpu) schedule_host_copy(layout_.slot * 4);  // reduced shards back to the host
  else schedule_kernel(layout_.slot * 4 * 3);                              // shard += reduced
  if (dry_) return;
  // Sharded gradients accumulate (local += new), as FSDP2's do across micro-batches; offloaded ones on the
  // host, after a copy back.
  if (options_.offload_policy.cpu) {
    accumulate_offloaded_gradients(reduced);
    return;
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    pieces_f32_.add(shard_grad_[i].data(), reduced.data() + layout_.offset[i], layout_.piece[i]);
  pieces_f32_.run(PieceOp::accumulate);
}

void FsdpGroup::accumulate_offloaded_gradients(const View1<float>& reduced) {
  if (context_) context_->stats.device_to_host_bytes += layout_.slot * 4;
#if defined(FSDPP_DEVICE_BUILD)
  // Device to pinned host memory on the offload stream, after the kernels that wrote `reduced`. The staging
  // buffer is allocated once per group: pinned allocations are slow and synchronize the device.
  if (offload_staging_.view.extent(0) != static_cast<std::size_t>(layout_.slot))
    offload_staging_ = offload_buffer(module_.display_name() + ".reduced_host", static_cast<std::size_t>(layout_.slot));
  ExecSpace().fence();
  Kokkos::deep_copy(*offload_copies_, offload_staging_.view, reduced);
  offload_copies_->fence();
  const float* source = offload_staging_.view.data();
#else
  const float* source = reduced.data();  // host builds: already in host memory
#endif
  for (std::size_t i = 0; i < params_.size(); ++i)
    add_on_host(shard_grad_[i].data(), source + layout_.offset[i], layout_.piece[i]);
}

// Reproducible mode: the whole gradients of this backward, cut into words in slot order, are reduce-scattered as
// exact int64 sums (no scaling: the mean over the step's units is taken once, in finish_exact_gradients). The
// HSDP all-reduce waits for the step's end too, on the summed words; only the step's single backward (no
// accumulation) converts its words, all-reduced, as soon as they arrive.
void FsdpGroup::issue_exact_reduce_scatter() {
  PendingReduction pending;
  pending.site = module_.display_name() + " gradient reduction";
  pending.single_backward = words_exchange_ ? 0 : exact_single_backward_;
  const std::int64_t count = layout_.slot * GradientWords::words;
  const bool chunked = chunk_words_.bytes != 0;  // the model's token chunks are in these words already
  if (chunked) {
    pending.in_words = std::move(chunk_words_);
    chunk_words_ = Tracked<std::int64_t>();
  } else
    allocate(pending.in_words, FsdpBuffer::reduce_scatter, count * ranks_,
             module_.display_name() + ".reduce_scatter_words");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const SlotWords words{pending.in_words.view, layout_.piece[i], layout_.offset[i], layout_.slot};
    if (!dry_ && chunked) add_cut_into_slots(words, full_grad_[i].view);  // what was not cut by chunks (zeros)
    else if (!dry_) cut_into_slots(words.words, full_grad_[i].view, words.piece, words.offset, words.slot);
    if (chunked && !dry_) params_[i]->show_grad_words({});
    params_[i]->use_grad(shard_grad_[i]);
    release(full_grad_[i], FsdpBuffer::unsharded_grads);
  }
  if (ranks_ > 1) {
    allocate(pending.out_words, FsdpBuffer::reduce_scatter, count, module_.display_name() + ".reduced_words");
    if (!dry_) {
      fence_for(comm_);
      ReduceScatterOptions o;
      o.op = ReduceOp::sum;
      pending.work = comm_.reduce_scatter_async(pending.in_words.view.data(), pending.out_words.view.data(),
                                                static_cast<std::size_t>(count), DType::i64, o);
    }
    context_->stats.reduce_scatters++;
    context_->stats.reduce_scatter_bytes += pending.in_words.bytes;
  }
  context_->pending.push_back({this, std::move(pending)});
}

void FsdpGroup::accumulate_words(const View1<std::int64_t>& words) {
  if (!exact_sum_.bytes)
    allocate(exact_sum_, FsdpBuffer::partial_reduction, layout_.slot * GradientWords::words,
             module_.display_name() + ".exact_sum", true);
  if (!dry_) add_words(exact_sum_.view, words);
}

void FsdpGroup::convert_exact_sum(std::int64_t units) {
  if (exact_sum_.bytes) convert_words(exact_sum_, FsdpBuffer::partial_reduction, units);
}

// The step's summed shard words (reported as `kind`): all-reduced over the HSDP replicas (integers: exact), then
// their mean over `units` added to the shard gradients, and released.
void FsdpGroup::convert_words(Tracked<std::int64_t>& words, FsdpBuffer kind, std::int64_t units) {
  if (replicate_comm_) {
    if (!dry_) {
      fence_for(*replicate_comm_);
      const FlightSite site(module_.display_name() + " gradient reduction");
      replicate_comm_->all_reduce(words.view.data(), words.view.extent(0), DType::i64, ReduceOp::sum);
    }
    context_->stats.all_reduces++;
    context_->stats.all_reduce_bytes += words.bytes;
  }
  if (words_exchange_ && !dry_) {  // the other copy's words of the parameter's shard
    const std::int64_t W = GradientWords::words;
    const std::size_t i = words_exchange_->param;
    const auto range = std::make_pair(static_cast<std::size_t>(layout_.offset[i] * W),
                                      static_cast<std::size_t>((layout_.offset[i] + layout_.piece[i]) * W));
    Kokkos::fence();
    words_exchange_->sum(Kokkos::subview(words.view, range));
  }
  Tracked<float> reduced;
  allocate(reduced, FsdpBuffer::reduced_f32, layout_.slot, module_.display_name() + ".reduced_f32");
  if (!dry_) words_to_mean(reduced.view, words.view, static_cast<double>(units));
  release(words, kind);
  accumulate_reduced(reduced.view);
  release(reduced, FsdpBuffer::reduced_f32);
}

void FsdpGroup::reduce_scatter_gradients() {
  // One rank with f32 gradients needs no scatter; a custom divide factor or a deferred HSDP all-reduce takes
  // the general path.
  const bool whole = !options_.exact_reduction && ranks_ == 1 && options_.mp_policy.reduce_dtype == DType::f32 && !options_.offload_policy.cpu &&
                     (divide_factor_ == 0 || divide_factor_ == 1) && (requires_all_reduce_ || !replicate_comm_) &&
                     !partial_reduction_.bytes;
  context_->advance();  // the previous unit's reduce-scatter (and the one before's all-reduce) first
  const FlightSite site(module_.display_name() + " gradient reduction");
  if (whole) issue_whole_gradient_all_reduces();
  else if (options_.exact_reduction) issue_exact_reduce_scatter();
  else if (options_.mp_policy.reduce_dtype == DType::bf16) issue_reduce_scatter<bf16>();
  else issue_reduce_scatter<float>();
  grads_unsharded_ = false;
  if (!context_->overlap_reduction) context_->drain();  // blocking: the schedule before overlap, event for event
}

}  // namespace fsdpp
