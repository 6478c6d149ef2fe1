#pragma once
// StepMetrics: what a run reports, LAMMPS style. The banner (build, deck echo, model, data, batch, sharding);
// a step-table row every log.interval steps, with its twin in <run.output>/metrics.jsonl (StepLog); the
// section timers and the communication the compute waited on; and at the end the "Loop time" line, the
// min/avg/max breakdowns over ranks and the per-rank peak memory. Rank 0 prints; the reductions behind the
// tables are collective, so every rank calls every method.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/language_model.hpp"
#include "fsdpp/optim/optimizer.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/train/step_log.hpp"
#include "fsdpp/train/train_step.hpp"
#include "fsdpp/train/trainer.hpp"

#include <mpi.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

class StepMetrics {
 public:
  StepMetrics(MPI_Comm comm, const Deck& deck, const Parallelism& parallel, bool speaks, bool measure_peak,
              std::optional<StepTimePrediction> prediction);

  bool speaks() const { return speaks_; }
  SectionTimers& timers() { return timers_; }
  // `whole`: the whole model on meta where `model` is one pipeline stage of it (its FLOPs per token and parameters
  // are the job's), else null.
  void banner(const LanguageModel& model, const DataFeed& data, const Optimizer& optimizer,
              const LanguageModel* whole = nullptr);

  void start_loop(std::int64_t first_step);
  // After each step: adds its communication times; every log.interval steps (and the first and last) writes
  // a row. `val`: the validation loss when this step was evaluated.
  void after_step(std::int64_t done, const StepResult& r, const FsdpStats& stats, float lr,
                  std::optional<double> val, bool last);
  void add_eval_seconds(double seconds) { eval_seconds_ += seconds; }
  // The end-of-run report (collective); fills the summary's figures.
  TrainSummary finish(LanguageModel& model, std::optional<double> loss_floor);
  // "predicted X ms/step (machine M) vs measured Y ms/step ...: error +Z%", or how to get a prediction.
  std::string prediction_line(const TrainSummary& s) const;

 private:
  MPI_Comm comm_;
  const Deck& deck_;
  const Parallelism& parallel_;
  bool speaks_;
  int ranks_ = 1;
  double tokens_per_step_ = 0;
  TrainSummary summary_;
  StepLog log_;
  SectionTimers timers_;
  std::chrono::steady_clock::time_point loop_start_, last_log_;
  std::int64_t last_log_step_ = 0, first_step_ = 0;
  double eval_seconds_ = 0;
  // Communication the compute thread waited on, per rank: all-gathers not hidden by prefetch,
  // reduce-scatters, and all-reduces; and the same since the last row.
  double comm_seconds_[3] = {0, 0, 0};
  double comm_since_log_ = 0;
  std::int64_t peak_unsharded_ = 0;
  // Every step's wall time (the median after the first is compared with run.machine's prediction).
  std::vector<double> step_seconds_;
  std::chrono::steady_clock::time_point last_step_end_;
  std::optional<StepTimePrediction> prediction_;
};

}  // namespace fsdpp
