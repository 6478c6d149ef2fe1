#pragma once
// `fsdpp plan` for a deck with mesh.pp > 1: the stages (parallel/pipeline_stages.hpp), the schedule's order on
// every pipeline rank (parallel/pipeline_schedule.hpp) and what it costs in idle time, worked out from the
// model's shapes on meta and replayed with each stage's FLOPs: forward a third of a stage's training FLOPs,
// the input and the weight gradients a third each.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/parallel/pipeline_schedule.hpp"
#include "fsdpp/parallel/pipeline_stages.hpp"

#include <string>

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

}  // namespace fsdpp
