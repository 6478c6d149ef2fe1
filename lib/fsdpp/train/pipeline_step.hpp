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
// flight (GPipe m, 1F1B at most pp - stage) and the slots are allocated in the first step only. What a slot keeps
// is the modules' own: under context parallelism the micro-batch's rows of the sequences too (nn/causal_lm.hpp).
//
// The model's pipeline payload (LanguageModel::pipeline_payload_size: a mixture of experts' router statistics,
// whose balancing losses are over every sparse layer) travels with the messages, unread here: F i hands on what the
// model wrote after the stage's forward, B i hands back what came with the gradient, and each stage gives the model
// what it received before its forward and its backward (the last stage keeps its own per micro-batch). Each sparse
// layer's route and expert exchange live in the slot.
//
// zero_bubble (ZB-H1): I i is B i with its weight gradients recorded in a stash (nn/weight_gradient_stash.hpp)
// instead of computed, and the slot kept; W i computes them and frees the slot and the stash. Gradients
// synchronize as parallel/pipeline_gradient_sync.hpp says: on a chunk's last B or W, never after an I (its weight
// gradients are missing).
//
// Interleaved 1F1B: a rank holds several chunks (global stages r, r + pp, ...) and its actions name the stage;
// each action selects its chunk (LanguageModel::select_pipeline_chunk), and each chunk has slots of its own. A
// chunk's blocks synchronize their gradients on its last micro-batch's backward; the root's own parameters (the
// embedding, the head) on the rank's last backward of the step, after every chunk has added to them.
#include "fsdpp/nn/language_model.hpp"
#include "fsdpp/nn/weight_gradient_stash.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/parallel/pipeline_parallel.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/train/reproducible.hpp"

#include <memory>
#include <vector>

namespace fsdpp {

class PipelineStep {
 public:
  PipelineStep(PipelineParallel& pipeline, LanguageModel& model, Parallelism& parallel, DataFeed& data)
      : pipeline_(pipeline), topology_(pipeline.topology()), transport_(pipeline.transport()), model_(model),
        parallel_(parallel), data_(data) {}

  // The step's `microbatches` forwards and backwards on this stage; returns the sum of their losses on the last
  // stage (0 on the others). Marks `forward_section` and `backward_section` on `timers` after each.
  // Reproducible mode (`exact_loss` not null): each micro-batch is a unit with the gradient of its own mean loss
  // (loss scale 1), and the last stage adds each unit's loss there, as TrainStep does without a pipeline.
  double train(Flow& flow, int microbatches, SectionTimers& timers, int forward_section, int backward_section,
               ExactLossMean* exact_loss = nullptr);
  // Evaluation batch `index` through this stage: its loss on the last stage, 0 on the others.
  double evaluate(Flow& flow, int index);
  double from_last_stage(double value) { return topology_.from_last_stage(value); }
  // Activation slots this rank has made, over its chunks (the most (chunk, micro-batch) pairs in flight).
  int slots() const {
    int n = 0;
    for (int k : slots_made_) n += k;
    return n;
  }
  int stashes() const { return static_cast<int>(stashes_.size()); }  // zero_bubble: most Ws pending at once
  // Over every train() so far: the seconds spent in it, and waiting there for another stage (receives).
  double train_s() const { return train_s_; }
  double train_waited_s() const { return train_waited_s_; }
  double last_bubble() const { return last_bubble_; }  // the last train()'s share waited, on this rank
  // The model's routing figures (LanguageModel::add_routing_totals), over the last train()'s forwards on the last
  // stage (zeros elsewhere): what TrainStep sums over its micro-batches without a pipeline.
  const LanguageModel::RoutingTotals& routing_totals() const { return routing_totals_; }
  // "pipeline 1f1b, pp 2 x 4 micro-batches: bubble measured 31.2 / 33.0 / 34.8 % (min / avg / max over ranks) of
  // the step's micro-batch time; ideal (p-1)/(m+p-1) 20.0 %; ...": collective over `world`, the job's ranks.
  std::string summary(MPI_Comm world, int microbatches) const;

 private:
  // Under interleaving a rank runs several chunks (global stages); what a micro-batch keeps is per (chunk, micro-batch).
  // The messages an action receives and sends are PipelineTransport::message_into / message_out_of's.
  void forward(Flow& flow, const PipelineAction& forward, int microbatches);
  // A whole backward (B), or zero_bubble's I: its weight gradients into a stash of their own. FSDP's flags are set
  // before (parallel/pipeline_gradient_sync.hpp).
  void backward(Flow& flow, const PipelineAction& backward, int microbatches);
  void backward_weight(Flow& flow, int chunk, int microbatch);  // W: the stash's gradients
  std::size_t residual_elements(const Flow& flow) const;
  std::size_t cell(int chunk, int microbatch) const;  // index of (chunk, micro-batch) in the per-step tables
  int slot_id(int chunk, int slot) const;  // the model's activation slot of a chunk's slot
  void select_slot(int chunk, int slot);
  View1<float>& input_buffer(std::size_t index);

  PipelineParallel& pipeline_;  // its schedule; its parts:
  const PipelineTopology& topology_;
  PipelineTransport& transport_;
  LanguageModel& model_;
  Parallelism& parallel_;
  DataFeed& data_;
  // What this rank's stages after the first received: per model slot (slot_id).
  std::vector<View1<float>> inputs_;
  View1<float> gradient_;             // the gradient of this stage's output, as received
  std::vector<int> slot_of_;          // per cell: its chunk's activation slot
  std::vector<std::vector<int>> free_slots_;  // per chunk
  std::vector<int> slots_made_;               // per chunk
  // zero_bubble: a stash per micro-batch between its I and its W (made in the first step, then reused).
  std::vector<std::unique_ptr<WeightGradientStash>> stashes_;
  std::vector<int> free_stashes_;
  std::vector<int> stash_of_;  // per cell
  int microbatches_ = 0;              // of the step running
  bool exact_ = false;                // of the step running: reproducible mode's loss scale
  std::vector<std::size_t> elements_;  // per cell: its residual stream's floats on this rank
  // The model's payload (LanguageModel::pipeline_payload_size), opaque here: per cell, what the last stage's
  // forward wrote for its backward; the one a forward received; the one of the backward running; a send's copy.
  std::vector<std::vector<double>> payload_of_;
  std::vector<double> payload_in_, payload_back_, payload_out_;
  LanguageModel::RoutingTotals routing_totals_;
  double train_s_ = 0, train_waited_s_ = 0, last_bubble_ = 0;
};

}  // namespace fsdpp
