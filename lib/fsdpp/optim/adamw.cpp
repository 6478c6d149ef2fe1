#include "fsdpp/optim/adamw.hpp"

#include "fsdpp/runtime/error.hpp"

#include <cmath>

namespace fsdpp {

AdamW::AdamW(std::vector<Parameter*> params, AdamWConfig config) : Optimizer(std::move(params), "AdamW"), config_(config) {
  FSDPP_REQUIRE(config.lr >= 0.0f, "AdamW: lr must be >= 0, got {}", config.lr);
  FSDPP_REQUIRE(config.beta1 >= 0.0f && config.beta1 < 1.0f, "AdamW: beta1 must be in [0, 1), got {}", config.beta1);
  FSDPP_REQUIRE(config.beta2 >= 0.0f && config.beta2 < 1.0f, "AdamW: beta2 must be in [0, 1), got {}", config.beta2);
  FSDPP_REQUIRE(config.eps >= 0.0f, "AdamW: eps must be >= 0, got {}", config.eps);
  FSDPP_REQUIRE(config.weight_decay >= 0.0f, "AdamW: weight_decay must be >= 0, got {}", config.weight_decay);
  for (const Parameter* p : params_) {
    // Zero-initialised: the first step's m and v are then (1 - beta) g and (1 - beta) g^2, as bias correction assumes.
    m_.push_back(state_tensor(*p, "adamw.exp_avg:" + p->name()));
    v_.push_back(state_tensor(*p, "adamw.exp_avg_sq:" + p->name()));
  }
}

bool AdamW::decays(const Parameter& p) const {
  return role_decays(p.role(), config_.decay_embeddings, config_.decay_norms, config_.decay_biases);
}

void AdamW::step(float lr) {
  check_parameters();
  ++steps_;
  // Bias corrections in double on the host: beta^t underflows gracefully and the kernel gets plain multipliers.
  const double t = static_cast<double>(steps_);
  const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(config_.beta1), t)));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(config_.beta2), t)));
  const float beta1 = config_.beta1, beta2 = config_.beta2, eps = config_.eps;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    // Raw pointers: the same loop runs on the host for CPU-offloaded shards (tensor/offload.hpp).
    float* param = params_[i]->value().data();
    const float* grad = params_[i]->grad().data();
    float* m = m_[i].data();
    float* v = v_[i].data();
    const float wd = decays(*params_[i]) ? config_.weight_decay : 0.0f;
    const std::int64_t n = static_cast<std::int64_t>(params_[i]->value().extent(0));
    for_each_index("fsdpp::adamw_step", params_[i]->host_resident(), n, KOKKOS_LAMBDA(const std::int64_t j) {
      const float g = grad[j];
      const float mj = beta1 * m[j] + (1.0f - beta1) * g;
      const float vj = beta2 * v[j] + (1.0f - beta2) * g * g;
      m[j] = mj;
      v[j] = vj;
      const float m_hat = mj * inv_bc1;
      const float v_hat = vj * inv_bc2;
      const float p = param[j];
      param[j] = p - lr * (m_hat / (kmath::sqrt(v_hat) + eps) + wd * p);
    });
  }
}

}  // namespace fsdpp
