#include "fsdpp/optim/deck_optimizer.hpp"

#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/optim/sgd.hpp"

namespace fsdpp {

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& o, std::vector<Parameter*> params) {
  if (o.name == OptimizerKind::sgd) {
    SgdConfig c;
    c.lr = static_cast<float>(o.lr);
    c.momentum = static_cast<float>(o.momentum);
    c.weight_decay = static_cast<float>(o.weight_decay);
    c.decay_embeddings = o.decay_embeddings, c.decay_norms = o.decay_norms, c.decay_biases = o.decay_biases;
    return std::make_unique<Sgd>(std::move(params), c);
  }
  AdamWConfig c;
  c.lr = static_cast<float>(o.lr);
  c.beta1 = static_cast<float>(o.beta1), c.beta2 = static_cast<float>(o.beta2), c.eps = static_cast<float>(o.eps);
  c.weight_decay = static_cast<float>(o.weight_decay);
  c.decay_embeddings = o.decay_embeddings, c.decay_norms = o.decay_norms, c.decay_biases = o.decay_biases;
  return std::make_unique<AdamW>(std::move(params), c);
}

int optimizer_state_copies(const OptimConfig& optim) {
  if (optim.name == OptimizerKind::adamw) return 2;
  return optim.momentum != 0 ? 1 : 0;
}

int optimizer_passes(const OptimConfig& optim) {
  const int norm = 1;
  return norm + (optim.name == OptimizerKind::adamw ? 7 : optim.momentum != 0 ? 5 : 3);
}

}  // namespace fsdpp
