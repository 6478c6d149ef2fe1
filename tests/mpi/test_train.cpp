// Training end to end: tiny.yaml learns the synthetic corpus down to its entropy floor, and the batch is
// fixed by the deck, not the launch: 1, 2 and 4 ranks train the same model.
#include "mpi_test.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/train/trainer.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

using namespace fsdpp;

namespace {

Deck tiny_deck(std::vector<std::string> overrides) {
  std::ifstream in(FSDPP_SOURCE_DIR "/input/tiny.yaml");
  std::ostringstream text;
  text << in.rdbuf();
  Deck deck = parse_deck(text.str(), "tiny.yaml", overrides);
  deck.run.output.clear();  // no files from tests
  return deck;
}

TrainOptions quiet() {
  TrainOptions o;
  o.quiet = true;
  o.measure_peak = false;
  return o;
}

// The same deck on a group of `n` ranks of test_comm (the rest wait), returning the final training loss.
double final_loss_on(MPI_Comm test_comm, int test_rank, int n, const Deck& deck) {
  MPI_Comm group;
  MPI_Comm_split(test_comm, test_rank < n ? 0 : MPI_UNDEFINED, test_rank, &group);
  double loss = 0;
  if (group != MPI_COMM_NULL) {
    loss = train(group, deck, quiet()).final_loss;
    MPI_Comm_free(&group);
  }
  MPI_Bcast(&loss, 1, MPI_DOUBLE, 0, test_comm);
  return loss;
}

}  // namespace

MPI_TEST_CASE("train: tiny.yaml learns the synthetic corpus to within 10% of its entropy floor", 1) {
  const Deck deck = tiny_deck({});
  const TrainSummary s = train(test_comm, deck, quiet());
  REQUIRE(s.loss_floor);
  REQUIRE(s.final_val_loss);
  CHECK(s.first_loss > 0.9 * std::log(deck.model.vocab_size));  // starts at chance
  CHECK(*s.final_val_loss <= 1.10 * *s.loss_floor);
  CHECK(*s.final_val_loss >= 0.95 * *s.loss_floor);  // a loss below the floor would mean leaked targets
}

MPI_TEST_CASE("train: 2 ranks train the same model as 1 rank (the deck fixes the batch)", 2) {
  const Deck deck = tiny_deck({"train.steps=15", "train.eval_interval=0", "schedule.warmup_steps=5"});
  const double one = final_loss_on(test_comm, test_rank, 1, deck);
  const double two = final_loss_on(test_comm, test_rank, 2, deck);
  CHECK(two == doctest::Approx(one).epsilon(1e-4));
}

MPI_TEST_CASE("train: 4 ranks train the same model as 1 rank", 4) {
  const Deck deck = tiny_deck({"train.steps=15", "train.eval_interval=0", "schedule.warmup_steps=5", "train.micro_batch=4"});
  const double one = final_loss_on(test_comm, test_rank, 1, deck);
  const double four = final_loss_on(test_comm, test_rank, 4, deck);
  CHECK(four == doctest::Approx(one).epsilon(1e-4));
}

MPI_TEST_CASE("train: a global batch the ranks cannot split is refused on every rank", 4) {
  const Deck deck = tiny_deck({"train.steps=2", "schedule.warmup_steps=0", "train.micro_batch=8"});  // 16 / (8 x 4) does not divide
  CHECK_THROWS_WITH_AS(train(test_comm, deck, quiet()), doctest::Contains("train.global_batch"), UsageError);
}
