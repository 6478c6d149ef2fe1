#pragma once
// A small MPI layer over doctest, after doctest's own MPI extension (which Debian's doctest-dev lacks):
//   MPI_TEST_CASE("name", N) { ... }  runs the body on a sub-communicator `test_comm` of world ranks 0..N-1
//                                     (`test_rank`, `test_nb_procs`); other ranks skip it, and the test is
//                                     skipped everywhere when the job has fewer than N ranks. With
//                                     FSDPP_TEST_RANKS=exact (ctest's mpi_npK runs) it runs only in a job of
//                                     exactly N ranks: each test once, at its own size, not again in every
//                                     larger job while the other ranks wait.
//   MPI_CHECK(r, expr)                checks only on rank r of the test communicator.
// tests/mpi_test_main.cpp prints one summary naming the failing ranks, and every rank exits with the same code.
// Use CHECK rather than REQUIRE inside collective code: a REQUIRE that leaves one rank's body early strands
// the others in a collective (ctest's timeout then reports the hang).
#include <doctest/doctest.h>
#include <mpi.h>

namespace fsdpp::test {
int world_size();
bool runs_in_this_job(int nprocs);  // the rule above: enough ranks, or exactly N under FSDPP_TEST_RANKS=exact
MPI_Comm sub_comm(int nprocs);  // collective over the world; MPI_COMM_NULL on ranks >= nprocs
}  // namespace fsdpp::test

#define FSDPP_MPI_TEST_CASE_IMPL(func, name, nprocs)                                                     \
  static void func(int test_rank, int test_nb_procs, MPI_Comm test_comm);                                \
  TEST_CASE(name * doctest::description("MPI_TEST_CASE") *                                               \
            doctest::skip(!::fsdpp::test::runs_in_this_job(nprocs))) {                                   \
    MPI_Comm comm_ = ::fsdpp::test::sub_comm(nprocs);                                                    \
    if (comm_ == MPI_COMM_NULL) return;                                                                  \
    int rank_ = 0;                                                                                       \
    MPI_Comm_rank(comm_, &rank_);                                                                        \
    func(rank_, (nprocs), comm_);                                                                        \
  }                                                                                                      \
  static void func([[maybe_unused]] int test_rank, [[maybe_unused]] int test_nb_procs,                   \
                   [[maybe_unused]] MPI_Comm test_comm)

#define MPI_TEST_CASE(name, nprocs) FSDPP_MPI_TEST_CASE_IMPL(DOCTEST_ANONYMOUS(FSDPP_MPI_TEST_), name, nprocs)
#define MPI_CHECK(rank, ...)                                                                             \
  do {                                                                                                   \
    if (test_rank == (rank)) CHECK(__VA_ARGS__);                                                         \
  } while (0)
#define MPI_CHECK_EQ(rank, a, b)                                                                         \
  do {                                                                                                   \
    if (test_rank == (rank)) CHECK_EQ(a, b);                                                             \
  } while (0)
