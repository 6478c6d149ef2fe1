// Training end to end: tiny.yaml learns the synthetic corpus down to its entropy floor, and the batch is
// fixed by the deck, not the launch: 1, 2 and 4 ranks train the same model.
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "train_runs.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/seed_checkpoint.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/train/checkpointer.hpp"
#include "fsdpp/plan/memory_plan.hpp"
#include "fsdpp/train/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <iterator>
#include <sstream>

using namespace fsdpp;

namespace {

using test::check_same_losses;
using test::losses_on;
using test::quiet;
using test::shared_temp_dir;

Deck tiny_deck(const std::vector<std::string>& overrides) { return test::input_deck("tiny.yaml", overrides); }

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

MPI_TEST_CASE("train: the same deck gives the same loss at every step on 1, 2 and 3 ranks", 3) {
  // global_batch 12, micro_batch 12/N: every rank count processes the same 12 sequences per step.
  const std::vector<std::string> common = {"train.steps=12", "train.eval_interval=0", "schedule.warmup_steps=3",
                                           "train.global_batch=12"};
  auto deck_for = [&](int n) {
    auto o = common;
    o.push_back("train.micro_batch=" + std::to_string(12 / n));
    return tiny_deck(o);
  };
  const auto one = losses_on(test_comm, test_rank, 1, deck_for(1));
  check_same_losses(losses_on(test_comm, test_rank, 2, deck_for(2)), one);
  check_same_losses(losses_on(test_comm, test_rank, 3, deck_for(3)), one);
}

MPI_TEST_CASE("train: 4 ranks, every strategy, train the same model as 1 rank", 4) {
  const std::vector<std::string> common = {"train.steps=8", "train.eval_interval=0", "schedule.warmup_steps=2",
                                           "train.micro_batch=4"};
  const auto one = losses_on(test_comm, test_rank, 1, tiny_deck(common));
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"fsdp.strategy=full_shard"}, {"fsdp.strategy=shard_grad_op"},
        {"fsdp.strategy=no_shard"}, {"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"},
        {"fsdp.reshard_after_forward=2"}, {"fsdp.offload=cpu"}, {"fsdp.accumulate=unsharded", "train.micro_batch=2"},
        {"train.micro_batch=2"}}) {
    auto o = common;
    o.insert(o.end(), extra.begin(), extra.end());
    CAPTURE(o.back());
    check_same_losses(losses_on(test_comm, test_rank, 4, tiny_deck(o)), one);
  }
}

MPI_TEST_CASE("train: fsdpp plan predicts the measured per-rank peak under every strategy", 4) {
  // The plan runs fully_shard's own schedule dry (memory events), so it should agree to the byte but for
  // what MemoryAccounting sees outside FSDP's buffers; tests/cli/plan_vs_measured.sh checks small.yaml.
  const std::vector<std::string> common = {"train.steps=2", "train.eval_interval=0", "schedule.warmup_steps=1",
                                           "train.micro_batch=2"};
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"fsdp.strategy=full_shard"}, {"fsdp.strategy=shard_grad_op"},
        {"fsdp.strategy=no_shard"}, {"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"},
        {"fsdp.reshard_after_forward=2"},
        // f32 GEMMs: the plan does not count the packing scratch of bf16 GEMMs (tensor/matmul.cpp); this case
        // checks fully_shard's bf16 buffers.
        {"fsdp.param_dtype=bf16", "fsdp.reduce_dtype=bf16", "matmul.precision=f32"},
        {"fsdp.accumulate=unsharded", "train.micro_batch=1"}, {"optim.name=sgd"},
        // The partial reduction each unit keeps between micro-batches.
        {"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2",
         "fsdp.replica_all_reduce=last_micro_batch"},
        // Prefetch depth changes which whole parameters are live at the peak; the dry step follows it.
        {"fsdp.forward_prefetch=2"}, {"fsdp.backward_prefetch=0"}, {"fsdp.backward_prefetch=h.1:h.0"},
        {"comm.overlap=false"}}) {
    auto o = common;
    o.insert(o.end(), extra.begin(), extra.end());
    CAPTURE(o.back());
    const Deck deck = tiny_deck(o);
    const std::int64_t planned = plan_memory(deck, test_nb_procs).memory.total();
    const std::int64_t measured = train(test_comm, deck, quiet()).measured_peak_bytes;
    CAPTURE(planned);
    CAPTURE(measured);
    CHECK(std::abs(static_cast<double>(planned - measured)) <= 0.01 * static_cast<double>(measured));
  }
}

MPI_TEST_CASE("train: fsdp.replica_all_reduce last_micro_batch trains the same model with 1/accum of the replica "
              "all-reduce bytes", 4) {
  // HSDP 2 x 2, global_batch 16 at micro_batch 1: 4 micro-batches per step, each reduce-scattered.
  const std::vector<std::string> hsdp = {"train.steps=6", "train.eval_interval=0", "schedule.warmup_steps=2",
                                         "train.micro_batch=1", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2",
                                         "mesh.dp_shard=2"};
  auto run = [&](const std::string& when) {
    return test::run_steps(test_comm, tiny_deck(test::with(hsdp, {"fsdp.replica_all_reduce=" + when})));
  };
  const test::StepsRun every = run("every_micro_batch"), last = run("last_micro_batch");
  constexpr int kAccum = 4, kUnits = 3;  // tiny: two blocks and the root
  check_same_losses(last.losses, every.losses);
  REQUIRE(last.weights.size() == every.weights.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < last.weights.size(); ++i) {
    diff += std::pow(double(last.weights[i]) - every.weights[i], 2);
    norm += std::pow(double(every.weights[i]), 2);
  }
  MESSAGE("relative L2 distance of the weights: " << std::sqrt(diff / norm));
  CHECK(std::sqrt(diff / norm) <= 1e-5);  // fp32: only the order of the sums over micro-batches and replicas differs
  REQUIRE(last.shard_bytes > 0);
  for (std::size_t s = 0; s < last.stats.size(); ++s) {
    CAPTURE(s);
    CHECK(every.stats[s].reduce_scatters == kAccum * kUnits);
    CHECK(last.stats[s].reduce_scatters == kAccum * kUnits);
    CHECK(last.stats[s].reduce_scatter_bytes == every.stats[s].reduce_scatter_bytes);
    CHECK(every.stats[s].all_reduces == kAccum * kUnits);
    CHECK(last.stats[s].all_reduces == kUnits);
    CHECK(every.stats[s].all_reduce_bytes == kAccum * last.shard_bytes);
    CHECK(last.stats[s].all_reduce_bytes == last.shard_bytes);
  }
}

MPI_TEST_CASE("train: a global batch the ranks cannot split is refused on every rank", 4) {
  const Deck deck = tiny_deck({"train.steps=2", "schedule.warmup_steps=0", "train.micro_batch=8"});  // 16 / (8 x 4) does not divide
  CHECK_THROWS_WITH_AS(train(test_comm, deck, quiet()), doctest::Contains("train.global_batch"), UsageError);
}

MPI_TEST_CASE("train: resuming from a checkpoint continues bitwise, and within fp32 tolerance on fewer ranks", 2) {
  char name[256] = {0};
  if (test_rank == 0) {
    const auto dir = std::filesystem::temp_directory_path() / ("fsdpp-resume-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::snprintf(name, sizeof name, "%s", dir.c_str());
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, test_comm);
  const std::string dir = name;
  const std::vector<std::string> common = {"train.eval_interval=0", "schedule.warmup_steps=3", "train.steps=12"};
  auto deck_with = [&](std::vector<std::string> extra) {
    auto o = common;
    o.insert(o.end(), extra.begin(), extra.end());
    return tiny_deck(o);
  };
  const auto straight = losses_on(test_comm, test_rank, 2, deck_with({}));
  // Stopped after 6 steps (as a preempted job) and saved; the schedule still spans 12 steps.
  losses_on(test_comm, test_rank, 2, deck_with({"checkpoint.interval=6", "checkpoint.dir=" + dir}), 6);
  const std::vector<double> tail(straight.begin() + 6, straight.end());
  // On 1 rank, naming the file: resharded from 2, the same global batches; sums differ only in order.
  auto one = losses_on(test_comm, test_rank, 1, deck_with({"checkpoint.resume=" + dir + "/step_00000006.h5"}));
  Deck resumed = deck_with({"checkpoint.resume=true", "checkpoint.dir=" + dir});
  one.resize(6);
  check_same_losses(one, tail);
  // On 2 ranks: bitwise.
  auto two = losses_on(test_comm, test_rank, 2, resumed);
  two.resize(6);
  for (int s = 0; s < 6; ++s) CHECK(two[s] == tail[s]);
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

// An evaluation's forwards leave the units whole where reshard_after_forward is off (shard_grad_op; a pipeline's
// stages): a save right after one wrote shard 0's rows into every rank's shard, and the resumed run diverged.
MPI_TEST_CASE("train: a save right after an evaluation holds each rank's shards (shard_grad_op), resumed bitwise", 2) {
  char name[256] = {0};
  if (test_rank == 0) {
    const auto dir = std::filesystem::temp_directory_path() / ("fsdpp-eval-save-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::snprintf(name, sizeof name, "%s", dir.c_str());
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, test_comm);
  const std::string dir = name;
  const std::vector<std::string> common = {"train.eval_interval=3", "train.eval_batches=1", "schedule.warmup_steps=1",
                                           "train.steps=6", "fsdp.strategy=shard_grad_op"};
  auto deck_with = [&](std::vector<std::string> extra) {
    auto o = common;
    o.insert(o.end(), extra.begin(), extra.end());
    return tiny_deck(o);
  };
  const auto straight = losses_on(test_comm, test_rank, 2, deck_with({}));
  losses_on(test_comm, test_rank, 2, deck_with({"checkpoint.interval=3", "checkpoint.dir=" + dir}), 3);
  auto resumed = losses_on(test_comm, test_rank, 2, deck_with({"checkpoint.resume=true", "checkpoint.dir=" + dir}));
  resumed.resize(3);
  for (int s = 0; s < 3; ++s) CHECK(resumed[s] == straight[3 + s]);
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

MPI_TEST_CASE("train: seed files are the same on 1, 2 and 3 ranks, and init_from reproduces a self-seeded run", 3) {
  char name[256] = {0};
  if (test_rank == 0) {
    const auto dir = std::filesystem::temp_directory_path() / ("fsdpp-seed-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::snprintf(name, sizeof name, "%s", dir.c_str());
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, test_comm);
  const std::string dir = name;
  const Deck deck = tiny_deck({"train.steps=2", "train.eval_interval=0", "schedule.warmup_steps=1"});
  for (int n : {1, 2, 3}) {
    MPI_Comm group;
    MPI_Comm_split(test_comm, test_rank < n ? 0 : MPI_UNDEFINED, test_rank, &group);
    if (group != MPI_COMM_NULL) {
      write_seed_checkpoint(group, deck, dir + "/seed" + std::to_string(n) + ".h5");
      MPI_Comm_free(&group);
    }
    MPI_Barrier(test_comm);
  }
  if (test_rank == 0) {
    auto tensors = [](const std::string& path) {
      h5::Handle file = h5::open_file(path, MPI_COMM_NULL);
      h5::Handle model = h5::open_group(file, "/model", path);
      std::vector<std::vector<float>> all;
      for (const std::string& n : h5::children(model)) {
        h5::Handle ds = h5::open_dataset(model, n, path);
        const auto dims = h5::dataset_dims(ds);
        std::uint64_t row = 1;
        for (std::size_t d = 1; d < dims.size(); ++d) row *= dims[d];
        std::vector<float> v(dims[0] * row);
        h5::read_rows(ds, 0, dims[0], row, v.data(), path);
        all.push_back(std::move(v));
      }
      return all;
    };
    const auto one = tensors(dir + "/seed1.h5");
    CHECK(one.size() == 28);  // GPT-2 tiny: 4 root tensors + 2 blocks x 12, tied
    CHECK(tensors(dir + "/seed2.h5") == one);
    CHECK(tensors(dir + "/seed3.h5") == one);
    // Byte for byte, too: no timestamps or rank counts in the file.
    auto bytes = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    CHECK(bytes(dir + "/seed1.h5") == bytes(dir + "/seed3.h5"));
  }
  // init_from the seed: the first loss equals the self-initialized run's; a seed of other weights does not.
  const auto self = losses_on(test_comm, test_rank, 2, deck);
  Deck from_seed = deck;
  from_seed.checkpoint.init_from = dir + "/seed2.h5";
  const auto seeded = losses_on(test_comm, test_rank, 2, from_seed);
  CHECK(seeded[0] == self[0]);
  Deck other_seed = tiny_deck({"train.steps=2", "train.eval_interval=0", "schedule.warmup_steps=1", "run.seed=4242"});
  {
    MPI_Comm group;
    MPI_Comm_split(test_comm, test_rank < 2 ? 0 : MPI_UNDEFINED, test_rank, &group);
    if (group != MPI_COMM_NULL) {
      write_seed_checkpoint(group, other_seed, dir + "/other.h5");
      MPI_Comm_free(&group);
    }
    MPI_Barrier(test_comm);
  }
  Deck from_other = deck;
  from_other.checkpoint.init_from = dir + "/other.h5";
  CHECK(losses_on(test_comm, test_rank, 2, from_other)[0] != self[0]);
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

MPI_TEST_CASE("train: a NaN or Inf loss aborts on every rank naming the step and the first bad gradient", 2) {
  // optim.lr 1e30: step 1 moves the weights to ~1e30 (finite), step 2's forward overflows.
  const std::vector<std::string> diverging = {"optim.lr=1e30", "schedule.warmup_steps=0", "train.steps=6",
                                              "train.eval_interval=0"};
  CHECK_THROWS_WITH_AS(train(test_comm, tiny_deck(diverging), quiet()),
                       doctest::Contains("step 2: loss "), UsageError);
  CHECK_THROWS_WITH_AS(train(test_comm, tiny_deck(diverging), quiet()),
                       doctest::Contains("first non-finite gradient 'wte.weight'"), UsageError);
  // skip: steps 2 and 3 are skipped (the weights stay finite), the third non-finite step in a row stops the run.
  auto skipping = diverging;
  skipping.insert(skipping.end(), {"train.on_nonfinite=skip", "train.max_skipped_steps=2"});
  CHECK_THROWS_WITH_AS(train(test_comm, tiny_deck(skipping), quiet()),
                       doctest::Contains("step 4: loss "), UsageError);
  CHECK_THROWS_WITH_AS(train(test_comm, tiny_deck(skipping), quiet()),
                       doctest::Contains("2 steps in a row were skipped already (train.max_skipped_steps 2)"), UsageError);
  // A limit the run does not reach: it ends, with the skipped steps' losses not finite and the rest finite.
  skipping.back() = "train.max_skipped_steps=10";
  const TrainSummary s = train(test_comm, tiny_deck(skipping), quiet());
  REQUIRE(s.losses.size() == 6);
  CHECK(std::isfinite(s.losses[0]));
  for (std::size_t i = 1; i < s.losses.size(); ++i) CHECK(!std::isfinite(s.losses[i]));
}

MPI_TEST_CASE("train: the checkpointer refuses non-finite weights, naming the first bad parameter on any rank", 2) {
  const std::string dir = shared_temp_dir(test_comm, test_rank, "fsdpp-nonfinite");
  const Deck deck = tiny_deck({"train.steps=2", "schedule.warmup_steps=1", "checkpoint.interval=1", "checkpoint.dir=" + dir});
  TrainModel built = build_model(test_comm, deck);
  const std::vector<Parameter*> params = built.model->parameters();
  ProgressState progress(1.0);
  ModelState state(params, nullptr);
  Checkpointer checkpointer(test_comm, deck, *built.parallel, {&state, &progress}, progress, false);
  progress.completed(1, 1e-3f);
  checkpointer.save(1);
  // Rank 1 poisons its shard of parameter 4, rank 0 its shard of parameter 8: parameter 4 is the first.
  REQUIRE(params.size() > 8);
  Parameter& bad = *params[test_rank == 1 ? 4 : 8];
  REQUIRE(bad.local_numel() > 0);
  Kokkos::deep_copy(Kokkos::subview(bad.value(), 0),
                    test_rank == 1 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity());
  progress.completed(2, 1e-3f);
  const std::string refusal = "refusing to save step 2: parameter '" + params[4]->name() + "' holds NaN or Inf";
  CHECK_THROWS_WITH_AS(checkpointer.save(2), doctest::Contains(refusal.c_str()), UsageError);
  MPI_Barrier(test_comm);
  const auto latest = latest_checkpoint(dir);
  REQUIRE(latest);
  CHECK(std::filesystem::path(*latest).filename() == checkpoint_file_name(1));
  CHECK(!std::filesystem::exists(std::filesystem::path(dir) / checkpoint_file_name(2)));
  MPI_Barrier(test_comm);
  if (test_rank == 0) std::filesystem::remove_all(dir);
}
