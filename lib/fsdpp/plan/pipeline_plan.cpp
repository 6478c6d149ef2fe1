#include "fsdpp/plan/pipeline_plan.hpp"

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

}  // namespace fsdpp
