#pragma once
// When a pipeline rank's gradients synchronize: fully_shard's flags before each backward action of its step, the
// one rule train/pipeline_step.cpp runs and plan/memory_plan.cpp replays dry.
//
//   B i   a whole backward: the chunk's n-th micro-batch whose gradients are complete is FSDP's micro-batch n of m
//         (the last synchronizes the chunk's blocks, as under accumulation); the root's own parameters (embedding,
//         head), which every chunk adds to, synchronize on the rank's last backward.
//   I i   zero_bubble's input gradients: its weight gradients are missing, so nothing synchronizes after it
//         (Parallelism::before_input_gradients).
//   W i   its weight gradients: complete now, counted as B i.
//
// Parameters stay whole between the step's backwards (Parallelism::keep_parameters_between_micro_batches) and are
// resharded after the rank's last.
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/parallel/pipeline_schedule.hpp"

#include <cstddef>
#include <vector>

namespace fsdpp {

class PipelineGradientSync {
 public:
  // A rank's `actions` for one step of `microbatches`, over chunks of `pp` stages apart.
  PipelineGradientSync(const std::vector<PipelineAction>& actions, int pp, int microbatches);
  // Before actions[k] (not a forward): sets `parallel`'s flags for it. In the order of the actions.
  void before(Parallelism& parallel, std::size_t k);

 private:
  const std::vector<PipelineAction>& actions_;
  int pp_, microbatches_;
  std::size_t last_backward_ = 0;
  std::vector<int> completed_;  // per chunk: its B and W so far
};

}  // namespace fsdpp
