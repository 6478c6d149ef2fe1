#pragma once
// When each pipeline rank posts its messages (parallel/pipeline_parallel.hpp): receives are posted early, so that
// a message can land while the rank computes, and every rank posts in one order that all ranks agree on, so that
// a transport whose sends wait for their receive (NCCL's send/recv, matched in order per pair of ranks, one stream
// after another) cannot deadlock either.
//
// The order: the schedule replayed with equal stages (simulate_pipeline), each message keyed by the end of the
// action that sends it (then sending stage, micro-batch, direction: a total order every rank computes alike). A rank
// lists its own sends and receives in that order; each send follows its action, and the receives between two of
// its sends are posted together, right after the first (before the rank's first action for those before any
// send). A receive lands no later than its action starts, so it is posted before that action waits on it; a rank
// never posts out of the global order, so the globally first message not yet through always has both its ends
// posted, and it goes through: there is always progress. tests/unit/test_pipeline_schedule.cpp checks every
// schedule against a model of such a transport.
#include "fsdpp/parallel/pipeline_schedule.hpp"

#include <optional>
#include <vector>

namespace fsdpp {

// An activation going forward (stage s to s + 1) or its gradient going back (s + 1 to s), of one micro-batch.
struct PipelineMessage {
  int from_stage = 0, to_stage = 0, microbatch = 0;
  bool gradient = false;
  bool operator==(const PipelineMessage& o) const {
    return from_stage == o.from_stage && to_stage == o.to_stage && microbatch == o.microbatch && gradient == o.gradient;
  }
};

// What action `a` receives before it runs (a forward after the first stage: the activations; a backward, whole or
// I, before the last: its output's gradient) and what it sends after (the other way round); W neither.
std::optional<PipelineMessage> message_into(const PipelineAction& a, const PipelineShape& shape);
std::optional<PipelineMessage> message_out_of(const PipelineAction& a, const PipelineShape& shape);

// One rank's posting order, per action of its list.
struct RankMessagePlan {
  std::vector<std::vector<PipelineMessage>> receives_before;  // posted (together) just before the action runs
  int most_pending = 0;  // receives posted and not yet waited on, at most: the landing buffers the rank needs
};
std::vector<RankMessagePlan> plan_pipeline_messages(const PipelineSchedule& schedule, const PipelineShape& shape);

}  // namespace fsdpp
