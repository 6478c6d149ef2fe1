// A weighted mixture of data sources (data/mixture.hpp) over real ranks: each rank fills only its part of every
// global batch, and the parts gathered over 1, 2 or 3 ranks are the batch one process draws whole; a state saved
// after k steps by the ranks of a 2-rank layout, resumed on 3 ranks, continues that stream exactly.
#include "mpi_test.hpp"

#include "fsdpp/data/mixture.hpp"

#include <mpi.h>

#include <vector>

using namespace fsdpp;

namespace {

constexpr std::int64_t T = 8, G = 12, kSteps = 8;

// Three sources whose tokens name them (source k holds 1000 k + position mod 1000).
MixtureSampler make_mixture(SampleOrder order, std::uint64_t seed) {
  std::vector<MixtureInput> in;
  const std::vector<double> weights = {0.5, 0.3, 0.2};
  for (int k = 0; k < 3; ++k) {
    std::vector<std::uint32_t> tokens(static_cast<std::size_t>(3000 + 500 * k));
    for (std::size_t p = 0; p < tokens.size(); ++p) tokens[p] = static_cast<std::uint32_t>(1000 * k + p % 1000);
    in.push_back({"source" + std::to_string(k), std::move(tokens), weights[static_cast<std::size_t>(k)]});
  }
  return MixtureSampler(std::move(in), T, 0.1, seed, order);
}

// Global batch `step` as the ranks of `comm` fill it: each its own G/R sequences, gathered in rank order.
std::vector<std::int32_t> gathered_batch(const MixtureSampler& sampler, Split split, std::int64_t step, MPI_Comm comm) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const std::int64_t share = G / ranks;
  std::vector<std::int32_t> mine(static_cast<std::size_t>(share * T)), targets(mine.size());
  sampler.fill_batch(split, step, G, rank * share, share, mine.data(), targets.data());
  std::vector<std::int32_t> all(static_cast<std::size_t>(G * T));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT32_T, all.data(), static_cast<int>(mine.size()),
                MPI_INT32_T, comm);
  return all;
}

std::vector<std::int32_t> whole_batch(const MixtureSampler& sampler, Split split, std::int64_t step) {
  std::vector<std::int32_t> in(static_cast<std::size_t>(G * T)), tg(in.size());
  sampler.fill_batch(split, step, G, 0, G, in.data(), tg.data());
  return in;
}

void same_batches_on_every_layout(MPI_Comm comm) {
  for (const SampleOrder order : {SampleOrder::shuffled, SampleOrder::sequential}) {
    const MixtureSampler sampler = make_mixture(order, 21);
    for (std::int64_t step = 0; step < kSteps; ++step) {
      CHECK(gathered_batch(sampler, Split::train, step, comm) == whole_batch(sampler, Split::train, step));
      CHECK(gathered_batch(sampler, Split::val, step, comm) == whole_batch(sampler, Split::val, step));
    }
  }
}

}  // namespace

MPI_TEST_CASE("data mixture: the same global batches on 1 rank", 1) { same_batches_on_every_layout(test_comm); }
MPI_TEST_CASE("data mixture: the same global batches on 2 ranks", 2) { same_batches_on_every_layout(test_comm); }

MPI_TEST_CASE("data mixture: the same global batches on 3 ranks; a state saved on 2 ranks resumes on 3", 3) {
  same_batches_on_every_layout(test_comm);
  // Ranks 0 and 1 train 5 steps as a 2-rank layout; rank 0's state (what its checkpoint holds) reaches every rank.
  constexpr std::int64_t k = 5;
  MixtureSampler run = make_mixture(SampleOrder::sequential, 77);
  if (test_rank < 2)
    for (std::int64_t s = 0; s < k; ++s) run.advance(G);
  MixtureState saved = run.state();
  std::vector<std::int64_t> words = {saved.next_step};
  for (const SourceRecord& r : saved.sources) words.push_back(r.sequences);
  MPI_Bcast(words.data(), static_cast<int>(words.size()), MPI_INT64_T, 0, test_comm);
  saved.next_step = words[0];
  for (std::size_t i = 0; i < saved.sources.size(); ++i) saved.sources[i].sequences = words[i + 1];
  CHECK(saved.next_step == k);

  MixtureSampler resumed = make_mixture(SampleOrder::sequential, 77);
  resumed.set_state(saved);
  const MixtureSampler uninterrupted = make_mixture(SampleOrder::sequential, 77);
  for (std::int64_t s = k; s < k + 4; ++s) {
    CHECK(gathered_batch(resumed, Split::train, resumed.next_step(), test_comm) ==
          whole_batch(uninterrupted, Split::train, s));
    resumed.advance(G);
  }
  // The counts of the whole run: those of 9 uninterrupted steps.
  MixtureSampler nine = make_mixture(SampleOrder::sequential, 77);
  for (int s = 0; s < 9; ++s) nine.advance(G);
  CHECK(resumed.sequences_drawn() == nine.sequences_drawn());
}
