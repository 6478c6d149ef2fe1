// runtime/collective_errors: an error seen on one rank becomes the same UsageError on every rank (never a hang,
// never a different text per rank), and broadcast_string carries any string from any root. Each check runs on
// every rank of its communicator; a rank left behind in a collective would trip ctest's timeout.
#include "mpi_test.hpp"

#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

using namespace fsdpp;

namespace {

// The text of the UsageError that `call` throws on this rank, or "" when it throws nothing. Any other
// exception type fails the check.
template <class Call> std::string usage_error_or_empty(Call&& call) {
  try {
    call();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("not a UsageError: " << e.what());
    return "wrong type";
  }
  return "";
}

// A string of `length` bytes that differs at every position from a shifted copy of itself, with NULs in it
// (a C-string copy would stop at the first).
std::string patterned(std::size_t length, int seed) {
  std::string s(length, '\0');
  for (std::size_t i = 0; i < length; ++i) s[i] = static_cast<char>((i * 131 + static_cast<std::size_t>(seed)) % 256);
  return s;
}

}  // namespace

MPI_TEST_CASE("collective errors: no rank has an error, nobody throws", 1) {
  CHECK(usage_error_or_empty([&] { agree_on_error(test_comm, ""); }) == "");
  int ran = 0;
  CHECK(usage_error_or_empty([&] { root_does(test_comm, [&] { ++ran; }); }) == "");
  CHECK(ran == 1);
  CHECK(usage_error_or_empty([&] { throw_agreed_error("plain"); }) == "plain");
}

MPI_TEST_CASE("collective errors: one rank's error is the same error on every rank", 1) {
  CHECK(usage_error_or_empty([&] { agree_on_error(test_comm, "rank 0 failed"); }) == "rank 0 failed");
}

MPI_TEST_CASE("collective errors: rank 1's error reaches every rank", 2) {
  const std::string mine = test_rank == 1 ? "cannot write shard 1: No space left on device" : "";
  CHECK(usage_error_or_empty([&] { agree_on_error(test_comm, mine); }) ==
        "cannot write shard 1: No space left on device");
  // The communicator is still in step afterwards: a second round with no error passes everywhere.
  CHECK(usage_error_or_empty([&] { agree_on_error(test_comm, ""); }) == "");
}

MPI_TEST_CASE("collective errors: several ranks fail, every rank gets the lowest failing rank's error", 4) {
  const std::string mine = test_rank >= 2 ? fmt::format("rank {} failed", test_rank) : "";
  CHECK(usage_error_or_empty([&] { agree_on_error(test_comm, mine); }) == "rank 2 failed");
  // A long message from the last rank (longer than any fixed buffer).
  const std::string long_error = "rank 3: " + std::string(100000, 'x');
  CHECK(usage_error_or_empty([&] { agree_on_error(test_comm, test_rank == 3 ? long_error : ""); }) == long_error);
}

MPI_TEST_CASE("root_does: the work runs on the root only, its exception text is the same on every rank", 3) {
  int ran = 0;
  CHECK(usage_error_or_empty([&] { root_does(test_comm, [&] { ++ran; }); }) == "");
  CHECK(ran == (test_rank == 0 ? 1 : 0));

  // The text names the root's rank: a rank that formatted its own would differ.
  const std::string expected = "cannot read deck 'missing.yaml' (rank 0)";
  CHECK(usage_error_or_empty([&] {
          root_does(test_comm, [&] { throw std::runtime_error(fmt::format("cannot read deck 'missing.yaml' (rank {})", test_rank)); });
        }) == expected);

  // Another root; an fsdpp::Error (one rank's error) becomes the same UsageError everywhere.
  CHECK(usage_error_or_empty([&] {
          root_does(test_comm, [&] { throw Error(fmt::format("rank {} could not open the file", test_rank)); }, 2);
        }) == "rank 2 could not open the file");

  // An exception without text still stops every rank, with a message that says where it came from.
  CHECK(usage_error_or_empty([&] { root_does(test_comm, [] { throw std::runtime_error(""); }, 1); }) ==
        "unknown error on rank 1");
}

MPI_TEST_CASE("root_does then broadcast_string: the root's result on every rank", 2) {
  std::string text;
  root_does(test_comm, [&] { text = "model:\n  n_layer: 2\n"; });
  CHECK(text == (test_rank == 0 ? "model:\n  n_layer: 2\n" : ""));
  text = broadcast_string(test_comm, std::move(text));
  CHECK(text == "model:\n  n_layer: 2\n");
}

MPI_TEST_CASE("broadcast_string: empty, long and binary strings, from any root", 4) {
  CHECK(broadcast_string(test_comm, test_rank == 0 ? "" : "ignored on non-roots") == "");
  // 8 MiB with embedded NULs: the length travels first, whatever the receivers held before.
  const std::string big = patterned(std::size_t{8} << 20, 7);
  for (int root = 0; root < test_nb_procs; ++root) {
    const std::string got = broadcast_string(test_comm, test_rank == root ? big : std::string(5, 'z'), root);
    CHECK(got.size() == big.size());
    CHECK((got == big));
  }
}

MPI_TEST_CASE("collective errors: every rank of the job at once", ::fsdpp::test::world_size()) {
  const int last = test_nb_procs - 1;
  const std::string expected = fmt::format("rank {} of {} failed", last, test_nb_procs);
  CHECK(usage_error_or_empty([&] { agree_on_error(test_comm, test_rank == last ? expected : ""); }) == expected);
  CHECK(usage_error_or_empty([&] { root_does(test_comm, [&] { throw UsageError(expected); }, last); }) == expected);
  CHECK(broadcast_string(test_comm, test_rank == last ? expected : "", last) == expected);
}
