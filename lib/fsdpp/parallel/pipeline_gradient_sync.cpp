#include "fsdpp/parallel/pipeline_gradient_sync.hpp"

#include "fsdpp/runtime/error.hpp"

#include <algorithm>

namespace fsdpp {

PipelineGradientSync::PipelineGradientSync(const std::vector<PipelineAction>& actions, int pp, int microbatches)
    : actions_(actions), pp_(pp), microbatches_(microbatches) {
  int chunks = 1;
  for (std::size_t k = 0; k < actions.size(); ++k) {
    if (actions[k].op != PipelineOp::forward) last_backward_ = k;
    chunks = std::max(chunks, actions[k].stage / pp + 1);
  }
  completed_.assign(static_cast<std::size_t>(chunks), 0);
}

void PipelineGradientSync::before(Parallelism& parallel, std::size_t k) {
  const PipelineAction& a = actions_[k];
  FSDPP_CHECK(a.op != PipelineOp::forward, "gradient synchronization before a forward ({})", to_string(a));
  const bool last = k == last_backward_;
  if (a.op == PipelineOp::backward_input) {
    parallel.before_input_gradients();
  } else {
    int& done = completed_[static_cast<std::size_t>(a.stage / pp_)];
    parallel.before_micro_batch(done++, microbatches_, last);
  }
  parallel.keep_parameters_between_micro_batches(!last);  // gathered once per step
}

}  // namespace fsdpp
