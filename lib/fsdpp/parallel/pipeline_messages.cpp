#include "fsdpp/parallel/pipeline_messages.hpp"

#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace fsdpp {

namespace {
bool is_backward(PipelineOp op) { return op == PipelineOp::backward || op == PipelineOp::backward_input; }
}  // namespace

std::optional<PipelineMessage> message_into(const PipelineAction& a, const PipelineShape& shape) {
  if (a.op == PipelineOp::forward && a.stage > 0) return PipelineMessage{a.stage - 1, a.stage, a.microbatch, false};
  if (is_backward(a.op) && a.stage < shape.stages() - 1)
    return PipelineMessage{a.stage + 1, a.stage, a.microbatch, true};
  return std::nullopt;
}

std::optional<PipelineMessage> message_out_of(const PipelineAction& a, const PipelineShape& shape) {
  if (a.op == PipelineOp::forward && a.stage < shape.stages() - 1)
    return PipelineMessage{a.stage, a.stage + 1, a.microbatch, false};
  if (is_backward(a.op) && a.stage > 0) return PipelineMessage{a.stage, a.stage - 1, a.microbatch, true};
  return std::nullopt;
}

std::vector<RankMessagePlan> plan_pipeline_messages(const PipelineSchedule& schedule, const PipelineShape& shape) {
  const PipelineTimeline timeline = simulate_pipeline(schedule, shape, PipelineCosts::uniform(shape.stages()));
  // Each message's key: its sending action's end, then the message itself.
  using Key = std::tuple<double, int, int, bool>;
  std::map<std::tuple<int, int, bool>, Key> key_of;  // (from stage, micro-batch, gradient) -> key
  for (const auto& slots : timeline.ranks)
    for (const PipelineSlot& slot : slots)
      if (const auto out = message_out_of(slot.action, shape))
        key_of[{out->from_stage, out->microbatch, out->gradient}] =
            Key{slot.end, out->from_stage, out->microbatch, out->gradient};
  auto key = [&](const PipelineMessage& m) {
    const auto found = key_of.find({m.from_stage, m.microbatch, m.gradient});
    FSDPP_CHECK(found != key_of.end(), "pipeline messages: stage {} never sends micro-batch {}", m.from_stage,
                m.microbatch);
    return found->second;
  };
  std::vector<RankMessagePlan> plans(schedule.size());
  for (std::size_t r = 0; r < schedule.size(); ++r) {
    const std::vector<PipelineAction>& actions = schedule[r];
    RankMessagePlan& plan = plans[r];
    plan.receives_before.assign(actions.size(), {});
    // The rank's sends (keyed by their action) and receives, in the global order.
    struct Op {
      Key key;
      bool send;
      std::size_t action;  // a send's action, or the action that waits on a receive
      PipelineMessage message;
    };
    std::vector<Op> ops;
    for (std::size_t k = 0; k < actions.size(); ++k) {
      if (const auto in = message_into(actions[k], shape)) ops.push_back({key(*in), false, k, *in});
      if (const auto out = message_out_of(actions[k], shape)) ops.push_back({key(*out), true, k, *out});
    }
    std::sort(ops.begin(), ops.end(), [](const Op& a, const Op& b) { return a.key < b.key; });
    std::size_t post_at = 0;  // before the first action, until the rank's first send
    int pending = 0;
    std::vector<int> waited(actions.size(), 0);  // receives waited on by each action
    for (const Op& op : ops) {
      if (op.send) {
        post_at = op.action + 1;
        continue;
      }
      FSDPP_CHECK(post_at <= op.action, "pipeline messages: rank {} would post the receive of {} after it runs", r,
                  to_string(actions[op.action]));
      if (post_at < actions.size()) plan.receives_before[post_at].push_back(op.message);
      ++waited[op.action];
    }
    // Landing buffers: receives posted so far, less those their actions have waited on.
    for (std::size_t k = 0; k < actions.size(); ++k) {
      pending += static_cast<int>(plan.receives_before[k].size());
      plan.most_pending = std::max(plan.most_pending, pending);
      pending -= waited[k];
    }
  }
  return plans;
}

}  // namespace fsdpp
