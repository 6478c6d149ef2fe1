#include "fsdpp/plan/pipeline_plan.hpp"

#include "fsdpp/parallel/pipeline_messages.hpp"
#include "fsdpp/parallel/pipeline_parallel.hpp"
#include "fsdpp/plan/memory_plan.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/nn/make_model.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace fsdpp {
namespace {

// Stage s's forward, input gradient and weight gradient: a third each of its training FLOPs (forward 2, backward
// 4 per weight: 2 for the input, 2 for the weight).
PipelineCosts costs_of(const std::vector<double>& stage_flops) {
  PipelineCosts c;
  for (double f : stage_flops) {
    c.forward.push_back(f / 3);
    c.backward_input.push_back(f / 3);
    c.backward_weight.push_back(f / 3);
  }
  return c;
}

}  // namespace

PipelinePlan plan_pipeline(const Deck& deck, int ranks) {
  check_pipeline(deck.model, deck.mesh, deck.pipeline);
  check_job_size(deck.mesh, ranks);
  PipelinePlan plan;
  plan.kind = deck.pipeline.schedule;
  plan.data_parallel = ranks / (deck.mesh.pp * deck.mesh.tp * deck.mesh.cp);
  const int accumulation = grad_accum_steps(deck.train, plan.data_parallel);
  plan.shape = {deck.mesh.pp, deck.pipeline.virtual_stages,
                pipeline_microbatches(deck.mesh, deck.pipeline, accumulation)};
  const std::unique_ptr<LanguageModel> model = make_model(deck.model);
  plan.split = split_stages(model->flops_per_token_by_piece(deck.model.context_length), plan.shape.stages(),
                            deck.pipeline.split);
  const PipelineSchedule schedule = make_pipeline_schedule(plan.kind, plan.shape);
  plan.timeline = simulate_pipeline(schedule, plan.shape, costs_of(plan.split.flops));
  plan.equal_stages_bubble = simulate_pipeline(schedule, plan.shape, PipelineCosts::uniform(plan.shape.stages())).bubble;
  plan.one_f_one_b_bubble = one_f_one_b_ideal_bubble(plan.shape.ranks, plan.shape.microbatches);
  return plan;
}

std::string format_pipeline_plan(const PipelinePlan& plan) {
  const PipelineShape& s = plan.shape;
  double total = 0;
  for (double f : plan.split.flops) total += f;
  std::string out = fmt::format(
      "Pipeline: mesh.pp {} x {} virtual stage(s) = {} stages, schedule {}, {} micro-batches per step, {} "
      "data-parallel rank(s) per stage\n  stage  rank  blocks     FLOPs share\n",
      s.ranks, s.virtual_stages, s.stages(), to_string(plan.kind), s.microbatches, plan.data_parallel);
  for (int st = 0; st < s.stages(); ++st) {
    std::string extra = st == 0 ? " + embedding" : "";
    if (st == s.stages() - 1) extra += " + head";
    out += fmt::format("  {:>5}  {:>4}  {:<9}  {:>10.1f}%{}\n", st, s.rank_of_stage(st),
                       fmt::format("{}-{}", plan.split.first[st], plan.split.first[st + 1] - 1),
                       100.0 * plan.split.flops[st] / total, extra);
  }
  std::string in_flight;
  for (int r = 0; r < s.ranks; ++r) in_flight += fmt::format("{}{}", r ? ", " : "", plan.timeline.peak_in_flight[r]);
  out += fmt::format("  bubble (idle share of the pipeline ranks' time): {:.1f}% with these stages, {:.1f}% with "
                     "equal ones; 1f1b's (p-1)/(m+p-1) = {:.1f}%\n",
                     100 * plan.timeline.bubble, 100 * plan.equal_stages_bubble, 100 * plan.one_f_one_b_bubble);
  out += fmt::format("  micro-batches whose activations a rank holds at once, by pipeline rank: {}\n", in_flight);
  // The order itself, when it fits a terminal: one character per sixth of the mean stage's training FLOPs.
  const double unit = total / s.stages() / 6;
  if (plan.timeline.makespan / unit <= 110) {
    out += "  schedule (digits: forwards of micro-batch i mod 10; a-z: their backwards; A-Z: weight gradients; "
           ".: idle)\n";
    const std::string picture = draw_pipeline(plan.timeline, unit);
    for (std::size_t at = 0; at < picture.size();) {
      const std::size_t end = picture.find('\n', at);
      out += "    " + picture.substr(at, end - at + 1);
      at = end + 1;
    }
  }
  return out;
}

PipelineStepPlan plan_pipeline_step(const Deck& deck, int ranks, const Machine& machine) {
  const int pp = deck.mesh.pp, v = deck.pipeline.virtual_stages, stage_ranks = ranks / pp;
  const PipelinePlan pipeline = plan_pipeline(deck, ranks);
  const Deck stage_deck = pipeline_stage_deck(deck);
  PipelineStepPlan out;
  for (int r = 0; r < pp; ++r)
    out.stages.push_back(price_step(stage_deck, stage_ranks, machine, [&](std::shared_ptr<FsdpMemoryListener> recorder) {
      return plan_stage_memory(deck, ranks, r, std::move(recorder));
    }));
  // Per micro-batch, each global stage's share of its rank's passes (by FLOPs, over the rank's chunks). zero_bubble's
  // weight pass is what the rank's Ws were priced at, per W; elsewhere the input and weight gradients are half a
  // backward each. The rest of a rank's step (reductions left exposed at its end, the optimizer) follows the
  // pipeline's last action.
  const int m = pipeline.shape.microbatches, S = pipeline.shape.stages();
  const PipelineSchedule schedule = make_pipeline_schedule(deck.pipeline.schedule, pipeline.shape);
  PipelineCosts costs;
  costs.forward.resize(sz(S));
  costs.backward_input.resize(sz(S));
  costs.backward_weight.resize(sz(S));
  double after = 0;
  for (int r = 0; r < pp; ++r) {
    const StepTime& t = out.stages[sz(r)].time;
    auto ms = [&](const char* what) { return t.compute_ms_by_what.count(what) ? t.compute_ms_by_what.at(what) : 0.0; };
    const double forward = ms("forward"), backward = ms("backward") + ms("recompute") + ms("backward_weight");
    int weight_passes = 0;
    for (const PipelineAction& a : schedule[sz(r)]) weight_passes += a.op == PipelineOp::backward_weight ? 1 : 0;
    const double weight = weight_passes > 0 ? ms("backward_weight") / weight_passes : backward / m / 2;
    double rank_flops = 0;
    for (int s = r; s < S; s += pp) rank_flops += pipeline.split.flops[sz(s)];
    for (int s = r; s < S; s += pp) {
      const double share = rank_flops > 0 ? pipeline.split.flops[sz(s)] / rank_flops : 1.0 / v;
      costs.forward[sz(s)] = forward * share / m;
      costs.backward_weight[sz(s)] = weight * share;
      costs.backward_input[sz(s)] = backward * share / m - costs.backward_weight[sz(s)];
    }
    after = std::max(after, t.ms_per_step - forward - backward);
  }
  const MemoryPlan& first = out.stages.front().memory;  // every stage's message is the residual stream's
  out.message_bytes = first.pipeline_message_bytes;
  const bool spans = group_spans_nodes(machine, 0, stage_ranks, pp);
  out.p2p_ms = 1e3 * point_to_point_seconds(machine, out.message_bytes, spans,
                                            spans ? group_ranks_per_node(machine, stage_ranks, pp) : 0);
  costs.p2p = out.p2p_ms;
  out.timeline = simulate_pipeline(schedule, pipeline.shape, costs);
  // The job's figures: the slowest stage's, with the step the pipeline's makespan plus the longest tail.
  const auto slowest = std::max_element(out.stages.begin(), out.stages.end(), [](const StepPlan& a, const StepPlan& b) {
    return a.time.ms_per_step < b.time.ms_per_step;
  });
  StepTime& t = out.time;
  t = slowest->time;
  t.ms_per_step = out.timeline.makespan + after;
  const double tokens = static_cast<double>(deck.train.global_batch) * deck.model.context_length;
  t.tokens_per_s = t.ms_per_step > 0 ? tokens / (t.ms_per_step / 1e3) : 0;
  t.tokens_per_s_per_device = t.tokens_per_s / ranks;
  double model_flops = 0;  // per rank, averaged over the stages (each stage's ranks compute its own share)
  for (const StepPlan& s : out.stages) model_flops += s.time.model_flops_per_rank / pp;
  t.model_flops_per_rank = model_flops;
  t.mfu = t.ms_per_step > 0 ? mfu(model_flops / (t.ms_per_step / 1e3), t.peak_tflops * 1e12) : 0;
  // The priced rank's sends, as its schedule sends them (the first global stage sends no gradient back, the last no
  // activations forward).
  int sends = 0;
  for (const PipelineAction& a : schedule[sz(slowest - out.stages.begin())])
    sends += message_out_of(a, pipeline.shape) ? 1 : 0;
  t.busy_comm_ms["pp"] = out.p2p_ms * sends;
  t.link_of["pp"] = spans ? "inter-node" : "intra-node";
  t.comm_bytes["pp"] = static_cast<double>(out.message_bytes) * sends;
  return out;
}

std::string format_pipeline_step_time(const PipelineStepPlan& p) {
  std::string out = format_step_time(p.time);
  out += fmt::format("  pipeline: schedule replayed with each stage's priced passes and {:.3f} ms per message "
                     "({:.2f} MiB): makespan {:.2f} ms, bubble {:.1f}%; per stage ms/step alone:",
                     p.p2p_ms, p.message_bytes / 1048576.0, p.timeline.makespan, 100 * p.timeline.bubble);
  for (std::size_t r = 0; r < p.stages.size(); ++r) out += fmt::format(" {:.2f}", p.stages[r].time.ms_per_step);
  return out + "\n";
}


}  // namespace fsdpp
