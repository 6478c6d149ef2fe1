#include "fsdpp/fsdp/fully_shard.hpp"

#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"

#include <algorithm>
#include <chrono>

namespace fsdpp {

struct FsdpContext {
  std::vector<FsdpGroup*> groups;         // every group under the root, in module-tree order (root first)
  std::vector<FsdpGroup*> forward_order;  // groups in the order their forward finished this iteration
  bool in_backward = false;
  FsdpStats stats;
};

namespace {

using Range = std::pair<std::size_t, std::size_t>;
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Range range(std::int64_t begin, std::int64_t count) {
  return {static_cast<std::size_t>(begin), static_cast<std::size_t>(begin + count)};
}

// dst += src, elementwise.
void accumulate(const View1<float>& dst, const View1<const float>& src) {
  Kokkos::parallel_for(
      "fsdpp::fsdp_accumulate_grad", Kokkos::RangePolicy<ExecSpace>(0, dst.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { dst(i) += src(i); });
}

ShardPlacement place(const Parameter& p, int ranks, int rank, const std::string& mesh) {
  ShardPlacement s;
  s.ranks = ranks;
  s.rank = rank;
  s.chunk_rows = (p.rows() + ranks - 1) / ranks;
  s.offset_rows = std::min<std::int64_t>(rank * s.chunk_rows, p.rows());
  s.local_rows = std::clamp<std::int64_t>(p.rows() - rank * s.chunk_rows, 0, s.chunk_rows);
  s.mesh = mesh;
  return s;
}

}  // namespace

FsdpGroup::FsdpGroup(Module& module, const DeviceMesh& mesh, FullyShardOptions options)
    : module_(module), mesh_(mesh), comm_(mesh.comm(0)), options_(options) {
  FSDPP_REQUIRE(mesh.ndim() == 1, "fully_shard({}): mesh {} has {} dimensions; pass the 1-D shard mesh, e.g. "
                "mesh[\"dp_shard\"]", module.display_name(), mesh.describe(), mesh.ndim());
  ranks_ = comm_.size();
  rank_ = comm_.rank();
  for (Parameter* p : module.parameters(true))
    if (!p->placement) params_.push_back(p);  // parameters of sharded descendants belong to their groups
  FSDPP_REQUIRE(!params_.empty(), "fully_shard({}): every parameter of this module already belongs to a sharded "
                "submodule; nothing is left to shard", module.display_name());
  const std::string mesh_name = mesh.describe();
  for (Parameter* p : params_) {
    shard_offset_.push_back(flat_numel_);
    const bool materialized = !p->is_meta() && p->value.extent(0) > 0;
    p->placement = place(*p, ranks_, rank_, mesh_name);
    flat_numel_ += p->storage_numel();
    if (materialized) {
      // Already allocated (built without meta): keep only this rank's rows, padded.
      View1<float> shard(p->name(), static_cast<std::size_t>(p->storage_numel()));
      const auto from = range(p->placement->offset_rows * p->row_size(), p->local_numel());
      Kokkos::deep_copy(Kokkos::subview(shard, range(0, p->local_numel())), Kokkos::subview(p->value, from));
      p->value = shard;
      p->grad = View1<float>(p->name() + ".grad", shard.extent(0));
    }
  }
  shard_value_.resize(params_.size());
  shard_grad_.resize(params_.size());
  full_value_.resize(params_.size());
  full_grad_.resize(params_.size());
}

FsdpGroup::~FsdpGroup() {
  if (pending_gather_) pending_gather_->wait();
}

FsdpGroup* fsdp_group(Module& module) { return module.find_hooks<FsdpGroup>(); }

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
  for (FsdpGroup* g : context->groups) {
    g->context_ = context;
    g->initialized_ = true;
    g->is_root_ = g == this;
    if (!g->options_.reshard_after_forward) g->options_.reshard_after_forward = !g->is_root_;
    for (Parameter* p : g->params_)
      FSDPP_REQUIRE(!p->is_meta(), "parameter '{}' has no storage: call to_empty() and reset_parameters() after "
                    "fully_shard and before the first forward", p->name());
  }
  if (context->groups.size() == 1 && !module_.children().empty())
    Log::warn("fully_shard was applied only to the root {}: one group holds all {} parameters, so communication "
              "cannot overlap compute and every rank holds the whole model during forward and backward. Apply "
              "fully_shard to each block first, then to the root", module_.display_name(), params_.size());
}

void FsdpGroup::start_all_gather() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    shard_value_[i] = params_[i]->value;
    shard_grad_[i] = params_[i]->grad;
  }
  // In place: this rank's shards go straight into its slot of the output.
  gather_buffer_ = uninitialized<float>(module_.display_name() + ".all_gather", static_cast<std::size_t>(flat_numel_ * ranks_));
  const std::int64_t mine = rank_ * flat_numel_;
  for (std::size_t i = 0; i < params_.size(); ++i)
    Kokkos::deep_copy(Kokkos::subview(gather_buffer_, range(mine + shard_offset_[i], params_[i]->storage_numel())),
                      shard_value_[i]);
  track_params(flat_numel_ * ranks_ * 4);
  if (context_) {
    (context_->in_backward ? context_->stats.backward_all_gathers : context_->stats.forward_all_gathers)++;
    context_->stats.all_gather_bytes += flat_numel_ * ranks_ * 4;
  }
  if (ranks_ > 1) {
    Kokkos::fence();  // the communication thread reads what the kernels above wrote
    pending_gather_ = comm_.all_gather_async(gather_buffer_.data() + mine, gather_buffer_.data(),
                                             static_cast<std::size_t>(flat_numel_), DType::f32);
  }
}

void FsdpGroup::unshard(bool async) {
  if (unsharded_ || pending_gather_ || gather_buffer_.extent(0)) {
    if (!async) wait_for_unshard();
    return;
  }
  start_all_gather();
  if (!async) wait_for_unshard();
}

void FsdpGroup::wait_for_unshard() {
  if (unsharded_) return;
  if (!gather_buffer_.extent(0)) start_all_gather();
  if (pending_gather_) {
    const auto t0 = std::chrono::steady_clock::now();
    pending_gather_->wait();
    pending_gather_.reset();
    if (context_) context_->stats.all_gather_wait_s += seconds_since(t0);
  }
  // Copy-out: rank q's slot holds chunk q of every parameter, so parameter i's whole (padded) tensor is the
  // concatenation of its pieces from each slot.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    const std::int64_t piece = p->storage_numel();
    full_value_[i] = uninitialized<float>(p->name() + ".unsharded", static_cast<std::size_t>(piece * ranks_));
    for (int q = 0; q < ranks_; ++q)
      Kokkos::deep_copy(Kokkos::subview(full_value_[i], range(q * piece, piece)),
                        Kokkos::subview(gather_buffer_, range(q * flat_numel_ + shard_offset_[i], piece)));
    p->value = Kokkos::subview(full_value_[i], range(0, p->numel()));
    p->unsharded = true;
    track_params(piece * ranks_ * 4);
  }
  gather_buffer_ = View1<float>();
  track_params(-flat_numel_ * ranks_ * 4);
  unsharded_ = true;
}

void FsdpGroup::reshard() {
  if (pending_gather_ || gather_buffer_.extent(0)) wait_for_unshard();  // finish a prefetch before dropping it
  if (!unsharded_) return;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i]->value = shard_value_[i];
    params_[i]->grad = shard_grad_[i];
    params_[i]->unsharded = false;
    full_value_[i] = View1<float>();
    track_params(-params_[i]->storage_numel() * ranks_ * 4);
  }
  unsharded_ = false;
}

void FsdpGroup::reduce_scatter_gradients() {
  // Copy-in: slot q of the input holds chunk q of every parameter's gradient (zero-padded), so after the
  // reduce-scatter this rank holds the reduced padded shards of all parameters, in group order.
  View1<float> input = uninitialized<float>(module_.display_name() + ".reduce_scatter", static_cast<std::size_t>(flat_numel_ * ranks_));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::int64_t piece = params_[i]->storage_numel();
    for (int q = 0; q < ranks_; ++q)
      Kokkos::deep_copy(Kokkos::subview(input, range(q * flat_numel_ + shard_offset_[i], piece)),
                        Kokkos::subview(full_grad_[i], range(q * piece, piece)));
  }
  View1<float> output = uninitialized<float>(module_.display_name() + ".reduced", static_cast<std::size_t>(flat_numel_));
  track_grads((ranks_ + 1) * flat_numel_ * 4);
  const auto t0 = std::chrono::steady_clock::now();
  if (ranks_ > 1) {
    Kokkos::fence();
    ReduceScatterOptions o;
    o.op = divide_factor_ > 0 ? ReduceOp::sum : ReduceOp::avg;
    o.post_scale = divide_factor_ > 0 ? 1.0 / divide_factor_ : 1.0;
    comm_.reduce_scatter(input.data(), output.data(), static_cast<std::size_t>(flat_numel_), DType::f32, o);
  } else {
    Kokkos::deep_copy(output, input);
    if (divide_factor_ > 0) {
      const float scale = static_cast<float>(1.0 / divide_factor_);
      Kokkos::parallel_for("fsdpp::fsdp_divide_grad", Kokkos::RangePolicy<ExecSpace>(0, output.extent(0)),
                           KOKKOS_LAMBDA(const std::size_t k) { output(k) *= scale; });
    }
  }
  if (context_) {
    context_->stats.reduce_scatters++;
    context_->stats.reduce_scatter_bytes += flat_numel_ * ranks_ * 4;
    context_->stats.reduce_scatter_s += seconds_since(t0);
  }
  // Sharded gradients accumulate (local += new), as FSDP2's do across micro-batches.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    accumulate(shard_grad_[i], Kokkos::subview(output, range(shard_offset_[i], params_[i]->storage_numel())));
    full_grad_[i] = View1<float>();
    track_grads(-params_[i]->storage_numel() * ranks_ * 4);
  }
  track_grads(-(ranks_ + 1) * flat_numel_ * 4);
  grads_unsharded_ = false;
}

void FsdpGroup::before(Module&, Pass pass) {
  if (!initialized_) lazy_init();
  if (pass == Pass::forward) {
    if (is_root_) context_->forward_order.clear();
    wait_for_unshard();
    // Prefetch: the next group's all-gather runs on the communication thread while this module computes.
    std::vector<FsdpGroup*> next;
    if (!forward_prefetch_.empty()) {
      for (Module* m : forward_prefetch_) next.push_back(group_of(m));
    } else {
      const auto& all = context_->groups;
      auto it = std::find(all.begin(), all.end(), this);
      if (it != all.end() && it + 1 != all.end()) next.push_back(*(it + 1));
    }
    for (FsdpGroup* g : next)
      if (g && !g->unsharded_) g->unshard(true);
    return;
  }
  if (is_root_) context_->in_backward = true;
  wait_for_unshard();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    if (!grads_unsharded_) {
      full_grad_[i] = View1<float>(p->name() + ".grad.unsharded", static_cast<std::size_t>(p->storage_numel() * ranks_));
      track_grads(p->storage_numel() * ranks_ * 4);
    }
    p->grad = Kokkos::subview(full_grad_[i], range(0, p->numel()));
  }
  grads_unsharded_ = true;
  // Backward prefetch: the group that ran just before this one in forward runs just after it in backward.
  std::vector<FsdpGroup*> previous;
  if (!backward_prefetch_.empty()) {
    for (Module* m : backward_prefetch_) previous.push_back(group_of(m));
  } else {
    const auto& order = context_->forward_order;
    auto it = std::find(order.begin(), order.end(), this);
    if (it != order.end() && it != order.begin()) previous.push_back(*(it - 1));
  }
  for (FsdpGroup* g : previous)
    if (g && !g->unsharded_) g->unshard(true);
}

void FsdpGroup::after(Module&, Pass pass) {
  if (pass == Pass::forward) {
    context_->forward_order.push_back(this);
    if (*options_.reshard_after_forward) reshard();
    return;
  }
  if (requires_gradient_sync_) reduce_scatter_gradients();
  // Gradients point back at the shards; unreduced ones (sync off) stay in full_grad_ for the next backward.
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i]->grad = shard_grad_[i];
  if (reshard_after_backward_) reshard();
  if (is_root_) {
    // A prefetch that no backward consumed would hold whole parameters past the step: release it.
    for (FsdpGroup* g : context_->groups)
      if (g != this && (g->pending_gather_ || g->gather_buffer_.extent(0) || g->unsharded_)) g->reshard();
    context_->in_backward = false;
  }
}

std::vector<float> gather_full_parameter(const Parameter& p, const DeviceMesh& mesh) {
  std::vector<float> out(static_cast<std::size_t>(p.numel()));
  if (!p.is_sharded()) {
    Kokkos::deep_copy(HostView1<float>(out.data(), out.size()), Kokkos::subview(p.value, range(0, p.numel())));
    return out;
  }
  const std::int64_t piece = p.storage_numel();
  std::vector<float> shard(static_cast<std::size_t>(piece)), all(static_cast<std::size_t>(piece * p.placement->ranks));
  Kokkos::deep_copy(HostView1<float>(shard.data(), shard.size()), p.value);
  mesh.comm(0).all_gather(shard.data(), all.data(), shard.size());
  std::copy(all.begin(), all.begin() + p.numel(), out.begin());
  return out;
}

FsdpStats fsdp_stats(Module& root) {
  FsdpGroup* g = fsdp_group(root);
  return g && g->context_ ? g->context_->stats : FsdpStats{};
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

void FsdpGroup::track_params(std::int64_t bytes) {
  if (!context_) return;
  FsdpStats& s = context_->stats;
  s.unsharded_param_bytes += bytes;
  s.peak_unsharded_param_bytes = std::max(s.peak_unsharded_param_bytes, s.unsharded_param_bytes);
  s.peak_unsharded_bytes = std::max(s.peak_unsharded_bytes, s.unsharded_param_bytes + s.unsharded_grad_bytes);
}

void FsdpGroup::track_grads(std::int64_t bytes) {
  if (!context_) return;
  FsdpStats& s = context_->stats;
  s.unsharded_grad_bytes += bytes;
  s.peak_unsharded_grad_bytes = std::max(s.peak_unsharded_grad_bytes, s.unsharded_grad_bytes);
  s.peak_unsharded_bytes = std::max(s.peak_unsharded_bytes, s.unsharded_param_bytes + s.unsharded_grad_bytes);
}

}  // namespace fsdpp
