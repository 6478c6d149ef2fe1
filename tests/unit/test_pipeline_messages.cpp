// When pipeline ranks post their messages (parallel/pipeline_messages.hpp), checked against a model of a transport
// whose sends wait for their receive (NCCL's send/recv): each rank a queue of groups posted in its order (the
// receives posted before an action, one group; an action's send, one), only the head group of each rank in
// progress, a message through when both its ends are at their ranks' heads, messages between two ranks matched in
// the order they were posted. Every schedule and shape completes; the naive order (receive just before the action)
// is shown to deadlock under 1f1b, so the model can tell.
#include "fsdpp/parallel/pipeline_messages.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

using namespace fsdpp;

namespace {

struct Op {
  bool send = false;
  PipelineMessage message;
  bool done = false;
};
using Group = std::vector<Op>;
using Streams = std::vector<std::vector<Group>>;  // per rank, its groups in posting order

// Each rank's groups: the receives the plan posts before an action, then the action's send.
Streams streams_of(const PipelineSchedule& schedule, const PipelineShape& shape,
                   const std::vector<RankMessagePlan>& plans) {
  Streams out(schedule.size());
  for (std::size_t r = 0; r < schedule.size(); ++r)
    for (std::size_t k = 0; k < schedule[r].size(); ++k) {
      Group receives;
      for (const PipelineMessage& m : plans[r].receives_before[k]) receives.push_back({false, m});
      if (!receives.empty()) out[r].push_back(receives);
      if (const auto sent = message_out_of(schedule[r][k], shape)) out[r].push_back({{true, *sent}});
    }
  return out;
}

// The sequence of messages each ordered pair of ranks sends and receives, for the in-order matching.
std::map<std::pair<int, int>, std::vector<PipelineMessage>> pair_sequences(const Streams& streams,
                                                                          const PipelineShape& shape, bool sends) {
  std::map<std::pair<int, int>, std::vector<PipelineMessage>> out;
  for (const auto& groups : streams)
    for (const Group& g : groups)
      for (const Op& op : g)
        if (op.send == sends)
          out[{shape.rank_of_stage(op.message.from_stage), shape.rank_of_stage(op.message.to_stage)}].push_back(
              op.message);
  return out;
}

// True when every group of every rank completes.
bool completes(Streams streams, const PipelineShape& shape) {
  std::vector<std::size_t> head(streams.size(), 0);
  auto at_head = [&](int rank, const PipelineMessage& m, bool send) -> Op* {
    if (head[rank] == streams[rank].size()) return nullptr;
    for (Op& op : streams[rank][head[rank]])
      if (!op.done && op.send == send && op.message == m) return &op;
    return nullptr;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < streams.size(); ++r) {
      if (head[r] == streams[r].size()) continue;
      for (Op& op : streams[r][head[r]]) {
        if (op.done) continue;
        const int peer = shape.rank_of_stage(op.send ? op.message.to_stage : op.message.from_stage);
        if (Op* other = at_head(peer, op.message, !op.send)) op.done = other->done = progress = true;
      }
      for (std::size_t p = 0; p < streams.size(); ++p)
        while (head[p] < streams[p].size() &&
               std::all_of(streams[p][head[p]].begin(), streams[p][head[p]].end(), [](const Op& o) { return o.done; }))
          ++head[p], progress = true;
    }
  }
  for (std::size_t r = 0; r < streams.size(); ++r)
    if (head[r] != streams[r].size()) return false;
  return true;
}

}  // namespace

TEST_CASE("pipeline messages: every schedule's posting order completes on a transport whose sends wait") {
  for (PipelineScheduleKind kind : {PipelineScheduleKind::gpipe, PipelineScheduleKind::one_f_one_b,
                                    PipelineScheduleKind::interleaved_1f1b, PipelineScheduleKind::zero_bubble})
    for (int p : {2, 3, 4})
      for (int m : {4, 6, 8, 16}) {
        const int v = kind == PipelineScheduleKind::interleaved_1f1b ? 2 : 1;
        if (kind == PipelineScheduleKind::interleaved_1f1b && m % p != 0) continue;
        const PipelineShape shape{p, v, m};
        CAPTURE(to_string(kind));
        CAPTURE(p);
        CAPTURE(m);
        const PipelineSchedule schedule = make_pipeline_schedule(kind, shape);
        const std::vector<RankMessagePlan> plans = plan_pipeline_messages(schedule, shape);
        REQUIRE(plans.size() == static_cast<std::size_t>(p));
        // Every receive is posted once, before the action that waits on it.
        for (int r = 0; r < p; ++r) {
          std::map<std::tuple<int, int, bool>, std::size_t> posted_before;
          for (std::size_t k = 0; k < schedule[r].size(); ++k)
            for (const PipelineMessage& msg : plans[r].receives_before[k])
              CHECK(posted_before.emplace(std::make_tuple(msg.from_stage, msg.microbatch, msg.gradient), k).second);
          for (std::size_t k = 0; k < schedule[r].size(); ++k)
            if (const auto in = message_into(schedule[r][k], shape)) {
              const auto found = posted_before.find({in->from_stage, in->microbatch, in->gradient});
              REQUIRE(found != posted_before.end());
              CHECK(found->second <= k);
              CHECK(in->to_stage == schedule[r][k].stage);
            }
          CHECK(plans[r].most_pending >= 1);
          CHECK(plans[r].most_pending <= m * v);
        }
        const Streams streams = streams_of(schedule, shape, plans);
        CHECK(pair_sequences(streams, shape, true) == pair_sequences(streams, shape, false));  // matched in order
        CHECK(completes(streams, shape));
      }
}

TEST_CASE("pipeline messages: receiving just before the action deadlocks 1f1b on such a transport; the plan does not") {
  const PipelineShape shape{2, 1, 4};
  const PipelineSchedule schedule = make_pipeline_schedule(PipelineScheduleKind::one_f_one_b, shape);
  std::vector<RankMessagePlan> naive(2);
  for (int r = 0; r < 2; ++r) {
    naive[r].receives_before.assign(schedule[r].size(), {});
    for (std::size_t k = 0; k < schedule[r].size(); ++k)
      if (const auto in = message_into(schedule[r][k], shape)) naive[r].receives_before[k].push_back(*in);
  }
  // rank 0 sends F1's activations while rank 1 sends B0's gradient: each waits for a receive the other posts later
  CHECK_FALSE(completes(streams_of(schedule, shape, naive), shape));
  const std::vector<RankMessagePlan> plans = plan_pipeline_messages(schedule, shape);
  CHECK(completes(streams_of(schedule, shape, plans), shape));
  // rank 1 (the last stage) posts F0's and F1's receives before it starts; rank 0 posts B0's gradient after sending
  // F1's activations
  REQUIRE(plans[1].receives_before[0].size() == 2);
  CHECK(plans[1].receives_before[0][1] == PipelineMessage{0, 1, 1, false});
  CHECK(plans[0].receives_before[2] == std::vector<PipelineMessage>{PipelineMessage{1, 0, 0, true}});
  // after its last send (F3's) rank 0 posts both B2's and B3's gradients
  CHECK(plans[0].receives_before[6] == std::vector<PipelineMessage>{{1, 0, 2, true}, {1, 0, 3, true}});
  CHECK(plans[0].most_pending == 2);
  CHECK(plans[1].most_pending == 2);
}
