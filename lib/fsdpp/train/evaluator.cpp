#include "fsdpp/train/evaluator.hpp"

namespace fsdpp {

double Evaluator::run() {
  double total = 0;
  for (int e = 0; e < batches_ && pipeline_; ++e) total += pipeline_->evaluate(flow_, e);
  for (int e = 0; e < batches_ && !pipeline_; ++e) {
    data_.load_val(e, flow_);
    flow_.training = false;
    model_(flow_);
    total += flow_.loss;
  }
  parallel_.after_evaluation();
  const double mean = parallel_.mean_over_ranks(total / batches_);
  return pipeline_ ? pipeline_->from_last_stage(mean) : mean;
}

}  // namespace fsdpp
