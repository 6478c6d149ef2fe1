// Context parallelism (mesh.cp, nn/context_parallel.hpp): one rank's per-step losses and gradient norms (cp 1) on
// every mesh with cp, within fp32 parity (1e-5 relative): cp 2 and 4, cp x dp_shard, cp x tp with and without
// sequence parallelism, HSDP x cp, activation checkpointing, bf16 parameters, accumulation with clipping, grouped-
// query attention (llama-tiny: 4 query heads, 2 KV heads), packed documents with reset positions, GPT-2's learned
// positions, and a mixture of experts at cp 2 and ep 2 x cp 2; reproducible mode with token chunks bitwise across
// cp 1, 2 and 4 and the meshes around them; the deck's rules refused with their text; a checkpoint saved at cp 2
// resumes at cp 1 and continues (bitwise in reproducible mode).
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "train_runs.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/train/trainer.hpp"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

using namespace fsdpp;

namespace {

using test::with;

// Four sequences a step in micro-batches of two (accumulation on one data-parallel rank), clipped; T 32, so cp 4
// cuts it into 8 chunks of 4 rows.
const std::vector<std::string> kShort = {"train.eval_interval=0", "schedule.warmup_steps=1", "train.steps=3",
                                         "train.global_batch=4", "train.micro_batch=2", "train.grad_clip=0.5",
                                         "model.context_length=32", "model.attention=fused"};
// Token 22, one of the synthetic corpus's frequent ones, stands for the end-of-text (test_tensor_parallel.cpp).
const std::vector<std::string> kMasks = {"data.document_mask=true", "data.eot_id=22", "data.reset_positions=true"};

Deck llama(const std::vector<std::string>& extra) { return test::input_deck("llama-tiny.yaml", with(kShort, extra)); }

using Run = test::RunOnRanks;
using test::check_same_run;
using test::run_on;

std::string rule_error(const std::vector<std::string>& overrides, int ranks) {
  try {
    parallel_layout(llama(overrides), ranks);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

MPI_TEST_CASE("context parallel: the same losses and gradient norms as cp 1 on every mesh with cp", 4) {
  const Run one = run_on(test_comm, test_rank, 1, llama({}));
  check_same_run(run_on(test_comm, test_rank, 2, llama({"mesh.cp=2"})), one, "cp 2");
  check_same_run(run_on(test_comm, test_rank, 4, llama({"mesh.cp=4"})), one, "cp 4");
  check_same_run(run_on(test_comm, test_rank, 4, llama({"mesh.cp=2", "mesh.dp_shard=2"})), one, "dp_shard 2 x cp 2");
  check_same_run(run_on(test_comm, test_rank, 4, llama({"mesh.cp=2", "mesh.tp=2"})), one, "cp 2 x tp 2");
  check_same_run(run_on(test_comm, test_rank, 4, llama({"mesh.cp=2", "mesh.tp=2", "mesh.tp_sequence_parallel=true"})),
                 one, "cp 2 x tp 2, sequence parallel");
  check_same_run(run_on(test_comm, test_rank, 4,
                        llama({"mesh.cp=2", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=1"})),
                 one, "HSDP 2 x 1 x cp 2");
  check_same_run(run_on(test_comm, test_rank, 2, llama({"mesh.cp=2", "train.activation_checkpointing=full"})), one,
                 "cp 2, activation checkpointing");
  const Run bf16 = run_on(test_comm, test_rank, 1, llama({"fsdp.param_dtype=bf16"}));
  check_same_run(run_on(test_comm, test_rank, 2, llama({"mesh.cp=2", "fsdp.param_dtype=bf16"})), bf16,
                 "cp 2, bf16 parameters");
}

// GPT-2: its learned position table read (and its gradient written) at each row's global position; under tp 2 the
// vocabulary-parallel embedding adds them on one tp rank.
MPI_TEST_CASE("context parallel: GPT-2's learned positions at cp 2 and cp 2 x tp 2", 4) {
  auto gpt2 = [](const std::vector<std::string>& extra) { return test::input_deck("tiny.yaml", with(kShort, extra)); };
  const Run one = run_on(test_comm, test_rank, 1, gpt2({}));
  check_same_run(run_on(test_comm, test_rank, 2, gpt2({"mesh.cp=2"})), one, "GPT-2, cp 2");
  check_same_run(run_on(test_comm, test_rank, 4, gpt2({"mesh.cp=2", "mesh.tp=2", "mesh.tp_sequence_parallel=true"})),
                 one, "GPT-2, cp 2 x tp 2, sequence parallel");
}

MPI_TEST_CASE("context parallel: packed documents with reset positions as at cp 1", 4) {
  const Run one = run_on(test_comm, test_rank, 1, llama(kMasks));
  const Run unmasked = run_on(test_comm, test_rank, 1, llama({}));
  CHECK(std::fabs(one.losses.front() - unmasked.losses.front()) > 1e-4);  // the masks reach the model
  check_same_run(run_on(test_comm, test_rank, 2, llama(with(kMasks, {"mesh.cp=2"}))), one, "masks, cp 2");
  check_same_run(run_on(test_comm, test_rank, 4, llama(with(kMasks, {"mesh.cp=4"}))), one, "masks, cp 4");
  check_same_run(run_on(test_comm, test_rank, 4, llama(with(kMasks, {"mesh.cp=2", "mesh.tp=2"}))), one,
                 "masks, cp 2 x tp 2");
}

// A mixture of experts: the balancing losses are the whole sequences' (the router's statistics summed over cp), and
// the experts' shard group takes the cp ranks; with expert parallelism the ep group exchanges each chunk's rows.
MPI_TEST_CASE("context parallel: Qwen3-MoE at cp 2, and ep 2 x cp 2, as on one rank", 4) {
  auto moe = [](const std::vector<std::string>& extra) {
    return test::input_deck("qwen3-moe-tiny.yaml", with(kShort, extra));
  };
  const Run one = run_on(test_comm, test_rank, 1, moe({}));
  check_same_run(run_on(test_comm, test_rank, 2, moe({"mesh.cp=2"})), one, "Qwen3-MoE, cp 2");
  check_same_run(run_on(test_comm, test_rank, 4, moe({"mesh.cp=2", "mesh.ep=2"})), one, "Qwen3-MoE, ep 2 x cp 2");
}

// Reproducible mode with token chunks (train.reproducible_chunks 8: T 32 in chunks of 4 rows, whole chunks at cp 1, 2
// and 4): per-step losses, gradient norms and every final weight compared with ==, against the one-rank run.
void check_bitwise_run(const Run& got, const Run& want, const std::string& layout) {
  CAPTURE(layout);
  test::check_bitwise_run(got, want);
}

MPI_TEST_CASE("context parallel: reproducible mode bitwise across cp 1, 2 and 4 and the meshes around it", 4) {
  const std::vector<std::string> exact = {"train.reproducible=true", "train.reproducible_chunks=8"};
  const auto llama_exact = [&](const std::vector<std::string>& extra) { return llama(with(exact, extra)); };
  const Run one = run_on(test_comm, test_rank, 1, llama_exact({}));
  const Run plain = run_on(test_comm, test_rank, 2, llama({"mesh.cp=2"}));
  test::check_same_losses(plain.losses, one.losses);  // the same training, to fp32 parity
  CHECK(plain.weights != one.weights);                // but not the same bits without the mode
  check_bitwise_run(run_on(test_comm, test_rank, 2, llama_exact({"mesh.cp=2"})), one, "cp 2");
  check_bitwise_run(run_on(test_comm, test_rank, 4, llama_exact({"mesh.cp=4"})), one, "cp 4");
  check_bitwise_run(run_on(test_comm, test_rank, 4, llama_exact({"mesh.cp=2", "mesh.dp_shard=2"})), one,
                    "dp_shard 2 x cp 2");
  check_bitwise_run(run_on(test_comm, test_rank, 4,
                           llama_exact({"mesh.cp=2", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2",
                                        "mesh.dp_shard=1"})),
                    one, "HSDP 2 x 1 x cp 2");
  check_bitwise_run(run_on(test_comm, test_rank, 2, llama_exact({"mesh.cp=2", "train.activation_checkpointing=full"})),
                    one, "cp 2, activation checkpointing");
  check_bitwise_run(run_on(test_comm, test_rank, 2, llama_exact({"train.micro_batch=1"})), one,
                    "cp 1, 2 ranks, micro-batch 1");
  // One backward a step (no accumulation): the words are converted as they arrive, as the mean over the units.
  const std::vector<std::string> single = {"train.global_batch=2", "train.reproducible_unit=2"};
  check_bitwise_run(run_on(test_comm, test_rank, 2, llama_exact(with(single, {"mesh.cp=2"}))),
                    run_on(test_comm, test_rank, 1, llama_exact(single)), "one backward a step, cp 2");
  const Run tp = run_on(test_comm, test_rank, 2, llama_exact({"mesh.tp=2"}));  // at a fixed tp, as ever
  check_bitwise_run(run_on(test_comm, test_rank, 4, llama_exact({"mesh.cp=2", "mesh.tp=2"})), tp, "cp 2 x tp 2");
  const Run masked = run_on(test_comm, test_rank, 1, llama_exact(kMasks));
  check_bitwise_run(run_on(test_comm, test_rank, 4, llama_exact(with(kMasks, {"mesh.cp=4"}))), masked, "masks, cp 4");
  const auto gpt2 = [&](const std::vector<std::string>& extra) {
    return test::input_deck("tiny.yaml", with(kShort, with(exact, extra)));
  };
  const Run gpt2_one = run_on(test_comm, test_rank, 1, gpt2({}));
  check_bitwise_run(run_on(test_comm, test_rank, 2, gpt2({"mesh.cp=2"})), gpt2_one, "GPT-2, cp 2");
  check_bitwise_run(run_on(test_comm, test_rank, 4, gpt2({"mesh.cp=4"})), gpt2_one, "GPT-2, cp 4");
}

MPI_TEST_CASE("context parallel: a checkpoint saved at cp 2 resumes at cp 1 (bitwise in reproducible mode)", 2) {
  const std::string dir = test::shared_temp_dir(test_comm, test_rank, "fsdpp-cp-resume");
  const std::vector<std::string> saving = {"checkpoint.dir=" + dir, "checkpoint.interval=2", "train.steps=4",
                                           "checkpoint.resume=auto"};
  // stopped after step 2 on two ranks at cp 2 (its checkpoint saved there), then resumed on one rank
  test::losses_on(test_comm, test_rank, 2, llama(with(saving, {"mesh.cp=2"})), 2);
  const auto resumed = test::losses_on(test_comm, test_rank, 1, llama(saving));
  const auto whole = test::losses_on(test_comm, test_rank, 1, llama({"train.steps=4"}));
  REQUIRE(resumed.size() == whole.size());
  // The resumed run's summary holds the steps it ran, 3 and 4, first: it resumed rather than started again.
  for (std::size_t s = 2; s < whole.size(); ++s) {
    CAPTURE(s);
    CHECK(resumed[s - 2] == doctest::Approx(whole[s]).epsilon(1e-5));
  }
  CHECK(resumed[2] == 0.0);
  // In reproducible mode with token chunks the resumed steps are bitwise those of the uninterrupted run.
  const std::vector<std::string> exact = {"train.reproducible=true", "train.reproducible_chunks=4",
                                          "checkpoint.dir=" + dir + "-exact", "checkpoint.interval=2", "train.steps=4",
                                          "checkpoint.resume=auto"};
  test::losses_on(test_comm, test_rank, 2, llama(with(exact, {"mesh.cp=2"})), 2);
  const auto exact_resumed = test::losses_on(test_comm, test_rank, 1, llama(exact));
  const auto exact_whole = test::losses_on(test_comm, test_rank, 1,
                                           llama({"train.reproducible=true", "train.reproducible_chunks=4", "train.steps=4"}));
  test::check_bitwise(std::vector<double>(exact_resumed.begin(), exact_resumed.begin() + 2),
                      std::vector<double>(exact_whole.begin() + 2, exact_whole.end()), "resumed loss");
  if (test_rank == 0) std::filesystem::remove_all(dir), std::filesystem::remove_all(dir + "-exact");
}

TEST_CASE("context parallel: the deck's rules, with what to do") {
  CHECK(rule_error({"mesh.cp=3"}, 3).find("model.context_length (32) must be a multiple of 6") != std::string::npos);
  CHECK(rule_error({"mesh.cp=2", "model.attention=reference"}, 2).find("set model.attention fused") != std::string::npos);
  CHECK(rule_error({"mesh.cp=2", "train.reproducible=true"}, 2).find("Set train.reproducible_chunks to a multiple "
                                                                     "of 4") != std::string::npos);
  CHECK(rule_error({"mesh.cp=4", "train.reproducible=true", "train.reproducible_chunks=4"}, 4)
            .find("must be a multiple of 2 x mesh.cp = 8") != std::string::npos);
  CHECK(rule_error({"train.reproducible=true", "train.reproducible_chunks=3"}, 1)
            .find("model.context_length (32) must be a multiple of it") != std::string::npos);
  CHECK(rule_error({"train.reproducible=true", "train.reproducible_chunks=4", "model.attention=reference"}, 1)
            .find("set model.attention fused on every run") != std::string::npos);
  CHECK(rule_error({"train.reproducible=true", "train.reproducible_chunks=4", "mesh.tp=2",
                    "mesh.tp_sequence_parallel=true"}, 2)
            .find("drop mesh.tp_sequence_parallel") != std::string::npos);
  CHECK(rule_error({"mesh.cp=2", "fsdp.strategy=no_shard"}, 2).find("no_shard does not have") != std::string::npos);
  CHECK(rule_error({"mesh.cp=2"}, 3).find("does not divide the 3 ranks") != std::string::npos);
  CHECK(rule_error({"mesh.cp=0"}, 1).find("expected an integer >= 1, got 0") != std::string::npos);
}
