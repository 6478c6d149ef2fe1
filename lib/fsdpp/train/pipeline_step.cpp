#include "fsdpp/train/pipeline_step.hpp"

#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

namespace fsdpp {

std::size_t PipelineStep::residual_elements(const Flow& flow) const { return model_.residual_elements(flow.B, flow.T); }

double PipelineStep::train(Flow& flow, int microbatches, SectionTimers& timers, int forward_section,
                           int backward_section) {
  if (inputs_.size() < static_cast<std::size_t>(microbatches)) inputs_.resize(static_cast<std::size_t>(microbatches));
  elements_.resize(static_cast<std::size_t>(microbatches));
  slot_of_.assign(static_cast<std::size_t>(microbatches), -1);
  double loss = 0;
  held_ = -1;
  replays_ = 0;
  const double start = MPI_Wtime(), waited = pipeline_.waited_s();
  for (const PipelineAction& a : pipeline_.actions(microbatches)) {
    if (a.op == PipelineOp::forward) {
      forward(flow, a.microbatch, microbatches, false);
      loss += flow.loss;
      timers.mark(forward_section);
    } else {
      FSDPP_CHECK(a.op == PipelineOp::backward, "pipeline action {} is not run by this schedule", to_string(a));
      backward(flow, a.microbatch, microbatches);
      timers.mark(backward_section);
    }
  }
  pipeline_.wait_sends();
  if (keeps_slots_) model_.select_activation_slot(0);  // every slot is free again; the rest of training uses 0
  const double spent = MPI_Wtime() - start, step_waited = pipeline_.waited_s() - waited;
  train_s_ += spent;
  train_waited_s_ += step_waited;
  last_bubble_ = spent > 0 ? step_waited / spent : 0.0;
  return pipeline_.last() ? loss : 0.0;
}

std::string PipelineStep::summary(MPI_Comm world, int microbatches) const {
  const double share = train_s_ > 0 ? train_waited_s_ / train_s_ : 0.0;
  double low = share, high = share, sum = share;
  int ranks = 1;
  MPI_Comm_size(world, &ranks);
  MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_DOUBLE, MPI_MIN, world);
  MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_DOUBLE, MPI_MAX, world);
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, world);
  int counts[2] = {replays_, slots_made_};
  MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_MAX, world);
  const std::string activations =
      keeps_slots_ ? fmt::format("activations kept for up to {} micro-batches per rank", counts[1])
                   : fmt::format("forwards replayed for a backward (context parallelism), per step: up to {} per rank",
                                 counts[0]);
  return fmt::format("pipeline {}, pp {} x {} micro-batches, blocks {}: bubble measured {:.1f} / {:.1f} / {:.1f} % "
                     "(min / avg / max over ranks: time waiting for another stage, of the micro-batches' time); "
                     "ideal (p-1)/(m+p-1) {:.1f} %; {}",
                     to_string(pipeline_.schedule_kind()), pipeline_.stages(), microbatches, pipeline_.split().ranges(),
                     100 * low, 100 * sum / ranks, 100 * high,
                     100 * one_f_one_b_ideal_bubble(pipeline_.stages(), microbatches), activations);
}

void PipelineStep::forward(Flow& flow, int i, int m, bool replay) {
  data_.load_train(i, flow);
  flow.training = true;
  flow.loss_scale = parallel_.loss_scale(m);
  const std::size_t n = residual_elements(flow);  // before forward: context parallelism shortens flow.T there
  const int s = pipeline_.stage();
  if (keeps_slots_) {  // a slot of its own until its backward
    int& slot = slot_of_[static_cast<std::size_t>(i)];
    if (free_slots_.empty()) free_slots_.push_back(slots_made_++);
    slot = free_slots_.back();
    free_slots_.pop_back();
    model_.select_activation_slot(slot);
  }
  if (!pipeline_.first()) {
    View1<float>& input = inputs_[static_cast<std::size_t>(i)];
    if (input.extent(0) != n) input = uninitialized<float>("fsdpp::pipeline_input", n);
    if (!replay) pipeline_.receive(input, n, s - 1, i, false);
    flow.x = input;
  }
  model_(flow);
  Kokkos::fence();
  if (!replay && !pipeline_.last()) pipeline_.send(flow.x, n, s + 1, i, false);
  held_ = i;
  elements_[static_cast<std::size_t>(i)] = n;
}

void PipelineStep::backward(Flow& flow, int i, int m) {
  if (keeps_slots_) {  // its own activations: the slot its forward computed in, and its tokens again
    data_.load_train(i, flow);
    flow.training = true;
    flow.loss_scale = parallel_.loss_scale(m);
    model_.select_activation_slot(slot_of_[static_cast<std::size_t>(i)]);
  } else if (held_ != i) {  // a later micro-batch's forward ran since: rebuild this one's activations
    const TimelineScope span(timeline_names::pipeline_replay);
    forward(flow, i, m, true);
    ++replays_;
  }
  const std::size_t n = elements_[static_cast<std::size_t>(i)];
  const int s = pipeline_.stage();
  if (!pipeline_.last()) {
    if (gradient_.extent(0) != n) gradient_ = uninitialized<float>("fsdpp::pipeline_output_gradient", n);
    pipeline_.receive(gradient_, n, s + 1, i, true);
    flow.dx = gradient_;
  }
  parallel_.before_micro_batch(i, m);  // the last micro-batch's backward synchronizes the gradients
  model_(flow, Pass::backward);
  Kokkos::fence();
  if (!pipeline_.first()) pipeline_.send(flow.dx, n, s - 1, i, true);
  held_ = -1;  // backward has consumed the activations (the head's loss gradient among them)
  if (keeps_slots_) free_slots_.push_back(slot_of_[static_cast<std::size_t>(i)]);
}

double PipelineStep::evaluate(Flow& flow, int index) {
  data_.load_val(index, flow);
  flow.training = false;
  const std::size_t n = residual_elements(flow);
  const int s = pipeline_.stage();
  if (!pipeline_.first()) {
    if (inputs_.empty()) inputs_.resize(1);
    if (inputs_[0].extent(0) < n) inputs_[0] = uninitialized<float>("fsdpp::pipeline_input", n);
    pipeline_.receive(inputs_[0], n, s - 1, index, false);
    flow.x = Kokkos::subview(inputs_[0], std::make_pair(std::size_t{0}, n));
  }
  model_(flow);
  Kokkos::fence();
  if (!pipeline_.last()) pipeline_.send(flow.x, n, s + 1, index, false);
  pipeline_.wait_sends();
  return pipeline_.last() ? flow.loss : 0.0;
}

}  // namespace fsdpp
