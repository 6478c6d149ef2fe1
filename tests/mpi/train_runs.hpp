#pragma once
// What the end-to-end MPI tests share: training a deck on some of the test's ranks and comparing losses.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/optim/lr_schedule.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/train/train_step.hpp"
#include "fsdpp/train/trainer.hpp"

#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace fsdpp::test {

// Training options for the tests' runs: no progress output, no peak-memory measurement.
inline TrainOptions quiet() {
  TrainOptions o;
  o.quiet = true;
  o.measure_peak = false;
  return o;
}

// The deck's training losses on the first `n` ranks of test_comm (the others wait), broadcast to all. A
// positive `stop_after` stops the run after that step, as a preempted job would.
inline std::vector<double> losses_on(MPI_Comm test_comm, int test_rank, int n, const Deck& deck,
                                     std::int64_t stop_after = 0) {
  MPI_Comm group;
  MPI_Comm_split(test_comm, test_rank < n ? 0 : MPI_UNDEFINED, test_rank, &group);
  std::vector<double> losses(static_cast<std::size_t>(deck.train.steps));
  if (group != MPI_COMM_NULL) {
    TrainOptions o;
    o.quiet = true;
    o.measure_peak = false;
    o.stop_after_step = stop_after;
    const auto run = train(group, deck, o).losses;
    std::copy(run.begin(), run.end(), losses.begin());
    MPI_Comm_free(&group);
  }
  MPI_Bcast(losses.data(), static_cast<int>(losses.size()), MPI_DOUBLE, 0, test_comm);
  return losses;
}

// What a run of the trainer's step loop leaves, step by step and at its end.
struct StepsRun {
  std::vector<double> losses, norms;
  std::vector<float> weights;    // every parameter's whole tensor after the last step, in model order
  std::vector<FsdpStats> stats;  // per step
  std::int64_t shard_bytes = 0;  // every unit's padded shard on this rank, in f32 bytes
};

// The trainer's step loop (TrainStep, the deck's optimizer and schedule) on all of `comm`, keeping the model for
// its final weights (whole: gathered over the data-parallel mesh, and over tensor parallelism when there is any;
// none under pipeline parallelism).
inline StepsRun run_steps(MPI_Comm comm, const Deck& deck) {
  TrainModel built = build_model(comm, deck);
  LanguageModel& model = *built.model;
  Parallelism& parallel = *built.parallel;
  DataFeed data(deck, parallel.data_parallel_size(), parallel.data_parallel_rank());
  const auto optimizer = make_optimizer(deck.optim, model.parameters());
  const LrSchedule schedule = make_schedule(deck);
  SectionTimers timers(step_section_names());
  TrainStep step(comm, model, parallel, *optimizer, data, deck.train, timers);
  step.set_pipeline(built.pipeline.get());
  StepsRun run;
  for (const UnitSummary& u : parallel.units()) run.shard_bytes += u.sharded_numel * 4;
  for (std::int64_t s = 0; s < deck.train.steps; ++s) {
    const StepResult r = step.run(s + 1, schedule.at(s));
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
    run.stats.push_back(step.fsdp_stats_of_last_step());
  }
  if (built.pipeline) return run;  // each stage holds its own parameters: no whole-model weights on one rank
  for (Parameter* p : model.parameters()) {
    const std::vector<float> whole = parallel.layout().tp > 1 ? gather_full_parameter(*p, parallel.fsdp_mesh(),
                                                                                      parallel.tensor_parallel_group())
                                                              : built.whole(*p);
    run.weights.insert(run.weights.end(), whole.begin(), whole.end());
  }
  return run;
}

// run_steps on the first n ranks of test_comm (the others wait): its losses, gradient norms and final weights
// (none under pipeline parallelism), broadcast from rank 0 to all.
struct RunOnRanks {
  std::vector<double> losses, norms;
  std::vector<float> weights;
};
inline RunOnRanks run_on(MPI_Comm test_comm, int test_rank, int n, const Deck& deck) {
  MPI_Comm group;
  MPI_Comm_split(test_comm, test_rank < n ? 0 : MPI_UNDEFINED, test_rank, &group);
  RunOnRanks r;
  r.losses.resize(static_cast<std::size_t>(deck.train.steps));
  r.norms.resize(r.losses.size());
  if (group != MPI_COMM_NULL) {
    const StepsRun steps = run_steps(group, deck);
    r.losses = steps.losses;
    r.norms = steps.norms;
    r.weights = steps.weights;
    MPI_Comm_free(&group);
  }
  MPI_Bcast(r.losses.data(), static_cast<int>(r.losses.size()), MPI_DOUBLE, 0, test_comm);
  MPI_Bcast(r.norms.data(), static_cast<int>(r.norms.size()), MPI_DOUBLE, 0, test_comm);
  int count = static_cast<int>(r.weights.size());
  MPI_Bcast(&count, 1, MPI_INT, 0, test_comm);
  r.weights.resize(static_cast<std::size_t>(count));
  MPI_Bcast(r.weights.data(), count, MPI_FLOAT, 0, test_comm);
  return r;
}

// Step by step, within a relative tolerance (fp32 parity).
inline void check_same_losses(const std::vector<double>& got, const std::vector<double>& want, double tolerance = 1e-5) {
  REQUIRE(got.size() == want.size());
  for (std::size_t s = 0; s < got.size(); ++s) {
    CAPTURE(s);
    CHECK(got[s] == doctest::Approx(want[s]).epsilon(tolerance));
  }
}

// Per-step losses and gradient norms of two runs within fp32 parity, `layout` naming the one under test.
inline void check_same_run(const RunOnRanks& got, const RunOnRanks& want, const std::string& layout) {
  CAPTURE(layout);
  check_same_losses(got.losses, want.losses);
  check_same_losses(got.norms, want.norms);
}

// Element by element with == (not Approx): schedules that must not change any arithmetic.
template <class T>
inline void check_bitwise(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  std::size_t differing = 0, first = got.size();
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) {
      if (!differing) first = i;
      ++differing;
    }
  if (differing) MESSAGE(differing << " " << what << "(s) differ; the first at " << first << ": " << got[first] << " vs "
                                   << want[first]);
  CHECK(differing == 0);
}

// Losses, gradient norms and final weights of two runs (StepsRun or RunOnRanks), bit for bit.
template <class Run> void check_bitwise_run(const Run& got, const Run& want) {
  check_bitwise(got.losses, want.losses, "loss");
  check_bitwise(got.norms, want.norms, "gradient norm");
  check_bitwise(got.weights, want.weights, "final weight");
}

// A fresh folder under the temporary directory, the same name on every rank of `comm`.
inline std::string shared_temp_dir(MPI_Comm comm, int rank, const std::string& stem) {
  char name[256] = {0};
  if (rank == 0) {
    const auto dir = std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::snprintf(name, sizeof name, "%s", dir.c_str());
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
  return name;
}

// `base` then `extra`: deck overrides.
inline std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& extra) {
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

}  // namespace fsdpp::test
