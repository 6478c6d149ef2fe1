#pragma once
// DeviceMesh: the job's ranks arranged as an N-D array with named dimensions, as PyTorch's init_device_mesh.
//   - Row-major layout, last dimension fastest: rank = ((c0 * s1) + c1) * s2 + c2 ... Put the dimension whose
//     traffic is heaviest (dp_shard under HSDP) last, so its groups are node-local.
//   - Each dimension d gets the group of ranks that differ only in coordinate d: an MPI sub-communicator and a
//     Communicator of the chosen backend, created eagerly in dimension order (NCCL needs the same order on
//     every rank).
//   - mesh["dp_shard"] and mesh.slice({...}) return sub-meshes that reuse those groups; flatten() makes a new
//     group over several dimensions (dp = dp_replicate x dp_shard).
// Construction is collective over `world`; an invalid shape is reported by every rank alike (UsageError).
#include "fsdpp/comm/communicator.hpp"

#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpp {

struct MeshDim {
  std::string name;
  int size;  // -1: inferred from the world size
};

// "dp_replicate=2,dp_shard=-1" (or space-separated) -> dims; UsageError on malformed text.
std::vector<MeshDim> parse_mesh_shape(std::string_view text);
std::string format_mesh_shape(const std::vector<MeshDim>& dims);  // "{dp_replicate: 2, dp_shard: 2}"
// The sizes a mesh of `dims` takes on `world_size` ranks (a -1 inferred); UsageError when they do not fit.
// Needs no MPI: `fsdpp plan` resolves meshes for launches that have not happened.
std::vector<MeshDim> resolve_mesh_shape(std::vector<MeshDim> dims, int world_size);

class DeviceMesh {
 public:
  DeviceMesh(MPI_Comm world, std::vector<MeshDim> dims, CommBackend backend = CommBackend::mpi);
  // The mesh a launch of `world_size` ranks would have, seen from `rank`, with no MPI at all: its
  // communicators know their size and rank but refuse to communicate. `fsdpp plan` shards a model on meta
  // over it, and fully_shard then runs dry (memory events only). Not collective.
  static DeviceMesh planning(std::vector<MeshDim> dims, int world_size, int rank = 0,
                             CommBackend backend = CommBackend::mpi);
  bool is_planning() const;

  int ndim() const { return static_cast<int>(dims_.size()); }
  int size() const;                        // ranks in this (sub-)mesh: the product of its dimension sizes
  int rank() const;                        // this rank's row-major index within the (sub-)mesh
  const std::string& name(int dim) const;
  int dim_size(int dim) const;
  int dim_index(std::string_view name) const;  // UsageError naming the known dimensions if absent
  int coordinate(int dim) const;
  std::vector<int> coordinates() const;
  std::vector<MeshDim> shape() const;
  CommBackend backend() const { return backend_; }

  MPI_Comm mpi_comm(int dim) const;
  MPI_Comm mpi_comm(std::string_view name) const { return mpi_comm(dim_index(name)); }
  Communicator& comm(int dim) const;
  Communicator& comm(std::string_view name) const { return comm(dim_index(name)); }
  std::vector<int> group_world_ranks(int dim) const;  // world ranks of this rank's group along dim, in group order

  DeviceMesh operator[](std::string_view name) const { return slice({std::string(name)}); }
  DeviceMesh slice(const std::vector<std::string>& names) const;  // names in ascending dimension order
  // A 1-D mesh named `new_name` over the product of `names`. Collective over the whole world: every rank
  // must flatten the same dimensions in the same order.
  DeviceMesh flatten(const std::vector<std::string>& names, const std::string& new_name) const;
  // This mesh with dimension `name` (of size s) cut into two, {outer_name: s / inner_size, inner_name:
  // inner_size}, the inner part taking consecutive coordinates: torchtitan's expert parallelism, dp_shard ->
  // dp_shard_mod_ep x ep ({dp_replicate, dp_shard, tp} becomes {dp_replicate, dp_shard_mod_ep, ep, tp}). The two
  // parts get their own groups and communicators (the backend's, created like every dimension's); the other
  // dimensions keep theirs. Collective over the whole world like flatten (a planning mesh: none). UsageError
  // when inner_size does not divide s.
  DeviceMesh split(std::string_view name, int inner_size, const std::string& outer_name,
                   const std::string& inner_name) const;
  // This mesh with its consecutive dimensions `names` (two or more, in mesh order) replaced, in place, by one
  // dimension `new_name` over their product, the last of them fastest: torchtitan's dp_shard_cp, the ranks
  // fully_shard shards over under context parallelism ({dp_replicate, dp_shard, cp} becomes {dp_replicate,
  // dp_shard_cp}). The new group gets its own communicator; the other dimensions keep theirs. Works on split
  // dimensions too (every group is an arithmetic progression of world ranks). Collective over the whole world
  // like flatten (a planning mesh: none).
  DeviceMesh merge(const std::vector<std::string>& names, const std::string& new_name) const;

  std::string describe() const;  // "dp_replicate=2 x dp_shard=2 (4 ranks, mpi)"

 private:
  struct Group;  // one dimension's communicators, shared by the meshes that slice it
  struct Root;   // the world this mesh was laid over
  DeviceMesh() = default;

  std::shared_ptr<Root> root_;
  std::vector<std::shared_ptr<Group>> dims_;
  std::vector<int> root_dim_of_;  // for each dim, its index in the root mesh (-1 for a flattened dim)
  CommBackend backend_ = CommBackend::mpi;
};

}  // namespace fsdpp
