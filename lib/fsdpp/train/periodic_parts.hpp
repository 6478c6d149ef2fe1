#pragma once
// The training loop's periodic parts (train/periodic_part.hpp): evaluation, samples, checkpoint saves and the
// preemption check, each over the component that does the work.
#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/train/checkpointer.hpp"
#include "fsdpp/train/evaluator.hpp"
#include "fsdpp/train/periodic_part.hpp"
#include "fsdpp/train/training_samples.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace fsdpp {

// The validation loss every train.eval_interval steps and at the last.
class EvaluationPart final : public PeriodicPart {
 public:
  explicit EvaluationPart(Evaluator& evaluator) : evaluator_(evaluator) {}
  bool due(const StepEnd& step) override { return evaluator_.due(step.done, step.last); }
  PartFrame frame(const StepEnd& step) const override;
  void run(const StepEnd& step) override;
  // The validation loss when step `done` was evaluated.
  std::optional<double> loss_after(std::int64_t done) const {
    return done == step_ ? loss_ : std::optional<double>();
  }

 private:
  Evaluator& evaluator_;
  std::int64_t step_ = 0;
  std::optional<double> loss_;
};

// A greedy continuation of train.sample_prompt every train.sample_interval steps, logged by rank 0.
class SamplesPart final : public PeriodicPart {
 public:
  SamplesPart(TrainingSamples& samples, bool speaks) : samples_(samples), speaks_(speaks) {}
  bool due(const StepEnd& step) override { return samples_.due(step.done); }
  PartFrame frame(const StepEnd& step) const override;
  void run(const StepEnd& step) override;
  void report(const StepEnd& step) override;

 private:
  TrainingSamples& samples_;
  bool speaks_;
  std::string text_;
};

// A checkpoint save every checkpoint.interval steps and at the last (in the background with checkpoint.async).
class CheckpointPart final : public PeriodicPart {
 public:
  explicit CheckpointPart(Checkpointer& checkpointer) : checkpointer_(checkpointer) {}
  bool due(const StepEnd& step) override { return checkpointer_.due(step.done, step.last); }
  PartFrame frame(const StepEnd& step) const override;
  void run(const StepEnd& step) override { checkpointer_.save(step.done); }

 private:
  Checkpointer& checkpointer_;
};

// Preemption (SIGUSR1/SIGTERM/SIGINT on any rank, runtime/preemption.hpp): due when any rank got a signal -
// a collective at every step boundary before the last, when `enabled`; running it saves synchronously (no
// background save left in flight), after which the loop stops.
// The decision is taken over `job`, every rank of the job, at the one point each rank passes once per step (the
// step boundary): signals reach ranks at different times, and a decision over fewer ranks (a pipeline stage's)
// would let one stage stop while the next one waits for its activations.
class PreemptionPart final : public PeriodicPart {
 public:
  PreemptionPart(bool enabled, Communicator& job, Checkpointer& checkpointer, std::int64_t steps, bool speaks)
      : enabled_(enabled), job_(job), checkpointer_(checkpointer), steps_(steps), speaks_(speaks) {}
  bool due(const StepEnd& step) override;
  PartFrame frame(const StepEnd& step) const override;
  void run(const StepEnd& step) override;
  bool preempted() const { return preempted_; }

 private:
  bool enabled_;
  Communicator& job_;
  Checkpointer& checkpointer_;
  std::int64_t steps_;
  bool speaks_;
  int signal_ = 0;
  bool preempted_ = false;
};

}  // namespace fsdpp
