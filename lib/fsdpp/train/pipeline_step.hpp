#pragma once
// PipelineStep: one stage's part of a training step under mesh.pp (parallel/pipeline_parallel.hpp), run in the
// order of the deck's schedule (parallel/pipeline_schedule.hpp), and the stage's part of an evaluation forward.
//
//   forward  F i:  micro-batch i's tokens (every stage loads them: the first embeds them, the last reads the
//                  targets); a later stage receives the previous stage's output as its input and keeps it until
//                  B i; the stage's blocks (and the head and loss on the last); the output is sent on.
//   backward B i:  the next stage's gradient arrives (the last stage starts from its loss); the stage's backward;
//                  the gradient of its input is sent back. Gradients synchronize on the last micro-batch's
//                  backward, as under accumulation.
//
// Each micro-batch in flight keeps its activations in an activation slot of its own (module.hpp): F i takes a free
// slot, B i computes in it and frees it, so a stage holds as many micro-batches' activations as its schedule has in
// flight (GPipe m, 1F1B at most pp - stage) and the slots are allocated in the first step only. Under context
// parallelism (whose ring keeps one micro-batch) the stage instead replays F i from the input it kept when a later
// micro-batch's forward ran since, as activation checkpointing replays a block: the same kernels on the same
// input, so the gradients are those of an unbroken forward and backward, at the cost of a forward.
#include "fsdpp/nn/language_model.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/parallel/pipeline_parallel.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/train/data_feed.hpp"

#include <vector>

namespace fsdpp {

class PipelineStep {
 public:
  PipelineStep(PipelineParallel& pipeline, LanguageModel& model, Parallelism& parallel, DataFeed& data)
      : pipeline_(pipeline), model_(model), parallel_(parallel), data_(data),
        keeps_slots_(parallel.context_parallel_group() == nullptr) {}

  // The step's `microbatches` forwards and backwards on this stage; returns the sum of their losses on the last
  // stage (0 on the others). Marks `forward_section` and `backward_section` on `timers` after each.
  double train(Flow& flow, int microbatches, SectionTimers& timers, int forward_section, int backward_section);
  // Evaluation batch `index` through this stage: its loss on the last stage, 0 on the others.
  double evaluate(Flow& flow, int index);
  double from_last_stage(double value) { return pipeline_.from_last_stage(value); }
  int replays() const { return replays_; }  // forwards replayed for a backward, in the last step
  int slots() const { return slots_made_; }  // activation slots this rank has made (the most in flight)
  // Over every train() so far: the seconds spent in it, and waiting there for another stage (receives).
  double train_s() const { return train_s_; }
  double train_waited_s() const { return train_waited_s_; }
  double last_bubble() const { return last_bubble_; }  // the last train()'s share waited, on this rank
  // "pipeline 1f1b, pp 2 x 4 micro-batches: bubble measured 31.2 / 33.0 / 34.8 % (min / avg / max over ranks) of
  // the step's micro-batch time; ideal (p-1)/(m+p-1) 20.0 %; ...": collective over `world`, the job's ranks.
  std::string summary(MPI_Comm world, int microbatches) const;

 private:
  void forward(Flow& flow, int microbatch, int microbatches, bool replay);
  void backward(Flow& flow, int microbatch, int microbatches);
  std::size_t residual_elements(const Flow& flow) const;

  PipelineParallel& pipeline_;
  LanguageModel& model_;
  Parallelism& parallel_;
  DataFeed& data_;
  std::vector<View1<float>> inputs_;  // per micro-batch: what this stage received (stages after the first)
  View1<float> gradient_;             // the gradient of this stage's output, as received
  const bool keeps_slots_;            // activation slots per micro-batch (else replays)
  std::vector<int> slot_of_;          // per micro-batch: its activation slot
  std::vector<int> free_slots_;
  int slots_made_ = 0;
  int held_ = -1;                     // replays: the micro-batch whose activations the modules hold
  std::vector<std::size_t> elements_;  // per micro-batch: its residual stream's floats on this rank
  int replays_ = 0;
  double train_s_ = 0, train_waited_s_ = 0, last_bubble_ = 0;
};

}  // namespace fsdpp
