#pragma once
// parallelize: the one place that turns a deck into parallelism (torchtitan's parallelize_* / apply_fsdp).
//
//   Parallelism par = parallelize(model, deck, MPI_COMM_WORLD);   // collective; model still on meta
//   model.to_empty(); model.reset_parameters(seed);               // only the local shards get storage
//
// It decides, from the deck and the launch:
//   - the mesh: (dp_replicate x) dp_shard (x cp) (x tp) from `mesh`; fsdp.strategy no_shard is a (ranks x 1) mesh, DDP;
//   - tensor parallelism (mesh.tp > 1, nn/tensor_parallel.hpp): the model's Megatron plan on the tp dimension,
//     applied first, as torchtitan's apply_tp comes before apply_ac and apply_fsdp;
//   - context parallelism (mesh.cp > 1, nn/context_parallel.hpp): the sequence's chunks and the attention ring
//     on the cp dimension; the cp ranks join fully_shard's shard group (dp_shard_cp);
//   - the communicator backend of every mesh dimension: `comm.backend` (auto: NCCL when Kokkos computes on a
//     GPU, MPI otherwise);
//   - activation checkpointing (train.activation_checkpointing): which blocks recompute in backward, set
//     before fully_shard as torchtitan's apply_ac wraps blocks before apply_fsdp;
//   - fully_shard per block, then the root, with FullyShardOptions from the `fsdp` section. Every strategy is
//     a mode of that one machinery: full_shard and hybrid_shard as FSDP2 has them, shard_grad_op as
//     reshard_after_forward false, no_shard as a shard group of one rank whose gradients are all-reduced over
//     the replicas;
// and it answers what the rest of training asks of the layout: which ranks take which sequences, the loss
// scale and when gradients synchronize, the group gradient norms are summed over, which ranks write
// checkpoint shards, and the units with their sizes (the run banner, train/step_metrics.cpp, and the plan).
//
// `fsdpp plan` calls parallelize_for_planning, the same code over a planning mesh (no MPI, no storage), so
// nothing else maps deck keys to sharding.
#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/mesh/parallel_dims.hpp"
#include "fsdpp/nn/language_model.hpp"

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace fsdpp {

// The deck's parallel layout for a launch of `world_size` ranks, before any communicator exists.
struct ParallelLayout {
  ShardStrategy strategy = ShardStrategy::full_shard;
  // The mesh's sizes, rules, order and submeshes (mesh/parallel_dims.hpp); the four below are its answers.
  ParallelDims dims;
  std::vector<MeshDim> mesh;       // dims.mesh(): resolved sizes, outermost first; then cp and tp, when above 1
  int tp = 1;                      // tensor-parallel ranks (mesh.tp)
  bool sequence_parallel = false;  // mesh.tp_sequence_parallel (with tp > 1)
  int ep = 1;                      // expert-parallel ranks (mesh.ep), inside the dp_shard dimension
  int cp = 1;                      // context-parallel ranks (mesh.cp), a dimension between dp_shard and tp
  CommBackend backend = CommBackend::mpi;
  FullyShardOptions block_options, root_options;
  // fsdp.forward_prefetch / backward_prefetch: the depths are in the options; explicit per-unit lists are
  // resolved against the model's units when it is sharded.
  PrefetchSetting forward_prefetch, backward_prefetch;
  // false: gradients stay whole and unreduced until the last micro-batch of a step (no_sync); true: every
  // micro-batch reduce-scatters (sharded accumulation).
  bool sync_every_micro_batch = true;
  // HSDP (fsdp.replica_all_reduce): false: micro-batches that reduce-scatter sum their reduced shards locally and
  // only the last one all-reduces over the replicas (FSDP2's set_requires_all_reduce).
  bool all_reduce_every_micro_batch = true;
  // train.reproducible: gradients, losses and the gradient norm are summed exactly (docs/reproducible.md).
  bool exact_reduction = false;
  // train.reproducible_chunks (gradient_chunks.hpp): the token rows of one chunk, 0 off (reproducible_chunk_rows).
  int token_chunk_rows = 0;
  // What the loss is scaled by, per micro-batch, is 1 / (accumulation steps x loss_scale_ranks), and gradients
  // are then summed (divide factor 1) or averaged (0) over the data-parallel ranks. FSDP averages; no_shard
  // sums pre-scaled gradients as DDP implementations do.
  int loss_scale_ranks = 1;
  double gradient_divide_factor = 0;
};

// UsageError, the same on every rank, for a deck that cannot run on `world_size` ranks: ParallelDims::resolve's
// mesh rules, in its order, then the whole job's layout under mesh.pp > 1 and comm.backend.
ParallelLayout parallel_layout(const Deck& deck, int world_size);

// The deck as a model that runs no backward sees it (fsdpp init, eval, generate): fsdp.reshard_after_forward
// back to auto, so that its group k, which only a backward uses (and which must divide the shard group), does not
// refuse a launch it does not concern, and mesh.cp 1 (whole sequences per rank). Training's other options are kept.
Deck forward_only(Deck deck);

// "prefetch: forward 1, backward 2 unit(s) ahead; gradient reductions: overlapped (...)": the schedule the deck's
// fsdp.forward_prefetch, fsdp.backward_prefetch and comm.overlap give (banner and plan).
std::string schedule_text(const PrefetchSetting& forward, const PrefetchSetting& backward, bool overlap);

// The communicator backend `comm.backend` asks for on this build (UsageError for nccl on a host build).
CommBackend choose_backend(CommBackendChoice choice);

struct UnitSummary {
  std::string name;                  // "h.0", "GPT (root)"
  std::int64_t parameters = 0;       // elements, unpadded
  std::int64_t sharded_numel = 0;    // per rank, padded
  std::int64_t unsharded_numel = 0;  // per rank while gathered
};

class Parallelism {
 public:
  Parallelism(ParallelLayout layout, std::unique_ptr<DeviceMesh> mesh, MPI_Comm world);
  // Reductions still in flight (only after an error) are waited for before the communicators they run on go.
  ~Parallelism();
  Parallelism(const Parallelism&) = delete;
  Parallelism& operator=(const Parallelism&) = delete;

  const ParallelLayout& layout() const { return layout_; }
  const DeviceMesh& mesh() const { return *mesh_; }
  // What fully_shard shards over: the data-parallel dimensions, (dp_replicate x) dp_shard, with context
  // parallelism's cp folded into the shard dimension, (dp_replicate x) dp_shard_cp (the cp ranks hold the same
  // parameters; torchtitan's dp_shard_cp). Neither tp nor, for the experts, ep.
  const DeviceMesh& fsdp_mesh() const { return *fsdp_mesh_; }
  // The tp dimension's group, or null without tensor parallelism.
  Communicator* tensor_parallel_group() const { return layout_.tp > 1 ? &mesh_->comm("tp") : nullptr; }
  FsdpGroup& root() const { return *root_; }
  // "dp_shard=4 (4 ranks, mpi)"; with mesh.ep > 1 "dp_shard=4 (4 ranks, mpi); experts over dp_shard_mod_ep=2 x ep=2"
  std::string describe() const;
  // With mesh.ep > 1, the expert groups as this rank sees them (world ranks): "expert parallel over ep=2 (world
  // ranks 0,1) inside dp_shard; experts' data parallel dp_shard_mod_ep=2 (world ranks 0,2)"; "" without.
  std::string describe_expert_groups() const;
  // Expert parallelism (mesh.ep > 1; else null): the ep group (ep consecutive ranks of dp_shard, which split the
  // experts and exchange tokens), and what the experts' fully_shard groups shard over: (dp_replicate x)
  // dp_shard_mod_ep, the ranks holding the same experts (dp_replicate replicates the experts as it does the rest).
  Communicator* expert_parallel_group() const { return ep_mesh_ ? &ep_mesh_->comm("ep") : nullptr; }
  const DeviceMesh* expert_fsdp_mesh() const { return expert_dp_mesh_.get(); }

  // Data parallelism: every rank of the data-parallel mesh, (dp_replicate x) dp_shard, takes its own sequences of
  // each global batch; the tp and cp ranks of one data-parallel rank take the same ones (cp: each its chunks).
  int data_parallel_size() const { return batch_mesh_->size(); }
  int data_parallel_rank() const { return batch_mesh_->rank(); }

  float loss_scale(int accumulation_steps) const {
    return 1.0f / static_cast<float>(accumulation_steps * layout_.loss_scale_ranks);
  }
  // Call before micro-batch `index` of `count`: sets whether its backward synchronizes gradients.
  // `root_too` false: the root's own parameters wait for a later backward of the same micro-batch (a pipeline rank
  // holding several chunks runs the root once per chunk; its embedding or head is complete after its last one).
  void before_micro_batch(int index, int count, bool root_too = true);
  // zero_bubble's input-gradient pass (nn/weight_gradient_stash.hpp): its weight gradients come in a later pass,
  // so no group reduces after it (but in reproducible mode); that pass calls before_micro_batch as a whole
  // backward would.
  void before_input_gradients();
  // Pipeline stages (torch.distributed.pipelining's set_reshard_after_backward(False) but for the last backward):
  // where the parameters stay whole after forward (reshard_after_forward false, a stage's default) they stay whole
  // after backward too while `keep`, so a stage gathers its blocks once per step instead of once per micro-batch.
  void keep_parameters_between_micro_batches(bool keep);
  // After an evaluation forward: the root (and, with reshard_after_forward off, every unit) keeps its parameters
  // whole after forward for a backward that will not come; all go back to their shards.
  void after_evaluation();
  // Whether every unit's parameters are its shards (value and grad are this rank's rows), as a checkpoint reads them.
  bool parameters_sharded() const;

  // The group the squared gradient norm is summed over: the shard dimension. Replicas hold copies.
  Communicator* grad_norm_group() const { return &fsdp_mesh_->comm(fsdp_mesh_->ndim() - 1); }
  // HSDP and no_shard: one replica writes each shard; the others hold copies.
  bool writes_checkpoint_shards() const { return fsdp_mesh_->ndim() == 1 || fsdp_mesh_->coordinate(0) == 0; }
  // Host scalars over the ranks this Parallelism was built on: every rank of the job, but under a pipeline only
  // the stage's (parallelize takes the stage's communicator). A decision the whole job must share (the preemption
  // check) does not go through these.
  // The mean of a host scalar (a loss).
  double mean_over_ranks(double value) const;
  // The largest (a peak). Both go through the host communicator, so the collective watchdog and the flight
  // recorder see them: a rank lost at a step's end cannot hang the others.
  double max_over_ranks(double value) const;
  // Element-wise sums, in place (a mixture of experts' per-expert token counts).
  void sum_over_ranks(std::vector<double>& values) const;

  // The units fully_shard made, blocks first and the root last (the order of the banner and the plan).
  std::vector<UnitSummary> units() const;

  void add_expert_unit(Module& experts) { expert_units_.push_back(&experts); }  // mesh.ep > 1: their own groups
  void attach(Module& model, FsdpGroup& root) {
    model_ = &model;
    root_ = &root;
  }

 private:
  ParallelLayout layout_;
  std::unique_ptr<DeviceMesh> mesh_;
  std::unique_ptr<DeviceMesh> batch_mesh_;  // (dp_replicate x) dp_shard: who takes which sequences
  std::unique_ptr<DeviceMesh> fsdp_mesh_;   // (dp_replicate x) dp_shard, or dp_shard_cp under cp
  std::unique_ptr<DeviceMesh> ep_mesh_;  // the whole mesh with dp_shard cut into {dp_shard_mod_ep, ep}, mesh.ep > 1
  std::unique_ptr<DeviceMesh> expert_dp_mesh_;  // its (dp_replicate x) dp_shard_mod_ep
  std::unique_ptr<MpiCommunicator> host_world_;  // host scalars; null on a planning mesh
  Module* model_ = nullptr;
  FsdpGroup* root_ = nullptr;
  std::vector<Module*> expert_units_;
};

// Sets recompute_in_backward on the blocks `ac` names (module.hpp, "Activation checkpointing"); returns how many.
int apply_activation_checkpointing(LanguageModel& model, const ActivationCheckpointing& ac);

// Collective over `world`. The model must be on meta; it is sharded but not given storage.
std::unique_ptr<Parallelism> parallelize(LanguageModel& model, const Deck& deck, MPI_Comm world);
// The same sharding for a launch of `world_size` ranks, seen from rank 0, on a planning mesh: no MPI, and
// fully_shard runs dry (memory events only).
std::unique_ptr<Parallelism> parallelize_for_planning(LanguageModel& model, const Deck& deck, int world_size);

}  // namespace fsdpp
