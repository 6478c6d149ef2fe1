#pragma once
// The deck's optimizer (optim.*): the one place that builds it and the one place that says what it costs, in the
// units the planner (plan/memory_plan.cpp, plan/step_cost.cpp) and the run's banner and summary
// (train/step_metrics.cpp) count. tests/unit/test_optim.cpp holds the counts against the optimizers' real state.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/optim/optimizer.hpp"

#include <memory>
#include <vector>

namespace fsdpp {

// AdamW or SGD over `params` (this rank's shards), with the deck's hyperparameters.
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& optim, std::vector<Parameter*> params);

// f32 copies of each sharded parameter the optimizer keeps as state: AdamW m and v (2); SGD its momentum buffer
// when optim.momentum != 0 (1), else none.
int optimizer_state_copies(const OptimConfig& optim);

// Passes of 4 bytes over each sharded element in the update alone: AdamW reads parameter, gradient, m and v and
// writes three of them (SGD with momentum: three reads, two writes; without: two and one).
int optimizer_update_passes(const OptimConfig& optim);
// The same for the whole optimizer step: the update and the gradient norm, which reads every gradient once (every
// step: the log reports it, clipping scales by it).
int optimizer_passes(const OptimConfig& optim);

}  // namespace fsdpp
