// main() for fsdpp's doctest binaries: start the fsdpp Runtime (MPI, Kokkos), run the tests on every rank,
// then one summary from rank 0 with the output of any rank that failed, and the same exit code everywhere.
#define DOCTEST_CONFIG_IMPLEMENT
#include "mpi_test.hpp"

#include "fsdpp/runtime/runtime.hpp"
#include "fsdpp/tensor/matmul.hpp"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace fsdpp::test {
namespace {
std::map<int, MPI_Comm> g_sub_comms;
}

// Test registration (and so doctest::skip) happens before main, before MPI_Init: read the launcher's
// environment then, as doctest's MPI extension does. Run MPI tests under mpiexec, which sets it.
int world_size() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int size = 1;
  if (initialized) {
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
  }
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return size;
}

bool runs_in_this_job(int nprocs) {
  const char* mode = std::getenv("FSDPP_TEST_RANKS");
  if (mode && std::string(mode) == "exact") return world_size() == nprocs;
  return world_size() >= nprocs;
}

MPI_Comm sub_comm(int nprocs) {
  auto found = g_sub_comms.find(nprocs);
  if (found != g_sub_comms.end()) return found->second;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < nprocs ? 0 : MPI_UNDEFINED, rank, &comm);
  g_sub_comms[nprocs] = comm;
  return comm;
}

}  // namespace fsdpp::test

int main(int argc, char** argv) {
  int failed = 0;
  {
    fsdpp::Runtime runtime(argc, argv);
    fsdpp::configure_blas_threads(runtime.local_size());
    const int rank = runtime.rank(), size = runtime.size();

    doctest::Context context(argc, argv);
    // Open MPI gives ranks a pty, so doctest would colour even ctest logs; plain text reads better there.
    context.setOption("no-colors", true);
    std::ostringstream captured;
    if (rank != 0) context.setCout(&captured);  // other ranks speak only if they fail (below)
    failed = context.run() != 0;
    if (context.shouldExit()) return failed;

    // Rank 0 prints the captured output of every failing rank, in rank order.
    std::string text = failed && rank != 0 ? captured.str() : std::string();
    int length = static_cast<int>(text.size());
    std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size), 0);
    MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    for (int r = 1; r < size; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
    std::string all(rank == 0 ? static_cast<std::size_t>(offsets.back() + lengths.back()) : 0, '\0');
    MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
    std::vector<int> failures(static_cast<std::size_t>(size));
    MPI_Gather(&failed, 1, MPI_INT, failures.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::string ranks;
      for (int r = 0; r < size; ++r) {
        if (!failures[r]) continue;
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        if (r > 0) std::printf("---- output of failing rank %d ----\n%s", r, all.substr(offsets[r], lengths[r]).c_str());
      }
      std::printf("[mpi] %d rank(s): %s\n", size, ranks.empty() ? "all passed" : ("FAILED on rank(s) " + ranks).c_str());
    }
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    for (auto& [n, comm] : fsdpp::test::g_sub_comms)
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  return failed;
}
