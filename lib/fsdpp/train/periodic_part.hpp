#pragma once
// A periodic part of the training loop (torchtitan's trainer hooks): work that runs after some optimizer steps -
// evaluation, samples, checkpoint saves, the preemption check. A part says when it is due and what it does;
// run_part() frames every part alike: the section timers, the evaluation seconds tokens/s leaves out, the
// timeline span and the collective watchdog's region. A new periodic part is one class (train/periodic_parts.hpp).
#include "fsdpp/train/train_step.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace fsdpp {

class StepMetrics;

// The optimizer step just completed: `done` is 1-based; `last` is the run's last step (train.steps, or
// TrainOptions::stop_after_step).
struct StepEnd {
  std::int64_t done = 0;
  bool last = false;
};

// How run_part() wraps a part's run().
struct PartFrame {
  const std::string* span = nullptr;   // the timeline span (observe/timeline.hpp timeline_names); none: no span
  // The timer section run() is charged to: the time before it is marked Other first. None: run() is not marked
  // (its time falls to the next mark).
  std::optional<StepSection> section;
  bool evaluation_time = false;  // counted as evaluation: left out of tokens/s and MFU
  std::string watched;           // the watchdog region around run(), as its message names it; empty: none
};

class PeriodicPart {
 public:
  virtual ~PeriodicPart() = default;
  // Whether the part runs after this step. Called on every rank at every step boundary, and must answer alike on
  // every rank (it may be collective, as the preemption check is).
  virtual bool due(const StepEnd& step) = 0;
  virtual PartFrame frame(const StepEnd& step) const = 0;
  virtual void run(const StepEnd& step) = 0;  // collective
  // After run(), outside its timeline span but inside its timing: what rank 0 logs.
  virtual void report(const StepEnd& step) { (void)step; }
};

// Runs `part` for `step` inside its frame.
void run_part(PeriodicPart& part, const StepEnd& step, StepMetrics& metrics);

}  // namespace fsdpp
