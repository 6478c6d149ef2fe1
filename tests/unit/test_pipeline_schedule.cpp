// Pipeline schedules, stages and their deck rules (parallel/pipeline_schedule.hpp, parallel/pipeline_stages.hpp,
// plan/pipeline_plan.hpp): every schedule runs each stage's forward and backward once per micro-batch on the
// stage's rank and never hangs; the replay gives 1F1B's and GPipe's textbook bubble (p-1)/(m+p-1) exactly,
// less for interleaved 1F1B and zero-bubble, and the activations in flight each schedule is known for; a
// schedule edited so that two ranks wait on each other is refused with both named; the balanced split is the
// best possible one (checked against every split by brute force); the deck's pipeline keys are refused with
// their line and column when they cannot work.
#include "input_decks.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/make_model.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/parallel/pipeline_parallel.hpp"
#include "fsdpp/parallel/pipeline_schedule.hpp"
#include "fsdpp/parallel/pipeline_stages.hpp"
#include "fsdpp/plan/machine.hpp"
#include "fsdpp/plan/memory_plan.hpp"
#include "fsdpp/plan/pipeline_plan.hpp"
#include "fsdpp/runtime/error.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace fsdpp;
using fsdpp::test::deck_error;

namespace {

constexpr PipelineScheduleKind kAll[] = {PipelineScheduleKind::gpipe, PipelineScheduleKind::one_f_one_b,
                                         PipelineScheduleKind::interleaved_1f1b, PipelineScheduleKind::zero_bubble};

// F = 1, B = 2 (input 1 + weight 1) on every stage.
PipelineTimeline replay(PipelineScheduleKind kind, const PipelineShape& shape) {
  return simulate_pipeline(make_pipeline_schedule(kind, shape), shape, PipelineCosts::uniform(shape.stages()));
}

}  // namespace

TEST_CASE("pipeline schedules: every stage's forward and backward once per micro-batch, on its rank, without a hang") {
  for (PipelineScheduleKind kind : kAll)
    for (int p : {1, 2, 4})
      for (int v : {1, 2})
        for (int m : {4, 8, 16}) {
          if (v > 1 && kind != PipelineScheduleKind::interleaved_1f1b) continue;
          if (kind == PipelineScheduleKind::zero_bubble && m < p) continue;
          const PipelineShape shape{p, v, m};
          CAPTURE(to_string(kind));
          CAPTURE(p);
          CAPTURE(v);
          CAPTURE(m);
          const PipelineSchedule schedule = make_pipeline_schedule(kind, shape);
          int forwards = 0, backwards_done = 0;  // a whole backward, or the weight half that ends a split one
          for (const auto& list : schedule)
            for (const PipelineAction& a : list) {
              forwards += a.op == PipelineOp::forward;
              backwards_done += a.op == PipelineOp::backward || a.op == PipelineOp::backward_weight;
            }
          CHECK(forwards == shape.stages() * m);
          CHECK(backwards_done == shape.stages() * m);
          // simulate_pipeline checks each action once, on its rank, and throws on a hang.
          const PipelineTimeline t = simulate_pipeline(schedule, shape, PipelineCosts::uniform(shape.stages()));
          CHECK(t.busy == doctest::Approx(3.0 * shape.stages() * m));
        }
}

TEST_CASE("pipeline schedules: 1F1B and GPipe idle (p-1)/(m+p-1) of the time; GPipe holds m micro-batches, 1F1B p-r") {
  for (int p : {2, 4})
    for (int m : {4, 8, 16}) {
      CAPTURE(p);
      CAPTURE(m);
      const PipelineTimeline one = replay(PipelineScheduleKind::one_f_one_b, {p, 1, m});
      const PipelineTimeline gpipe = replay(PipelineScheduleKind::gpipe, {p, 1, m});
      CHECK(one.bubble == doctest::Approx(one_f_one_b_ideal_bubble(p, m)).epsilon(1e-12));
      CHECK(gpipe.bubble == doctest::Approx(one_f_one_b_ideal_bubble(p, m)).epsilon(1e-12));
      CHECK(one.makespan == doctest::Approx(3.0 * (m + p - 1)));
      for (int r = 0; r < p; ++r) {
        CHECK(gpipe.peak_in_flight[r] == m);
        CHECK(one.peak_in_flight[r] == std::min(p - r, m));
      }
    }
  CHECK(one_f_one_b_ideal_bubble(4, 8) == doctest::Approx(3.0 / 11));
}

TEST_CASE("pipeline picture: the replay's cells as timed; a traced action shorter than a cell still has one") {
  // 1F1B, p 2, m 2, F 1 and B 2: the replay lines up with the cells exactly.
  const PipelineTimeline one = replay(PipelineScheduleKind::one_f_one_b, {2, 1, 2});
  CHECK(draw_pipeline(one, 1.0) == "rank 0 |01..aa.bb|\n"
                                   "rank 1 |.0aa1bb..|\n");
  // As traced: a forward of 0.2 between two backwards of 2 rounds onto the second's first cell. It keeps that
  // cell, and the backward after it starts a cell late; nothing after that moves.
  PipelineTimeline traced;
  traced.ranks = {{{{PipelineOp::backward, 0, 0}, 0.0, 2.0},
                   {{PipelineOp::forward, 0, 1}, 2.0, 2.2},
                   {{PipelineOp::backward, 0, 1}, 2.2, 4.2}}};
  traced.makespan = 4.2;
  CHECK(draw_pipeline(traced, 1.0) == "rank 0 |aa1b.|\n");
}

TEST_CASE("pipeline schedules: interleaving and zero-bubble idle less than 1F1B; zero-bubble holds no more") {
  for (int p : {2, 4})
    for (int m : {4, 8, 16}) {
      CAPTURE(p);
      CAPTURE(m);
      const PipelineTimeline one = replay(PipelineScheduleKind::one_f_one_b, {p, 1, m});
      const PipelineTimeline zb = replay(PipelineScheduleKind::zero_bubble, {p, 1, m});
      // Interleaved: v = 2 stages per rank, each half a 1F1B stage's work (the same model cut twice as fine).
      const PipelineShape two{p, 2, m};
      const PipelineTimeline inter =
          simulate_pipeline(make_pipeline_schedule(PipelineScheduleKind::interleaved_1f1b, two), two,
                            PipelineCosts::uniform(two.stages(), 0.5));
      CHECK(inter.busy == doctest::Approx(one.busy));
      CHECK(inter.bubble < one.bubble);
      CHECK(zb.bubble < one.bubble);
      for (int r = 0; r < p; ++r) CHECK(zb.peak_in_flight[r] == p);  // r weight gradients held back on rank r
      // Megatron's figure for the interleaved bubble: (p-1)/v of a micro-batch's time over m, ours within it.
      CHECK(inter.bubble <= static_cast<double>(p - 1) / (2.0 * m + p - 1) + 1e-12);
    }
  // 4 ranks, 8 micro-batches, F = I = W: 1F1B takes 3 (m + p - 1) = 33 units, ZB-H1 29 (the paper's bound, with
  // every W free to move, is 3 m + p - 1 = 27).
  CHECK(replay(PipelineScheduleKind::one_f_one_b, {4, 1, 8}).makespan == 33);
  CHECK(replay(PipelineScheduleKind::zero_bubble, {4, 1, 8}).makespan == 29);
  CHECK_THROWS_WITH_AS(make_pipeline_schedule(PipelineScheduleKind::zero_bubble, {4, 1, 3}),
                       "pipeline.schedule zero_bubble needs at least mesh.pp = 4 micro-batches, but there are 3: raise "
                       "pipeline.microbatches", UsageError);
}

TEST_CASE("pipeline schedules: an order that would hang is refused with the ranks that wait on each other") {
  const PipelineShape shape{2, 1, 4};
  PipelineSchedule s = make_pipeline_schedule(PipelineScheduleKind::one_f_one_b, shape);
  // Rank 0 runs backward 0 before its first forward: it waits for rank 1's backward, which waits for the forward.
  std::rotate(s[0].begin(), s[0].begin() + 2, s[0].begin() + 3);
  CHECK(to_string(s[0].front()) == "B0@s0");
  try {
    simulate_pipeline(s, shape, PipelineCosts::uniform(2));
    FAIL("no error");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()) ==
          "pipeline schedule for pp 2, 1 virtual stage(s) and 4 micro-batches would hang: rank 0 runs B0@s0 next "
          "and waits for F0@s0 (rank 0); rank 1 runs F0@s1 next and waits for F0@s0 (rank 0)");
  }
  PipelineSchedule missing = make_pipeline_schedule(PipelineScheduleKind::gpipe, shape);
  missing[1].pop_back();
  CHECK_THROWS_WITH_AS(simulate_pipeline(missing, shape, PipelineCosts::uniform(2)),
                       "pipeline schedule: stage 1 micro-batch 3 lacks its forward or its backward (or has both a "
                       "whole and a split backward), on rank 1", UsageError);
}

TEST_CASE("pipeline stages: the balanced split is the best one; pipeline.split is taken as given") {
  LanguageModel::FlopsByPiece f;
  f.before = 0;
  f.blocks = {5, 5, 5, 5, 5, 5, 5, 5};
  f.after = 9;  // a head worth almost two blocks
  for (int stages : {1, 2, 3, 4, 8}) {
    CAPTURE(stages);
    const StageSplit got = split_stages(f, stages, {});
    const double worst = *std::max_element(got.flops.begin(), got.flops.end());
    // Every way to cut 8 blocks into `stages` runs, by brute force.
    double best = std::numeric_limits<double>::infinity();
    std::function<void(int, int, double)> walk = [&](int stage, int from, double so_far) {
      if (stage == stages - 1) {
        double last = f.after;
        for (int b = from; b < 8; ++b) last += f.blocks[b];
        best = std::min(best, std::max(so_far, last));
        return;
      }
      double cost = stage == 0 ? f.before : 0.0;
      for (int to = from + 1; to <= 8 - (stages - 1 - stage); ++to) {
        cost += f.blocks[to - 1];
        walk(stage + 1, to, std::max(so_far, cost));
      }
    };
    walk(0, 0, 0.0);
    CHECK(worst == best);
    double total = 0;
    for (double x : got.flops) total += x;
    CHECK(total == 49);
  }
  CHECK(split_stages(f, 2, {}).ranges() == "0-4 | 5-7");  // the head's stage gets fewer blocks
  CHECK(split_stages(f, 2, {2}).ranges() == "0-1 | 2-7");
  // A model's pieces add up to its FLOPs per token.
  const auto model = make_model(parse_deck("train: {steps: 1}\nmodel: {n_layer: 3, n_embd: 64, n_head: 4, vocab_size: 512, "
                                           "context_length: 32}\n", "deck.yaml", {}).model);
  const LanguageModel::FlopsByPiece pieces = model->flops_per_token_by_piece(32);
  CHECK(pieces.blocks.size() == 3);
  CHECK(pieces.blocks[0] == pieces.blocks[2]);
  CHECK(pieces.after > 0);
}

TEST_CASE("pipeline deck rules: refused with the key's line and column") {
  const std::string deck = "train: {steps: 1}\nmodel: {n_layer: 4}\nmesh:\n  pp: 2\n";
  CHECK(deck_error(deck, {"pipeline.virtual_stages=2"}) ==
        "override 'pipeline.virtual_stages=2': pipeline.virtual_stages 2 needs pipeline.schedule: "
        "interleaved_1f1b (1f1b runs one stage per rank)");
  CHECK(deck_error(deck, {"pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=4"}) ==
        "override 'pipeline.virtual_stages=4': the pipeline has mesh.pp x pipeline.virtual_stages = 2 x 4 = 8 "
        "stages but the model only 4 blocks (model.n_layer): every stage needs at least one; lower mesh.pp or "
        "pipeline.virtual_stages");
  CHECK(deck_error(deck + "pipeline:\n  split: [3, 1]\n") ==
        "deck.yaml:6:10: pipeline.split names 2 first block(s), but 2 stages need 1 (the first block of every stage "
        "after the first)");
  CHECK(deck_error(deck + "pipeline:\n  split: [4]\n") ==
        "deck.yaml:6:10: pipeline.split [4] must rise from 1 to at most model.n_layer - 1 = 3, each stage keeping "
        "at least one block; 4 breaks that");
  CHECK(deck_error(deck + "pipeline:\n  schedule: interleaved_1f1b\n  microbatches: 3\n") ==
        "deck.yaml:7:17: pipeline.schedule interleaved_1f1b runs the micro-batches in groups of mesh.pp = 2, but "
        "there are 3: make pipeline.microbatches a multiple of 2");
  CHECK(deck_error("train: {steps: 1}\npipeline: {split: [2]}\n") ==
        "deck.yaml:2:19: pipeline.* is set but mesh.pp is 1 (no pipeline): set mesh.pp > 1, or remove the pipeline "
        "keys");
  CHECK(deck_error(deck, {"pipeline.schedule=zero_bubble"}) == "(no error)");
  // Context parallelism and a mixture of experts keep each micro-batch's rows and route in its slot: every schedule
  CHECK(deck_error(deck, {"mesh.cp=2", "pipeline.schedule=zero_bubble"}) == "(no error)");
  const std::string moe = "train: {steps: 1}\nmodel: {arch: qwen3_moe, n_layer: 4, moe: {num_experts: 4, expert_ffn_hidden: 32}}\nmesh:\n  pp: 2\n";
  CHECK(deck_error(moe, {"pipeline.schedule=zero_bubble"}) == "(no error)");
}

TEST_CASE("pipeline plan: the deck's stages, schedule and bubble on N ranks") {
  Deck deck = parse_deck("model: {n_layer: 8, n_embd: 64, n_head: 4, vocab_size: 512, context_length: 32}\n"
                         "train: {steps: 1, global_batch: 16, micro_batch: 2}\nmesh: {pp: 2}\n",
                         "deck.yaml", {});
  const PipelinePlan plan = plan_pipeline(deck, 4);  // 2 stages x 2 data-parallel ranks: 4 micro-batches each
  CHECK(plan.data_parallel == 2);
  CHECK(plan.shape.microbatches == 4);
  CHECK(plan.split.stages() == 2);
  CHECK(plan.one_f_one_b_bubble == doctest::Approx(1.0 / 5));
  CHECK(plan.equal_stages_bubble == doctest::Approx(1.0 / 5));
  CHECK(plan.timeline.bubble >= plan.equal_stages_bubble - 1e-12);  // unequal stages idle more, never less
  const std::string text = format_pipeline_plan(plan);
  CHECK(text.find("schedule 1f1b, 4 micro-batches per step") != std::string::npos);
  CHECK(text.find("rank 1 |") != std::string::npos);
}

// A rank's pp traffic is the sends its schedule's actions make (message_out_of): the first global stage sends no
// gradient back and the last no activations forward, so at pp 2 each rank sends one message per micro-batch, and
// interleaved over 2 x 2 stages each rank three per two of its chunks' micro-batches.
TEST_CASE("pipeline plan: the priced rank's pp sends are its schedule's") {
  const Machine machine = *machine_preset("h100-sxm-8x");
  const std::string text = "model: {n_layer: 8, n_embd: 64, n_head: 4, vocab_size: 512, context_length: 32}\n"
                           "train: {steps: 1, global_batch: 16, micro_batch: 2}\nmesh: {pp: 2}\n";
  const Deck deck = parse_deck(text, "deck.yaml", {});
  const PipelineStepPlan one = plan_pipeline_step(deck, 4, machine);  // 4 micro-batches
  CHECK(one.time.comm_bytes.at("pp") == doctest::Approx(4.0 * one.message_bytes));
  CHECK(one.time.busy_comm_ms.at("pp") == doctest::Approx(4 * one.p2p_ms));
  const Deck interleaved = parse_deck(text, "deck.yaml",
                                      {"pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2"});
  const PipelineStepPlan two = plan_pipeline_step(interleaved, 4, machine);
  CHECK(two.time.comm_bytes.at("pp") == doctest::Approx(3.0 * two.message_bytes * 4));
}

// Each stage's memory (plan_stage_memory; tests/cli/plan_vs_measured.sh holds it within 1% of measured peaks):
// activation slots as the schedule holds micro-batches in flight, the messages a stage keeps, its own units.
TEST_CASE("pipeline plan: each stage's memory, by its schedule's micro-batches in flight") {
  Deck deck = parse_deck("model: {n_layer: 8, n_embd: 64, n_head: 4, vocab_size: 512, context_length: 32}\n"
                         "train: {steps: 1, global_batch: 16, micro_batch: 2}\nmesh: {pp: 2}\n",
                         "deck.yaml", {});
  const MemoryPlan first = plan_stage_memory(deck, 2, 0), last = plan_stage_memory(deck, 2, 1);
  CHECK(first.accum_steps == 8);
  CHECK(first.pipeline_slots == std::vector<int>{2});  // 1F1B: pp - r micro-batches in flight
  CHECK(last.pipeline_slots == std::vector<int>{1});
  // Messages of a micro-batch's residual stream, 2 x 32 x 64 floats: stage 0 keeps its output gradient, stage 1 an
  // input per slot; on a host build each also keeps its transport's buffers (PipelineTransport::kept_buffers): a copy
  // of each of its 8 sends and, 1F1B at pp 2 posting ahead, 2 landing buffers.
  const std::int64_t message = 2 * 32 * 64 * 4;
  const int transport = PipelineTransport::buffers_in_compute_memory(choose_backend(deck.comm.backend)) ? 8 + 2 : 0;
  CHECK(first.memory.pipeline_messages == (1 + transport) * message);
  CHECK(last.memory.pipeline_messages == (1 + transport) * message);
  CHECK(first.units.back().name == "GPT (root)");
  CHECK(first.units.size() + last.units.size() == 8 + 2);  // every block once, a root per stage
  deck.pipeline.schedule = PipelineScheduleKind::gpipe;
  const MemoryPlan gpipe = plan_stage_memory(deck, 2, 1);
  CHECK(gpipe.pipeline_slots == std::vector<int>{8});  // all m
  CHECK(gpipe.memory.activations > last.memory.activations);
  // GPipe's last stage: 8 inputs, and (host build) 8 sends and all 8 receives posted before its first backward
  const int gpipe_transport = PipelineTransport::buffers_in_compute_memory(choose_backend(deck.comm.backend)) ? 8 + 8 : 0;
  CHECK(gpipe.memory.pipeline_messages == (8 + gpipe_transport) * message);
  deck.pipeline.schedule = PipelineScheduleKind::interleaved_1f1b;
  deck.pipeline.virtual_stages = 2;
  const MemoryPlan interleaved = plan_stage_memory(deck, 2, 0);
  CHECK(interleaved.pipeline_slots.size() == 2);  // slots per chunk
  CHECK_THROWS_AS(plan_stage_memory(deck, 2, 2), UsageError);
}

// Training parallelizes each stage on its own ranks (build_model.hpp), and the planner plans each stage's memory
// (plan_stage_memory); the whole job's layout, which only the step-time model would ask for, is refused.
TEST_CASE("pipeline: the whole job's layout under mesh.pp > 1 is refused aloud, and the job size rule") {
  const Deck deck = parse_deck("train: {steps: 1}\nmodel: {n_layer: 4}\nmesh: {pp: 2}\n", "deck.yaml", {});
  CHECK_THROWS_WITH_AS(parallel_layout(deck, 2),
                       "mesh.pp is 2: a pipeline has a layout per stage, not one for the job, and its step time is not "
                       "priced yet. `fsdpp plan --ranks 2` prints each stage's memory, the schedule and its bubble",
                       UsageError);
  CHECK_THROWS_WITH_AS(parallel_layout(deck, 3),
                       "mesh.pp x mesh.cp x mesh.tp is 2 x 1 x 1 = 2, which does not divide the 3 ranks of the job: "
                       "launch a multiple of 2 ranks, or change mesh.pp", UsageError);
  // Each of pp and tp divides 6, their product does not: the stages would not be whole.
  Deck with_tp = deck;
  with_tp.mesh.tp = 2;
  CHECK_THROWS_WITH_AS(plan_pipeline(with_tp, 6),
                       "mesh.pp x mesh.cp x mesh.tp is 2 x 1 x 2 = 4, which does not divide the 6 ranks of the job: "
                       "launch a multiple of 4 ranks, or change mesh.pp", UsageError);
}
