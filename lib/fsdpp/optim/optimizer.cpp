#include "fsdpp/optim/optimizer.hpp"

#include "fsdpp/runtime/error.hpp"

#include <unordered_set>

namespace fsdpp {

Optimizer::Optimizer(std::vector<Parameter*> params, std::string kind) : params_(std::move(params)), kind_(std::move(kind)) {
  std::unordered_set<const Parameter*> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter* p = params_[i];
    FSDPP_REQUIRE(p != nullptr, "{}: parameter {} of {} is null", kind_, i, params_.size());
    // Two updates per step of one tensor would double its learning rate without any visible sign.
    FSDPP_REQUIRE(seen.insert(p).second, "{}: parameter '{}' was passed more than once", kind_, p->name());
    data_.push_back(p->value().data());
    extent_.push_back(p->value().extent(0));
  }
}

void Optimizer::set_steps(std::int64_t steps) {
  FSDPP_REQUIRE(steps >= 0, "{}: step count must be >= 0, got {}", kind_, steps);
  steps_ = steps;
}

void Optimizer::check_parameters() const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    FSDPP_REQUIRE(p.value().data() == data_[i] && p.value().extent(0) == extent_[i],
                  "optimizer holds stale parameter '{}': its storage changed after the optimizer was built (was "
                  "the model sharded with fully_shard after building the optimizer? build the optimizer from "
                  "model.parameters() after sharding)",
                  p.name());
    FSDPP_REQUIRE(p.grad().extent(0) == p.value().extent(0) && (p.grad().data() != nullptr || p.value().extent(0) == 0),
                  "{}: parameter '{}' has no gradient storage matching its value (grad has {} elements, value {}); "
                  "give the model storage with to_empty() before building the optimizer",
                  kind_, p.name(), p.grad().extent(0), p.value().extent(0));
  }
}

std::size_t Optimizer::index_of(const Parameter& p) const {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i] == &p) return i;
  throw UsageError(fmt::format("{}: parameter '{}' is not one of this optimizer's parameters", kind_, p.name()));
}

View1<float> Optimizer::state_tensor(const Parameter& p, const std::string& label) {
  const auto n = static_cast<std::size_t>(p.value().extent(0));
  if (!p.host_resident()) return View1<float>(label, n);
  offloaded_state_.push_back(offload_buffer(label, n));
  return offloaded_state_.back().view;
}

}  // namespace fsdpp
