#include "fsdpp/train/periodic_parts.hpp"

#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/runtime/preemption.hpp"

#include <fmt/format.h>

namespace fsdpp {

PartFrame EvaluationPart::frame(const StepEnd&) const {
  return {&timeline_names::eval, kEval, /*evaluation_time=*/true, {}};
}

void EvaluationPart::run(const StepEnd& step) {
  loss_ = evaluator_.run();
  step_ = step.done;
}

// Forwards without a backward, as evaluation's: timed as evaluation.
PartFrame SamplesPart::frame(const StepEnd&) const {
  return {&timeline_names::sample, kEval, /*evaluation_time=*/true, {}};
}

void SamplesPart::run(const StepEnd&) { text_ = samples_.run(); }

void SamplesPart::report(const StepEnd& step) {
  if (speaks_) Log::info("{}\n{}\n---- end of sample ----", samples_.heading(step.done), text_);
}

PartFrame CheckpointPart::frame(const StepEnd& step) const {
  return {&timeline_names::checkpoint, kCheckpoint, false, fmt::format("checkpoint save of step {}", step.done)};
}

bool PreemptionPart::due(const StepEnd& step) {
  // The signal any rank of the job received (the largest number when ranks got different ones), the same on
  // every rank.
  signal_ = 0;
  if (!enabled_ || step.last) return false;
  std::int64_t signal = preemption_signal();
  job_.all_reduce(&signal, 1, ReduceOp::max);
  signal_ = static_cast<int>(signal);
  return signal_ != 0;
}

PartFrame PreemptionPart::frame(const StepEnd& step) const {
  return {nullptr, std::nullopt, false, fmt::format("checkpoint save of step {} (preemption)", step.done)};
}

void PreemptionPart::run(const StepEnd& step) {
  // Finish cleanly: the save is synchronous and waits for any background one, so nothing is in flight.
  checkpointer_.finish();
  const std::string where = checkpointer_.enabled() ? checkpointer_.save_and_wait(step.done)
                                                    : "no checkpoint (checkpoint.interval is 0)";
  if (speaks_)
    Log::info("preempted: signal {} received; stopped after step {} of {}, saved {}; resume with "
              "checkpoint.resume: auto (exit code {})", signal_, step.done, steps_, where, kPreemptedExitCode);
  preempted_ = true;
}

}  // namespace fsdpp
