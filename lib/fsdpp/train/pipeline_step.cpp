#include "fsdpp/train/pipeline_step.hpp"

#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/parallel/pipeline_gradient_sync.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

namespace fsdpp {

std::size_t PipelineStep::residual_elements(const Flow& flow) const { return model_.residual_elements(flow.B, flow.T); }

double PipelineStep::train(Flow& flow, int microbatches, SectionTimers& timers, int forward_section,
                           int backward_section, ExactLossMean* exact_loss) {
  microbatches_ = microbatches;
  exact_ = exact_loss != nullptr;
  const bool chunked = parallel_.layout().token_chunk_rows > 0;
  const std::size_t cells = static_cast<std::size_t>(topology_.virtual_stages() * microbatches);
  elements_.resize(cells);
  slot_of_.assign(cells, -1);
  free_slots_.resize(static_cast<std::size_t>(topology_.virtual_stages()));
  slots_made_.resize(free_slots_.size(), 0);
  double loss = 0;
  const double start = MPI_Wtime(), waited = transport_.waited_s();
  const std::vector<PipelineAction>& actions = pipeline_.actions(microbatches);
  PipelineGradientSync sync(actions, topology_.stages(), microbatches);
  stash_of_.assign(cells, -1);
  payload_of_.resize(cells);
  routing_totals_ = {};
  // Every message of the step has one size: a micro-batch's residual stream (and the model's payload).
  const std::size_t message = PipelineTransport::message_floats(
      model_.residual_elements(data_.train_batch(), model_.context_length()), model_.pipeline_payload_size());
  for (std::size_t k = 0; k < actions.size(); ++k) {
    const PipelineAction& a = actions[k];
    const int chunk = topology_.local_chunk_of(a.stage);
    transport_.post_receives(k, message);
    const TimelineScope span(pipeline_.schedule().action_region(k));
    if (a.op == PipelineOp::forward) {
      forward(flow, a, microbatches);
      if (topology_.last_stage(a.stage)) {
        loss += flow.loss;
        model_.add_routing_totals(routing_totals_);
        if (exact_loss && chunked) exact_loss->add_each(model_.losses());
        else if (exact_loss) exact_loss->add(flow.loss);
      }
      timers.mark(forward_section);
    } else {
      sync.before(parallel_, k);
      if (a.op == PipelineOp::backward_weight) backward_weight(flow, chunk, a.microbatch);
      else backward(flow, a, microbatches);
      timers.mark(backward_section);
    }
  }
  transport_.wait_sends();
  transport_.check_no_posted_receives();
  model_.select_pipeline_chunk(0);
  model_.select_activation_slot(0);  // every slot is free again; the rest of training uses 0
  const double spent = MPI_Wtime() - start, step_waited = transport_.waited_s() - waited;
  train_s_ += spent;
  train_waited_s_ += step_waited;
  last_bubble_ = spent > 0 ? step_waited / spent : 0.0;
  return topology_.last() ? loss : 0.0;
}

std::string PipelineStep::summary(MPI_Comm world, int microbatches) const {
  const double share = train_s_ > 0 ? train_waited_s_ / train_s_ : 0.0;
  double low = share, high = share, sum = share;
  int ranks = 1;
  MPI_Comm_size(world, &ranks);
  MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_DOUBLE, MPI_MIN, world);
  MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_DOUBLE, MPI_MAX, world);
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, world);
  int counts[2] = {slots(), stashes()};
  MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_MAX, world);
  std::string activations = fmt::format("activations kept for up to {} micro-batches per rank", counts[0]);
  if (counts[1] > 0)
    activations += fmt::format(", weight gradients held back (I before W) for up to {} of them", counts[1]);
  const std::string schedule =
      topology_.virtual_stages() > 1
          ? fmt::format("{} ({} virtual stages)", to_string(pipeline_.schedule().kind()), topology_.virtual_stages())
          : std::string(to_string(pipeline_.schedule().kind()));
  return fmt::format("pipeline {}, pp {} x {} micro-batches, blocks {}: bubble measured {:.1f} / {:.1f} / {:.1f} % "
                     "(min / avg / max over ranks: time waiting for another stage, of the micro-batches' time); "
                     "the schedule's ideal (equal stages) {:.1f} %, 1f1b's (p-1)/(m+p-1) {:.1f} %; {}",
                     schedule, topology_.stages(), microbatches, topology_.split().ranges(),
                     100 * low, 100 * sum / ranks, 100 * high, 100 * pipeline_.schedule().ideal_bubble(),
                     100 * one_f_one_b_ideal_bubble(topology_.stages(), microbatches), activations);
}

std::size_t PipelineStep::cell(int chunk, int microbatch) const {
  return static_cast<std::size_t>(chunk * microbatches_ + microbatch);
}

int PipelineStep::slot_id(int chunk, int slot) const {
  // Chunk-local slot k of chunk c is the model's slot k v + c: every chunk's modules see slots of their own only.
  return slot * topology_.virtual_stages() + chunk;
}

void PipelineStep::select_slot(int chunk, int slot) { model_.select_activation_slot(slot_id(chunk, slot)); }

View1<float>& PipelineStep::input_buffer(std::size_t index) {
  if (inputs_.size() <= index) inputs_.resize(index + 1);
  return inputs_[index];
}

void PipelineStep::forward(Flow& flow, const PipelineAction& a, int m) {
  const int chunk = topology_.local_chunk_of(a.stage), i = a.microbatch, s = a.stage;
  {
    const TimelineScope loading(timeline_names::data);
    data_.load_train(i, flow);
  }
  flow.training = true;
  flow.loss_scale = exact_ ? 1.0f : parallel_.loss_scale(m);
  const std::size_t n = residual_elements(flow);  // before forward: context parallelism shortens flow.T there
  const std::size_t at = cell(chunk, i);
  model_.select_pipeline_chunk(chunk);
  {  // a slot of its own until its backward
    std::vector<int>& free = free_slots_[static_cast<std::size_t>(chunk)];
    if (free.empty()) free.push_back(slots_made_[static_cast<std::size_t>(chunk)]++);
    slot_of_[at] = free.back();
    free.pop_back();
    select_slot(chunk, slot_of_[at]);
  }
  const bool payload = model_.pipeline_payload_size() > 0;
  if (const auto in = transport_.message_into(a)) {
    // Kept until the backward: per slot (the micro-batches in flight).
    View1<float>& input = input_buffer(static_cast<std::size_t>(slot_id(chunk, slot_of_[at])));
    if (input.extent(0) != n) input = uninitialized<float>("fsdpp::pipeline_input", n);
    if (payload) payload_in_.resize(model_.pipeline_payload_size());  // the stages before wrote it
    transport_.receive(input, n, *in, payload ? &payload_in_ : nullptr);
    if (payload) model_.read_forward_payload(payload_in_);
    flow.x = input;
  }
  model_(flow);
  Kokkos::fence();
  if (const auto out = transport_.message_out_of(a)) {
    if (payload) model_.write_pipeline_payload(payload_out_);
    transport_.send(flow.x, n, *out, payload ? &payload_out_ : nullptr);
  }
  // The last stage keeps each micro-batch's payload for its backward: other forwards may run between.
  if (payload && topology_.last_stage(s)) model_.write_pipeline_payload(payload_of_[at]);
  elements_[at] = n;
}

void PipelineStep::backward(Flow& flow, const PipelineAction& a, int m) {
  const int chunk = topology_.local_chunk_of(a.stage), i = a.microbatch;
  const bool input_only = a.op == PipelineOp::backward_input;
  const std::size_t at = cell(chunk, i);
  model_.select_pipeline_chunk(chunk);
  {  // its own activations: the slot its forward computed in, and its tokens again
    const TimelineScope loading(timeline_names::data);
    data_.load_train(i, flow);
  }
  flow.training = true;
  flow.loss_scale = exact_ ? 1.0f : parallel_.loss_scale(m);
  select_slot(chunk, slot_of_[at]);
  const std::size_t n = elements_[at];
  const bool payload = model_.pipeline_payload_size() > 0;
  if (payload) payload_back_.resize(model_.pipeline_payload_size());
  if (const auto in = transport_.message_into(a)) {
    if (gradient_.extent(0) != n) gradient_ = uninitialized<float>("fsdpp::pipeline_output_gradient", n);
    transport_.receive(gradient_, n, *in, payload ? &payload_back_ : nullptr);
    flow.dx = gradient_;
  } else if (payload) {
    payload_back_ = payload_of_[at];  // what its forward wrote
  }
  if (payload) model_.read_backward_payload(payload_back_, flow.loss_scale);
  if (input_only) {  // zero_bubble's I: the weight gradients wait in a stash for W
    if (free_stashes_.empty()) {
      free_stashes_.push_back(static_cast<int>(stashes_.size()));
      stashes_.push_back(std::make_unique<WeightGradientStash>());
    }
    stash_of_[at] = free_stashes_.back();
    free_stashes_.pop_back();
    flow.weight_stash = stashes_[static_cast<std::size_t>(stash_of_[at])].get();
  }
  model_(flow, Pass::backward);
  flow.weight_stash = nullptr;
  Kokkos::fence();
  if (const auto out = transport_.message_out_of(a))
    transport_.send(flow.dx, n, *out, payload ? &payload_back_ : nullptr);
  // After I the stash still reads the slot's activations (the weights' inputs): W frees it.
  if (!input_only) free_slots_[static_cast<std::size_t>(chunk)].push_back(slot_of_[at]);
}

void PipelineStep::backward_weight(Flow& flow, int chunk, int i) {
  const std::size_t at = cell(chunk, i);
  FSDPP_CHECK(stash_of_[at] >= 0, "pipeline: W{} before its I on this rank", i);
  WeightGradientStash& stash = *stashes_[static_cast<std::size_t>(stash_of_[at])];
  model_.select_pipeline_chunk(chunk);
  flow.weight_stash = &stash;
  model_(flow, Pass::backward_weight);
  flow.weight_stash = nullptr;
  stash.finish();
  free_stashes_.push_back(stash_of_[at]);
  stash_of_[at] = -1;
  free_slots_[static_cast<std::size_t>(chunk)].push_back(slot_of_[at]);
}

double PipelineStep::evaluate(Flow& flow, int index) {
  data_.load_val(index, flow);
  flow.training = false;
  const std::size_t n = residual_elements(flow);
  for (int chunk = 0; chunk < topology_.virtual_stages(); ++chunk) {  // each chunk in its own slot 0
    const PipelineAction forward{PipelineOp::forward, topology_.global_stage(chunk), index};
    model_.select_pipeline_chunk(chunk);
    select_slot(chunk, 0);
    if (const auto in = transport_.message_into(forward)) {  // training's buffer of (chunk, slot 0)
      View1<float>& input = input_buffer(static_cast<std::size_t>(slot_id(chunk, 0)));
      if (input.extent(0) < n) input = uninitialized<float>("fsdpp::pipeline_input", n);
      transport_.receive(input, n, *in);
      flow.x = Kokkos::subview(input, std::make_pair(std::size_t{0}, n));
    }
    model_(flow);
    Kokkos::fence();
    if (const auto out = transport_.message_out_of(forward)) transport_.send(flow.x, n, *out);
    transport_.wait_sends();  // the next chunk's receive reuses the input buffer only after
  }
  model_.select_pipeline_chunk(0);
  select_slot(0, 0);
  return topology_.last() ? flow.loss : 0.0;
}

}  // namespace fsdpp
