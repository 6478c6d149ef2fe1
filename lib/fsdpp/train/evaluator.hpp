#pragma once
// The validation loss: train.eval_batches fixed validation micro-batches per rank, averaged over the job.
// Forward only; the root group, which keeps its parameters after forward for a backward, is resharded after.
#include "fsdpp/nn/language_model.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/train/pipeline_step.hpp"

namespace fsdpp {

class Evaluator {
 public:
  Evaluator(LanguageModel& model, Parallelism& parallel, DataFeed& data, const TrainConfig& train)
      : model_(model), parallel_(parallel), data_(data), interval_(train.eval_interval),
        batches_(std::max(1, train.eval_batches)) {}

  // Whether the step just completed (`done`, 1-based) is evaluated: every train.eval_interval, and the last.
  bool due(std::int64_t done, bool last) const { return interval_ > 0 && (done % interval_ == 0 || last); }
  double run();  // collective
  // mesh.pp > 1: each evaluation batch runs through the stages in turn; the loss is the last stage's.
  void set_pipeline(PipelineStep* pipeline) { pipeline_ = pipeline; }

 private:
  LanguageModel& model_;
  Parallelism& parallel_;
  DataFeed& data_;
  std::int64_t interval_;
  int batches_;
  Flow flow_;
  PipelineStep* pipeline_ = nullptr;
};

}  // namespace fsdpp
