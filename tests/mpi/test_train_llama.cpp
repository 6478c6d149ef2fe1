// The Llama family (Llama, and Qwen2 through the same skeleton) end to end through everything GPT-2 goes through:
// llama-tiny.yaml and qwen2-tiny.yaml learn the synthetic corpus, the same losses on 1, 2, 3 and 4 ranks under
// every strategy (HSDP and bf16 parameters included), the planner's peak against the measured one, a checkpoint
// saved on 2 ranks resumed on 3, and seed files / init_from.
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "train_runs.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/ckpt/seed_checkpoint.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/nn/qwen2.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/plan/memory_plan.hpp"
#include "fsdpp/train/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

using namespace fsdpp;

namespace {

Deck llama_deck(const std::vector<std::string>& overrides) { return test::input_deck("llama-tiny.yaml", overrides); }

// Llama and Qwen2 (q/k/v biases, tied): the Llama family's decks.
constexpr const char* kFamily[] = {"llama-tiny.yaml", "qwen2-tiny.yaml"};

using test::check_same_losses;
using test::losses_on;
using test::quiet;
using test::shared_temp_dir;
using test::with;

}  // namespace

MPI_TEST_CASE("llama: llama-tiny.yaml and qwen2-tiny.yaml learn the synthetic corpus to within 10% of its entropy floor", 1) {
  for (const char* name : kFamily) {
    CAPTURE(name);
    const Deck deck = test::input_deck(name, {});
    const TrainSummary s = train(test_comm, deck, quiet());
    REQUIRE(s.loss_floor);
    REQUIRE(s.final_val_loss);
    CHECK(s.first_loss > 0.8 * std::log(deck.model.vocab_size));  // near-uniform (a tied head: a little below)
    CHECK(*s.final_val_loss <= 1.10 * *s.loss_floor);
    CHECK(*s.final_val_loss >= 0.95 * *s.loss_floor);
  }
}

MPI_TEST_CASE("llama: 1, 2, 3 and 4 ranks under every strategy train the same model as 1 rank", 4) {
  // global_batch 12 splits over 1, 2, 3 and 4 ranks; micro_batch 1 fits them all.
  const std::vector<std::string> common = {"train.steps=8", "train.eval_interval=0", "schedule.warmup_steps=2",
                                           "train.global_batch=12", "train.micro_batch=1"};
  {  // Qwen2: every rank count and HSDP
    auto qwen2 = [&](const std::vector<std::string>& extra) { return test::input_deck("qwen2-tiny.yaml", with(common, extra)); };
    const auto q1 = losses_on(test_comm, test_rank, 1, qwen2({}));
    for (int n : {2, 3, 4}) check_same_losses(losses_on(test_comm, test_rank, n, qwen2({})), q1);
    check_same_losses(losses_on(test_comm, test_rank, 4, qwen2({"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2"})), q1);
  }
  const auto one = losses_on(test_comm, test_rank, 1, llama_deck(common));
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    check_same_losses(losses_on(test_comm, test_rank, n, llama_deck(common)), one);
  }
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"fsdp.strategy=shard_grad_op"}, {"fsdp.strategy=no_shard"},
        {"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"}, {"fsdp.reshard_after_forward=2"},
        {"fsdp.accumulate=unsharded"}}) {
    CAPTURE(extra.front());
    check_same_losses(losses_on(test_comm, test_rank, 4, llama_deck(with(common, extra))), one);
  }
  // bf16 parameters: every rank count computes with the same rounded weights; close to f32 overall.
  const auto bf16_one = losses_on(test_comm, test_rank, 1, llama_deck(with(common, {"fsdp.param_dtype=bf16"})));
  check_same_losses(losses_on(test_comm, test_rank, 4, llama_deck(with(common, {"fsdp.param_dtype=bf16"}))), bf16_one,
                    1e-4);
  check_same_losses(bf16_one, one, 2e-2);
}

MPI_TEST_CASE("llama: fsdpp plan predicts the measured per-rank peak", 4) {
  const std::vector<std::string> common = {"train.steps=2", "train.eval_interval=0", "schedule.warmup_steps=1",
                                           "train.micro_batch=2"};
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"fsdp.strategy=full_shard"}, {"fsdp.strategy=no_shard"},
        {"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"},
        // f32 GEMMs: the plan does not count bf16 GEMMs' packing scratch (tensor/matmul.cpp).
        {"fsdp.param_dtype=bf16", "fsdp.reduce_dtype=bf16", "matmul.precision=f32"}, {"model.tie_embeddings=true"}}) {
    const Deck deck = llama_deck(with(common, extra));
    CAPTURE(extra.front());
    const std::int64_t planned = plan_memory(deck, test_nb_procs).memory.total();
    const std::int64_t measured = train(test_comm, deck, quiet()).measured_peak_bytes;
    CAPTURE(planned);
    CAPTURE(measured);
    CHECK(std::abs(static_cast<double>(planned - measured)) <= 0.01 * static_cast<double>(measured));
  }
}

MPI_TEST_CASE("llama: a checkpoint saved on 2 ranks resumes on 3 within fp32 tolerance (Llama, Qwen2)", 3) {
  for (const char* name : kFamily) {
    CAPTURE(name);
    const std::string dir = shared_temp_dir(test_comm, test_rank, "fsdpp-llama-resume");
    const std::vector<std::string> common = {"train.eval_interval=0", "schedule.warmup_steps=3", "train.steps=12",
                                             "train.global_batch=12", "train.micro_batch=2"};
    auto deck = [&](const std::vector<std::string>& extra) { return test::input_deck(name, with(common, extra)); };
    const auto straight = losses_on(test_comm, test_rank, 2, deck({}));
    losses_on(test_comm, test_rank, 2, deck({"checkpoint.interval=6", "checkpoint.dir=" + dir}), 6);
    auto three = losses_on(test_comm, test_rank, 3, deck({"checkpoint.resume=true", "checkpoint.dir=" + dir}));
    three.resize(6);
    check_same_losses(three, std::vector<double>(straight.begin() + 6, straight.end()));
    MPI_Barrier(test_comm);
    if (test_rank == 0) std::filesystem::remove_all(dir);
  }
}

MPI_TEST_CASE("llama: fsdpp init seed files give the first loss of a self-seeded run through init_from", 2) {
  const std::string dir = shared_temp_dir(test_comm, test_rank, "fsdpp-llama-seed");
  if (test_rank == 0) std::filesystem::create_directories(dir);
  MPI_Barrier(test_comm);
  const Deck deck = llama_deck({"train.steps=2", "train.eval_interval=0", "schedule.warmup_steps=1"});
  write_seed_checkpoint(test_comm, deck, dir + "/seed.h5");
  const auto self = losses_on(test_comm, test_rank, 2, deck);
  Deck from_seed = deck;
  from_seed.checkpoint.init_from = dir + "/seed.h5";
  CHECK(losses_on(test_comm, test_rank, 1, from_seed)[0] == doctest::Approx(self[0]).epsilon(1e-6));
  // A GPT-2 deck refuses Llama weights, naming what does not match.
  Deck gpt = test::input_deck("tiny.yaml", {"train.steps=1", "train.eval_interval=0", "schedule.warmup_steps=0"});
  gpt.checkpoint.init_from = dir + "/seed.h5";
  CHECK_THROWS_WITH_AS(train(test_comm, gpt, quiet()), doctest::Contains("missing from the file: wte.weight"), UsageError);
  CHECK_THROWS_WITH_AS(train(test_comm, gpt, quiet()), doctest::Contains("check model.arch"), UsageError);
  MPI_Barrier(test_comm);
  if (test_rank == 0) std::filesystem::remove_all(dir);
}
