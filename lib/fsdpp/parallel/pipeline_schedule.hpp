#pragma once
// Pipeline schedules (mesh.pp, pipeline.schedule): which forward and backward each pipeline rank runs, in what
// order, as torch.distributed.pipelining's action lists; and a replay of those lists that every rank can run
// before the first step, so a schedule that would hang is refused instead, and so the bubble and the
// micro-batches in flight are known in advance (`fsdpp plan`, the benchmark's ideal).
//
// Stages: the model's blocks are cut into S = pp x v consecutive stages (v = pipeline.virtual_stages); stage s
// lives on pipeline rank s mod pp (Megatron's interleaving: rank r holds stages r, r + pp, r + 2 pp, ...).
// Micro-batch i's forward runs stage 0, 1, ..., S-1; its backward S-1, ..., 0.
//
//   gpipe             every forward, then every backward (m micro-batches' activations in flight)
//   1f1b              PipeDream-flush: pp - 1 - r warm-up forwards on rank r, then one forward and one backward
//                     in turn, then the remaining backwards (at most pp - r in flight); bubble (p-1)/(m+p-1)
//   interleaved_1f1b  Megatron's interleaved 1F1B over v model chunks per rank; the bubble shrinks about v-fold;
//                     micro-batches in groups of pp (m a multiple of pp)
//   zero_bubble       ZB-H1 (Qi et al. 2023): the backward split into the input gradient (I, on the critical
//                     path) and the weight gradient (W, free to wait); rank r holds back r weight gradients to
//                     the end, where 1F1B idles; every rank then holds up to pp micro-batches (1F1B: pp - r);
//                     needs m >= pp
#include "fsdpp/config/deck_enums.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

// backward: input and weight gradients together; backward_input / backward_weight: zero_bubble's two halves.
enum class PipelineOp : std::uint8_t { forward, backward, backward_input, backward_weight };

struct PipelineAction {
  PipelineOp op = PipelineOp::forward;
  int stage = 0;       // global stage, 0 .. S-1
  int microbatch = 0;  // 0 .. m-1
  bool operator==(const PipelineAction& o) const {
    return op == o.op && stage == o.stage && microbatch == o.microbatch;
  }
};
std::string to_string(const PipelineAction& a);  // "F3@s1", "B3@s1", "I3@s1", "W3@s1"
// The action to_string wrote, or nullopt for any other text.
std::optional<PipelineAction> parse_pipeline_action(const std::string& text);

struct PipelineShape {
  int ranks = 1;           // pp
  int virtual_stages = 1;  // v: stages per rank
  int microbatches = 1;    // m
  int stages() const { return ranks * virtual_stages; }
  int rank_of_stage(int stage) const { return stage % ranks; }
};

// One list of actions per pipeline rank, in the order that rank runs them.
using PipelineSchedule = std::vector<std::vector<PipelineAction>>;

// The schedule of `kind` for `shape`. UsageError when the shape does not suit the kind (the deck's rules,
// config/deck_rules.hpp's check_pipeline_shape, say which key to change).
PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, const PipelineShape& shape);

// What one action of one stage costs (any unit: the replay only adds them). backward = input + weight.
struct PipelineCosts {
  std::vector<double> forward;          // per stage
  std::vector<double> backward_input;   // per stage
  std::vector<double> backward_weight;  // per stage
  double p2p = 0;                       // an activation or its gradient from one rank to the next
  // Every stage alike: forward f, backward 2 f split evenly (the usual ratio of a transformer block).
  static PipelineCosts uniform(int stages, double f = 1.0, double p2p = 0);
};

struct PipelineSlot {
  PipelineAction action;
  double start = 0, end = 0;
};

struct PipelineTimeline {
  std::vector<std::vector<PipelineSlot>> ranks;  // per rank, in its order
  double makespan = 0;
  double busy = 0;    // the ranks' compute time, summed
  double bubble = 0;  // idle share of the ranks' time: 1 - busy / (pp x makespan)
  // Per rank: the most micro-batches whose activations it held at once (a stage's forward ran, its weight
  // gradient has not), counting a micro-batch once per stage it holds on that rank.
  std::vector<int> peak_in_flight;
};

// Runs the schedule's lists against each other, each rank in its order, an action starting when its rank is
// free and its inputs have arrived (forward: the previous stage's forward, plus p2p when that is another rank;
// backward: the next stage's backward, or this stage's forward on the last stage; W: this stage's B).
// UsageError naming the ranks and actions that wait on each other when the lists would hang, or when an action
// is missing, repeated or on the wrong rank.
PipelineTimeline simulate_pipeline(const PipelineSchedule& schedule, const PipelineShape& shape,
                                   const PipelineCosts& costs);

// The bubble of 1F1B (and GPipe) with equal stages: (p - 1) / (m + p - 1).
double one_f_one_b_ideal_bubble(int ranks, int microbatches);

// A picture of the timeline, one row per rank, one character per `unit` of time: the micro-batch number
// (mod 10) for forwards, the same on a letter cell for backwards ('a' + i mod 26 for B and I, 'A' + i mod 26
// for W), '.' idle. Every action has at least one cell, so each shows even when it ran for less than half a unit.
// For docs/parallelism.md, `fsdpp plan` and `fsdpp report --trace`.
std::string draw_pipeline(const PipelineTimeline& timeline, double unit);

}  // namespace fsdpp
