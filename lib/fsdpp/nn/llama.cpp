#include "fsdpp/nn/llama.hpp"

#include "fsdpp/nn/kernels/swiglu.hpp"

#include <fmt/format.h>

#include <cmath>

namespace fsdpp {

BlockDims llama_dims(const ModelConfig& c, ModelArch arch) {
  CausalLM::require_shape(c, arch);
  return BlockDims{c.n_embd, c.n_head, c.n_kv_head, head_size(c), c.ffn_hidden};
}

LmLayout llama_layout(std::string type_name) {
  return LmLayout{std::move(type_name), "embed_tokens.weight", "", "norm", NormKind::rms_norm, "layers."};
}

std::string describe_llama_family(const std::string& name, const ModelConfig& c) {
  const std::string scaling =
      c.rope_scaling_factor == 1 ? "" : fmt::format(" scaled x{} (llama3: low {} high {} original {})",
                                                    c.rope_scaling_factor, c.rope_low_freq_factor,
                                                    c.rope_high_freq_factor, c.rope_original_context);
  const std::string heads = c.head_dim > 0 ? fmt::format(" hs {}", c.head_dim) : "";
  const bool sparse = is_moe_arch(c.arch);
  const std::string experts =
      sparse ? fmt::format(" E {} top {} Fe {}", c.moe.num_experts, c.moe.top_k, c.moe.expert_ffn_hidden) : "";
  return fmt::format("{}, V {} T {} C {} L {} NH {} NKV {}{} F {}{} rope_theta {}{} ({} embeddings)", name, c.vocab_size,
                     c.context_length, c.n_embd, c.n_layer, c.n_head, c.n_kv_head, heads, c.ffn_hidden, experts,
                     c.rope_theta, scaling, c.tie_embeddings ? "tied" : "untied");
}

// x -> x + o_proj(attn(rope(qkv(rms_1(x))))) -> (that) + down(silu(gate(rms_2(that))) * up(rms_2(that)))
// (a sparse block: (that) + experts(rms_2(that)); Qwen3: q and k through their per-head norms before RoPE)
LlamaBlock::LlamaBlock(std::string type_name, const ModelConfig& c, const BlockDims& d,
                       std::shared_ptr<BlockContext> context, const LlamaBlockKind& kind)
    : DecoderBlock(std::move(type_name), d, std::move(context)),
      input_layernorm(*this, "input_layernorm", NormKind::rms_norm, d.C, c.norm_eps),
      q_proj(Linear::add(*this, "self_attn.q_proj", d.heads * d.head_size, d.C, InitRule::normal(kInitStd), kind.qkv_bias)),
      k_proj(Linear::add(*this, "self_attn.k_proj", d.kv_heads * d.head_size, d.C, InitRule::normal(kInitStd), kind.qkv_bias)),
      v_proj(Linear::add(*this, "self_attn.v_proj", d.kv_heads * d.head_size, d.C, InitRule::normal(kInitStd), kind.qkv_bias)),
      o_proj(Linear::add(*this, "self_attn.o_proj", d.C, d.heads * d.head_size,
                         InitRule::normal(kInitStd / std::sqrt(2.0f * c.n_layer)), false)),
      post_attention_layernorm(*this, "post_attention_layernorm", NormKind::rms_norm, d.C, c.norm_eps) {
  if (kind.qk_norm) {
    q_norm.emplace(*this, "self_attn.q_norm", NormKind::rms_norm, d.head_size, c.norm_eps);
    k_norm.emplace(*this, "self_attn.k_norm", NormKind::rms_norm, d.head_size, c.norm_eps);
  }
  const float down_std = kInitStd / std::sqrt(2.0f * c.n_layer);
  BlockParts parts{&input_layernorm, {{&q_proj}, {&k_proj}, {&v_proj}}, &o_proj, &post_attention_layernorm, {}, nullptr};
  if (kind.sparse) {
    experts = std::make_unique<MoeFeedForward>(*this, c, kind.moe_names, kInitStd, down_std);
    add_child(experts->experts, kind.moe_names.prefix + "experts");  // "mlp.experts": a module of its own
    parts.moe = experts.get();
  } else {
    gate_proj.emplace(Linear::add(*this, "mlp.gate_proj", d.mlp_width, d.C, InitRule::normal(kInitStd), false));
    up_proj.emplace(Linear::add(*this, "mlp.up_proj", d.mlp_width, d.C, InitRule::normal(kInitStd), false));
    down_proj.emplace(Linear::add(*this, "mlp.down_proj", d.C, d.mlp_width, InitRule::normal(down_std), false));
    parts.mlp_in = {&*gate_proj, &*up_proj};
    parts.mlp_out = &*down_proj;
  }
  if (q_norm) parts.q_norm = &*q_norm, parts.k_norm = &*k_norm;
  assemble(std::move(parts));
}

// h = silu(gate) * up
// branches: gate, up
void LlamaBlock::mlp_activation(const View1<float>& h, const Branches& gate_up, std::int64_t n) const {
  kernels::swiglu_forward<float>(h, gate_up[0], gate_up[1], n);
}

void LlamaBlock::mlp_activation_backward(const Branches& dgate_up, const View1<float>& dh, const Branches& gate_up,
                                         std::int64_t n) const {
  Kokkos::deep_copy(dgate_up[0], 0.0f);
  Kokkos::deep_copy(dgate_up[1], 0.0f);
  kernels::swiglu_backward<float>(dgate_up[0], dgate_up[1], dh, gate_up[0], gate_up[1], n);
}

Llama::Llama(const ModelConfig& c)
    : CausalLM(c, llama_layout("Llama"), llama_dims(c, ModelArch::llama)), embed_tokens(token_embedding), norm(final_norm.weight) {
  add_blocks<LlamaBlock>();
}

}  // namespace fsdpp
