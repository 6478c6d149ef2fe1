#include "fsdpp/parallel/parallelize.hpp"

#include "fsdpp/comm/make_communicator.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/nn/context_parallel.hpp"
#include "fsdpp/nn/expert_parallel.hpp"
#include "fsdpp/nn/moe.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace fsdpp {

CommBackend choose_backend(CommBackendChoice choice) {
#if defined(FSDPP_DEVICE_BUILD)
  constexpr bool computes_on_gpu = true;
#else
  constexpr bool computes_on_gpu = false;
#endif
  switch (choice) {
    case CommBackendChoice::mpi: return CommBackend::mpi;
    case CommBackendChoice::automatic: return computes_on_gpu ? CommBackend::nccl : CommBackend::mpi;
    case CommBackendChoice::nccl:
      FSDPP_REQUIRE(computes_on_gpu, "comm.backend is nccl, but this fsdpp computes on the host (Kokkos {}): NCCL "
                    "only moves GPU memory. Use comm.backend: mpi (or auto), or run a build made for GPUs (README, "
                    "\"Building for NVIDIA GPUs\")", ExecSpace::name());
      FSDPP_REQUIRE(backend_available(CommBackend::nccl), "comm.backend is nccl, but this build has no NCCL: "
                    "reconfigure with -DFSDPP_ENABLE_CUDA=ON, or use comm.backend: mpi");
      return CommBackend::nccl;
  }
  return CommBackend::mpi;
}

ParallelLayout parallel_layout(const Deck& deck, int world_size) {
  // The mesh: its sizes on this launch and every rule on them, in ParallelDims's order (mesh/parallel_dims.hpp).
  ParallelLayout layout;
  layout.dims = ParallelDims::resolve(deck, world_size);
  // A pipeline's stages are parallelized one by one (build_model.hpp, pipeline_stage_deck).
  FSDPP_REQUIRE(deck.mesh.pp == 1, "mesh.pp is {}: a pipeline has a layout per stage, not one for the job, and its "
                "step time is not priced yet. `fsdpp plan --ranks {}` prints each stage's memory, the schedule and its "
                "bubble", deck.mesh.pp, world_size);
  layout.strategy = deck.fsdp.strategy;
  layout.backend = choose_backend(deck.comm.backend);
  // Tensor parallelism takes consecutive ranks (the innermost dimension), context parallelism the cp ranks between
  // the data-parallel dimensions and tp.
  layout.mesh = layout.dims.mesh();
  layout.tp = layout.dims.tp();
  layout.sequence_parallel = deck.mesh.tp > 1 && deck.mesh.tp_sequence_parallel;
  layout.cp = layout.dims.cp();
  layout.ep = layout.dims.ep();
  if (deck.fsdp.strategy == ShardStrategy::no_shard) {
    // DDP: every rank a replica (ParallelDims's (ranks x 1) mesh).
    layout.sync_every_micro_batch = false;
    layout.loss_scale_ranks = layout.dims.data_parallel_size();
    layout.gradient_divide_factor = 1;
  }
  if (deck.fsdp.accumulate == GradAccumulation::unsharded) layout.sync_every_micro_batch = false;
  layout.all_reduce_every_micro_batch = deck.fsdp.replica_all_reduce == ReplicaAllReduce::every_micro_batch;
  // Reproducible mode: every unit's gradient is cut into fixed-point words after its own backward, so every
  // micro-batch (a unit) synchronizes, whatever fsdp.accumulate or the strategy would defer.
  layout.exact_reduction = deck.train.reproducible;
  if (layout.exact_reduction) layout.sync_every_micro_batch = true;
  layout.token_chunk_rows = reproducible_chunk_rows(deck.model, deck.train);

  FullyShardOptions& block = layout.block_options;
  block.mp_policy.param_dtype = deck.fsdp.param_dtype;
  block.mp_policy.reduce_dtype = deck.fsdp.reduce_dtype;
  block.mp_policy.output_dtype = deck.fsdp.output_dtype;
  block.offload_policy.cpu = deck.fsdp.offload == OffloadPolicy::cpu;
  block.overlap_reduction = deck.comm.overlap;
  block.exact_reduction = layout.exact_reduction;
  block.exact_words_in_backward = layout.token_chunk_rows > 0;
  block.forward_prefetch = deck.fsdp.forward_prefetch.depth;
  block.backward_prefetch = deck.fsdp.backward_prefetch.depth;
  layout.forward_prefetch = deck.fsdp.forward_prefetch;
  layout.backward_prefetch = deck.fsdp.backward_prefetch;
  const auto& raf = deck.fsdp.reshard_after_forward;
  if (deck.fsdp.strategy == ShardStrategy::shard_grad_op || raf.kind == ReshardAfterForward::Kind::no)
    block.reshard_after_forward = false;
  else if (raf.kind == ReshardAfterForward::Kind::yes)
    block.reshard_after_forward = true;
  else if (raf.kind == ReshardAfterForward::Kind::group)
    block.reshard_after_forward_ranks = raf.group_size;  // ParallelDims::resolve checked it against dp_shard x cp
  FullyShardOptions& root = layout.root_options;
  root.mp_policy = block.mp_policy;
  root.offload_policy = block.offload_policy;
  root.overlap_reduction = block.overlap_reduction;  // the root's options hold for every group under it
  root.exact_reduction = block.exact_reduction;
  // A tied embedding's two parts are cut apart (nn/causal_lm.hpp), where one rank holds both: without a pipeline.
  root.exact_words_in_backward =
      block.exact_words_in_backward || (layout.exact_reduction && deck.model.tie_embeddings && deck.mesh.pp == 1);
  root.forward_prefetch = block.forward_prefetch;
  root.backward_prefetch = block.backward_prefetch;
  if (block.reshard_after_forward == false) root.reshard_after_forward = false;
  return layout;
}

std::string schedule_text(const PrefetchSetting& forward, const PrefetchSetting& backward, bool overlap) {
  auto ahead = [](const PrefetchSetting& p) {
    return p.lists.empty() ? std::to_string(p.depth) : fmt::format("lists {} (other units {})", to_string(p), p.depth);
  };
  return fmt::format("prefetch: forward {}, backward {} unit(s) ahead; gradient reductions: {}", ahead(forward),
                     ahead(backward), overlap ? "overlapped (waited for in the next unit's backward)"
                                              : "blocking (comm.overlap false)");
}

Deck forward_only(Deck deck) {
  deck.fsdp.reshard_after_forward = {};
  // Whole sequences on every rank (mesh.cp 1): evaluation reports per-token losses in sequence order, and a
  // checkpoint trained at any cp holds the same tensors.
  deck.mesh.cp = 1;
  // The whole model on every rank (mesh.pp 1): a checkpoint trained at any pp holds the same tensors.
  deck.mesh.pp = 1;
  deck.pipeline = {};
  return deck;
}

Parallelism::Parallelism(ParallelLayout layout, std::unique_ptr<DeviceMesh> mesh, MPI_Comm world)
    : layout_(std::move(layout)), mesh_(std::move(mesh)) {
  // The submeshes ParallelDims names, in its order: fsdp's merge under cp and the ep split are collective over the
  // world (every rank reads the same deck), after the dimensions' own communicators.
  const ParallelDims& dims = layout_.dims;
  batch_mesh_ = std::make_unique<DeviceMesh>(dims.batch_mesh(*mesh_));
  fsdp_mesh_ = std::make_unique<DeviceMesh>(dims.fsdp_mesh(*mesh_));
  if (dims.ep() > 1) {
    ep_mesh_ = std::make_unique<DeviceMesh>(dims.ep_mesh(*mesh_));
    expert_dp_mesh_ = std::make_unique<DeviceMesh>(dims.expert_dp_mesh(*ep_mesh_));
  }
  if (world != MPI_COMM_NULL) {
    host_world_ = std::make_unique<MpiCommunicator>(world);
    host_world_->set_label("the job's ranks (host scalars)");
  }
}

std::string Parallelism::describe() const {
  if (!ep_mesh_) return mesh_->describe();
  const int ep = ep_mesh_->dim_index("ep"), experts_dp = ep_mesh_->dim_index("dp_shard_mod_ep");
  return fmt::format("{}; experts over dp_shard_mod_ep={} x ep={}", mesh_->describe(), ep_mesh_->dim_size(experts_dp),
                     ep_mesh_->dim_size(ep));
}

std::string Parallelism::describe_expert_groups() const {
  if (!ep_mesh_) return "";
  const int ep = ep_mesh_->dim_index("ep"), experts_dp = ep_mesh_->dim_index("dp_shard_mod_ep");
  return fmt::format("expert parallel over ep={} (world ranks {}: consecutive ranks of dp_shard, outside tp); "
                     "experts' data parallel dp_shard_mod_ep={} (world ranks {}: the ranks holding the same experts; "
                     "the experts' fully_shard mesh: {})",
                     ep_mesh_->dim_size(ep), fmt::join(ep_mesh_->group_world_ranks(ep), ","),
                     ep_mesh_->dim_size(experts_dp), fmt::join(ep_mesh_->group_world_ranks(experts_dp), ","),
                     expert_dp_mesh_->describe());
}

Parallelism::~Parallelism() {
  if (model_) abandon_gradient_reduction(*model_);
}

void Parallelism::before_micro_batch(int index, int count, bool root_too) {
  // Recursive: every block's group too. Sharded accumulation syncs every micro-batch.
  root_->set_requires_gradient_sync(layout_.sync_every_micro_batch || index == count - 1);
  // HSDP: micro-batches that synchronize may still leave the replica all-reduce to the last one (recursive too).
  root_->set_requires_all_reduce(layout_.all_reduce_every_micro_batch || index == count - 1);
  if (!root_too) {  // not recursive: the blocks keep theirs
    root_->set_requires_gradient_sync(layout_.sync_every_micro_batch, false);
    root_->set_requires_all_reduce(layout_.all_reduce_every_micro_batch, false);
  }
  // Reproducible mode without accumulation: the one backward's words are the step's sum (no accumulator). The
  // experts under ep run a backward per source rank, whose words always accumulate.
  if (layout_.exact_reduction) {
    root_->set_exact_single_backward(count == 1 ? data_parallel_size() : 0);
    for (Module* experts : expert_units_) fsdp_group(*experts)->set_exact_single_backward(0, false);
  }
}

void Parallelism::before_input_gradients() {
  // Reproducible mode rounds each synchronized backward's gradients to words, so a float sum across micro-batches
  // would change the bits: I synchronizes what it computed (norms, embedding, head) and W the weights'. Each
  // parameter's gradient comes whole from one of the two, so its words are those of a whole backward.
  const bool exact = layout_.exact_reduction;
  root_->set_requires_gradient_sync(exact);
  root_->set_requires_all_reduce(exact && layout_.all_reduce_every_micro_batch);
  if (exact) root_->set_exact_single_backward(0);
}

void Parallelism::keep_parameters_between_micro_batches(bool keep) {
  const bool whole_after_forward = layout_.block_options.reshard_after_forward == false;
  root_->set_reshard_after_backward(!(keep && whole_after_forward));
}

void Parallelism::after_evaluation() {
  // Every unit, not only the root: where reshard_after_forward is off (shard_grad_op, a pipeline's stages) the
  // blocks too stay whole after a forward, for a backward that will not come. A checkpoint reads each parameter's
  // value as this rank's shard: a save after an evaluation once wrote shard 0's rows into every shard.
  for (Module* m : model_->modules())
    if (FsdpGroup* g = fsdp_group(*m)) g->reshard();
}

bool Parallelism::parameters_sharded() const {
  for (Module* m : model_->modules())
    if (const FsdpGroup* g = fsdp_group(*m); g && g->unsharded()) return false;
  return true;
}

double Parallelism::mean_over_ranks(double value) const {
  FSDPP_CHECK(host_world_, "mean_over_ranks on a planning layout: there are no ranks to average over");
  host_world_->all_reduce(&value, 1, ReduceOp::avg);
  return value;
}

double Parallelism::max_over_ranks(double value) const {
  FSDPP_CHECK(host_world_, "max_over_ranks on a planning layout: there are no ranks to compare");
  host_world_->all_reduce(&value, 1, ReduceOp::max);
  return value;
}

void Parallelism::sum_over_ranks(std::vector<double>& values) const {
  FSDPP_CHECK(host_world_, "sum_over_ranks on a planning layout: there are no ranks to sum over");
  host_world_->all_reduce(values.data(), values.size(), ReduceOp::sum);
}

std::vector<UnitSummary> Parallelism::units() const {
  std::vector<UnitSummary> out;
  for (Module* m : model_->modules()) {
    FsdpGroup* g = fsdp_group(*m);
    if (!g) continue;
    UnitSummary u;
    u.name = m->display_name();
    for (Parameter* p : g->parameters()) u.parameters += p->global_numel();
    u.sharded_numel = g->sharded_numel();
    u.unsharded_numel = g->unsharded_numel();
    out.push_back(u);
  }
  std::rotate(out.begin(), out.begin() + 1, out.end());  // modules() lists the root first
  return out;
}

int apply_activation_checkpointing(LanguageModel& model, const ActivationCheckpointing& ac) {
  const std::vector<Module*> blocks = model.block_modules();
  for (std::size_t l = 0; l < blocks.size(); ++l) blocks[l]->set_recompute_in_backward(ac.recomputes(static_cast<int>(l)));
  return model.recomputing_blocks();
}

namespace {

// fsdp.forward_prefetch / backward_prefetch lists: unit names (h.<i>, root) to modules, set on each unit.
// UsageError for a name that is not a unit, or a unit that names itself.
void apply_prefetch_lists(LanguageModel& model, const PrefetchSetting& setting, const std::string& key, bool forward) {
  if (setting.lists.empty()) return;
  std::vector<std::pair<std::string, Module*>> units;
  for (Module* block : model.block_modules()) units.emplace_back(block->display_name(), block);
  units.emplace_back("root", &model);
  auto find = [&](const std::string& name) -> Module* {
    for (const auto& [unit, module] : units)
      if (unit == name) return module;
    std::string known;
    for (const auto& u : units) known += (known.empty() ? "" : ", ") + u.first;
    throw UsageError(fmt::format("{}: '{}' is not a unit of this model; its units are {}", key, name, known));
  };
  for (const auto& [name, targets] : setting.lists) {
    Module* unit = find(name);
    std::vector<Module*> chosen;
    for (const std::string& t : targets) {
      Module* target = find(t);
      FSDPP_REQUIRE(target != unit, "{}: unit {} prefetches itself; list the units it should start gathering "
                    "before it runs (e.g. the next one)", key, name);
      chosen.push_back(target);
    }
    FsdpGroup& group = *fsdp_group(*unit);
    if (forward) group.set_modules_to_forward_prefetch(std::move(chosen));
    else group.set_modules_to_backward_prefetch(std::move(chosen));
  }
}

std::unique_ptr<Parallelism> shard(LanguageModel& model, const Deck& deck, ParallelLayout layout,
                                   std::unique_ptr<DeviceMesh> mesh, MPI_Comm world) {
  auto par = std::make_unique<Parallelism>(std::move(layout), std::move(mesh), world);
  const ParallelLayout& l = par->layout();
  // Tensor parallelism first, then activation checkpointing, then FSDP, in torchtitan's order: the TP plan
  // sets the local shapes that the AC summary and fully_shard see.
  if (l.tp > 1) {
    const DeviceMesh& whole = par->mesh();
    const int tp_dim = whole.dim_index("tp");
    model.apply_tensor_parallel(
        std::make_shared<TensorParallelGroup>(whole.dim_size(tp_dim), whole.coordinate(tp_dim), &whole.comm(tp_dim),
                                              l.sequence_parallel, whole.name(tp_dim), deck.comm.overlap));
  }
  // Context parallelism after tp (the ring sends this tp rank's KV heads), before fully_shard: the cp ranks hold
  // the same parameters, sharded with dp_shard's (fsdp_mesh's dp_shard_cp).
  if (l.cp > 1) {
    const DeviceMesh& whole = par->mesh();
    const int cp_dim = whole.dim_index("cp");
    model.apply_context_parallel(
        std::make_shared<ContextParallelGroup>(whole.dim_size(cp_dim), whole.coordinate(cp_dim), &whole.comm(cp_dim)));
  }
  // Reproducible chunks (gradient_chunks.hpp) after tp and cp: the scratch follows the TP-local shapes, and under cp
  // attention takes the fixed order.
  if (l.token_chunk_rows > 0) model.apply_reproducible_chunks(l.token_chunk_rows);
  // AC before fully_shard, as torchtitan applies AC before FSDP: recomputation happens inside each block's
  // backward, after fully_shard's pre-backward all-gather.
  apply_activation_checkpointing(model, deck.train.activation_checkpointing);
  // Expert parallelism: each sparse block keeps E / ep experts, and its experts get a group of their own on the
  // ranks that hold the same ones (torchtitan's edp mesh), sharded before the block as a child must be. Their
  // gradients sum the rows of the whole ep group, so they are averaged over every rank whose rows reach them (every
  // data-parallel and cp rank: the dense weights' shard group), not only over the experts' group.
  if (l.ep > 1) {
    const std::int64_t pairs = std::int64_t{training_forward_batch(deck.train)} * deck.model.context_length / l.cp *
                               deck.model.moe.top_k;  // this rank's rows: T / cp of each sequence
    const int E = deck.model.moe.num_experts;
    const std::int64_t rows = ExpertParallelGroup::worst_case_rows(
        l.ep, E / l.ep, pairs, expert_capacity_rows(deck.model.moe.capacity_factor, pairs, E));
    auto group = std::make_shared<ExpertParallelGroup>(par->expert_parallel_group(), E, deck.model.n_embd, rows);
    for (Module* experts : model.apply_expert_parallel(std::move(group), l.exact_reduction)) {
      fully_shard(*experts, *par->expert_fsdp_mesh(), l.block_options)
          .set_gradient_divide_factor(par->fsdp_mesh().size());
      par->add_expert_unit(*experts);
    }
  }
  for (Module* block : model.block_modules()) fully_shard(*block, par->fsdp_mesh(), l.block_options);
  FullyShardOptions root_options = l.root_options;
  root_options.allow_no_parameters = !model.pipeline_stage().embedding && !model.pipeline_stage().head;
  FsdpGroup& root = fully_shard(model, par->fsdp_mesh(), root_options);
  if (l.gradient_divide_factor > 0)
    for (Module* m : model.modules())
      if (FsdpGroup* g = fsdp_group(*m)) g->set_gradient_divide_factor(l.gradient_divide_factor);
  apply_prefetch_lists(model, l.forward_prefetch, "fsdp.forward_prefetch", true);
  apply_prefetch_lists(model, l.backward_prefetch, "fsdp.backward_prefetch", false);
  par->attach(model, root);
  return par;
}

}  // namespace

std::unique_ptr<Parallelism> parallelize(LanguageModel& model, const Deck& deck, MPI_Comm world) {
  int ranks = 1;
  MPI_Comm_size(world, &ranks);
  ParallelLayout layout = parallel_layout(deck, ranks);
  auto mesh = std::make_unique<DeviceMesh>(world, layout.mesh, layout.backend);
  return shard(model, deck, std::move(layout), std::move(mesh), world);
}

std::unique_ptr<Parallelism> parallelize_for_planning(LanguageModel& model, const Deck& deck, int world_size) {
  FSDPP_REQUIRE(world_size >= 1, "--ranks is {}; it must be at least 1", world_size);
  ParallelLayout layout = parallel_layout(deck, world_size);
  auto mesh = std::make_unique<DeviceMesh>(DeviceMesh::planning(layout.mesh, world_size, 0, layout.backend));
  return shard(model, deck, std::move(layout), std::move(mesh), MPI_COMM_NULL);
}

}  // namespace fsdpp
