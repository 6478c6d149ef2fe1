// Reproducible mode (train.reproducible, docs/reproducible.md): the losses, gradient norms and final weights of
// a deck are bitwise those of its one-rank run on every data-parallel layout, compared with ==; the mode is the
// same training as the default one (within the fp32 tolerance of the parity tests); resuming on another number of
// ranks continues bitwise; and what cannot hold is refused by name.
//
// Every case needs 8 ranks (ctest's mpi_reproducible_np8), so the np 1-4 runs of the MPI tests skip them all.
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "train_runs.hpp"

#include "fsdpp/optim/lr_schedule.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/nn/qwen2.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/train/train_step.hpp"
#include "fsdpp/train/trainer.hpp"

#include <filesystem>
#include <string>
#include <vector>

using namespace fsdpp;
using test::with;

// This file's names, apart from other test files' in a unity build (FSDPP_UNITY_BUILD).
namespace reproducible_test {

namespace {

// 120 sequences split over 1, 2, 3, 4, 5, 6 and 8 ranks; short sequences keep the 120 units of a step cheap. At
// context length 16 OpenBLAS threads no product, and these runs (run_steps, not train()) keep ctest's
// OPENBLAS_NUM_THREADS=1: that the mode holds on any thread count (train() runs it with one BLAS thread per rank)
// is tests/cli/reproducible_blas_threads.sh's, at context length 64.
const std::vector<std::string> kCommon = {"train.steps=2",          "train.eval_interval=0",
                                          "schedule.warmup_steps=1", "train.global_batch=120",
                                          "model.context_length=16", "train.reproducible=true"};

Deck deck_of(const std::string& file, const std::vector<std::string>& extra) {
  return test::input_deck(file, with(kCommon, extra));
}

using Run = test::StepsRun;
using test::check_bitwise_run;
using test::run_steps;

template <class T> void broadcast(std::vector<T>& v, MPI_Datatype type, MPI_Comm comm) {
  long n = static_cast<long>(v.size());
  MPI_Bcast(&n, 1, MPI_LONG, 0, comm);
  v.resize(static_cast<std::size_t>(n));
  MPI_Bcast(v.data(), static_cast<int>(n), type, 0, comm);
}

// run_steps on the first `n` ranks of `comm` (the others wait), its results on every rank.
Run run_on(MPI_Comm comm, int rank, int n, const Deck& deck) {
  MPI_Comm group;
  MPI_Comm_split(comm, rank < n ? 0 : MPI_UNDEFINED, rank, &group);
  Run run;
  if (group != MPI_COMM_NULL) {
    run = run_steps(group, deck);
    MPI_Comm_free(&group);
  }
  broadcast(run.losses, MPI_DOUBLE, comm);
  broadcast(run.norms, MPI_DOUBLE, comm);
  broadcast(run.weights, MPI_FLOAT, comm);
  return run;
}

struct Layout {
  int ranks;
  std::vector<std::string> keys;
};

// The layouts of the matrix, each against the one-rank run of the same deck.
const std::vector<Layout> kMatrix = {
    {2, {"train.micro_batch=60"}},
    {3, {"train.micro_batch=40"}},
    {4, {"train.micro_batch=30"}},
    {5, {"train.micro_batch=24"}},
    {6, {"train.micro_batch=20"}},
    {8, {"train.micro_batch=15"}},
    {4, {"train.micro_batch=5"}},  // another split: 6 accumulation steps of 5
    {1, {"train.micro_batch=8"}},  // one rank, 15 accumulation steps
    {4, {"train.micro_batch=30", "fsdp.strategy=shard_grad_op"}},
    {3, {"train.micro_batch=8", "fsdp.strategy=no_shard"}},
    {6, {"train.micro_batch=20", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=3", "mesh.dp_shard=2"}},
    {6, {"train.micro_batch=4", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=3"}},
    {4, {"train.micro_batch=10", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"}},
    {5, {"train.micro_batch=24", "fsdp.offload=cpu"}},
    {3, {"train.micro_batch=20", "train.activation_checkpointing=full"}},
    {4, {"train.micro_batch=30", "comm.overlap=false", "fsdp.reshard_after_forward=2"}},
};

void check_matrix(MPI_Comm comm, int rank, const std::string& file, const std::vector<std::string>& extra) {
  const Run one = run_on(comm, rank, 1, deck_of(file, with(extra, {"train.micro_batch=120"})));
  REQUIRE(one.losses.size() == 2);
  CHECK(one.losses.back() < one.losses.front());  // it trains: the comparisons are not between idle runs
  for (const Layout& layout : kMatrix) {
    CAPTURE(layout.ranks);
    CAPTURE(layout.keys.back());
    check_bitwise_run(run_on(comm, rank, layout.ranks, deck_of(file, with(extra, layout.keys))), one);
  }
}

}  // namespace

MPI_TEST_CASE("reproducible: GPT-2 bitwise on 1-8 ranks, every strategy, split, offload and checkpointing", 8) {
  check_matrix(test_comm, test_rank, "tiny.yaml", {});
}

MPI_TEST_CASE("reproducible: Llama bitwise on 1-8 ranks, every strategy, split, offload and checkpointing", 8) {
  check_matrix(test_comm, test_rank, "llama-tiny.yaml", {});
}

// A mixture of experts: the load-balancing loss is each forward's own (nn/moe.hpp), so a deck's micro_batch fixes
// which sequences share one; at that size every layout gives the one-rank run bitwise (the routed rows summed in
// their fixed expert-then-token order), expert parallelism too.
MPI_TEST_CASE("reproducible: Qwen3-MoE and Mixtral bitwise on 1-8 ranks at one micro-batch size, HSDP and checkpointing", 8) {
  for (const char* file : {"qwen3-moe-tiny.yaml", "mixtral-tiny.yaml"}) {
    CAPTURE(file);
    const Run one = run_on(test_comm, test_rank, 1, deck_of(file, {"train.micro_batch=5"}));
    REQUIRE(one.losses.size() == 2);
    CHECK(one.losses.back() < one.losses.front());
    for (const auto& layout : decltype(kMatrix){
             {2, {"train.micro_batch=5"}},
             {3, {"train.micro_batch=5"}},
             {8, {"train.micro_batch=5"}},
             {4, {"train.micro_batch=5", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"}},
             {6, {"train.micro_batch=5", "train.activation_checkpointing=full"}},
             // Expert parallelism: each expert's gradient in pieces per source rank (MoeFeedForward per_source).
             {2, {"train.micro_batch=5", "mesh.ep=2"}},
             {4, {"train.micro_batch=5", "mesh.ep=4"}},
             {8, {"train.micro_batch=5", "mesh.ep=2", "train.activation_checkpointing=full"}},
             {4, {"train.micro_batch=5", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2",
                  "mesh.ep=2"}}}) {
      CAPTURE(layout.ranks);
      CAPTURE(layout.keys.back());
      check_bitwise_run(run_on(test_comm, test_rank, layout.ranks, deck_of(file, layout.keys)), one);
    }
  }
}

MPI_TEST_CASE("reproducible: bf16 parameters bitwise on 1, 4 and 6 ranks", 8) {
  const std::vector<std::string> bf16 = {"fsdp.param_dtype=bf16", "matmul.precision=f32"};
  const Run one = run_on(test_comm, test_rank, 1, deck_of("tiny.yaml", with(bf16, {"train.micro_batch=120"})));
  check_bitwise_run(run_on(test_comm, test_rank, 4, deck_of("tiny.yaml", with(bf16, {"train.micro_batch=30"}))), one);
  check_bitwise_run(run_on(test_comm, test_rank, 6,
                           deck_of("tiny.yaml", with(bf16, {"train.micro_batch=10", "fsdp.strategy=hybrid_shard",
                                                            "mesh.dp_replicate=2", "mesh.dp_shard=3"}))),
                    one);
}

MPI_TEST_CASE("reproducible: larger units are bitwise on every layout they divide, a rank's whole share too", 8) {
  const std::vector<std::string> unit = {"train.reproducible_unit=4"};
  const Run one = run_on(test_comm, test_rank, 1, deck_of("tiny.yaml", with(unit, {"train.micro_batch=120"})));
  check_bitwise_run(run_on(test_comm, test_rank, 2, deck_of("tiny.yaml", with(unit, {"train.micro_batch=12"}))), one);
  check_bitwise_run(run_on(test_comm, test_rank, 5, deck_of("tiny.yaml", with(unit, {"train.micro_batch=8"}))), one);
  // A unit that is a rank's whole share: one backward per step, whose words are converted as they arrive.
  const std::vector<std::string> share = {"train.reproducible_unit=20"};
  const Run six_units = run_on(test_comm, test_rank, 1, deck_of("tiny.yaml", with(share, {"train.micro_batch=120"})));
  check_bitwise_run(run_on(test_comm, test_rank, 6, deck_of("tiny.yaml", with(share, {"train.micro_batch=20"}))),
                    six_units);
  check_bitwise_run(run_on(test_comm, test_rank, 6,
                           deck_of("tiny.yaml", with(share, {"train.micro_batch=20", "fsdp.strategy=hybrid_shard",
                                                             "mesh.dp_replicate=3", "mesh.dp_shard=2"}))),
                    six_units);
  check_bitwise_run(run_on(test_comm, test_rank, 6,
                           deck_of("tiny.yaml", with(share, {"train.micro_batch=20", "fsdp.strategy=no_shard"}))),
                    six_units);
}

MPI_TEST_CASE("reproducible: at tp 2, bitwise for dp 1, 2 and 3 around it", 8) {
  for (const char* file : {"tiny.yaml", "llama-tiny.yaml"}) {
    CAPTURE(file);
    const Run dp1 = run_on(test_comm, test_rank, 2, deck_of(file, {"mesh.tp=2", "train.micro_batch=120"}));
    check_bitwise_run(run_on(test_comm, test_rank, 4, deck_of(file, {"mesh.tp=2", "train.micro_batch=20"})), dp1);
    check_bitwise_run(run_on(test_comm, test_rank, 6, deck_of(file, {"mesh.tp=2", "train.micro_batch=40"})), dp1);
  }
}

MPI_TEST_CASE("reproducible: the same training as the default mode, within the fp32 parity tolerance", 8) {
  for (const char* file : {"tiny.yaml", "llama-tiny.yaml"}) {
    CAPTURE(file);
    const Run exact = run_on(test_comm, test_rank, 2, deck_of(file, {"train.micro_batch=60"}));
    const Run plain = run_on(test_comm, test_rank, 2, deck_of(file, {"train.micro_batch=60", "train.reproducible=false"}));
    test::check_same_losses(exact.losses, plain.losses);
    test::check_same_losses(exact.norms, plain.norms);
    // The default mode agrees between layouts only within a tolerance: its weights differ in the last bits
    // (what the matrix above would catch if reproducible mode fell back to it).
    const Run plain3 = run_on(test_comm, test_rank, 3, deck_of(file, {"train.micro_batch=40", "train.reproducible=false"}));
    test::check_same_losses(plain3.losses, plain.losses);
    CHECK(plain3.weights != plain.weights);
  }
}

MPI_TEST_CASE("reproducible: resumed from 4 ranks on 3, from 2 on 6, and from ep 2 at ep 4 and 1, bitwise as the uninterrupted run", 8) {
  const std::string dir = test::shared_temp_dir(test_comm, test_rank, "fsdpp-reproducible-resume");
  const std::vector<std::string> four_steps = {"train.steps=4"};
  auto deck = [&](const std::vector<std::string>& extra) { return deck_of("tiny.yaml", with(four_steps, extra)); };
  struct Resume {
    int from, to;
    std::string from_batch, to_batch;
  };
  for (const Resume& r : {Resume{4, 3, "train.micro_batch=30", "train.micro_batch=40"},
                          Resume{2, 6, "train.micro_batch=60", "train.micro_batch=20"}}) {
    CAPTURE(r.from);
    const std::string here = dir + "/" + std::to_string(r.from) + "-" + std::to_string(r.to);
    const auto straight = test::losses_on(test_comm, test_rank, r.from, deck({r.from_batch}));
    test::losses_on(test_comm, test_rank, r.from,
                    deck({r.from_batch, "checkpoint.interval=2", "checkpoint.dir=" + here}), 2);
    auto resumed = test::losses_on(test_comm, test_rank, r.to,
                                   deck({r.to_batch, "checkpoint.resume=true", "checkpoint.dir=" + here}));
    resumed.resize(2);
    test::check_bitwise(resumed, std::vector<double>(straight.begin() + 2, straight.end()), "loss after the resume");
  }
  // A mixture of experts saved at ep 2 on 4 ranks resumes at ep 4, and on 1 rank without ep, bitwise.
  auto moe = [&](const std::vector<std::string>& extra) {
    return deck_of("qwen3-moe-tiny.yaml", with(with(four_steps, {"train.micro_batch=5"}), extra));
  };
  const std::string here = dir + "/moe";
  const auto straight = test::losses_on(test_comm, test_rank, 4, moe({"mesh.ep=2"}));
  test::losses_on(test_comm, test_rank, 4, moe({"mesh.ep=2", "checkpoint.interval=2", "checkpoint.dir=" + here}), 2);
  for (const auto& to : std::vector<std::pair<int, std::string>>{{4, "mesh.ep=4"}, {1, "mesh.ep=1"}}) {
    const std::string& ep = to.second;  // (not a structured binding: CAPTURE's lambda takes it by reference)
    CAPTURE(ep);
    auto resumed =
        test::losses_on(test_comm, test_rank, to.first, moe({ep, "checkpoint.resume=true", "checkpoint.dir=" + here}));
    resumed.resize(2);
    test::check_bitwise(resumed, std::vector<double>(straight.begin() + 2, straight.end()), "loss after the resume");
  }
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("reproducible: a unit that does not divide the micro-batch, a bf16 reduction, too many units are refused") {
  const std::string deck = "train:\n  steps: 1\n  global_batch: 12\n  micro_batch: 6\n  reproducible: true\n";
  auto refused = [&](const std::vector<std::string>& overrides, const std::string& words) {
    const std::string error = test::deck_error(deck, overrides);
    CAPTURE(error);
    CHECK(error.find(words) != std::string::npos);
  };
  refused({"train.reproducible_unit=4"}, "units of train.reproducible_unit (4) sequences, which must divide "
                                         "train.micro_batch (6)");
  refused({"fsdp.reduce_dtype=bf16"}, "set fsdp.reduce_dtype f32, or train.reproducible false");
  refused({"train.global_batch=8192", "train.micro_batch=8192"}, "sums at most 4096 units per step exactly, but "
                                                                 "train.global_batch 8192 / train.reproducible_unit 1 "
                                                                 "makes 8192: raise train.reproducible_unit");
  CHECK(test::deck_error(deck, {"train.reproducible_unit=3"}) == "(no error)");
}

MPI_TEST_CASE("reproducible: resuming at another mesh.tp is refused, naming both degrees", 8) {
  const std::string dir = test::shared_temp_dir(test_comm, test_rank, "fsdpp-reproducible-tp");
  const std::vector<std::string> keys = {"checkpoint.dir=" + dir, "train.micro_batch=60"};
  test::losses_on(test_comm, test_rank, 4, deck_of("tiny.yaml", with(keys, {"mesh.tp=2", "checkpoint.interval=1"})), 1);
  std::string error = "(no error)";
  MPI_Comm group;
  MPI_Comm_split(test_comm, test_rank < 2 ? 0 : MPI_UNDEFINED, test_rank, &group);
  if (group != MPI_COMM_NULL) {
    TrainOptions o;
    o.quiet = true;
    o.measure_peak = false;
    try {
      train(group, deck_of("tiny.yaml", with(keys, {"checkpoint.resume=true"})), o);
    } catch (const UsageError& e) {
      error = e.what();
    }
    MPI_Comm_free(&group);
    CAPTURE(error);
    CHECK(error.find("was saved at mesh.tp 2 (dp_shard=2 x tp=2 (4 ranks, mpi)), but this run has mesh.tp 1") !=
          std::string::npos);
    CHECK(error.find("Resume with mesh.tp 2 (any data-parallel layout), or set train.reproducible false") !=
          std::string::npos);
  }
  MPI_Barrier(test_comm);
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

}  // namespace reproducible_test
