#include "fsdpp/nn/gpt.hpp"

#include "fsdpp/nn/kernels/gelu.hpp"

#include <fmt/format.h>

#include <cmath>

namespace fsdpp {

namespace {

BlockDims gpt_dims(const ModelConfig& c) {
  CausalLM::require_shape(c, ModelArch::gpt2);
  return BlockDims{c.n_embd, c.n_head, c.n_head, c.n_embd / c.n_head, 4 * c.n_embd};
}

LmLayout gpt_layout() {
  return LmLayout{"GPT", "wte.weight", "wpe.weight", "ln_f", NormKind::layer_norm, "h."};
}

}  // namespace

// x -> x + attn(ln_1(x)) -> (that) + mlp(ln_2(that)), mlp(x) = c_proj(gelu(c_fc(x)))
Block::Block(const ModelConfig& c, const BlockDims& d, std::shared_ptr<BlockContext> context)
    : DecoderBlock("Block", d, std::move(context)),
      ln_1(*this, "ln_1", NormKind::layer_norm, d.C, c.norm_eps),
      c_attn(Linear::add(*this, "attn.c_attn", 3 * d.C, d.C, InitRule::normal(kInitStd), true)),
      attn_proj(Linear::add(*this, "attn.c_proj", d.C, d.C, InitRule::normal(kInitStd / std::sqrt(2.0f * c.n_layer)), true)),
      ln_2(*this, "ln_2", NormKind::layer_norm, d.C, c.norm_eps),
      c_fc(Linear::add(*this, "mlp.c_fc", d.mlp_width, d.C, InitRule::normal(kInitStd), true)),
      mlp_proj(Linear::add(*this, "mlp.c_proj", d.C, d.mlp_width, InitRule::normal(kInitStd / std::sqrt(2.0f * c.n_layer)),
                           true)) {
  // c_attn holds q, k and v stacked: tensor parallelism splits each alike (a head's q, k and v on one rank).
  assemble({&ln_1, {{&c_attn, 3}}, &attn_proj, &ln_2, {&c_fc}, &mlp_proj});
}

// h = gelu(c_fc output), GPT-2's tanh approximation
void Block::mlp_activation(const View1<float>& h, const Branches& fc, std::int64_t n) const {
  kernels::gelu_forward<float>(h, fc[0], n);
}

void Block::mlp_activation_backward(const Branches& dfc, const View1<float>& dh, const Branches& fc,
                                    std::int64_t n) const {
  Kokkos::deep_copy(dfc[0], 0.0f);
  kernels::gelu_backward<float>(dfc[0], fc[0], dh, n);
}

Gpt::Gpt(const ModelConfig& c)
    : CausalLM(c, gpt_layout(), gpt_dims(c)), wte(token_embedding), wpe(*position_table) {
  add_blocks<Block>();
}

std::string Gpt::describe() const {
  const ModelConfig& c = config();
  return fmt::format("GPT-2, V {} T {} C {} L {} NH {} ({} embeddings)", c.vocab_size, c.context_length, c.n_embd,
                     c.n_layer, c.n_head, c.tie_embeddings ? "tied" : "untied");
}

}  // namespace fsdpp
