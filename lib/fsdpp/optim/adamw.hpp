#pragma once
// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization"), as torch.optim.AdamW and llm.c run it:
//   m = beta1 m + (1 - beta1) g              v = beta2 v + (1 - beta2) g^2
//   m_hat = m / (1 - beta1^t)                v_hat = v / (1 - beta2^t)       (t = steps() after the increment)
//   param -= lr (m_hat / (sqrt(v_hat) + eps) + wd param)
// The decay term uses the parameter before the update, which is torch's "param *= 1 - lr wd" first. It applies
// only to parameters whose role decays (optimizer.hpp: weights always; embeddings, norms and biases when the
// config says so). State m (exp_avg) and v (exp_avg_sq) are f32, one View per parameter, zero at construction.
#include "fsdpp/optim/optimizer.hpp"

namespace fsdpp {

struct AdamWConfig {
  float lr = 3e-4f;  // for callers that have no schedule: step(config().lr)
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  bool decay_embeddings = false, decay_norms = false, decay_biases = false;
};

class AdamW final : public Optimizer {
 public:
  // Build from the parameters as they will be trained: after fully_shard and to_empty (see optimizer.hpp).
  // Throws UsageError for hyperparameters outside torch's accepted ranges.
  AdamW(std::vector<Parameter*> params, AdamWConfig config);

  void step(float lr) override;

  const AdamWConfig& config() const { return config_; }
  bool decays(const Parameter& p) const;
  // State of one parameter, same extent as its value; read and write them for checkpoints (with set_steps).
  View1<float> exp_avg(const Parameter& p) const { return m_[index_of(p)]; }
  View1<float> exp_avg_sq(const Parameter& p) const { return v_[index_of(p)]; }
  std::vector<std::pair<std::string, View1<float>>> state_tensors(const Parameter& p) const override {
    return {{"exp_avg", exp_avg(p)}, {"exp_avg_sq", exp_avg_sq(p)}};
  }
  std::vector<std::pair<std::string, double>> hyperparameters() const override {
    const AdamWConfig& c = config_;
    return {{"lr", c.lr}, {"beta1", c.beta1}, {"beta2", c.beta2}, {"eps", c.eps}, {"weight_decay", c.weight_decay},
            {"decay_embeddings", c.decay_embeddings}, {"decay_norms", c.decay_norms}, {"decay_biases", c.decay_biases}};
  }

 private:
  AdamWConfig config_;
  std::vector<View1<float>> m_, v_;
};

}  // namespace fsdpp
