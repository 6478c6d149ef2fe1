#pragma once
// The parameterized pieces decoder models are built from: Linear (a weight (out, in) as PyTorch and Hugging Face
// store it, and an optional bias) and Norm (LayerNorm with weight and bias, or RMSNorm with a weight). Each
// registers its parameters on the module that owns it, under "<name>.weight" and "<name>.bias", in that order.
#include "fsdpp/nn/buffers.hpp"
#include "fsdpp/nn/gradient_chunks.hpp"
#include "fsdpp/nn/module.hpp"

#include <string>
#include <vector>

namespace fsdpp {

struct Linear {
  Parameter& weight;  // (out, in)
  Parameter* bias;    // (out), or nullptr: no bias

  // Registers "<name>.weight" (init `init`) and, with `with_bias`, "<name>.bias" (zeros) on `owner`.
  static Linear add(Module& owner, const std::string& name, int out, int in, InitRule init, bool with_bias);
  View1<float> bias_value() const { return bias ? bias->value() : View1<float>(); }
  // dweight += dout[:, at:at+out]^T @ inp and dbias += its column sums, over N token rows (dout rows of width ld,
  // inp rows of width in), chunk by chunk when `chunks` is on (gradient_chunks.hpp).
  void weight_gradients(GradientChunks& chunks, const View1<float>& dout, const View1<float>& inp, int N, int in,
                        int out, int ld, int at) const;
  void weight_gradients(GradientChunks& chunks, const View1<float>& dout, const View1<float>& inp, int N, int in,
                        int out) const {
    weight_gradients(chunks, dout, inp, N, in, out, out, 0);
  }
};

enum class NormKind { layer_norm, rms_norm };

// Per-row statistics a norm's backward reads: LayerNorm's mean and 1/std, RMSNorm's 1/rms (mean stays empty).
struct NormStats {
  View1<float> mean, rstd;
};

class Norm {
 public:
  // Registers "<name>.weight" (ones) and, for LayerNorm, "<name>.bias" (zeros) of width C on `owner`. RMSNorm's
  // epsilon is `eps`; LayerNorm's is the kernel's (kernels::kLayerNormEps, GPT-2's 1e-5) and `eps` is not read.
  Norm(Module& owner, const std::string& name, NormKind kind, int C, double eps);

  NormKind kind() const { return kind_; }
  double eps() const { return eps_; }  // RMSNorm's
  Parameter& weight;
  Parameter* bias;  // LayerNorm's; nullptr for RMSNorm
  // weight, then bias: the order of their slots when sequence parallelism sums partial gradients.
  std::vector<Parameter*> parameters() const;

  // Adds the statistics' buffers for `rows` rows to a table ("<prefix>_mean", "<prefix>_rstd").
  void add_stats(BufferTable& table, const std::string& prefix, std::size_t rows, NormStats& stats) const;
  // out = norm(in) over N rows of C, statistics into `stats`.
  void forward(const View1<float>& out, const NormStats& stats, const View1<float>& in, int N, int C) const;
  // din += d(norm)/d(in) * dout; grads[i] += the gradient of parameters()[i]. With `chunks` on, the parameters'
  // gradients go chunk by chunk into their exact words instead (gradient_chunks.hpp) and grads is not read.
  void backward(const View1<float>& din, const std::vector<View1<float>>& grads, const View1<float>& dout,
                const View1<float>& in, const NormStats& stats, int N, int C,
                GradientChunks* chunks = nullptr) const;

 private:
  NormKind kind_;
  double eps_;
};

}  // namespace fsdpp
