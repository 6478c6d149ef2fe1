// fsdpp plan's arithmetic, on one rank: activation sizes from shapes equal what a real forward and backward
// allocate; shards follow torch.chunk with padding; memory sizes parse; bad launches are refused.
#include "input_decks.hpp"
#include "mpi_test.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/plan/memory_plan.hpp"


using namespace fsdpp;

namespace {

Deck small_deck(const std::vector<std::string>& overrides) { return test::input_deck("small.yaml", overrides); }

}  // namespace

TEST_CASE("plan: activation bytes from shapes equal those a forward and backward allocate") {
  for (bool tied : {true, false}) {
    CAPTURE(tied);
    ModelConfig c;
    c.vocab_size = 50, c.context_length = 12, c.n_embd = 16, c.n_layer = 3, c.n_head = 2, c.tie_embeddings = tied;
    Gpt model(c);
    model.to_empty();
    model.reset_parameters(3);
    Flow flow;
    flow.B = 3, flow.T = 10;
    View1<std::int32_t> tokens("tokens", 30), targets("targets", 30);
    flow.tokens = tokens, flow.targets = targets, flow.training = true;
    model.zero_grad();
    model(flow);
    model(flow, Pass::backward);
    CHECK(model.activation_bytes() == Gpt(c).activation_bytes_for(3, 10));
    CHECK(Gpt(c).activation_bytes_for(6, 10) == 2 * Gpt(c).activation_bytes_for(3, 10));  // linear in B
  }
}

TEST_CASE("plan: units are the blocks then the root; shards are padded chunks that shrink as 1/N") {
  const Deck deck = small_deck({"train.micro_batch=1"});
  const MemoryPlan one = plan_memory(deck, 1), four = plan_memory(deck, 4), eight = plan_memory(deck, 8);
  REQUIRE(one.units.size() == 5);
  CHECK(one.units[0].name == "h.0");
  CHECK(one.units[4].name == "GPT (root)");
  std::int64_t parameters = 0;
  for (const PlannedUnit& u : one.units) parameters += u.parameters;
  CHECK(parameters == 4273664);
  CHECK(one.memory.parameters == 4 * parameters);  // one rank: no padding
  // wpe is (256, 256) and ln_f (256): 8 ranks split them evenly; wte (4096, 256) too. A block's c_attn bias
  // (768) is 96 rows per rank. Every parameter of small.yaml divides by 8, so there is no padding at all.
  CHECK(eight.memory.parameters * 8 == one.memory.parameters);
  CHECK(four.memory.parameters * 4 == one.memory.parameters);
  CHECK(four.memory.optimizer == 2 * four.memory.parameters);
  // A whole unit is gathered while it computes, whatever N is.
  CHECK(four.units[0].unsharded_bytes == one.units[0].unsharded_bytes);
  CHECK(four.memory.total() < one.memory.total());

  // Padding: 3 ranks split ln_1's 256 rows as 86, 86, 84, each rank storing 86.
  const MemoryPlan three = plan_memory(small_deck({"train.micro_batch=1", "train.global_batch=3"}), 3);
  CHECK(three.memory.parameters > one.memory.parameters / 3);
  CHECK(three.units[0].sharded_bytes * 3 >= one.units[0].sharded_bytes);
}

TEST_CASE("plan: the micro-batch that fits, and the fixed part it sits on") {
  const MemoryPlan plan = plan_memory(small_deck({"train.micro_batch=2"}), 4);
  CHECK(plan.fixed_bytes() + 2 * plan.per_sequence_bytes == plan.memory.total());
  CHECK(plan.largest_micro_batch(plan.memory.total()) == 2);
  CHECK(plan.largest_micro_batch(plan.memory.total() - 1) == 1);
  CHECK(plan.largest_micro_batch(plan.fixed_bytes()) == 0);
}

TEST_CASE("plan: memory sizes use binary units; anything else is refused with the option's name") {
  CHECK(parse_byte_size("80GiB", "--mem-per-rank") == 80LL << 30);
  CHECK(parse_byte_size("80G", "--mem-per-rank") == 80LL << 30);
  CHECK(parse_byte_size("512 MiB", "--mem-per-rank") == 512LL << 20);
  CHECK(parse_byte_size("1.5TiB", "--mem-per-rank") == 3LL << 39);
  CHECK(parse_byte_size("4096", "--mem-per-rank") == 4096);
  for (const char* bad : {"", "GiB", "-1GiB", "80XB", "80 GiBs", "0"})
    CHECK_THROWS_WITH_AS(parse_byte_size(bad, "--mem-per-rank"), doctest::Contains("--mem-per-rank"), UsageError);
}

TEST_CASE("plan: launches the trainer would refuse are refused with its words") {
  CHECK_THROWS_WITH_AS(plan_memory(small_deck({"train.micro_batch=2"}), 3), doctest::Contains("train.global_batch (8)"),
                       UsageError);
  CHECK_THROWS_WITH_AS(plan_memory(small_deck({"train.micro_batch=1", "mesh.dp_replicate=3"}), 4),
                       doctest::Contains("mesh"), UsageError);
  CHECK_THROWS_WITH_AS(plan_memory(small_deck({"train.micro_batch=1", "fsdp.reshard_after_forward=3"}), 4),
                       doctest::Contains("reshard_after_forward = 3 must divide the 4 ranks"), UsageError);
}
