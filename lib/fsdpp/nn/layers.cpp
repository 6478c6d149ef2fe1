#include "fsdpp/nn/layers.hpp"

#include "fsdpp/nn/kernels/layernorm.hpp"
#include "fsdpp/nn/kernels/linear.hpp"
#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/runtime/error.hpp"

#include <tuple>

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

void Linear::weight_gradients(GradientChunks& chunks, const View1<float>& dout, const View1<float>& inp, int N,
                              int in, int out, int ld, int at) const {
  chunks.sum(&weight, bias, N, [&](const View1<float>& dw, const View1<float>& db, int row0, int rows) {
    linear_backward_weight<float>(dw, db, chunk_rows(dout, row0, rows, ld), chunk_rows(inp, row0, rows, in), rows, in,
                                  out, ld, at);
  });
}

void Norm::backward(const View1<float>& din, const std::vector<View1<float>>& grads, const View1<float>& dout,
                    const View1<float>& in, const NormStats& stats, int N, int C, GradientChunks* chunks) const {
  const auto rows_of = [&](int row0, int rows) {  // the kernels' inputs for rows [row0, row0 + rows)
    NormStats part;
    if (stats.mean.extent(0)) part.mean = chunk_rows(stats.mean, row0, rows, 1);
    part.rstd = chunk_rows(stats.rstd, row0, rows, 1);
    return std::make_tuple(chunk_rows(din, row0, rows, C), chunk_rows(dout, row0, rows, C), chunk_rows(in, row0, rows, C),
                           part);
  };
  const auto run = [&](const View1<float>& dw, const View1<float>& db, int row0, int rows) {
    const auto [d_in, d_out, x, st] = rows_of(row0, rows);
    if (kind_ == NormKind::layer_norm)
      layernorm_backward<float>(d_in, dw, db, d_out, x, weight.value(), st.mean, st.rstd, rows, C);
    else
      rmsnorm_backward<float>(d_in, dw, d_out, x, weight.value(), st.rstd, rows, C);
  };
  if (chunks && chunks->active()) return chunks->sum(&weight, bias, N, run);
  run(grads[0], kind_ == NormKind::layer_norm ? grads[1] : View1<float>(), 0, N);
}

}  // namespace fsdpp
