#pragma once
// The training loop of `fsdpp train`, a short loop over parts with one job each (torchtitan's trainer):
//   build_model     the model on meta, parallelized as the deck says (parallel/parallelize.hpp), given storage
//   DataFeed        tokens, the global sample order, the device batch           (train/data_feed.hpp)
//   TrainStep       micro-batches, gradient sync, clipping, the optimizer update (train/train_step.hpp)
//   Evaluator       the validation loss                                          (train/evaluator.hpp)
//   StepMetrics     banner, step table, metrics.jsonl, end-of-run breakdowns     (train/step_metrics.hpp)
//   Checkpointer    saves and restores the Stateful parts; resume; async saves   (train/checkpointer.hpp)
//   PeriodicPart    evaluation, samples, checkpoint saves, the preemption check: each says when it is due,
//                   and one wrapper times it, spans it on the timeline and watches it  (train/periodic_part.hpp)
// The batch is fixed by the deck, not the launch: global batch s holds the same sequences on 1 rank or 64,
// and each rank runs its share as micro-batches (gradient accumulation).
#include "fsdpp/config/deck.hpp"
#include "fsdpp/optim/lr_schedule.hpp"
#include "fsdpp/optim/deck_optimizer.hpp"
#include "fsdpp/optim/optimizer.hpp"
#include <mpi.h>

#include <functional>
#include <memory>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

struct TrainSummary {
  std::int64_t steps = 0;
  double first_loss = 0;               // training loss of the first step
  double final_loss = 0;               // training loss of the last step
  std::vector<double> losses;          // training loss of every step
  std::optional<double> final_val_loss;
  // mesh.pp > 1: this rank's share of the micro-batches' time spent waiting for another stage (its bubble).
  std::optional<double> pipeline_bubble;
  std::optional<double> loss_floor;    // entropy rate of the synthetic corpus, nats per token
  double tokens_per_s = 0;             // over the whole loop, evaluation excluded
  double flops_per_token = 0;
  double sgemm_gflops = 0;             // measured single-rank peak MFU is quoted against (0 if not measured)
  double mfu = 0;
  double loop_seconds = 0;
  bool preempted = false;              // stopped early on SIGUSR1/SIGTERM/SIGINT, after saving a checkpoint
  double exposed_comm_ms = 0;          // per step, averaged over steps and ranks
  // Bytes per rank (the largest over ranks): sharded f32 parameters, gradients, optimizer state; the peak of
  // unsharded parameters + gradients + collective buffers over the run; activations and backward scratch.
  std::int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, peak_unsharded_bytes = 0, activation_bytes = 0;
  // Measured: the most bytes of Views live at once in the compute memory space (MemoryAccounting) beyond what
  // was live when the run started, the largest over ranks. What `fsdpp plan` predicts.
  std::int64_t measured_peak_bytes = 0;
  // run.machine: what `fsdpp plan --machine` predicts for this deck and launch, and the measured median ms/step
  // of the steps after the first (the first allocates the buffer pool and warms up).
  std::optional<double> predicted_ms_per_step;
  double median_ms_per_step = 0;
};

// run.machine's prediction of the step time for this deck and launch (`fsdpp plan --machine`), made where the
// run is set up (app/train_command.cpp), so that training does not plan.
struct StepTimePrediction {
  std::string machine;  // the machine's name, as the end-of-run line quotes it
  double ms_per_step = 0;
};

struct TrainOptions {
  bool measure_peak = true;  // time an sgemm at start-up for the MFU column
  bool quiet = false;        // no banner, table or breakdown (tests)
  // Stop after this optimizer step, as a preempted job would (the schedule still spans train.steps). 0: run on.
  std::int64_t stop_after_step = 0;
  // Combine the ranks' SIGUSR1/SIGTERM/SIGINT flags at each step boundary and, when set, save and stop.
  bool handle_preemption = false;
  // Called on every rank before each optimizer step (1-based), if set: test hooks (a rank that stalls).
  std::function<void(std::int64_t step)> before_step;
  // Printed beside the measured median ms/step at the end and written to metrics.jsonl; none: the end says how
  // to get one.
  std::optional<StepTimePrediction> prediction;
};

LrSchedule make_schedule(const Deck& deck);  // UsageError for an invalid schedule

// Collective over `comm` (the job's world, or a sub-communicator in tests). Throws UsageError for a deck
// that cannot run on this launch.
TrainSummary train(MPI_Comm comm, const Deck& deck, TrainOptions options = {});

}  // namespace fsdpp
