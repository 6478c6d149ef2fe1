#pragma once
// ParallelDims: the mesh's one home (torchtitan's distributed/parallel_dims.py): the sizes of the parallel
// dimensions a deck asks for on a launch of N ranks, their rules in one order, the order of the dimensions in the
// DeviceMesh, and which dimensions make the submeshes each feature uses.
//
//   ParallelDims dims = ParallelDims::resolve(deck, world_size);   // every mesh rule; UsageError, same on every rank
//   DeviceMesh mesh(world, dims.mesh(), backend);                  // {dp_replicate,} dp_shard {, cp} {, tp}
//   DeviceMesh fsdp = dims.fsdp_mesh(mesh);                        // (dp_replicate x) dp_shard(_cp)
//
// The sizes: pp x dp_replicate x dp_shard x cp x tp = world_size, with one data-parallel size -1 inferred
// (mesh.dp_shard unless set), and ep borrowed from dp_shard (dp_shard = dp_shard_mod_ep x ep). The pipeline's pp is
// outermost and split off by PipelineParallel (each stage is parallelized on its own ranks, with a deck of mesh.pp
// 1), so mesh() holds the rest: the data-parallel dimensions, then cp and tp when above 1 (tp innermost:
// consecutive ranks).
//
// The rules are deck_rules.hpp's functions (their texts and deck keys, which parse_deck also reports at the deck's
// lines); resolve() calls the mesh's in this order:
//   1. check_parallel_strategy     fsdp.strategy against the data-parallel dimensions, tp_sequence_parallel
//   2. check_job_size              tp, cp x tp and pp x cp x tp divide the job's ranks
//   3. check_pipeline              mesh.pp and pipeline.* (stages against model.n_layer)
//   4. check_context_parallel      mesh.cp (with a dp_shard dimension, not no_shard; the model's context length)
//   5. check_reproducible_chunks   train.reproducible at mesh.cp > 1
//   6. resolve_mesh_shape          the data-parallel sizes on world / (pp x cp x tp) ranks, -1 inferred
//   7. check_expert_parallel       mesh.ep divides the resolved dp_shard
//   8. check_reshard_after_forward_group  fsdp.reshard_after_forward k divides the shard group, dp_shard x cp
// The model-shape rules of tensor parallelism (heads and widths divisible by tp) stay the model's
// (check_tensor_parallel, run by parse_deck and by the model when tp is applied).
#include "fsdpp/config/deck.hpp"
#include "fsdpp/mesh/device_mesh.hpp"

#include <string>
#include <vector>

namespace fsdpp {

class ParallelDims {
 public:
  // The deck's dimensions on `world_size` ranks, after every rule above (UsageError / DeckRuleError).
  static ParallelDims resolve(const Deck& deck, int world_size);

  int world_size() const { return world_size_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int cp() const { return cp_; }
  int ep() const { return ep_; }
  // The ranks fully_shard shards over before cp joins: the data-parallel mesh's last (innermost) dimension,
  // dp_shard (1 under no_shard).
  int shard_ranks() const { return dp_.back().size; }
  // The data-parallel ranks of one stage: (dp_replicate x) dp_shard, the ranks that take their own sequences.
  int data_parallel_size() const;

  // The DeviceMesh's dimensions, outermost first: (dp_replicate,) dp_shard, then cp and tp when above 1.
  // fsdp.strategy no_shard is (dp_replicate = ranks, dp_shard = 1), DDP.
  std::vector<MeshDim> mesh() const;

  // The named submeshes of a mesh built from mesh() (collective where they merge or split: every rank calls them
  // in the same order, batch, fsdp, ep, expert_dp).
  // batch: the data-parallel dimensions, (dp_replicate x) dp_shard: who takes which sequences (tp and cp ranks
  // take the same ones).
  std::vector<std::string> batch_dims() const;
  DeviceMesh batch_mesh(const DeviceMesh& mesh) const;
  // fsdp: what fully_shard shards the dense weights over: batch, with cp folded into the shard dimension under
  // mesh.cp > 1, (dp_replicate x) dp_shard_cp (torchtitan's dp_shard_cp).
  DeviceMesh fsdp_mesh(const DeviceMesh& mesh) const;
  // ep (mesh.ep > 1): the whole mesh with dp_shard cut into {dp_shard_mod_ep, ep}, ep consecutive ranks.
  DeviceMesh ep_mesh(const DeviceMesh& mesh) const;
  // experts' dp: what the experts' fully_shard shards over, taken from ep_mesh: (dp_replicate x) dp_shard_mod_ep,
  // with cp merged in under mesh.cp > 1 (dp_shard_mod_ep_cp; the cp ranks hold the same experts).
  DeviceMesh expert_dp_mesh(const DeviceMesh& ep_mesh) const;

 private:
  int world_size_ = 1;
  int pp_ = 1, tp_ = 1, cp_ = 1, ep_ = 1;
  std::vector<MeshDim> dp_;  // the data-parallel dimensions, resolved, outermost first
};

}  // namespace fsdpp
