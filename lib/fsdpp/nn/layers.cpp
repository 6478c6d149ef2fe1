#include "fsdpp/nn/layers.hpp"

#include "fsdpp/nn/kernels/layernorm.hpp"
#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/runtime/error.hpp"

namespace fsdpp {

using namespace kernels;

Linear Linear::add(Module& owner, const std::string& name, int out, int in, InitRule init, bool with_bias) {
  Parameter& weight = owner.add_parameter(name + ".weight", {out, in}, init, ParamRole::weight);
  Parameter* bias = with_bias ? &owner.add_parameter(name + ".bias", {out}, InitRule::zeros(), ParamRole::bias) : nullptr;
  return Linear{weight, bias};
}

Norm::Norm(Module& owner, const std::string& name, NormKind kind, int C, double eps)
    : weight(owner.add_parameter(name + ".weight", {C}, InitRule::ones(), ParamRole::norm)),
      bias(kind == NormKind::layer_norm ? &owner.add_parameter(name + ".bias", {C}, InitRule::zeros(), ParamRole::bias)
                                        : nullptr),
      kind_(kind),
      eps_(kind == NormKind::layer_norm ? kLayerNormEps : eps) {}

std::vector<Parameter*> Norm::parameters() const {
  if (bias) return {&weight, bias};
  return {&weight};
}

void Norm::add_stats(BufferTable& table, const std::string& prefix, std::size_t rows, NormStats& stats) const {
  if (kind_ == NormKind::layer_norm) table.add(prefix + "_mean", rows, stats.mean);
  table.add(prefix + "_rstd", rows, stats.rstd);
}

void Norm::forward(const View1<float>& out, const NormStats& stats, const View1<float>& in, int N, int C) const {
  if (kind_ == NormKind::layer_norm)
    layernorm_forward<float>(out, stats.mean, stats.rstd, in, weight.value(), bias->value(), N, C);
  else
    rmsnorm_forward<float>(out, stats.rstd, in, weight.value(), N, C, eps_);
}

void Norm::backward(const View1<float>& din, const std::vector<View1<float>>& grads, const View1<float>& dout,
                    const View1<float>& in, const NormStats& stats, int N, int C) const {
  if (kind_ == NormKind::layer_norm)
    layernorm_backward<float>(din, grads[0], grads[1], dout, in, weight.value(), stats.mean, stats.rstd, N, C);
  else
    rmsnorm_backward<float>(din, grads[0], dout, in, weight.value(), stats.rstd, N, C);
}

}  // namespace fsdpp
