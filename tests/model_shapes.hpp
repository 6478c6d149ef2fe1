#pragma once
// Small models of each architecture for the tests, and the host-side helpers the model tests share: the same
// ModelConfig the deck would give (model.arch set, the Llama family's n_kv_head and ffn_hidden filled).
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/module.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <vector>

namespace fsdpp::test {

inline constexpr ModelArch kArchs[] = {ModelArch::gpt2, ModelArch::llama, ModelArch::qwen2};

// V vocabulary, T context, C channels, L layers, NH heads; the Llama family gets NKV = NH/2 key/value heads, an
// MLP of `ffn` (1.5 C when 0), RoPE theta 100 (so that short sequences see several turns) and eps 1e-5.
inline ModelConfig model_config(ModelArch arch, int V, int T, int C, int L, int NH, bool tied, int ffn = 0) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = V, c.context_length = T, c.n_embd = C, c.n_layer = L, c.n_head = NH, c.tie_embeddings = tied;
  if (arch != ModelArch::gpt2) {
    c.n_kv_head = NH % 2 == 0 ? NH / 2 : NH;
    c.ffn_hidden = ffn > 0 ? ffn : 3 * C / 2;
    c.rope_theta = 100.0;
    c.norm_eps = 1e-5;
  }
  return c;
}

inline std::vector<float> to_host(const View1<float>& v) {
  std::vector<float> out(v.extent(0));
  Kokkos::deep_copy(HostView1<float>(out.data(), out.size()), v);
  return out;
}

inline void to_device(const View1<float>& v, const std::vector<float>& host) {
  Kokkos::deep_copy(v, HostView1<const float>(host.data(), host.size()));
}

inline View1<std::int32_t> tokens_view(const std::vector<std::int32_t>& t) {
  View1<std::int32_t> v("tokens", t.size());
  Kokkos::deep_copy(v, HostView1<const std::int32_t>(t.data(), t.size()));
  return v;
}

// The mean loss of an evaluation forward (no gradient prepared).
inline double loss_of(Module& model, Flow flow) {
  flow.training = false;
  model(flow);
  return flow.loss;
}

}  // namespace fsdpp::test
