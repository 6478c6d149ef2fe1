#include "fsdpp/fsdp/fully_shard_detail.hpp"

#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/tensor/exact_words.hpp"
#include "fsdpp/tensor/fixed_point.hpp"

#include <algorithm>
#include <deque>
#include <numeric>
#include <chrono>

namespace fsdpp {

using namespace fsdp_detail;

const char* fsdp_buffer_name(FsdpBuffer buffer) {
  switch (buffer) {
    case FsdpBuffer::all_gather: return "all-gather buffer";
    case FsdpBuffer::staged_shards: return "shards staged for the all-gather";
    case FsdpBuffer::unsharded_params: return "whole parameters";
    case FsdpBuffer::post_forward_slice: return "post-forward slice";
    case FsdpBuffer::unsharded_grads: return "whole gradients";
    case FsdpBuffer::reduce_scatter: return "reduce-scatter buffers";
    case FsdpBuffer::reduced_f32: return "reduced gradients (f32)";
    case FsdpBuffer::partial_reduction: return "partial reduction";
  }
  return "?";
}

namespace {

ShardPlacement place(const Parameter& p, int ranks, int rank, const DeviceMesh& mesh) {
  ShardPlacement s;
  s.ranks = ranks;
  s.rank = rank;
  s.chunk_rows = chunk_rows(p.rows(), ranks);
  s.offset_rows = std::min<std::int64_t>(rank * s.chunk_rows, p.rows());
  s.local_rows = std::clamp<std::int64_t>(p.rows() - rank * s.chunk_rows, 0, s.chunk_rows);
  for (int d = 0; d < mesh.ndim(); ++d) s.mesh_dims.push_back({mesh.name(d), mesh.dim_size(d)});
  s.mesh = mesh.describe();
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Construction: claim the parameters, place them, shard what is already materialized.

FsdpGroup::FsdpGroup(Module& module, const DeviceMesh& mesh, FullyShardOptions options)
    : module_(module), unit_name_(module.display_name()),
      forward_region_(timeline_region("forward", unit_name_)), backward_region_(timeline_region("backward", unit_name_)),
      mesh_(mesh), comm_(mesh.comm(mesh.ndim() - 1)),
      options_(options), pool_(std::make_shared<BufferPool>(mesh.is_planning())) {
  FSDPP_REQUIRE(mesh.ndim() == 1 || mesh.ndim() == 2,
                "fully_shard({}): mesh {} has {} dimensions; pass a 1-D shard mesh, or a 2-D (replicate, shard) mesh "
                "for HSDP", module.display_name(), mesh.describe(), mesh.ndim());
  for (DType t : {options.mp_policy.param_dtype, options.mp_policy.reduce_dtype, options.mp_policy.output_dtype})
    FSDPP_REQUIRE(t == DType::f32 || t == DType::bf16, "fully_shard({}): mixed-precision dtypes must be f32 or bf16, "
                  "got {}", module.display_name(), dtype_name(t));
  if (mesh.ndim() == 2) replicate_comm_ = &mesh.comm(0);
  ranks_ = comm_.size();
  rank_ = comm_.rank();
  dry_ = mesh.is_planning();
  // CPU offload: shards, gradients and optimizer state in offload memory (pinned host memory on GPU builds,
  // tensor/offload.hpp); the copies to and from the device run on this instance's own stream.
  if (options_.offload_policy.cpu && !dry_) offload_copies_ = side_instance();
  shard_is_whole_ = ranks_ == 1 && options_.mp_policy.param_dtype == DType::f32 && !options_.offload_policy.cpu;

  if (const int k = options_.reshard_after_forward_ranks; k > 0) {
    check_reshard_after_forward_group(k, ranks_);  // the deck's rule (ParallelDims::resolve ran it before the mesh)
    if (k == 1) options_.reshard_after_forward = false;
    else if (k == ranks_) options_.reshard_after_forward = true;
    else {
      options_.reshard_after_forward = true;
      // Row-major [-1, k]: k consecutive ranks, node-local when ranks fill nodes in order.
      const std::vector<MeshDim> dims = {{"post_forward_replicate", -1}, {"post_forward_shard", k}};
      post_forward_mesh_ = dry_ ? std::make_unique<DeviceMesh>(DeviceMesh::planning(dims, ranks_, rank_))
                                : std::make_unique<DeviceMesh>(mesh.mpi_comm(mesh.ndim() - 1), dims, mesh.backend());
    }
  }

  for (Parameter* p : module.parameters(true))
    if (!p->placement()) params_.push_back(p);  // parameters of sharded descendants belong to their groups
  FSDPP_REQUIRE(!params_.empty() || options_.allow_no_parameters, "fully_shard({}): every parameter of this module already belongs to a sharded "
                "submodule; nothing is left to shard", module.display_name());
  for (Parameter* p : params_) {
    const bool materialized = !p->is_meta() && p->value().extent(0) > 0;
    ShardPlacement placement = place(*p, ranks_, rank_, mesh);
    placement.offloaded = options_.offload_policy.cpu;
    placement.memory = options_.offload_policy.cpu ? (options_.offload_policy.pin_memory ? "host (pinned)" : "host")
                                                   : std::string(MemSpace::name());
    const View1<float> whole = p->value();  // materialized: the whole tensor, before placing changes the shape
    p->place(std::move(placement));
    layout_.offset.push_back(layout_.slot);
    layout_.piece.push_back(p->storage_numel());
    layout_.slot += p->storage_numel();
    if (materialized) {
      // Already allocated (built without meta): keep only this rank's rows, padded, in the shard's own
      // storage (offload memory when offloaded).
      p->allocate();
      Kokkos::deep_copy(slice(p->value(), 0, p->local_numel()),
                        slice(whole, p->placement()->offset_rows * p->row_size(), p->local_numel()));
    }
  }
  flat_numel_ = layout_.slot;
  shard_value_.resize(params_.size());
  shard_grad_.resize(params_.size());
  full_value_.resize(params_.size());
  full_grad_.resize(params_.size());
}

FsdpGroup::~FsdpGroup() {
  if (pending_gather_) pending_gather_->wait();
  // Reductions in flight hold this group's buffers; their Work handles wait quietly as they are destroyed.
  if (context_)
    for (auto it = context_->pending.begin(); it != context_->pending.end();)
      it = it->group == this ? context_->pending.erase(it) : it + 1;
}

FsdpGroup* fsdp_group(Module& module) { return module.find_hooks<FsdpGroup>(); }

void FsdpGroup::add_memory_listener(std::shared_ptr<FsdpMemoryListener> listener) {
  FSDPP_REQUIRE(!initialized_, "fully_shard({}): add memory listeners before the first forward",
                module_.display_name());
  listeners_.push_back(std::move(listener));
}

void FsdpGroup::note(FsdpBuffer kind, std::int64_t bytes) {
  if (!context_) return;
  FsdpStats& s = context_->stats;
  switch (kind) {
    case FsdpBuffer::all_gather:
    case FsdpBuffer::unsharded_params:
    case FsdpBuffer::post_forward_slice:
      s.unsharded_param_bytes += bytes;
      s.peak_unsharded_param_bytes = std::max(s.peak_unsharded_param_bytes, s.unsharded_param_bytes);
      break;
    case FsdpBuffer::unsharded_grads:
    case FsdpBuffer::reduce_scatter:
      s.unsharded_grad_bytes += bytes;
      s.peak_unsharded_grad_bytes = std::max(s.peak_unsharded_grad_bytes, s.unsharded_grad_bytes);
      break;
    default: break;  // staging and reduction scratch: in the plan, not in FsdpStats
  }
  s.peak_unsharded_bytes = std::max(s.peak_unsharded_bytes, s.unsharded_param_bytes + s.unsharded_grad_bytes);
  if (context_->listeners.empty()) return;
  const FsdpMemoryEvent event{kind, bytes, &unit_name_, context_->in_backward};
  for (const auto& listener : context_->listeners) listener->on_memory(event);
}

void FsdpGroup::schedule(FsdpScheduleEvent event) {
  if (!context_ || context_->listeners.empty()) return;
  if (event.kind == FsdpScheduleEvent::Kind::pass_begin || event.kind == FsdpScheduleEvent::Kind::pass_end)
    event.module = &module_;
  for (const auto& listener : context_->listeners) listener->on_schedule(event);
}

void FsdpGroup::schedule_pass(FsdpScheduleEvent::Kind kind, Pass pass, bool defers_weight_gradients) {
  FsdpScheduleEvent e(kind);
  e.pass = pass;
  e.defers_weight_gradients = defers_weight_gradients;
  schedule(e);
}

void FsdpGroup::schedule_kernel(std::int64_t bytes) {
  FsdpScheduleEvent e(FsdpScheduleEvent::Kind::kernel);
  e.bytes = bytes;
  schedule(e);
}

int FsdpGroup::schedule_issue(CollectiveOp op, std::int64_t bytes, const Communicator& comm, const std::string& group,
                              int id) {
  if (!context_) return -1;
  if (id < 0) id = context_->next_collective_id++;
  FsdpScheduleEvent e(FsdpScheduleEvent::Kind::issue);
  e.op = op;
  e.bytes = bytes;
  e.ranks = comm.size();
  e.group = group;
  e.id = id;
  schedule(e);
  return id;
}

void FsdpGroup::schedule_wait(int id) {
  if (id < 0) return;
  FsdpScheduleEvent e(FsdpScheduleEvent::Kind::wait);
  e.id = id;
  schedule(e);
}

void FsdpGroup::schedule_host_copy(std::int64_t bytes) {
  FsdpScheduleEvent e(FsdpScheduleEvent::Kind::host_copy);
  e.bytes = bytes;
  schedule(e);
}

FsdpGroup& fully_shard(Module& module, const DeviceMesh& mesh, FullyShardOptions options) {
  FSDPP_REQUIRE(!fsdp_group(module), "fully_shard({}) was already applied to this module", module.display_name());
  for (Module* a = module.parent(); a; a = a->parent())
    FSDPP_REQUIRE(!fsdp_group(*a),
                  "fully_shard({}) after fully_shard({}): an ancestor already took this module's parameters into its "
                  "group. Apply fully_shard bottom-up: each block first, then the root",
                  module.display_name(), a->display_name());
  auto group = std::make_shared<FsdpGroup>(module, mesh, options);
  module.add_hooks(group);
  return *group;
}

FsdpGroup* FsdpGroup::group_of(Module* m) const { return m ? fsdp_group(*m) : nullptr; }

// This group's `flag`, and with `recurse` every group's below it (FSDP2's setters recurse by default).
void FsdpGroup::set_flag(bool FsdpGroup::*flag, bool value, bool recurse) {
  if (!recurse) {
    this->*flag = value;
    return;
  }
  for (Module* m : module_.modules())
    if (FsdpGroup* g = fsdp_group(*m)) g->*flag = value;
}

void FsdpGroup::set_reshard_after_backward(bool value, bool recurse) {
  set_flag(&FsdpGroup::reshard_after_backward_, value, recurse);
}

void FsdpGroup::set_requires_gradient_sync(bool value, bool recurse) {
  set_flag(&FsdpGroup::requires_gradient_sync_, value, recurse);
}

void FsdpGroup::set_requires_all_reduce(bool value, bool recurse) {
  set_flag(&FsdpGroup::requires_all_reduce_, value, recurse);
}

void FsdpGroup::set_exact_single_backward(std::int64_t units, bool recurse) {
  for (Module* m : module_.modules())
    if (FsdpGroup* g = fsdp_group(*m); g && (recurse || g == this)) g->exact_single_backward_ = units;
}

void FsdpGroup::exchange_exact_words(const Parameter& p, std::function<void(const View1<std::int64_t>&)> sum) {
  FSDPP_CHECK(options_.exact_reduction, "{}: exchange_exact_words outside reproducible mode", module_.display_name());
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i] == &p) {
      words_exchange_ = WordsExchange{i, std::move(sum)};
      return;
    }
  FSDPP_CHECK(false, "{}: exchange_exact_words for {}, which this group does not hold", module_.display_name(),
              p.name());
}

void FsdpGroup::lazy_init() {
  // The first group to run forward is the root; it adopts every group below it (FSDP2's lazy init).
  auto context = std::make_shared<FsdpContext>();
  for (Module* m : module_.modules()) {
    FsdpGroup* g = fsdp_group(*m);
    if (!g) continue;
    FSDPP_REQUIRE(!g->initialized_, "module {} ran forward before its ancestor {}: run forward through the root "
                  "module first", m->display_name(), module_.display_name());
    context->groups.push_back(g);
  }
  context->listeners = listeners_;
  context->overlap_reduction = options_.overlap_reduction;
  context->forward_prefetch = options_.forward_prefetch;
  context->backward_prefetch = options_.backward_prefetch;
  for (FsdpGroup* g : context->groups) {
    g->context_ = context;
    if (!g->pool_->rule().live_bytes()) g->pool_ = pool_;  // one pool for the root (blocks out stay with theirs)
    g->initialized_ = true;
    g->is_root_ = g == this;
    if (!g->options_.reshard_after_forward) g->options_.reshard_after_forward = !g->is_root_;
    FSDPP_REQUIRE(g->dry_ == dry_, "fully_shard: group {} is on a {} mesh but its root {} is not; shard a model "
                  "over one kind of mesh", g->module_.display_name(), g->dry_ ? "planning" : "real", module_.display_name());
    for (Parameter* p : g->params_)
      FSDPP_REQUIRE(g->dry_ || !p->is_meta(), "parameter '{}' has no storage: call to_empty() and reset_parameters() "
                    "after fully_shard and before the first forward", p->name());
  }
  if (context->groups.size() == 1 && !module_.children().empty())
    Log::warn("fully_shard was applied only to the root {}: one group holds all {} parameters, so communication "
              "cannot overlap compute and every rank holds the whole model during forward and backward. Apply "
              "fully_shard to each block first, then to the root", module_.display_name(), params_.size());
}

// ---------------------------------------------------------------------------------------------------------
// Unshard: one all-gather per group, in param_dtype, then copy-out into whole tensors.

template <class T> void FsdpGroup::all_gather_flat(Tracked<T>& flat, Tracked<T>& kept, bool in_backward) {
  allocate(flat, FsdpBuffer::all_gather, layout_.slot * ranks_, module_.display_name() + ".all_gather");
  if (context_) context_->stats.all_gather_bytes += flat.bytes;
  if (in_backward && kept.bytes) {
    // reshard_after_forward = k: the k-rank group holds every slot between them; gather over it only.
    Communicator& group = post_forward_mesh_->comm(1);
    const std::int64_t count = kept.bytes / static_cast<std::int64_t>(sizeof(T));
    schedule_kernel(2 * kept.bytes);  // the kept slice into its slots
    gather_id_ = schedule_issue(CollectiveOp::all_gather, flat.bytes, group, "post_forward");
    if (dry_) return;
    Kokkos::deep_copy(ExecSpace(), slice(flat.view, group.rank() * count, count), kept.view);  // on the stream
    fence_for(group);
    pending_gather_ = group.all_gather_async(flat.view.data() + group.rank() * count, flat.view.data(),
                                             static_cast<std::size_t>(count), dtype_v<T>);
    return;
  }
  if (options_.offload_policy.cpu) {
    // The shards live in host memory: stage them on the device (cudaMemcpyAsync on the offload stream; the
    // host finished the optimizer step that wrote them), wait for that stream only, then copy in.
    std::vector<Tracked<float>> staged(params_.size());
    // Pooled blocks may still be read by kernels queued on the compute stream (a block freed moments ago):
    // the side stream's copies into them start after that stream drains (a fence of that stream only).
    if (!dry_) ExecSpace().fence();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      allocate(staged[i], FsdpBuffer::staged_shards, layout_.piece[i], params_[i]->name() + ".staged");
      if (!dry_) Kokkos::deep_copy(*offload_copies_, staged[i].view, shard_value_[i]);
    }
    if (!dry_) offload_copies_->fence();
    schedule_host_copy(layout_.slot * 4);
    if (context_) context_->stats.host_to_device_bytes += layout_.slot * 4;
    if (!dry_) {
      std::vector<View1<float>> pieces;
      for (const auto& b : staged) pieces.push_back(b.view);
      pack_slot(copy_in<T>(), flat.view, rank_, layout_, pieces);
    }
    for (auto& b : staged) release(b, FsdpBuffer::staged_shards);
  } else if (!dry_) {
    pack_slot(copy_in<T>(), flat.view, rank_, layout_, shard_value_);  // in place: this rank's shards go straight into its slot
  }
  schedule_kernel(layout_.slot * (4 + static_cast<std::int64_t>(sizeof(T))));  // the shards packed into the slot
  if (ranks_ > 1) gather_id_ = schedule_issue(CollectiveOp::all_gather, flat.bytes, comm_, mesh_.name(mesh_.ndim() - 1));
  if (ranks_ > 1 && !dry_) {
    fence_for(comm_);  // the collective reads what the kernels above wrote
    pending_gather_ = comm_.all_gather_async(flat.view.data() + rank_ * layout_.slot, flat.view.data(),
                                             static_cast<std::size_t>(layout_.slot), dtype_v<T>);
  }
}

void FsdpGroup::start_all_gather() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    shard_value_[i] = params_[i]->value();
    shard_grad_[i] = params_[i]->grad();
  }
  gather_started_ = true;
  if (shard_is_whole_) return;  // the shard is the whole parameter: nothing to gather
  const bool in_backward = context_ && context_->in_backward;
  if (context_) (in_backward ? context_->stats.backward_all_gathers : context_->stats.forward_all_gathers)++;
  const FlightSite site(module_.display_name() + (in_backward ? " backward all-gather" : " forward all-gather"));
  if (options_.mp_policy.param_dtype == DType::bf16) all_gather_flat(gather_bf16_, post_forward_bf16_, in_backward);
  else all_gather_flat(gather_f32_, post_forward_f32_, in_backward);
}

void FsdpGroup::unshard(bool async) {
  if (!unsharded_ && !gather_started_) start_all_gather();
  if (!async) wait_for_unshard();
}

void FsdpGroup::wait_for_unshard() {
  if (unsharded_) return;
  if (!gather_started_) start_all_gather();
  schedule_wait(gather_id_);
  gather_id_ = -1;
  if (pending_gather_) {
    const auto t0 = std::chrono::steady_clock::now();
    pending_gather_->wait();
    pending_gather_.reset();
    if (context_) context_->stats.all_gather_wait_s += seconds_since(t0);
  }
  if (!shard_is_whole_) {
    for (std::size_t i = 0; i < params_.size(); ++i)
      allocate(full_value_[i], FsdpBuffer::unsharded_params, layout_.piece[i] * ranks_, params_[i]->name() + ".unsharded");
    // Copy-out: parameter i's whole (padded) tensor is its piece from every slot, in slot order.
    schedule_kernel(gather_bf16_.bytes + gather_f32_.bytes + layout_.slot * ranks_ * 4);
    if (!dry_) {
      std::vector<View1<float>> whole;
      for (const auto& b : full_value_) whole.push_back(b.view);
      if (gather_bf16_.bytes) unpack_all_slots(pieces_from_bf16_, whole, ranks_, layout_, gather_bf16_.view);
      else unpack_all_slots(pieces_f32_, whole, ranks_, layout_, gather_f32_.view);
    }
    release(gather_bf16_, FsdpBuffer::all_gather);
    release(gather_f32_, FsdpBuffer::all_gather);
    release(post_forward_bf16_, FsdpBuffer::post_forward_slice);
    release(post_forward_f32_, FsdpBuffer::post_forward_slice);
    if (!dry_)
      for (std::size_t i = 0; i < params_.size(); ++i) params_[i]->show_whole(slice(full_value_[i].view, 0, params_[i]->numel()));
  }
  // The shard is the whole parameter (or, dry, there is none): in place.
  if (shard_is_whole_ || dry_)
    for (Parameter* p : params_) p->show_whole(p->value());
  gather_started_ = false;
  unsharded_ = true;
}

void FsdpGroup::keep_post_forward_slice() {
  // This rank keeps slots [j * ranks/k, (j+1) * ranks/k) in param_dtype, j its place in its k-rank group.
  const int k = options_.reshard_after_forward_ranks, per = ranks_ / k, j = post_forward_mesh_->coordinate(1);
  auto keep = [&](auto& kept) {
    allocate(kept, FsdpBuffer::post_forward_slice, per * layout_.slot, module_.display_name() + ".post_forward");
    if (dry_) return;
    auto& batch = copy_in<typename std::decay_t<decltype(kept.view)>::value_type>();
    for (std::size_t i = 0; i < params_.size(); ++i)
      for (int q = 0; q < per; ++q)
        batch.add(kept.view.data() + q * layout_.slot + layout_.offset[i],
                  full_value_[i].view.data() + (j * per + q) * layout_.piece[i], layout_.piece[i]);
    batch.run();
  };
  if (options_.mp_policy.param_dtype == DType::bf16) keep(post_forward_bf16_);
  else keep(post_forward_f32_);
}

void FsdpGroup::reshard() {
  if (gather_started_) wait_for_unshard();  // finish a prefetch before dropping it
  if (!unsharded_) return;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i]->show_shard(shard_value_[i], shard_grad_[i]);
    release(full_value_[i], FsdpBuffer::unsharded_params);
  }
  unsharded_ = false;
}

// ---------------------------------------------------------------------------------------------------------
// The hooks around each pass.

bool FsdpGroup::replaying_forward() const { return !is_root_ && context_ && context_->in_backward; }

void FsdpGroup::before(Module&, Pass pass, Flow& flow) {
  Timeline::enter(pass == Pass::forward ? forward_region_ : backward_region_);  // left at the end of after()
  if (!initialized_) lazy_init();
  // Tensor-parallel collectives inside this unit's pass are named after it in the flight recorder.
  FlightSite::enter_unit(module_.display_name(), pass != Pass::forward);
  if (pass == Pass::forward) {
    if (is_root_) {
      context_->drain();  // no reduction crosses into the next micro-batch
      context_->forward_order.clear();
    }
    wait_for_unshard();
    if (!is_root_ && options_.mp_policy.cast_forward_inputs && !dry_) round_to(flow.x, options_.mp_policy.param_dtype);
    // Prefetch: the next group's all-gather runs on the communication thread while this module computes. Not in
    // a replay (replaying_forward): the units after this one have already run their backward.
    if (!replaying_forward()) prefetch(forward_prefetch_, context_->groups, +1);
    schedule_pass(FsdpScheduleEvent::Kind::pass_begin, pass);
    return;
  }
  if (is_root_) context_->in_backward = true;
  wait_for_unshard();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    if (!grads_unsharded_) {
      allocate(full_grad_[i], FsdpBuffer::unsharded_grads, layout_.piece[i] * ranks_, p->name() + ".grad.unsharded");
      pieces_f32_.add(full_grad_[i].view.data(), nullptr, full_grad_[i].view.extent(0));
    }
    if (!dry_) p->show_whole_grad(slice(full_grad_[i].view, 0, p->numel()));
  }
  if (!dry_) pieces_f32_.run(PieceOp::zero);  // the pooled whole gradients start at zero: one kernel
  if (!grads_unsharded_ && options_.exact_reduction && options_.exact_words_in_backward) {
    allocate(chunk_words_, FsdpBuffer::reduce_scatter, layout_.slot * GradientWords::words * ranks_,
             module_.display_name() + ".reduce_scatter_words", true);
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!dry_) params_[i]->show_grad_words({chunk_words_.view, layout_.piece[i], layout_.offset[i], layout_.slot});
  }
  if (!grads_unsharded_) schedule_kernel(layout_.slot * ranks_ * 4);
  grads_unsharded_ = true;
  // Backward prefetch: the group that ran just before this one in forward runs just after it in backward.
  prefetch(backward_prefetch_, context_->forward_order, -1);
  schedule_pass(FsdpScheduleEvent::Kind::pass_begin, pass, flow.weight_stash != nullptr);
}

// Starts the all-gathers of the explicitly chosen modules, or else of this group's neighbour in `order`.
void FsdpGroup::prefetch(const std::vector<Module*>& chosen, const std::vector<FsdpGroup*>& order, int step) {
  std::vector<FsdpGroup*> targets;
  for (Module* m : chosen) targets.push_back(group_of(m));
  if (chosen.empty()) {
    // The next `depth` groups in `order`, nearest first: the all-gathers queue in the order they are used.
    const int depth = step > 0 ? context_->forward_prefetch : context_->backward_prefetch;
    const auto it = std::find(order.begin(), order.end(), this);
    for (int d = 1; d <= depth && it != order.end(); ++d) {
      const auto at = it - order.begin() + step * d;
      if (at >= 0 && at < static_cast<std::ptrdiff_t>(order.size())) targets.push_back(order[at]);
    }
  }
  for (FsdpGroup* g : targets)
    if (g && !g->unsharded_) g->unshard(true);
}

void FsdpGroup::after(Module&, Pass pass, Flow& flow) {
  const Timeline::Leave leave_span(pass == Pass::forward ? forward_region_ : backward_region_);
  FlightSite::leave_unit(module_.display_name(), pass != Pass::forward);
  schedule_pass(FsdpScheduleEvent::Kind::pass_end, pass);
  if (pass == Pass::forward) {
    if (!is_root_ && !dry_) round_to(flow.x, options_.mp_policy.output_dtype);
    if (replaying_forward()) return;  // its backward comes next: the parameters stay whole for it
    context_->forward_order.push_back(this);
    if (post_forward_mesh_) keep_post_forward_slice();
    if (*options_.reshard_after_forward) reshard();
    return;
  }
  if (requires_gradient_sync_) reduce_scatter_gradients();
  // Gradients point back at the shards; unreduced ones (sync off) stay in full_grad_ for the next backward.
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i]->use_grad(shard_grad_[i]);
  if (reshard_after_backward_) reshard();
  if (is_root_) {
    // The last unit's backward ended: every reduction completes here (FSDP2's post-backward final callback),
    // so the gradients are whole when backward returns.
    context_->drain();
    // A prefetch that no backward consumed would hold whole parameters past the step: release it (unless the
    // groups keep their parameters for the next micro-batch).
    for (FsdpGroup* g : context_->groups)
      if (g != this && g->reshard_after_backward_ && (g->gather_started_ || g->unsharded_)) g->reshard();
    context_->in_backward = false;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Tools: whole parameters for tests and export; statistics.

namespace {

// The whole tensor from every tp rank's TP-local tensor `local` (rows x row size). Collective over `tp`.
std::vector<float> gather_tensor_parallel(const Parameter& p, const std::vector<float>& local, Communicator& tp) {
  const TensorParallelPlacement& placement = *p.tensor_parallel();
  std::int64_t largest = 0;  // torch.chunk may leave the last ranks fewer rows: gather padded blocks
  for (int t = 0; t < placement.ranks; ++t) {
    TensorParallelPlacement other = placement;
    other.rank = t;
    const auto shape = tensor_parallel_shape(p.shape(), other);
    largest = std::max(largest, std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>()));
  }
  std::vector<float> mine(static_cast<std::size_t>(largest), 0.0f), all(static_cast<std::size_t>(largest * placement.ranks));
  std::copy(local.begin(), local.end(), mine.begin());
  tp.all_gather(mine.data(), all.data(), mine.size());
  std::vector<float> whole(static_cast<std::size_t>(p.global_numel()));
  const std::int64_t stride = p.global_row_size();
  for (int t = 0; t < placement.ranks; ++t) {
    TensorParallelPlacement other = placement;
    other.rank = t;
    const auto shape = tensor_parallel_shape(p.shape(), other);
    const std::int64_t rows = shape.empty() ? 1 : shape[0], row = rows ? (std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>()) / rows) : 0;
    const float* block = all.data() + t * largest;
    for (const GlobalPiece& piece : global_pieces_of(p.shape(), other, 0, rows))
      for (std::int64_t r = 0; r < piece.rows; ++r)
        std::copy_n(block + (piece.local_row + r) * row, piece.cols, whole.data() + (piece.global_row + r) * stride + piece.global_col);
  }
  return whole;
}

}  // namespace

std::vector<float> gather_full_parameter(const Parameter& p, const DeviceMesh& mesh, Communicator* tensor_parallel) {
  std::vector<float> out(static_cast<std::size_t>(p.numel()));
  if (!p.is_sharded()) {
    Kokkos::deep_copy(HostView1<float>(out.data(), out.size()), slice(p.value(), 0, p.numel()));
  } else {
    const std::int64_t piece = p.storage_numel();
    std::vector<float> shard(static_cast<std::size_t>(piece)), all(static_cast<std::size_t>(piece * p.placement()->ranks));
    Kokkos::deep_copy(HostView1<float>(shard.data(), shard.size()), p.value());
    FSDPP_CHECK(mesh.dim_size(mesh.ndim() - 1) == p.placement()->ranks, "gather_full_parameter of '{}': it is sharded "
                "over {}, not over {}", p.name(), p.placement()->mesh, mesh.describe());
    mesh.comm(mesh.ndim() - 1).all_gather(shard.data(), all.data(), shard.size());
    std::copy(all.begin(), all.begin() + p.numel(), out.begin());
  }
  if (p.tensor_parallel() && tensor_parallel) return gather_tensor_parallel(p, out, *tensor_parallel);
  FSDPP_CHECK(!p.tensor_parallel(), "gather_full_parameter of '{}', which is split over {}, without its group",
              p.name(), p.tensor_parallel()->mesh_dim);
  return out;
}

FsdpStats fsdp_stats(Module& root) {
  FsdpGroup* g = fsdp_group(root);
  if (!g || !g->context_) return FsdpStats{};
  FsdpStats s = g->context_->stats;
  const PoolRule& pool = g->pool_->rule();
  s.pool_live_bytes = pool.live_bytes();
  s.pool_reserved_bytes = pool.reserved_bytes();
  s.pool_peak_reserved_bytes = pool.peak_reserved_bytes();
  s.pool_peak_live_bytes = pool.peak_live_bytes();
  s.pool_allocations = pool.allocations();
  return s;
}

void finish_gradient_reduction(Module& root) {
  FsdpGroup* g = fsdp_group(root);
  if (g && g->context_) g->context_->drain();
}

void abandon_gradient_reduction(Module& root) {
  FsdpGroup* g = fsdp_group(root);
  if (g && g->context_) g->context_->pending.clear();  // each Work waits quietly, then its buffers are freed
}

void finish_exact_gradients(Module& root, std::int64_t units) {
  FsdpGroup* g = fsdp_group(root);
  if (!g || !g->context_) return;
  g->context_->drain();
  for (FsdpGroup* group : g->context_->groups) group->convert_exact_sum(units);
}

void empty_fsdp_cache(Module& root) {
  if (FsdpGroup* g = fsdp_group(root)) g->pool_->clear();
}

void reset_fsdp_stats(Module& root) {
  FsdpGroup* g = fsdp_group(root);
  if (!g || !g->context_) return;
  const FsdpStats& old = g->context_->stats;
  FsdpStats fresh;
  fresh.unsharded_param_bytes = fresh.peak_unsharded_param_bytes = old.unsharded_param_bytes;
  fresh.unsharded_grad_bytes = fresh.peak_unsharded_grad_bytes = old.unsharded_grad_bytes;
  fresh.peak_unsharded_bytes = old.unsharded_param_bytes + old.unsharded_grad_bytes;
  g->context_->stats = fresh;
}

}  // namespace fsdpp
