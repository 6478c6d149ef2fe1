// fsdpp mesh <shape>: build a DeviceMesh on this launch and print its layout: a dry run of the mesh an input
// deck asks for, checked with one all-reduce per group.
#include "commands.hpp"

#include "fsdpp/mesh/device_mesh.hpp"

#include <mpi.h>

#include <numeric>
#include <vector>

namespace fsdpp::app {

Command add_mesh_command(CLI::App& app) {
  auto* cli = app.add_subcommand("mesh", "Build a device mesh on this launch and print each rank's coordinates and groups");
  auto shape = std::make_shared<std::vector<std::string>>();
  auto backend = std::make_shared<std::string>("mpi");
  cli->add_option("shape", *shape, "Dimensions as name=size, row-major, one size may be -1: dp_replicate=2 dp_shard=-1")
      ->required();
  cli->add_option("--backend", *backend, "Communicator backend: mpi | nccl")->check(CLI::IsMember({"mpi", "nccl"}));
  auto dry_run = std::make_shared<bool>(false);
  auto ranks = std::make_shared<int>(0);
  cli->add_flag("--dry-run", *dry_run, "Print the layout the mesh would have, from the shape alone: no communicators, "
                                       "no device (runs without a GPU)");
  cli->add_option("--ranks,-n", *ranks, "With --dry-run: the job size to lay out (default: this launch's)")
      ->check(CLI::PositiveNumber);

  return {cli, [shape, backend, dry_run, ranks](Runtime& runtime) {
            std::string text;
            for (const auto& s : *shape) text += s + " ";
            if (*dry_run) {
              // Every rank resolves the same shape (a bad one is the same UsageError everywhere); rank 0 prints.
              const int world = *ranks > 0 ? *ranks : runtime.size();
              const std::vector<MeshDim> dims = parse_mesh_shape(text);
              const CommBackend kind = parse_comm_backend(*backend);
              const DeviceMesh first = DeviceMesh::planning(dims, world, 0, kind);
              Log::info("mesh {} (dry run: {} ranks, {} backend; no communicator was created)",
                        format_mesh_shape(first.shape()), world, comm_backend_name(kind));
              for (int r = 0; r < world && runtime.rank() == 0; ++r) {
                const DeviceMesh mesh = DeviceMesh::planning(dims, world, r, kind);
                std::string row = fmt::format("  rank {:>4}  coords [", r);
                for (int d = 0; d < mesh.ndim(); ++d) row += fmt::format("{}{}", d ? ", " : "", mesh.coordinate(d));
                row += "]";
                for (int d = 0; d < mesh.ndim(); ++d) {
                  const auto members = mesh.group_world_ranks(d);
                  row += fmt::format("  {}: [", mesh.name(d));
                  for (std::size_t i = 0; i < members.size(); ++i) row += fmt::format("{}{}", i ? " " : "", members[i]);
                  row += "]";
                }
                Log::info("{}", row);
              }
              return 0;
            }
            DeviceMesh mesh(runtime.world(), parse_mesh_shape(text), parse_comm_backend(*backend));
            Log::info("mesh {}", mesh.describe());

            // Each group sums its members' world ranks; the result must match the group the mesh reports.
            std::string row = fmt::format("  rank {:>4}  host {}  coords [", runtime.rank(), runtime.hostname());
            for (int d = 0; d < mesh.ndim(); ++d) row += fmt::format("{}{}", d ? ", " : "", mesh.coordinate(d));
            row += "]";
            int mismatches = 0;
            for (int d = 0; d < mesh.ndim(); ++d) {
              const auto members = mesh.group_world_ranks(d);
              double sum = runtime.rank();
              mesh.comm(d).all_reduce(&sum, 1, ReduceOp::sum);
              const double expected = std::accumulate(members.begin(), members.end(), 0.0);
              if (sum != expected) ++mismatches;
              row += fmt::format("  {}: [", mesh.name(d));
              for (std::size_t i = 0; i < members.size(); ++i) row += fmt::format("{}{}", i ? " " : "", members[i]);
              row += "]";
            }
            // Rows are gathered to rank 0 so the table prints in rank order.
            const int length = static_cast<int>(row.size());
            std::vector<int> lengths(static_cast<std::size_t>(runtime.size()));
            MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, runtime.world());
            std::vector<int> offsets(lengths.size(), 0);
            std::partial_sum(lengths.begin(), lengths.end() - 1, offsets.begin() + 1);
            std::string all(runtime.rank() == 0 ? static_cast<std::size_t>(offsets.back() + lengths.back()) : 0, ' ');
            MPI_Gatherv(row.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0,
                        runtime.world());
            for (std::size_t r = 0; r < lengths.size() && runtime.rank() == 0; ++r)
              Log::info("{}", all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r])));
            MPI_Allreduce(MPI_IN_PLACE, &mismatches, 1, MPI_INT, MPI_SUM, runtime.world());
            if (mismatches) {
              Log::error_all_ranks(fmt::format("{} group all-reduce(s) disagreed with the mesh layout", mismatches));
              return 1;
            }
            Log::info("mesh check: every group's all-reduce matches its members");
            return 0;
          },
          [dry_run] { return !*dry_run; }};
}

}  // namespace fsdpp::app
