#pragma once
// `fsdpp plan` for a deck with mesh.pp > 1: the stages (parallel/pipeline_stages.hpp), the schedule's order on
// every pipeline rank (parallel/pipeline_schedule.hpp) and what it costs in idle time, worked out from the
// model's shapes on meta and replayed with each stage's FLOPs: forward a third of a stage's training FLOPs,
// the input and the weight gradients a third each. With a machine (plan/machine.hpp), the step's time: each stage
// priced on its own, the schedule replayed with those times (plan_pipeline_step).
#include "fsdpp/config/deck.hpp"
#include "fsdpp/parallel/pipeline_schedule.hpp"
#include "fsdpp/parallel/pipeline_stages.hpp"
#include "fsdpp/plan/step_cost.hpp"

#include <string>
#include <vector>

namespace fsdpp {

struct PipelinePlan {
  PipelineScheduleKind kind = PipelineScheduleKind::one_f_one_b;
  PipelineShape shape;
  int data_parallel = 1;   // ranks per stage outside tp and cp: ranks / (pp x tp x cp)
  StageSplit split;
  PipelineTimeline timeline;  // the deck's stages, each priced by its FLOPs
  double equal_stages_bubble = 0;  // the same schedule with every stage alike
  double one_f_one_b_bubble = 0;   // (p - 1) / (m + p - 1)
};

// UsageError (a deck rule, with its keys) when the deck cannot run a pipeline on `ranks`.
PipelinePlan plan_pipeline(const Deck& deck, int ranks);
std::string format_pipeline_plan(const PipelinePlan& plan);

// mesh.pp > 1: each stage's step priced as plan_step prices one (its units and collectives over its own actions,
// its optimizer), then the schedule replayed (parallel/pipeline_schedule.hpp) with each global stage's share of
// its rank's forward and backward per micro-batch and one message's time between ranks: ms/step = the replay's
// makespan + the longest tail after it (the reductions left exposed, the optimizer). `time` is the job's: the
// slowest stage's figures with that step.
struct PipelineStepPlan {
  std::vector<StepPlan> stages;  // per pipeline rank, alone
  PipelineTimeline timeline;     // the priced replay (ms)
  std::int64_t message_bytes = 0;
  double p2p_ms = 0;             // one message
  StepTime time;
};
PipelineStepPlan plan_pipeline_step(const Deck& deck, int ranks, const Machine& machine);
std::string format_pipeline_step_time(const PipelineStepPlan& plan);

}  // namespace fsdpp
