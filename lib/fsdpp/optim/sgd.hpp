#pragma once
// SGD with momentum and classic (coupled) weight decay, as torch.optim.SGD with dampening 0 and no Nesterov:
//   g = grad + wd param                      (wd only for parameters whose role decays, optimizer.hpp)
//   buf = momentum buf + g                   (buf = g on the first step)
//   param -= lr buf
// With momentum 0 no buffer is kept and the update is param -= lr g.
#include "fsdpp/optim/optimizer.hpp"

namespace fsdpp {

struct SgdConfig {
  float lr = 1e-2f;  // for callers that have no schedule: step(config().lr)
  float momentum = 0.9f, weight_decay = 0.0f;
  bool decay_embeddings = false, decay_norms = false, decay_biases = false;
};

class Sgd final : public Optimizer {
 public:
  // Build from the parameters as they will be trained: after fully_shard and to_empty (see optimizer.hpp).
  Sgd(std::vector<Parameter*> params, SgdConfig config);

  void step(float lr) override;

  const SgdConfig& config() const { return config_; }
  bool decays(const Parameter& p) const;
  // Momentum buffer of one parameter (empty when momentum is 0); for checkpoints, with set_steps: the first
  // step (steps() == 0) overwrites the buffer rather than decaying it.
  View1<float> momentum_buffer(const Parameter& p) const { return buf_[index_of(p)]; }
  std::vector<std::pair<std::string, View1<float>>> state_tensors(const Parameter& p) const override {
    if (momentum_buffer(p).extent(0) == 0) return {};
    return {{"momentum_buffer", momentum_buffer(p)}};
  }
  std::vector<std::pair<std::string, double>> hyperparameters() const override {
    const SgdConfig& c = config_;
    return {{"lr", c.lr}, {"momentum", c.momentum}, {"weight_decay", c.weight_decay},
            {"decay_embeddings", c.decay_embeddings}, {"decay_norms", c.decay_norms}, {"decay_biases", c.decay_biases}};
  }

 private:
  SgdConfig config_;
  std::vector<View1<float>> buf_;
};

}  // namespace fsdpp
