#include "fsdpp/optim/sgd.hpp"

#include "fsdpp/runtime/error.hpp"

namespace fsdpp {

Sgd::Sgd(std::vector<Parameter*> params, SgdConfig config) : Optimizer(std::move(params), "SGD"), config_(config) {
  FSDPP_REQUIRE(config.lr >= 0.0f, "SGD: lr must be >= 0, got {}", config.lr);
  FSDPP_REQUIRE(config.momentum >= 0.0f, "SGD: momentum must be >= 0, got {}", config.momentum);
  FSDPP_REQUIRE(config.weight_decay >= 0.0f, "SGD: weight_decay must be >= 0, got {}", config.weight_decay);
  for (const Parameter* p : params_)
    buf_.push_back(config.momentum != 0.0f ? state_tensor(*p, "sgd.momentum_buffer:" + p->name()) : View1<float>());
}

bool Sgd::decays(const Parameter& p) const {
  return role_decays(p.role(), config_.decay_embeddings, config_.decay_norms, config_.decay_biases);
}

void Sgd::step(float lr) {
  check_parameters();
  // torch starts the buffer as a copy of the first gradient; a zero factor on the (zeroed) buffer does that.
  const float keep = steps_ == 0 ? 0.0f : config_.momentum;
  const bool use_momentum = config_.momentum != 0.0f;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    // Raw pointers: the same loop runs on the host for CPU-offloaded shards (tensor/offload.hpp).
    float* param = params_[i]->value().data();
    const float* grad = params_[i]->grad().data();
    float* buf = buf_[i].data();
    const float wd = decays(*params_[i]) ? config_.weight_decay : 0.0f;
    const std::int64_t n = static_cast<std::int64_t>(params_[i]->value().extent(0));
    const bool on_host = params_[i]->host_resident();
    if (use_momentum) {
      for_each_index("fsdpp::sgd_momentum_step", on_host, n, KOKKOS_LAMBDA(const std::int64_t j) {
        const float p = param[j];
        const float b = keep * buf[j] + (grad[j] + wd * p);
        buf[j] = b;
        param[j] = p - lr * b;
      });
    } else {
      for_each_index("fsdpp::sgd_step", on_host, n, KOKKOS_LAMBDA(const std::int64_t j) {
        const float p = param[j];
        param[j] = p - lr * (grad[j] + wd * p);
      });
    }
  }
  ++steps_;
}

}  // namespace fsdpp
