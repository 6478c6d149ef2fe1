#include "fsdpp/optim/deck_optimizer.hpp"

#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/optim/sgd.hpp"

namespace fsdpp {

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& o, std::vector<Parameter*> all) {
  std::vector<Parameter*> params;  // what the optimizer updates: not the parameters their modules update
  for (Parameter* p : all)
    if (p->trainable()) params.push_back(p);
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

int optimizer_update_passes(const OptimConfig& optim) {
  // The gradient read; the parameter and each state copy read and written.
  return 1 + 2 * (1 + optimizer_state_copies(optim));
}

int optimizer_passes(const OptimConfig& optim) {
  const int gradient_norm = 1;
  return gradient_norm + optimizer_update_passes(optim);
}

}  // namespace fsdpp
