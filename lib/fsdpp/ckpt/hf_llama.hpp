#pragma once
// Hugging Face Llama weights (LlamaForCausalLM) in and out, through safetensors. fsdpp's Llama names are HF's
// without the leading "model." (lm_head.weight keeps its own): model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, model.layers.{i}.mlp.{gate,up,down}_proj.weight,
// model.layers.{i}.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight. HF's nn.Linear
// stores [out, in] as fsdpp does: nothing is transposed.
//
// Rotary convention: Meta's original checkpoints rotate interleaved channel pairs (2i, 2i+1); Hugging Face's
// conversion script permutes the rows of q_proj and k_proj within each head so that its rotate_half pairs
// (i, i + hs/2) rotate the same values. fsdpp's RoPE is rotate_half too (nn/kernels/rope.hpp), so HF's q_proj
// and k_proj rows are used exactly as stored, both ways: import and export are bitwise copies. Buffers such as
// rotary_emb.inv_freq (older files) are not parameters and are skipped; a file with a tied head has no lm_head.
#include "fsdpp/ckpt/hf_convert.hpp"
#include "fsdpp/nn/qwen2.hpp"

#include <optional>
#include <string>

namespace fsdpp {

std::optional<std::string> fsdpp_name_of_hf_llama_key(const std::string& hf_key);  // nullopt: a buffer
std::string hf_llama_key_of(const std::string& fsdpp_name);                          // "model.norm.weight"
const HfNaming& hf_llama_naming();

// Qwen2's names are Llama's, plus the q/k/v biases (nn/qwen2.hpp): the same mapping, under its own name.
const HfNaming& hf_qwen2_naming();
// Qwen3 (q/k norms, head_dim), Qwen3-MoE and Mixtral (stacked experts, one Hub tensor per expert: nn/moe.hpp).
const HfNaming& hf_qwen3_naming();
const HfNaming& hf_qwen3_moe_naming();
const HfNaming& hf_mixtral_naming();

// `fsdpp ckpt import` for a Llama-family deck: every tensor checked against `config` (llama, qwen2, qwen3,
// qwen3_moe, mixtral),
// every mismatch listed. Serial.
void import_hf_llama(const std::string& safetensors, const std::string& out, const ModelConfig& config);

}  // namespace fsdpp
