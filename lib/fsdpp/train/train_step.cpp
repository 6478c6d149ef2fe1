#include "fsdpp/train/train_step.hpp"

#include "fsdpp/nn/moe.hpp"
#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/optim/grad_norm.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/train/nonfinite.hpp"

#include <algorithm>
#include <cmath>

namespace fsdpp {

std::vector<std::string> step_section_names() {
  return {"Data", "Forward", "Backward", "GradSync", "Optimizer", "Eval", "Checkpoint", "Other"};
}

StepResult TrainStep::run(std::int64_t step, float lr) {
  const int accum = data_.accumulation_steps();
  const bool exact = parallel_.layout().exact_reduction;
  // Reproducible chunks: every token product in blocks of one chunk's rows, whatever rows a rank holds (mesh.cp),
  // and the loss token by token.
  const bool chunked = parallel_.layout().token_chunk_rows > 0;
  const ScopedGemmRowBlock gemm_rows(parallel_.layout().token_chunk_rows);
  // Reproducible mode: every micro-batch is one computation unit (as_executed) with the gradient of its own
  // mean loss; the mean over the step's units is taken once, exactly (ExactLossMean, finish_exact_gradients).
  const std::int64_t units = static_cast<std::int64_t>(accum) * parallel_.data_parallel_size();
  model_.zero_grad();
  reset_fsdp_stats(model_);
  model_.tensor_parallel().reset_stats();
  double loss = 0;
  LanguageModel::RoutingTotals routed;  // selections (sparse layers, E): the step's tokens per expert
  if (pipeline_) loss = pipeline_micro_batches(accum, exact, routed);
  else loss = micro_batches(accum, exact, chunked, routed);
  StepResult r;
  {
    const TimelineScope span(timeline_names::grad_sync);
    // Gradient reductions still in flight complete here (a no-op after a whole backward: the root's
    // post-backward drains them), before anything reads the gradients.
    if (exact) finish_exact_gradients(model_, units);
    else finish_gradient_reduction(model_);
    // GPT-2's wte: the lookup's and the head's parts.
    if (pipeline_) pipeline_->tied_embedding().sum_tied_gradient(model_);
    stats_ = fsdp_stats(model_);
    // Tensor parallelism's all-reduces block the compute too: they count with the all-reduces (the AllReduce row).
    const TensorParallelStats& tp = model_.tensor_parallel().stats();
    stats_.all_reduces += static_cast<int>(tp.all_reduces);
    stats_.all_reduce_s += tp.seconds;
    r.loss = chunked ? exact_loss_.mean_of_each(comm_)
             : exact ? exact_loss_.mean(comm_, units, parallel_.layout().tp)
                     : parallel_.mean_over_ranks(loss / accum);
    if (pipeline_) {
      // The stage's ranks, then the last stage's (reproducible mode's mean was over the job: the last stage's words).
      if (!exact) r.loss = pipeline_->topology().from_last_stage(r.loss);
      double bubble = pipeline_step_->last_bubble();
      MPI_Allreduce(MPI_IN_PLACE, &bubble, 1, MPI_DOUBLE, MPI_SUM, comm_);
      int ranks = 1;
      MPI_Comm_size(comm_, &ranks);
      r.pipeline_bubble = bubble / ranks;
    }
    if (model_.router_statistics()) report_routing(r, routed, accum);  // the same model everywhere: all or none
    timers_.mark(kGradSync);
  }
  const TimelineScope optimizer_span(timeline_names::optimizer);
  const auto params = model_.parameters();
  Communicator* norm_group = parallel_.grad_norm_group();  // shards; replicas are copies
  Communicator* tp_group = parallel_.tensor_parallel_group();  // null without tensor parallelism
  const NormType norm = exact ? NormType::l2_exact : NormType::l2;
  Communicator* stages = pipeline_ ? &pipeline_->topology().stages_group() : nullptr;  // each stage its own parameters
  const Parameter* counted_elsewhere = pipeline_ ? pipeline_->tied_embedding().counted_elsewhere(model_) : nullptr;
  r.grad_norm = train_.grad_clip > 0
                    ? clip_grad_norm(params, train_.grad_clip, norm_group, norm, tp_group, stages, counted_elsewhere)
                    : global_grad_norm(params, norm_group, norm, tp_group, stages, counted_elsewhere);
  r.nonfinite = guard(step, r);
  r.skipped = !r.nonfinite.empty();
  if (!r.skipped) {
    optimizer_.step(lr);
    if (!routed.selections.empty()) model_.balance_expert_load(routed.selections);  // model.moe.balance: bias
  }
  data_.advance();
  Kokkos::fence();
  timers_.mark(kOptimizer);
  return r;
}

double TrainStep::pipeline_micro_batches(int accum, bool exact, LanguageModel::RoutingTotals& routed) {
  const double loss =
      pipeline_step_->train(flow_, accum, timers_, kForward, kBackward, exact ? &exact_loss_ : nullptr);
  routed = pipeline_step_->routing_totals();  // the last stage's; zeros elsewhere
  return loss;
}

double TrainStep::micro_batches(int accum, bool exact, bool chunked, LanguageModel::RoutingTotals& routed) {
  double loss = 0;
  for (int a = 0; a < accum; ++a) {
    {
      const TimelineScope span(timeline_names::data);
      data_.load_train(a, flow_);
      flow_.training = true;
      // The objective is the mean over the global batch: the layout says how gradients are then combined.
      flow_.loss_scale = exact ? 1.0f : parallel_.loss_scale(accum);
      parallel_.before_micro_batch(a, accum);
      timers_.mark(kData);
    }
    model_(flow_);
    Kokkos::fence();
    timers_.mark(kForward);
    model_(flow_, Pass::backward);
    Kokkos::fence();
    timers_.mark(kBackward);
    loss += flow_.loss;
    if (exact && chunked) exact_loss_.add_each(model_.losses());
    else if (exact) exact_loss_.add(flow_.loss);
    model_.add_routing_totals(routed);
  }
  return loss;
}

void TrainStep::report_routing(StepResult& r, LanguageModel::RoutingTotals& routed, int accum) {
  std::vector<double>& selections = routed.selections;
  r.aux_loss = parallel_.mean_over_ranks(routed.aux / accum);
  // The load over the step's tokens on every rank (what an expert's rank computes under ep): per layer the
  // busiest expert's over the mean.
  selections.resize(model_.router_statistics()->selections().size());
  parallel_.sum_over_ranks(selections);
  double dropped_pairs = parallel_.mean_over_ranks(routed.dropped) * parallel_.mesh().size();
  if (pipeline_) {  // the last stage saw every layer's: its figures on every stage
    r.aux_loss = pipeline_->topology().from_last_stage(*r.aux_loss);
    dropped_pairs = pipeline_->topology().from_last_stage(dropped_pairs);
    pipeline_->topology().from_last_stage(selections);
  }
  r.expert_load_per_layer = expert_load_per_layer(selections, model_.router_statistics()->layers());
  r.expert_load = *std::max_element(r.expert_load_per_layer.begin(), r.expert_load_per_layer.end());
  r.dropped = static_cast<std::int64_t>(std::llround(dropped_pairs));
}

std::string TrainStep::guard(std::int64_t step, const StepResult& r) {
  if (std::isfinite(r.loss) && std::isfinite(r.grad_norm)) {
    skipped_in_a_row_ = 0;
    return {};
  }
  // Every rank got the same loss and norm, so every rank is here and takes part in the search.
  const auto param = first_nonfinite(comm_, model_.parameters(), ParamTensor::grad,
                                     pipeline_ ? pipeline_->topology().stage() : 0);
  const std::string what =
      fmt::format("loss {}, gradient norm {}, {}", r.loss, r.grad_norm,
                  param ? fmt::format("first non-finite gradient '{}'", *param) : std::string("every gradient finite"));
  FSDPP_REQUIRE(train_.on_nonfinite == NonFinitePolicy::skip,
                "step {}: {} (train.on_nonfinite: abort). Lower optim.lr or raise schedule.warmup_steps, check "
                "train.grad_clip, or set train.on_nonfinite: skip to step over rare spikes; no checkpoint is written "
                "from this step", step, what);
  FSDPP_REQUIRE(skipped_in_a_row_ < train_.max_skipped_steps,
                "step {}: {}; {} steps in a row were skipped already (train.max_skipped_steps {}): the run diverged. "
                "Lower optim.lr or resume from an earlier checkpoint", step, what, skipped_in_a_row_,
                train_.max_skipped_steps);
  ++skipped_in_a_row_;
  return fmt::format("step {}: {}; skipped the optimizer update ({} in a row, at most {})", step, what,
                     skipped_in_a_row_, train_.max_skipped_steps);
}

}  // namespace fsdpp
