// ExpertParallelGroup (nn/expert_parallel.hpp): dispatch delivers exactly the rows a serial reference routes to
// each local expert, in the documented received order (local expert, source rank, the sender's order), and
// combine brings every row home where it left; the backward exchanges follow the same routing. Each rank knows
// every rank's routing without asking (a hash), so the reference needs no communication. An overflow of the
// capacity raises the same error on every rank, and the group stays usable.
#include "mpi_test.hpp"

#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/nn/expert_parallel.hpp"
#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <string>
#include <vector>

using namespace fsdpp;

namespace {

constexpr int kWidth = 5;

enum class Routing { random, one_expert, first_rank_only };

// Rows rank `from` routes to global expert `e` in `trial`.
std::int64_t rows_to(Routing routing, int trial, int from, int e, int num_experts) {
  switch (routing) {
    case Routing::one_expert: return e == num_experts - 1 ? 17 + 3 * from : 0;
    case Routing::first_rank_only: return e < 2 ? 9 + from : 0;  // experts 0 and 1: rank 0's (2 per rank)
    case Routing::random: break;
  }
  const unsigned h = static_cast<unsigned>(trial * 7919 + from * 104729 + e * 1299709) * 2654435761u;
  return (h >> 9) % 4 == 0 ? 0 : static_cast<std::int64_t>((h >> 13) % 40);
}

// Element c of row i that rank q sends expert e: exact in f32 and distinct.
float row_value(int q, int e, std::int64_t i, int c) {
  return static_cast<float>(q * 1000000 + e * 10000 + static_cast<int>(i) * 10 + c);
}

struct Sent {
  View1<float> rows;
  View1<std::int64_t> counts;
  std::vector<float> host;  // the rows, for comparing
};

Sent rows_of(Routing routing, int trial, int rank, int num_experts) {
  Sent s;
  std::vector<std::int64_t> counts(sz(num_experts));
  for (int e = 0; e < num_experts; ++e) {
    counts[sz(e)] = rows_to(routing, trial, rank, e, num_experts);
    for (std::int64_t i = 0; i < counts[sz(e)]; ++i)
      for (int c = 0; c < kWidth; ++c) s.host.push_back(row_value(rank, e, i, c));
  }
  s.rows = View1<float>("rows", s.host.size());
  s.counts = View1<std::int64_t>("counts", counts.size());
  Kokkos::deep_copy(s.rows, HostView1<float>(s.host.data(), s.host.size()));
  Kokkos::deep_copy(s.counts, HostView1<std::int64_t>(counts.data(), counts.size()));
  return s;
}

std::vector<float> to_host(const View1<float>& v) {
  std::vector<float> out(v.extent(0));
  Kokkos::deep_copy(HostView1<float>(out.data(), out.size()), v);
  return out;
}

void check_round_trip(ExpertParallelGroup& group, Routing routing, int trial) {
  const int n = group.ranks(), r = group.rank(), E = group.num_experts(), L = E / n;
  ExpertRouting route = group.make_routing("h.1.mlp");
  const Sent sent = rows_of(routing, trial, r, E);
  View1<float> into("into", sz(group.capacity_rows()) * kWidth);
  const std::vector<float> received = to_host(group.dispatch(route, sent.rows, sent.counts, into));
  // The serial reference: local expert j, then source rank q ascending, then q's own order.
  std::vector<float> expected;
  for (int j = 0; j < L; ++j)
    for (int q = 0; q < n; ++q) {
      const int e = r * L + j;
      for (std::int64_t i = 0; i < rows_to(routing, trial, q, e, E); ++i)
        for (int c = 0; c < kWidth; ++c) expected.push_back(row_value(q, e, i, c));
    }
  CHECK(received == expected);
  std::int64_t in_all = 0;
  for (int j = 0; j < L; ++j) in_all += route.expert_rows[sz(j)];
  CHECK(in_all * kWidth == static_cast<std::int64_t>(expected.size()));

  // combine(f(dispatch(x))) == f(x) bitwise, f doubling (exact): each output lands at its row's home.
  View1<float> expert_out("expert out", received.size());
  std::vector<float> doubled = received;
  for (float& v : doubled) v *= 2;
  Kokkos::deep_copy(expert_out, HostView1<float>(doubled.data(), doubled.size()));
  const std::vector<float> home = to_host(group.combine(route, expert_out, into));
  std::vector<float> twice = sent.host;
  for (float& v : twice) v *= 2;
  CHECK(home == twice);
  // Backward: combine's backward moves gradients like dispatch; dispatch's backward like combine.
  CHECK(to_host(group.combine_backward(route, sent.rows, into)) == expected);
  CHECK(to_host(group.dispatch_backward(route, expert_out, into)) == twice);
}

void check_overflow(ExpertParallelGroup& group) {
  // Every rank routes 40 rows to expert 0 (rank 0's): it receives 40 n rows, over a capacity of 40 n - 1.
  ExpertRouting route = group.make_routing("h.7.mlp");
  const int E = group.num_experts(), n = group.ranks();
  std::vector<float> rows(40 * kWidth, 1.0f);
  std::vector<std::int64_t> counts(sz(E), 0);
  counts[0] = 40;
  View1<float> r("rows", rows.size());
  View1<std::int64_t> k("counts", counts.size());
  Kokkos::deep_copy(k, HostView1<std::int64_t>(counts.data(), counts.size()));
  std::string message = "(no error)";
  try {
    View1<float> into("into", sz(group.capacity_rows()) * kWidth);
    group.dispatch(route, r, k, into);
  } catch (const UsageError& e) {
    message = e.what();
  }
  CHECK(message == fmt::format("h.7.mlp: expert-parallel rank 0 of ep ({}) would receive {} rows and send 40, over "
                               "the {} rows its exchange buffers hold (the most, {} rows, for expert 0). The capacity "
                               "comes from the plan's worst case: size the group for more rows, or bound each "
                               "expert's load (model.moe.capacity_factor)", n, 40 * n, group.capacity_rows(), 40 * n));
}

void run_expert_parallel(MPI_Comm comm, int experts_per_rank) {
  MpiCommunicator ep(comm);
  const int n = ep.size();
  // Capacity: the most any rank can receive under these routings (random: < 40 rows per expert and source).
  ExpertParallelGroup group(&ep, experts_per_rank * n, kWidth, std::int64_t{40} * n * std::max(2, experts_per_rank));
  CHECK(group.experts_per_rank(experts_per_rank * n) == experts_per_rank);
  CHECK(group.first_expert() == group.rank() * experts_per_rank);
  for (int trial = 0; trial < 3; ++trial) {
    CAPTURE(trial);
    check_round_trip(group, Routing::random, trial);
  }
  check_round_trip(group, Routing::one_expert, 0);
  if (experts_per_rank == 2) check_round_trip(group, Routing::first_rank_only, 0);  // ranks > 0 receive nothing
  ExpertParallelGroup tight(&ep, experts_per_rank * n, kWidth, std::int64_t{40} * n - 1);
  check_overflow(tight);
  check_round_trip(group, Routing::random, 7);  // nothing hangs or stays half-done after the refusal
}

}  // namespace

#define FSDPP_EXPERT_PARALLEL_AT(NP)                                                                     \
  MPI_TEST_CASE("expert parallel: dispatch and combine on " #NP " rank(s) against a serial routing", NP) { \
    run_expert_parallel(test_comm, 2);                                                                   \
    run_expert_parallel(test_comm, 3);                                                                   \
  }
FSDPP_EXPERT_PARALLEL_AT(1)
FSDPP_EXPERT_PARALLEL_AT(2)
FSDPP_EXPERT_PARALLEL_AT(3)
FSDPP_EXPERT_PARALLEL_AT(4)

MPI_TEST_CASE("expert parallel: one rank without a communicator exchanges by copying; E must split evenly", 1) {
  ExpertParallelGroup alone(nullptr, 4, kWidth, 200);
  check_round_trip(alone, Routing::random, 1);
  CHECK_THROWS_WITH_AS(ExpertParallelGroup(nullptr, 0, kWidth, 10), doctest::Contains("must be a positive multiple"),
                       UsageError);
}
