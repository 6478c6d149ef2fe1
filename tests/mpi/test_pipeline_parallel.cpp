// Pipeline parallelism (mesh.pp, parallel/pipeline_parallel.hpp, train/pipeline_step.hpp): one rank's per-step losses
// and gradient norms (pp 1) at pp 2 and 4 under GPipe, 1F1B, interleaved 1F1B (2 chunks per rank) and zero_bubble
// (weight gradients in a pass of their own), within fp32 parity (1e-5 relative), for GPT-2 (tied embedding: its
// gradient summed over the first and the last stage) and Llama (untied head, RoPE), with accumulation and clipping,
// and composed with dp_shard, HSDP, tp (with sequence parallelism), cp and activation checkpointing; bitwise across
// pp, schedules and data-parallel layouts in reproducible mode (a resume across pp and dp too); an evaluation
// through the stages; checkpoints saved at one pp resumed at another; what does not run yet refused with its text.
// A mixture of experts too (its balancing losses over every stage's layers), every schedule, with ep, cp and bias
// balance.
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "train_runs.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/train/trainer.hpp"

#include <filesystem>
#include <string>
#include <vector>

using namespace fsdpp;

// This file's names, apart from other test files' in a unity build (FSDPP_UNITY_BUILD).
namespace pipeline_parallel_test {

namespace {

using test::with;

// Eight sequences a step in micro-batches of two: 4 micro-batches through the pipeline on one data-parallel rank
// (2 on two), clipped (every step's norm is above 0.5); four blocks, so that pp 4 holds one each.
const std::vector<std::string> kShort = {"train.eval_interval=0", "schedule.warmup_steps=1", "train.steps=3",
                                         "train.global_batch=8", "train.micro_batch=2", "train.grad_clip=0.5",
                                         "model.context_length=32", "model.n_layer=4"};

Deck gpt2(const std::vector<std::string>& extra) { return test::input_deck("tiny.yaml", with(kShort, extra)); }
Deck llama(const std::vector<std::string>& extra) { return test::input_deck("llama-tiny.yaml", with(kShort, extra)); }

using Run = test::RunOnRanks;
using test::check_same_run;
using test::run_on;

}  // namespace

MPI_TEST_CASE("pipeline parallel: GPT-2 (tied embedding) as on one rank, every runnable schedule and mesh", 4) {
  const Run one = run_on(test_comm, test_rank, 1, gpt2({}));
  check_same_run(run_on(test_comm, test_rank, 2, gpt2({"mesh.pp=2", "pipeline.schedule=gpipe"})), one, "pp 2, gpipe");
  check_same_run(run_on(test_comm, test_rank, 2, gpt2({"mesh.pp=2"})), one, "pp 2, 1f1b");
  check_same_run(run_on(test_comm, test_rank, 4, gpt2({"mesh.pp=4"})), one, "pp 4, 1f1b");
  check_same_run(run_on(test_comm, test_rank, 4, gpt2({"mesh.pp=4", "pipeline.schedule=gpipe"})), one, "pp 4, gpipe");
  check_same_run(run_on(test_comm, test_rank, 4, gpt2({"mesh.pp=2", "mesh.dp_shard=2"})), one, "pp 2 x dp_shard 2");
  check_same_run(run_on(test_comm, test_rank, 4,
                        gpt2({"mesh.pp=2", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=1"})),
                 one, "pp 2 x HSDP 2 x 1");
  check_same_run(run_on(test_comm, test_rank, 4, gpt2({"mesh.pp=2", "mesh.tp=2", "mesh.tp_sequence_parallel=true"})),
                 one, "pp 2 x tp 2, sequence parallel");
  check_same_run(run_on(test_comm, test_rank, 2, gpt2({"mesh.pp=2", "train.activation_checkpointing=full"})), one,
                 "pp 2, activation checkpointing");
  check_same_run(run_on(test_comm, test_rank, 2, gpt2({"mesh.pp=2", "pipeline.split=[1]"})), one,
                 "pp 2, pipeline.split [1]");
  // zero_bubble: weight gradients computed in a later pass than the input gradients, synchronized after the last.
  const std::vector<std::string> zero_bubble = {"pipeline.schedule=zero_bubble"};
  check_same_run(run_on(test_comm, test_rank, 2, gpt2(with(zero_bubble, {"mesh.pp=2"}))), one, "pp 2, zero_bubble");
  check_same_run(run_on(test_comm, test_rank, 4, gpt2(with(zero_bubble, {"mesh.pp=4"}))), one, "pp 4, zero_bubble");
  check_same_run(run_on(test_comm, test_rank, 4, gpt2(with(zero_bubble, {"mesh.pp=2", "mesh.dp_shard=2"}))), one,
                 "pp 2 x dp_shard 2, zero_bubble");
  check_same_run(run_on(test_comm, test_rank, 4,
                        gpt2(with(zero_bubble, {"mesh.pp=2", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2",
                                                "mesh.dp_shard=1", "train.activation_checkpointing=full"}))),
                 one, "pp 2 x HSDP 2 x 1, zero_bubble, activation checkpointing");
  // Interleaved: rank 0 holds blocks 0 and 2, rank 1 blocks 1 and 3 (the tied head after chunk 1 on rank 1).
  const std::vector<std::string> interleaved = {"pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2"};
  check_same_run(run_on(test_comm, test_rank, 2, gpt2(with(interleaved, {"mesh.pp=2"}))), one,
                 "pp 2 x 2 virtual stages, interleaved 1f1b");
  check_same_run(run_on(test_comm, test_rank, 4, gpt2(with(interleaved, {"mesh.pp=2", "mesh.dp_shard=2"}))), one,
                 "pp 2 x 2 virtual stages x dp_shard 2, interleaved 1f1b");
  check_same_run(run_on(test_comm, test_rank, 4,
                        gpt2(with(interleaved, {"mesh.pp=2", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2",
                                                "mesh.dp_shard=1", "train.activation_checkpointing=full"}))),
                 one, "pp 2 x 2 virtual stages x HSDP 2 x 1, interleaved 1f1b, activation checkpointing");
  // pp 4 x 2 virtual stages: eight stages of one block each
  check_same_run(run_on(test_comm, test_rank, 4, gpt2(with(interleaved, {"mesh.pp=4", "model.n_layer=8"}))),
                 run_on(test_comm, test_rank, 1, gpt2({"model.n_layer=8"})), "pp 4 x 2 virtual stages, interleaved 1f1b");
}

MPI_TEST_CASE("pipeline parallel: Llama (untied head, RoPE) as on one rank, with tp and cp", 4) {
  const Run one = run_on(test_comm, test_rank, 1, llama({}));
  check_same_run(run_on(test_comm, test_rank, 2, llama({"mesh.pp=2"})), one, "pp 2, 1f1b");
  check_same_run(run_on(test_comm, test_rank, 4, llama({"mesh.pp=4", "pipeline.schedule=gpipe"})), one, "pp 4, gpipe");
  check_same_run(run_on(test_comm, test_rank, 4, llama({"mesh.pp=2", "mesh.tp=2"})), one, "pp 2 x tp 2");
  check_same_run(run_on(test_comm, test_rank, 2, llama({"mesh.pp=2", "pipeline.schedule=interleaved_1f1b",
                                                        "pipeline.virtual_stages=2"})),
                 one, "pp 2 x 2 virtual stages, interleaved 1f1b");
  check_same_run(run_on(test_comm, test_rank, 4, llama({"mesh.pp=2", "mesh.tp=2", "mesh.tp_sequence_parallel=true",
                                                        "pipeline.schedule=zero_bubble"})),
                 one, "pp 2 x tp 2, sequence parallel, zero_bubble");
  check_same_run(run_on(test_comm, test_rank, 4, llama({"mesh.pp=4", "pipeline.schedule=zero_bubble",
                                                        "train.activation_checkpointing=every_2"})),
                 one, "pp 4, zero_bubble, activation checkpointing of every second block");
  // Context parallelism: each micro-batch in flight keeps its rows of the sequences (tokens, positions, document
  // starts) in its activation slot, so interleaving and zero_bubble run under cp too.
  const std::vector<std::string> fused = {"model.attention=fused"};
  const std::vector<std::string> masks = {"model.attention=fused", "data.document_mask=true", "data.eot_id=22",
                                          "data.reset_positions=true"};
  const Run fused_one = run_on(test_comm, test_rank, 1, llama(fused));
  check_same_run(run_on(test_comm, test_rank, 4, llama(with(fused, {"mesh.pp=2", "mesh.cp=2"}))), fused_one,
                 "pp 2 x cp 2");
  check_same_run(run_on(test_comm, test_rank, 4, llama(with(fused, {"mesh.pp=2", "mesh.cp=2",
                                                                   "pipeline.schedule=zero_bubble"}))),
                 fused_one, "pp 2 x cp 2, zero_bubble");
  check_same_run(run_on(test_comm, test_rank, 4, llama(with(masks, {"mesh.pp=2", "mesh.cp=2",
                                                                   "pipeline.schedule=interleaved_1f1b",
                                                                   "pipeline.virtual_stages=2"}))),
                 run_on(test_comm, test_rank, 1, llama(masks)),
                 "pp 2 x 2 virtual stages x cp 2, interleaved 1f1b, document masks with reset positions");
}

// A mixture of experts (Qwen3-MoE: block 0 dense, 1-3 sparse): the balancing losses are over every layer, so the
// router's statistics travel with the activations and back with the gradients; each micro-batch in flight keeps its
// route and expert exchange in its activation slot, so every schedule runs; with expert parallelism inside each
// stage, with cp, with the aux-loss-free bias balance (moved by the step's
// selections of every layer, from the last stage), and bitwise in reproducible mode.
MPI_TEST_CASE("pipeline parallel: Qwen3-MoE as on one rank, every schedule, with ep, cp, bias balance; bitwise", 4) {
  auto moe = [](const std::vector<std::string>& extra) {
    return test::input_deck("qwen3-moe-tiny.yaml", with(kShort, extra));
  };
  const Run one = run_on(test_comm, test_rank, 1, moe({}));
  check_same_run(run_on(test_comm, test_rank, 2, moe({"mesh.pp=2"})), one, "Qwen3-MoE, pp 2, 1f1b");
  check_same_run(run_on(test_comm, test_rank, 4, moe({"mesh.pp=4", "pipeline.schedule=gpipe"})), one,
                 "Qwen3-MoE, pp 4, gpipe");
  check_same_run(run_on(test_comm, test_rank, 4, moe({"mesh.pp=2", "mesh.ep=2"})), one, "Qwen3-MoE, pp 2 x ep 2");
  // Three blocks: stage 0 holds only the dense block 0, so it has no experts to exchange (it was refused).
  check_same_run(run_on(test_comm, test_rank, 4, moe({"model.n_layer=3", "mesh.pp=2", "mesh.dp_shard=2", "mesh.ep=2"})),
                 run_on(test_comm, test_rank, 1, moe({"model.n_layer=3"})),
                 "Qwen3-MoE, 3 blocks, pp 2 x dp_shard 2 x ep 2: stage 0 dense");
  check_same_run(run_on(test_comm, test_rank, 2, moe({"mesh.pp=2", "pipeline.schedule=interleaved_1f1b",
                                                      "pipeline.virtual_stages=2"})),
                 one, "Qwen3-MoE, pp 2 x 2 virtual stages, interleaved 1f1b");
  check_same_run(run_on(test_comm, test_rank, 4, moe({"mesh.pp=2", "mesh.ep=2", "pipeline.schedule=zero_bubble"})),
                 one, "Qwen3-MoE, pp 2 x ep 2, zero_bubble");
  check_same_run(run_on(test_comm, test_rank, 4, moe({"mesh.pp=4", "pipeline.schedule=zero_bubble",
                                                      "train.activation_checkpointing=full"})),
                 one, "Qwen3-MoE, pp 4, zero_bubble, activation checkpointing");
  check_same_run(run_on(test_comm, test_rank, 4, moe({"mesh.pp=2", "mesh.cp=2", "model.attention=fused"})),
                 run_on(test_comm, test_rank, 1, moe({"model.attention=fused"})), "Qwen3-MoE, pp 2 x cp 2");
  const std::vector<std::string> bias = {"model.moe.balance=bias", "model.moe.bias_update_rate=0.01"};
  check_same_run(run_on(test_comm, test_rank, 2, moe(with(bias, {"mesh.pp=2"}))), run_on(test_comm, test_rank, 1, moe(bias)),
                 "Qwen3-MoE, pp 2, bias balance");
  const std::vector<std::string> exact = {"train.reproducible=true"};
  const Run exact_one = run_on(test_comm, test_rank, 1, moe(exact));
  // (a pair, not structured bindings: CAPTURE's lambda may not capture those before C++20, and nvcc says so)
  for (const auto& layout : std::vector<std::pair<int, std::vector<std::string>>>{
           {2, {"mesh.pp=2"}}, {4, {"mesh.pp=2", "mesh.ep=2"}}, {4, {"mesh.pp=4", "pipeline.schedule=gpipe"}},
           {4, {"mesh.pp=2", "mesh.ep=2", "pipeline.schedule=zero_bubble"}}}) {
    CAPTURE(layout.second.back());
    const Run got = run_on(test_comm, test_rank, layout.first, moe(with(exact, layout.second)));
    test::check_bitwise(got.losses, exact_one.losses, "loss");
    test::check_bitwise(got.norms, exact_one.norms, "gradient norm");
  }
}

// Reproducible mode (docs/reproducible.md): each micro-batch a unit, its gradient words summed exactly over the
// stage's ranks and the unit losses and the norm's words over the stages: the same bits at any pp, schedule and
// data-parallel layout; with a tied embedding (GPT-2's wte) too, whose two copies' words are summed before either
// becomes floats, as one rank cuts the head's part apart from the lookup's.
MPI_TEST_CASE("pipeline parallel: reproducible mode is bitwise across pp, schedules and data-parallel layouts", 4) {
  const std::vector<std::string> exact = {"train.reproducible=true"};
  // Each layout of `model` (llama or gpt2) against one rank's run, bit for bit.
  auto checker = [&](Deck (*model)(const std::vector<std::string>&), std::vector<std::string> base) {
    const Run one = run_on(test_comm, test_rank, 1, model(base));
    return [=](int n, const std::vector<std::string>& layout, const std::string& name) {
      CAPTURE(name);
      const Run got = run_on(test_comm, test_rank, n, model(with(base, layout)));
      test::check_bitwise(got.losses, one.losses, "loss");
      test::check_bitwise(got.norms, one.norms, "gradient norm");
    };
  };
  const auto check = checker(llama, exact);
  check(2, {"mesh.pp=2"}, "pp 2, 1f1b");
  check(2, {"mesh.pp=2", "pipeline.schedule=gpipe"}, "pp 2, gpipe");
  check(4, {"mesh.pp=4"}, "pp 4, 1f1b");
  check(4, {"mesh.pp=2", "mesh.dp_shard=2"}, "pp 2 x dp_shard 2");
  check(2, {"mesh.pp=2", "pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2"}, "pp 2 x 2, interleaved");
  check(4, {"mesh.pp=4", "pipeline.schedule=zero_bubble"}, "pp 4, zero_bubble");
  check(4, {"mesh.pp=2", "mesh.dp_shard=2", "pipeline.schedule=zero_bubble"}, "pp 2 x dp_shard 2, zero_bubble");
  const auto check_tied = checker(gpt2, exact);
  check_tied(2, {"mesh.dp_shard=2"}, "GPT-2, dp_shard 2");
  check_tied(2, {"mesh.pp=2"}, "GPT-2, pp 2, 1f1b");
  check_tied(4, {"mesh.pp=2", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=1",
                 "pipeline.schedule=zero_bubble"}, "GPT-2, pp 2 x HSDP 2 x 1, zero_bubble");
  // One unit per step: the stages' words still accumulate to the step's end, where the copies meet.
  checker(gpt2, with(exact, {"train.global_batch=1", "train.micro_batch=1"}))(4, {"mesh.pp=4"},
                                                                             "GPT-2, pp 4, one unit per step");
  // A checkpoint saved at pp 2 x dp_shard 2 (zero_bubble) and resumed at pp 4 and at pp 1 x dp_shard 3 continues
  // with the uninterrupted run's bits.
  const std::string dir = test::shared_temp_dir(test_comm, test_rank, "fsdpp-pp-exact-resume");
  const std::vector<std::string> twelve = with(exact, {"train.global_batch=12", "train.steps=4"});
  const std::vector<double> whole = test::losses_on(test_comm, test_rank, 1, llama(twelve));
  const std::vector<std::string> saving = with(twelve, {"checkpoint.interval=2", "checkpoint.resume=auto"});
  for (const std::string& folder : {dir + "/a", dir + "/b"})  // stopped after step 2
    test::losses_on(test_comm, test_rank, 4, llama(with(saving, {"checkpoint.dir=" + folder, "mesh.pp=2",
                                                                 "mesh.dp_shard=2", "pipeline.schedule=zero_bubble"})), 2);
  auto check_resumed = [&](const std::vector<double>& resumed, const std::string& layout) {
    CAPTURE(layout);
    const std::vector<double> want(whole.begin() + 2, whole.end()), got(resumed.begin(), resumed.begin() + 2);
    test::check_bitwise(got, want, "resumed loss");
    CHECK(resumed[2] == 0.0);  // the run resumed at step 3: it did not start again
  };
  check_resumed(test::losses_on(test_comm, test_rank, 4, llama(with(saving, {"checkpoint.dir=" + dir + "/a", "mesh.pp=4"}))),
                "pp 4");
  check_resumed(test::losses_on(test_comm, test_rank, 3, llama(with(saving, {"checkpoint.dir=" + dir + "/b",
                                                                             "mesh.dp_shard=3"}))),
                "pp 1 x dp_shard 3");
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

// The training loop end to end: the losses a pipeline logs, its evaluation through the stages and its FLOPs per
// token (MFU's), as pp 1's.
MPI_TEST_CASE("pipeline parallel: train() with an evaluation through the stages", 2) {
  const std::vector<std::string> evaluated = {"train.eval_interval=3", "train.eval_batches=2"};
  TrainOptions quiet;
  quiet.quiet = true;
  quiet.measure_peak = false;
  MPI_Comm one_rank;
  MPI_Comm_split(test_comm, test_rank == 0 ? 0 : MPI_UNDEFINED, 0, &one_rank);
  const TrainSummary want = one_rank != MPI_COMM_NULL ? train(one_rank, gpt2(evaluated), quiet) : TrainSummary{};
  if (one_rank != MPI_COMM_NULL) MPI_Comm_free(&one_rank);
  const TrainSummary got = train(test_comm, gpt2(with(evaluated, {"mesh.pp=2"})), quiet);
  if (test_rank == 0) {
    test::check_same_losses(got.losses, want.losses);
    REQUIRE(got.final_val_loss.has_value());
    REQUIRE(want.final_val_loss.has_value());
    CHECK(*got.final_val_loss == doctest::Approx(*want.final_val_loss).epsilon(1e-5));
    CHECK(got.flops_per_token == want.flops_per_token);  // MFU counts the whole model, not rank 0's stage
  }
}

// One file whatever the pp: every stage's tensors under their whole-model names (the tied embedding once), so a save
// at pp 2 x dp_shard 2 resumes at pp 1 x dp_shard 3 and at pp 4 and continues as the uninterrupted run; an
// asynchronous save at pp 2 resumes at pp 2.
MPI_TEST_CASE("pipeline parallel: a checkpoint saved at pp 2 x dp 2 resumes at pp 1 x dp 3 and pp 4 x dp 1", 4) {
  const std::string dir = test::shared_temp_dir(test_comm, test_rank, "fsdpp-pp-resume");
  const std::vector<std::string> saving = {"train.global_batch=12", "train.steps=4", "checkpoint.interval=2",
                                           "checkpoint.resume=auto"};
  const auto whole = test::losses_on(test_comm, test_rank, 1, gpt2({"train.global_batch=12", "train.steps=4"}));
  auto resumed_at = [&](const std::string& folder, const std::vector<std::string>& mesh, int ranks) {
    return test::losses_on(test_comm, test_rank, ranks, gpt2(with(with(saving, {"checkpoint.dir=" + folder}), mesh)));
  };
  // A resumed run's summary holds the steps it ran: 3 and 4, first in the list.
  auto check_continues = [&](const std::vector<double>& resumed, const std::string& layout) {
    CAPTURE(layout);
    REQUIRE(resumed.size() == whole.size());
    for (std::size_t s = 2; s < whole.size(); ++s) {
      CAPTURE(s);
      CHECK(resumed[s - 2] == doctest::Approx(whole[s]).epsilon(1e-5));
    }
    CHECK(resumed[2] == 0.0);  // and no more: the run resumed, it did not start again
  };
  for (const std::string& folder : {dir + "/a", dir + "/b"})  // stopped after step 2 at pp 2 x dp_shard 2
    test::losses_on(test_comm, test_rank, 4, gpt2(with(saving, {"checkpoint.dir=" + folder, "mesh.pp=2", "mesh.dp_shard=2"})), 2);
  // The file holds every tensor once, each shard sound (what `fsdpp ckpt verify` checks).
  if (test_rank == 0) CHECK(verify_checkpoint(dir + "/a/step_00000002.h5").empty());
  if (test_rank == 0) {
    const std::string listing = inspect_checkpoint(dir + "/a/step_00000002.h5");
    std::size_t tensors = 0;
    for (std::size_t at = listing.find("\n  /model/"); at != std::string::npos; at = listing.find("\n  /model/", at + 1))
      ++tensors;
    CHECK(tensors == make_model(gpt2({}))->parameters().size());
  }
  check_continues(resumed_at(dir + "/a", {}, 3), "pp 1 x dp_shard 3");
  check_continues(resumed_at(dir + "/b", {"mesh.pp=4"}, 4), "pp 4 x dp_shard 1");
  const std::vector<std::string> async = {"checkpoint.async=true", "mesh.pp=2"};
  test::losses_on(test_comm, test_rank, 2, gpt2(with(saving, with(async, {"checkpoint.dir=" + dir + "/c"}))), 2);
  check_continues(resumed_at(dir + "/c", async, 2), "asynchronous save at pp 2, resumed at pp 2");
  // checkpoint.init_from: each stage reads its own tensors of the file, over its own ranks
  const std::vector<std::string> init = {"checkpoint.init_from=" + dir + "/a/step_00000002.h5"};
  check_same_run(run_on(test_comm, test_rank, 4, gpt2(with(init, {"mesh.pp=4"}))), run_on(test_comm, test_rank, 1, gpt2(init)),
                 "init_from at pp 4");
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

MPI_TEST_CASE("pipeline parallel: what does not run yet is refused on every rank, with what to do", 2) {
  // a stage's failure to read its weights stops every rank, naming the stage
  std::string init_error;
  try {
    TrainOptions quiet;
    quiet.quiet = true;
    quiet.measure_peak = false;
    train(test_comm, gpt2({"mesh.pp=2", "checkpoint.init_from=/nonexistent.h5"}), quiet);
  } catch (const UsageError& e) {
    init_error = e.what();
  }
  CHECK(init_error.find("pipeline stage 0: cannot open checkpoint '/nonexistent.h5'") != std::string::npos);
  // pipeline.microbatches other than the step's micro-batches (8 / 2 = 4 here) would be ignored: refused at step 1
  std::string micro_error;
  try {
    (void)test::run_steps(test_comm, gpt2({"mesh.pp=2", "pipeline.microbatches=8"}));
  } catch (const UsageError& e) {
    micro_error = e.what();
  }
  CHECK(micro_error.find("pipeline.microbatches is 8, but each step has 4 micro-batches (train.global_batch / "
                          "(train.micro_batch x the stage's data-parallel ranks) = 8 / (2 x 1))") != std::string::npos);
  // In reproducible mode the pipeline's micro-batches are the units: the message counts those, by their formula.
  std::string unit_error;
  try {
    (void)test::run_steps(test_comm, gpt2({"mesh.pp=2", "train.reproducible=true", "train.global_batch=12",
                                           "train.micro_batch=3", "pipeline.microbatches=2"}));
  } catch (const UsageError& e) {
    unit_error = e.what();
  }
  CHECK(unit_error.find("pipeline.microbatches is 2, but each step has 12 reproducible units (train.global_batch / "
                        "(train.reproducible_unit x the stage's data-parallel ranks) = 12 / (1 x 1))") !=
        std::string::npos);
  CHECK(test::run_steps(test_comm, gpt2({"mesh.pp=2", "pipeline.microbatches=4"})).losses.size() == 3);
}

}  // namespace pipeline_parallel_test
