// DeviceMesh: row-major layout, groups per dimension, slicing, flattening, and invalid meshes reported by
// every rank alike (each check here runs on all ranks; a hang would trip ctest's timeout).
#include "mpi_test.hpp"

#include "fsdpp/mesh/device_mesh.hpp"
#include "fsdpp/runtime/error.hpp"

#include <numeric>

using namespace fsdpp;

namespace {

// The group a mesh reports for dimension d must be the group its communicator really connects: gather the
// members' ranks (in test_comm numbering) through the communicator and compare.
void check_groups_are_real(const DeviceMesh& mesh, int test_rank) {
  for (int d = 0; d < mesh.ndim(); ++d) {
    Communicator& comm = mesh.comm(d);
    CHECK(comm.size() == mesh.dim_size(d));
    CHECK(comm.rank() == mesh.coordinate(d));
    std::vector<double> members(static_cast<std::size_t>(comm.size()));
    const double me = test_rank;
    comm.all_gather(&me, members.data(), 1);
    const auto expected = mesh.group_world_ranks(d);
    for (std::size_t i = 0; i < members.size(); ++i) CHECK(members[i] == expected[i]);
  }
}

// Row-major: the coordinates ravel back to the rank, last dimension fastest.
void check_row_major(const DeviceMesh& mesh, int test_rank) {
  int index = 0;
  for (int d = 0; d < mesh.ndim(); ++d) index = index * mesh.dim_size(d) + mesh.coordinate(d);
  CHECK(index == test_rank);
  CHECK(mesh.rank() == test_rank);
}

}  // namespace

MPI_TEST_CASE("mesh: 1-D over every rank, with the size inferred", 1) {
  DeviceMesh mesh(test_comm, {{"dp", -1}});
  CHECK(mesh.size() == 1);
  CHECK(mesh.describe() == "dp=1 (1 ranks, mpi)");
  check_groups_are_real(mesh, test_rank);
}

MPI_TEST_CASE("mesh: 1-D on 2 ranks", 2) {
  DeviceMesh mesh(test_comm, {{"dp_shard", 2}});
  CHECK(mesh.coordinate(0) == test_rank);
  check_row_major(mesh, test_rank);
  check_groups_are_real(mesh, test_rank);
}

MPI_TEST_CASE("mesh: 2-D replicate x shard on 4 ranks: coordinates, groups, slices, flattening", 4) {
  DeviceMesh mesh(test_comm, {{"dp_replicate", 2}, {"dp_shard", -1}});
  CHECK(mesh.dim_size(1) == 2);
  const int expected_coords[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  CHECK(mesh.coordinate(0) == expected_coords[test_rank][0]);
  CHECK(mesh.coordinate(1) == expected_coords[test_rank][1]);
  check_row_major(mesh, test_rank);
  check_groups_are_real(mesh, test_rank);
  // The shard groups are consecutive ranks (node-local under a block launch), the replicate groups strided.
  const std::vector<int> shard_group = test_rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
  const std::vector<int> replicate_group = test_rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
  CHECK(mesh.group_world_ranks(mesh.dim_index("dp_shard")) == shard_group);
  CHECK(mesh.group_world_ranks(mesh.dim_index("dp_replicate")) == replicate_group);

  // Slicing reuses the existing group: the very same communicator object.
  DeviceMesh shard = mesh["dp_shard"];
  CHECK(shard.ndim() == 1);
  CHECK(shard.size() == 2);
  CHECK(shard.rank() == mesh.coordinate(1));
  CHECK(&shard.comm(0) == &mesh.comm("dp_shard"));
  DeviceMesh both = mesh.slice({"dp_replicate", "dp_shard"});
  CHECK(both.size() == 4);
  CHECK_THROWS_WITH_AS(mesh.slice({"dp_shard", "dp_replicate"}), doctest::Contains("in mesh order"), UsageError);
  CHECK_THROWS_WITH_AS(mesh["tp"], doctest::Contains("has no dimension 'tp'"), UsageError);

  // Flattening makes one new group over both dimensions: dp = dp_replicate x dp_shard.
  DeviceMesh dp = mesh.flatten({"dp_replicate", "dp_shard"}, "dp");
  CHECK(dp.ndim() == 1);
  CHECK(dp.name(0) == "dp");
  CHECK(dp.size() == 4);
  CHECK(dp.coordinate(0) == test_rank);
  check_groups_are_real(dp, test_rank);
  CHECK_THROWS_WITH_AS(mesh.flatten({"dp_shard"}, "dp_replicate"), doctest::Contains("already names"), UsageError);
}

MPI_TEST_CASE("mesh: 3-D on 4 ranks, and flattening non-adjacent dimensions", 4) {
  DeviceMesh mesh(test_comm, {{"pp", 2}, {"dp", 1}, {"tp", 2}});
  check_row_major(mesh, test_rank);
  check_groups_are_real(mesh, test_rank);
  CHECK(mesh.group_world_ranks(2) == (test_rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
  CHECK(mesh.group_world_ranks(1) == std::vector<int>{test_rank});
  DeviceMesh outer = mesh.flatten({"pp", "tp"}, "pp_tp");
  CHECK(outer.size() == 4);
  check_groups_are_real(outer, test_rank);
  DeviceMesh deep(test_comm, {{"a", 1}, {"b", 2}, {"c", 1}, {"d", -1}});
  CHECK(deep.dim_size(3) == 2);
  check_row_major(deep, test_rank);
  check_groups_are_real(deep, test_rank);
}

MPI_TEST_CASE("mesh: expert parallelism cuts dp_shard into (dp_shard / ep) x ep, ep consecutive and outside tp", 4) {
  // dp_shard 4, ep 2: ep groups {0,1} {2,3}; the ranks holding the same experts {0,2} {1,3}.
  DeviceMesh flat(test_comm, {{"dp_shard", 4}});
  DeviceMesh ep = flat.split("dp_shard", 2, "dp_shard_mod_ep", "ep");
  CHECK(ep.ndim() == 2);
  CHECK(ep.name(0) == "dp_shard_mod_ep");
  CHECK(ep.describe() == "dp_shard_mod_ep=2 x ep=2 (4 ranks, mpi)");
  CHECK(ep.group_world_ranks(1) == (test_rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
  CHECK(ep.group_world_ranks(0) == (test_rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
  check_groups_are_real(ep, test_rank);
  CHECK(ep.comm("ep").label() == "ep");
  // With tp inside: dp_shard 2 x tp 2; dp_shard's group of rank 0 is {0, 2}, which ep 2 takes whole.
  DeviceMesh with_tp(test_comm, {{"dp_shard", 2}, {"tp", 2}});
  DeviceMesh ep_tp = with_tp.split("dp_shard", 2, "dp_shard_mod_ep", "ep");
  CHECK(ep_tp.describe() == "dp_shard_mod_ep=1 x ep=2 x tp=2 (4 ranks, mpi)");
  CHECK(ep_tp.group_world_ranks(1) == (test_rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
  CHECK(ep_tp.group_world_ranks(0) == std::vector<int>{test_rank});
  CHECK(ep_tp.group_world_ranks(2) == with_tp.group_world_ranks(1));  // tp keeps its group
  check_groups_are_real(ep_tp, test_rank);
  // HSDP: replicate 2 x shard 2, ep 2 inside each shard group.
  DeviceMesh hsdp(test_comm, {{"dp_replicate", 2}, {"dp_shard", 2}});
  DeviceMesh ep_hsdp = hsdp.split("dp_shard", 2, "dp_shard_mod_ep", "ep");
  CHECK(ep_hsdp.describe() == "dp_replicate=2 x dp_shard_mod_ep=1 x ep=2 (4 ranks, mpi)");
  CHECK(ep_hsdp.group_world_ranks(2) == hsdp.group_world_ranks(1));
  CHECK(ep_hsdp.group_world_ranks(0) == hsdp.group_world_ranks(0));  // the replicas keep theirs
  // The experts' FSDP mesh under HSDP: replicate x the ranks holding the same experts.
  CHECK(ep_hsdp.slice({"dp_replicate", "dp_shard_mod_ep"}).size() == 2);
  check_groups_are_real(ep_hsdp, test_rank);
  CHECK_THROWS_WITH_AS(flat.split("dp_shard", 3, "dp_shard_mod_ep", "ep"),
                       doctest::Contains("dp_shard (4) cannot be cut into groups of 3 consecutive ranks"), UsageError);
  // The planning mesh gives the same groups without MPI.
  DeviceMesh planned = DeviceMesh::planning({{"dp_shard", 4}}, 4, 3).split("dp_shard", 2, "dp_shard_mod_ep", "ep");
  CHECK(planned.group_world_ranks(1) == std::vector<int>{2, 3});
  CHECK(planned.coordinate(1) == 1);
}

MPI_TEST_CASE("mesh: 3-D on 2 ranks", 2) {
  DeviceMesh mesh(test_comm, {{"x", 1}, {"y", -1}, {"z", 1}});
  CHECK(mesh.dim_size(1) == 2);
  check_row_major(mesh, test_rank);
  check_groups_are_real(mesh, test_rank);
}

MPI_TEST_CASE("mesh: invalid shapes are an error on every rank, with no hang", 2) {
  // Each throw happens on both ranks; the next collective (a new mesh) proves nobody was left behind.
  CHECK_THROWS_WITH_AS(DeviceMesh(test_comm, {{"dp", 3}}),
                       doctest::Contains("mesh {dp: 3} needs 3 ranks (dp 3) but this job has 2"), UsageError);
  CHECK_THROWS_WITH_AS(DeviceMesh(test_comm, {{"dp_replicate", 3}, {"dp_shard", -1}}),
                       doctest::Contains("does not divide the 2 ranks"), UsageError);
  CHECK_THROWS_WITH_AS(DeviceMesh(test_comm, {{"a", -1}, {"b", -1}}), doctest::Contains("only one dimension may be -1"),
                       UsageError);
  CHECK_THROWS_WITH_AS(DeviceMesh(test_comm, {{"a", 2}, {"a", 1}}), doctest::Contains("appears twice"), UsageError);
  CHECK_THROWS_WITH_AS(DeviceMesh(test_comm, {{"dp", 0}}), doctest::Contains("sizes must be >= 1"), UsageError);
  CHECK_THROWS_WITH_AS(DeviceMesh(test_comm, {}), doctest::Contains("no dimensions"), UsageError);
  // Ranks given different meshes: all of them report it rather than splitting communicators apart.
  const std::vector<MeshDim> mine = test_rank == 0 ? std::vector<MeshDim>{{"dp", -1}} : std::vector<MeshDim>{{"tp", -1}};
  CHECK_THROWS_WITH_AS(DeviceMesh(test_comm, mine), doctest::Contains("ranks disagree on the mesh"), UsageError);
  DeviceMesh fine(test_comm, {{"dp", 2}});
  check_groups_are_real(fine, test_rank);
}

TEST_CASE("mesh: shape text parses, and malformed text says what was expected") {
  const auto dims = parse_mesh_shape("dp_replicate=2,dp_shard=-1");
  REQUIRE(dims.size() == 2);
  CHECK(dims[0].name == "dp_replicate");
  CHECK(dims[1].size == -1);
  CHECK(parse_mesh_shape("pp:1 dp:2  tp:4").size() == 3);
  CHECK(format_mesh_shape(dims) == "{dp_replicate: 2, dp_shard: -1}");
  CHECK_THROWS_WITH_AS(parse_mesh_shape("dp=two"), doctest::Contains("expected an integer"), UsageError);
  CHECK_THROWS_WITH_AS(parse_mesh_shape("dp"), doctest::Contains("expected name=size"), UsageError);
  CHECK_THROWS_WITH_AS(parse_mesh_shape(" , "), doctest::Contains("is empty"), UsageError);
}
