#pragma once
// One optimizer step (torchtitan's train_step): every micro-batch's forward and backward, with the gradient
// synchronization the parallel layout decides per micro-batch, the mean loss over the job, the global
// gradient norm (clipped when train.grad_clip > 0), the optimizer update, and the sampler's advance.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/optim/optimizer.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/train/data_feed.hpp"

namespace fsdpp {

// The step's sections, as the end-of-run breakdown names them.
enum StepSection { kData, kForward, kBackward, kGradSync, kOptimizer, kEval, kCheckpoint, kOther, kSections };
std::vector<std::string> step_section_names();

struct StepResult {
  double loss = 0;       // mean training loss over the global batch
  double grad_norm = 0;  // before clipping
};

class TrainStep {
 public:
  TrainStep(Gpt& model, Parallelism& parallel, Optimizer& optimizer, DataFeed& data, double grad_clip,
            SectionTimers& timers)
      : model_(model), parallel_(parallel), optimizer_(optimizer), data_(data), grad_clip_(grad_clip), timers_(timers) {}

  StepResult run(float lr);
  const FsdpStats& fsdp_stats_of_last_step() const { return stats_; }

 private:
  Gpt& model_;
  Parallelism& parallel_;
  Optimizer& optimizer_;
  DataFeed& data_;
  double grad_clip_;
  SectionTimers& timers_;
  Flow flow_;
  FsdpStats stats_;
};

}  // namespace fsdpp
