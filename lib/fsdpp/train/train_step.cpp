#include "fsdpp/train/train_step.hpp"

#include "fsdpp/optim/grad_norm.hpp"

namespace fsdpp {

std::vector<std::string> step_section_names() {
  return {"Data", "Forward", "Backward", "GradSync", "Optimizer", "Eval", "Checkpoint", "Other"};
}

StepResult TrainStep::run(float lr) {
  const int accum = data_.accumulation_steps();
  model_.zero_grad();
  reset_fsdp_stats(model_);
  double loss = 0;
  for (int a = 0; a < accum; ++a) {
    data_.load_train(a, flow_);
    flow_.training = true;
    // The objective is the mean over the global batch: the layout says how gradients are then combined.
    flow_.loss_scale = parallel_.loss_scale(accum);
    parallel_.before_micro_batch(a, accum);
    timers_.mark(kData);
    model_(flow_);
    Kokkos::fence();
    timers_.mark(kForward);
    model_(flow_, Pass::backward);
    Kokkos::fence();
    timers_.mark(kBackward);
    loss += flow_.loss;
  }
  stats_ = fsdp_stats(model_);
  StepResult r;
  r.loss = parallel_.mean_over_ranks(loss / accum);
  timers_.mark(kGradSync);
  const auto params = model_.parameters();
  Communicator* norm_group = parallel_.grad_norm_group();  // shards; replicas are copies
  r.grad_norm = grad_clip_ > 0 ? clip_grad_norm(params, grad_clip_, norm_group) : global_grad_norm(params, norm_group);
  optimizer_.step(lr);
  data_.advance();
  Kokkos::fence();
  timers_.mark(kOptimizer);
  return r;
}

}  // namespace fsdpp
