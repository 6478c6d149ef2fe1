#pragma once
// One optimizer step (torchtitan's train_step): every micro-batch's forward and backward, with the gradient
// synchronization the parallel layout decides per micro-batch, the mean loss over the job, the global
// gradient norm (clipped when train.grad_clip > 0), the non-finite guard, the optimizer update, and the
// sampler's advance.
//
// The guard (train.on_nonfinite): the loss and the norm are the same on every rank, so every rank sees a NaN
// or Inf alike; the ranks then find the first parameter, in model order, whose gradient holds one (each checks
// its shards; the lowest index wins). abort throws a UsageError naming the step and that parameter; skip leaves
// out the optimizer update (the sampler still advances, so the next step sees new data) and reports it in the
// result, and the (train.max_skipped_steps + 1)-th non-finite step in a row stops the run as abort would.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/language_model.hpp"
#include "fsdpp/optim/optimizer.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/train/pipeline_step.hpp"
#include "fsdpp/train/reproducible.hpp"

#include <mpi.h>

#include <optional>
#include <string>
namespace fsdpp {

// The step's sections, as the end-of-run breakdown names them.
enum StepSection { kData, kForward, kBackward, kGradSync, kOptimizer, kEval, kCheckpoint, kOther, kSections };
std::vector<std::string> step_section_names();

struct StepResult {
  double loss = 0;       // mean training loss over the global batch
  double grad_norm = 0;  // before clipping
  bool skipped = false;  // non-finite, and train.on_nonfinite is skip: the weights were not updated
  std::string nonfinite; // skipped: why, for the log ("loss nan, gradient norm nan, first non-finite ...")
  // Mixture-of-experts models (nn/moe.hpp): the load-balancing loss before its coefficient (mean over the global
  // batch's micro-batches), the busiest expert's rows over the mean (the largest over layers, micro-batches and
  // ranks), and the (token, choice) pairs a capacity dropped (summed).
  std::optional<double> aux_loss, expert_load;
  std::vector<double> expert_load_per_layer;  // the busiest expert's tokens over the mean, per sparse layer
  std::optional<std::int64_t> dropped;
  // mesh.pp > 1: the share of the step's micro-batch time the ranks waited for another stage (mean over ranks).
  std::optional<double> pipeline_bubble;
};

class TrainStep {
 public:
  // Collective over `comm`, the job's ranks (the non-finite guard's search).
  TrainStep(MPI_Comm comm, LanguageModel& model, Parallelism& parallel, Optimizer& optimizer, DataFeed& data,
            const TrainConfig& train, SectionTimers& timers)
      : comm_(comm), model_(model), parallel_(parallel), optimizer_(optimizer), data_(data), train_(train),
        timers_(timers) {}

  // mesh.pp > 1: the micro-batches run through this rank's stage in the schedule's order (pipeline_step.hpp);
  // the loss is the last stage's, the gradient norm the stages' together.
  void set_pipeline(PipelineParallel* pipeline) {
    pipeline_ = pipeline;
    if (pipeline) pipeline_step_.emplace(*pipeline, model_, parallel_, data_);
  }
  PipelineStep* pipeline_step() { return pipeline_step_ ? &*pipeline_step_ : nullptr; }
  // Runs optimizer step `step` (1-based, as the log counts) at learning rate `lr`.
  StepResult run(std::int64_t step, float lr);
  const FsdpStats& fsdp_stats_of_last_step() const { return stats_; }

 private:
  // The step's forwards and backwards, `accum` micro-batches: through this rank's pipeline stage in its schedule's
  // order, or one after another on the whole model. Each returns the sum of the micro-batches' losses (0 on a
  // pipeline's other stages) and leaves their routing figures in `routed`; reproducible mode (`exact`) adds each
  // unit's loss to exact_loss_.
  double pipeline_micro_batches(int accum, bool exact, LanguageModel::RoutingTotals& routed);
  double micro_batches(int accum, bool exact, bool chunked, LanguageModel::RoutingTotals& routed);
  // A mixture of experts' figures in `r`: the aux loss, the expert load, the dropped pairs, over the job's ranks
  // (the last stage's under a pipeline); `routed.selections` becomes the step's tokens per expert over every rank.
  void report_routing(StepResult& r, LanguageModel::RoutingTotals& routed, int accum);
  // Non-finite loss or norm: throws (abort, or too many skipped in a row) or returns why the step is skipped.
  std::string guard(std::int64_t step, const StepResult& r);

  MPI_Comm comm_;
  LanguageModel& model_;
  Parallelism& parallel_;
  Optimizer& optimizer_;
  DataFeed& data_;
  const TrainConfig& train_;
  int skipped_in_a_row_ = 0;
  SectionTimers& timers_;
  Flow flow_;
  FsdpStats stats_;
  ExactLossMean exact_loss_;  // reproducible mode
  PipelineParallel* pipeline_ = nullptr;
  std::optional<PipelineStep> pipeline_step_;
};

}  // namespace fsdpp
