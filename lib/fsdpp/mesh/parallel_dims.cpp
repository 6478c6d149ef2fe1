#include "fsdpp/mesh/parallel_dims.hpp"

#include "fsdpp/config/deck_rules.hpp"

namespace fsdpp {

ParallelDims ParallelDims::resolve(const Deck& deck, int world_size) {
  const MeshConfig& mesh = deck.mesh;
  // 1-3: the deck's strategy and mesh rules (parse_deck ran them on a parsed deck; a Deck built in code meets them
  // here), then the launch's: the job size, and the pipeline's stages.
  check_parallel_strategy(deck.fsdp, mesh);
  check_job_size(mesh, world_size);
  check_pipeline(deck.model, mesh, deck.pipeline);
  // 4-5: context parallelism, cp ranks between the data-parallel dimensions and tp.
  check_context_parallel(deck.model, mesh, deck.train, deck.fsdp);
  check_reproducible_chunks(deck.model, mesh, deck.train);
  ParallelDims dims;
  dims.world_size_ = world_size;
  dims.pp_ = mesh.pp;
  dims.tp_ = mesh.tp;
  dims.cp_ = mesh.cp;
  // 6: the data-parallel dimensions over what pp, cp and tp leave (check_job_size: they divide it).
  const int dp_ranks = world_size / (mesh.pp * mesh.cp * mesh.tp);
  if (deck.fsdp.strategy == ShardStrategy::no_shard) {
    // DDP: every rank a replica, each parameter "sharded" over a group of one.
    dims.dp_ = resolve_mesh_shape({{"dp_replicate", -1}, {"dp_shard", 1}}, dp_ranks);
  } else {
    std::vector<MeshDim> dp;  // the ones the deck sets, 2-D exactly for hybrid_shard
    if (mesh.dp_replicate != 0) dp.push_back({"dp_replicate", mesh.dp_replicate});
    if (mesh.dp_shard != 0) dp.push_back({"dp_shard", mesh.dp_shard});
    dims.dp_ = resolve_mesh_shape(std::move(dp), dp_ranks);
  }
  // 7: expert parallelism, borrowed from the resolved dp_shard.
  check_expert_parallel(deck.model, mesh, dims.shard_ranks());
  dims.ep_ = mesh.ep;
  // 8: the reshard group, before any communicator exists; the shard group is dp_shard x cp.
  const auto& raf = deck.fsdp.reshard_after_forward;
  if (raf.kind == ReshardAfterForward::Kind::group)
    check_reshard_after_forward_group(raf.group_size, dims.shard_ranks() * dims.cp_);
  return dims;
}

int ParallelDims::data_parallel_size() const {
  int size = 1;
  for (const MeshDim& d : dp_) size *= d.size;
  return size;
}

std::vector<MeshDim> ParallelDims::mesh() const {
  std::vector<MeshDim> out = dp_;
  if (cp_ > 1) out.push_back({"cp", cp_});
  if (tp_ > 1) out.push_back({"tp", tp_});
  return out;
}

std::vector<std::string> ParallelDims::batch_dims() const {
  std::vector<std::string> out;
  for (const MeshDim& d : dp_) out.push_back(d.name);
  return out;
}

DeviceMesh ParallelDims::batch_mesh(const DeviceMesh& mesh) const { return mesh.slice(batch_dims()); }

DeviceMesh ParallelDims::fsdp_mesh(const DeviceMesh& mesh) const {
  if (cp_ == 1) return batch_mesh(mesh);
  std::vector<std::string> dims = batch_dims();
  dims.push_back("cp");
  return mesh.slice(dims).merge({"dp_shard", "cp"}, "dp_shard_cp");
}

DeviceMesh ParallelDims::ep_mesh(const DeviceMesh& mesh) const {
  return mesh.split("dp_shard", ep_, "dp_shard_mod_ep", "ep");
}

DeviceMesh ParallelDims::expert_dp_mesh(const DeviceMesh& ep_mesh) const {
  std::vector<std::string> dims;
  for (int d = 0; d < ep_mesh.ndim(); ++d)
    if (ep_mesh.name(d) != "tp" && ep_mesh.name(d) != "ep") dims.push_back(ep_mesh.name(d));
  if (cp_ == 1) return ep_mesh.slice(dims);
  return ep_mesh.slice(dims).merge({"dp_shard_mod_ep", "cp"}, "dp_shard_mod_ep_cp");
}

}  // namespace fsdpp
