// The >2^31-element path: MPI takes int counts, so larger transfers are cut into pieces (comm/large_count.hpp).
// The arithmetic is checked here at real sizes; tests/mpi/test_collectives.cpp runs the collectives with a
// tiny piece limit to walk the same code with data.
#include "mpi_test.hpp"

#include "fsdpp/comm/large_count.hpp"

#include <climits>

TEST_CASE("large counts: 5e9 elements split into int-sized pieces that tile the range") {
  const std::size_t total = 5'000'000'000ull;
  fsdpp::PiecePlan plan(total, INT_MAX);
  CHECK(plan.pieces() == 3);
  std::size_t next = 0;
  plan.for_each([&](fsdpp::Piece p) {
    CHECK(p.offset == next);
    CHECK(p.count > 0);
    CHECK(p.count <= INT_MAX);
    next += static_cast<std::size_t>(p.count);
  });
  CHECK(next == total);
  CHECK(plan.piece(2).count == static_cast<int>(total - 2ull * INT_MAX));
}

TEST_CASE("large counts: limits above INT_MAX are clamped, tiny limits still make progress") {
  CHECK(fsdpp::PiecePlan(std::size_t{1} << 40, std::size_t{1} << 35).piece(0).count == INT_MAX);
  CHECK(fsdpp::PiecePlan(10, 0).pieces() == 10);
  CHECK(fsdpp::PiecePlan(0, 7).pieces() == 0);
  CHECK(fsdpp::PiecePlan(14, 7).pieces() == 2);
  CHECK(fsdpp::PiecePlan(15, 7).piece(2).count == 1);
}
