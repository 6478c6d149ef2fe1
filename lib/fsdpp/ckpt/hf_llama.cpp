#include "fsdpp/ckpt/hf_llama.hpp"

#include "fsdpp/ckpt/hf_config.hpp"
#include "fsdpp/nn/make_model.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cctype>
#include <cstring>

#include <fmt/format.h>

namespace fsdpp {
namespace {

bool never_transposed(const std::string&) { return false; }
void require_full_attention(HfConfigReader& c);

// RoPE: transformers 5's rope_parameters {rope_type, rope_theta, ...}, or 4's top-level rope_theta with an
// optional rope_scaling {rope_type (or type), ...}. fsdpp computes plain RoPE and Llama 3.1's frequency scaling.
void read_rope(HfConfigReader& c, ModelConfig& m) {
  std::optional<HfConfigReader> rope = c.object("rope_parameters");
  if (rope) {
    rope->take("rope_theta", "model.rope_theta", m.rope_theta, 10000.0);
    c.require("rope_theta", {fmt::format("{}", m.rope_theta)}, "RoPE with rope_parameters' rope_theta");
    c.require("rope_scaling", {"null"}, "RoPE as rope_parameters says");
  } else {
    c.take("rope_theta", "model.rope_theta", m.rope_theta, 10000.0);
    rope = c.object("rope_scaling");
  }
  std::optional<std::string> type;
  if (rope) {
    type = rope->string("rope_type");
    const std::optional<std::string> legacy = rope->string("type");  // transformers 4's older name of rope_type
    if (!type) type = legacy;
  }
  m.rope_scaling_factor = 1.0;
  if (!type || *type == "default") {
    if (rope) rope->finish("plain RoPE");
    c.determined("model.rope_scaling_factor", "rope_scaling");
    return;
  }
  FSDPP_REQUIRE(*type == "llama3", "{}: rope_type '{}' is not implemented: fsdpp computes plain RoPE (default) and "
                "Llama 3.1's frequency scaling (llama3); it refuses to load a model it would compute differently",
                rope->where(), *type);
  rope->take("factor", "model.rope_scaling_factor", m.rope_scaling_factor);
  rope->take("low_freq_factor", "model.rope_low_freq_factor", m.rope_low_freq_factor);
  rope->take("high_freq_factor", "model.rope_high_freq_factor", m.rope_high_freq_factor);
  rope->take("original_max_position_embeddings", "model.rope_original_context", m.rope_original_context);
  rope->finish("llama3 RoPE scaling");
}

// What Llama and Qwen2 configs share, with `defaults` the architecture's config class's.
struct LlamaDefaults {
  int vocab_size, hidden_size, intermediate_size, layers, heads, max_positions;
};

void read_llama_family(HfConfigReader& c, ModelConfig& m, const LlamaDefaults& d) {
  c.take("vocab_size", "model.vocab_size", m.vocab_size, d.vocab_size);
  c.take("hidden_size", "model.n_embd", m.n_embd, d.hidden_size);
  c.take("intermediate_size", "model.ffn_hidden", m.ffn_hidden, d.intermediate_size);
  c.take("num_hidden_layers", "model.n_layer", m.n_layer, d.layers);
  c.take("num_attention_heads", "model.n_head", m.n_head, d.heads);
  c.take("num_key_value_heads", "model.n_kv_head", m.n_kv_head, m.n_head);
  // Training may use shorter sequences than the model's longest: RoPE has no position table.
  c.take("max_position_embeddings", "model.context_length", m.context_length, d.max_positions);
  c.mark_less_allowed("model.context_length");
  c.take("rms_norm_eps", "model.norm_eps", m.norm_eps, 1e-6);
  c.take("tie_word_embeddings", "model.tie_embeddings", m.tie_embeddings, false);
  read_rope(c, m);
  c.require("hidden_act", {"\"silu\""}, "SwiGLU's SiLU");
  c.ignore("attention_dropout");  // training only, and fsdpp trains without dropout
}

// LlamaConfig, with transformers' defaults for absent fields.
void read_llama_config(HfConfigReader& c, ModelConfig& m) {
  m.arch = ModelArch::llama;
  read_llama_family(c, m, {32000, 4096, 11008, 32, 32, 2048});
  c.require("attention_bias", {"false"}, "q, k, v and o projections without biases");
  c.require("mlp_bias", {"false"}, "MLP projections without biases");
  if (m.n_head > 0) c.require("head_dim", {"null", std::to_string(m.n_embd / m.n_head)}, "heads of hidden_size / num_attention_heads channels");
  c.ignore("pretraining_tp");  // slices the same products into tp parts: the same model
}

// Qwen2Config: Llama's fields (q/k/v biases always, no attention_bias field), and sliding windows, which fsdpp
// does not compute: only a config that leaves them off is read.
void read_qwen2_config(HfConfigReader& c, ModelConfig& m) {
  m.arch = ModelArch::qwen2;
  read_llama_family(c, m, {151936, 4096, 22016, 32, 32, 32768});
  require_full_attention(c);
  c.ignore("sliding_window");  // read by transformers only under use_sliding_window
}

// Full causal attention in every layer: Qwen's and Mistral's sliding windows off.
void require_full_attention(HfConfigReader& c) {
  c.require("use_sliding_window", {"false"}, "full causal attention in every layer");
  for (const std::string& layer : c.strings("layer_types"))  // transformers 5: one entry per layer
    FSDPP_REQUIRE(layer == "full_attention", "{}: field 'layer_types' holds '{}', which fsdpp does not implement: it "
                  "computes full causal attention in every layer (layer_types all \"full_attention\"); it refuses to "
                  "load a model it would compute differently", c.where(), layer);
  c.ignore("max_window_layers");  // read by transformers only under use_sliding_window
}

// Qwen3Config: Llama's fields, q/k norms always, its own head_dim (128 by default), no biases.
void read_qwen3_attention(HfConfigReader& c, ModelConfig& m) {
  read_llama_family(c, m, {151936, 4096, 22016, 32, 32, 32768});
  c.take("head_dim", "model.head_dim", m.head_dim, 128);
  c.require("attention_bias", {"false"}, "q, k, v and o projections without biases");
  require_full_attention(c);
  c.ignore("sliding_window");
}

void read_qwen3_config(HfConfigReader& c, ModelConfig& m) {
  m.arch = ModelArch::qwen3;
  read_qwen3_attention(c, m);
}

// The mixture-of-experts fields Qwen3MoeConfig and MixtralConfig share, with their defaults.
void read_moe(HfConfigReader& c, ModelConfig& m, int experts, int top_k) {
  if (c.has("num_local_experts") || !c.has("num_experts"))  // transformers 5 writes both names for Qwen3-MoE
    c.take("num_local_experts", "model.moe.num_experts", m.moe.num_experts, experts);
  if (c.has("num_experts")) c.take("num_experts", "model.moe.num_experts", m.moe.num_experts);
  c.take("num_experts_per_tok", "model.moe.top_k", m.moe.top_k, top_k);
  c.take("router_aux_loss_coef", "model.moe.aux_loss_coef", m.moe.aux_loss_coef, 0.001);
  c.ignore("output_router_logits");  // whether transformers adds the aux loss in forward: fsdpp's balance decides
  c.ignore("router_jitter_noise");   // training-time noise, off in the releases; fsdpp adds none
  m.moe.balance = MoeBalance::aux_loss;
}

void read_qwen3_moe_config(HfConfigReader& c, ModelConfig& m) {
  m.arch = ModelArch::qwen3_moe;
  read_qwen3_attention(c, m);
  read_moe(c, m, 128, 8);
  c.take("moe_intermediate_size", "model.moe.expert_ffn_hidden", m.moe.expert_ffn_hidden, 768);
  c.take("norm_topk_prob", "model.moe.norm_topk_prob", m.moe.norm_topk_prob, false);
  c.take("decoder_sparse_step", "model.moe.sparse_step", m.moe.sparse_step, 1);
  c.take("mlp_only_layers", "model.moe.dense_layers", m.moe.dense_layers);
}

// MixtralConfig: Llama's attention, every layer sparse, intermediate_size the experts' width.
void read_mixtral_config(HfConfigReader& c, ModelConfig& m) {
  m.arch = ModelArch::mixtral;
  read_llama_family(c, m, {32000, 4096, 14336, 32, 32, 131072});
  m.moe.expert_ffn_hidden = m.ffn_hidden;
  c.determined("model.moe.expert_ffn_hidden", "intermediate_size");
  if (m.n_head > 0) c.require("head_dim", {"null", std::to_string(m.n_embd / m.n_head)}, "heads of hidden_size / num_attention_heads channels");
  read_moe(c, m, 8, 2);
  require_full_attention(c);
  c.require("sliding_window", {"null"}, "full causal attention (no sliding window)");
}

void write_rope(const ModelConfig& m, HfConfigWriter& c) {
  c.set("rope_theta", m.rope_theta);
  if (m.rope_scaling_factor == 1.0) {
    c.set_null("rope_scaling");
    return;
  }
  HfConfigWriter scaling;
  scaling.set("rope_type", "llama3");
  scaling.set("factor", m.rope_scaling_factor);
  scaling.set("low_freq_factor", m.rope_low_freq_factor);
  scaling.set("high_freq_factor", m.rope_high_freq_factor);
  scaling.set("original_max_position_embeddings", m.rope_original_context);
  c.set("rope_scaling", scaling);
}

// transformers 4's fields (rope_theta, rope_scaling), which transformers 5 reads too.
void write_llama_family(const char* model_type, const ModelConfig& m, HfConfigWriter& c) {
  c.set("model_type", model_type);
  c.set("vocab_size", m.vocab_size);
  c.set("hidden_size", m.n_embd);
  c.set("intermediate_size", m.ffn_hidden);
  c.set("num_hidden_layers", m.n_layer);
  c.set("num_attention_heads", m.n_head);
  c.set("num_key_value_heads", m.n_kv_head);
  c.set("hidden_act", "silu");
  c.set("max_position_embeddings", m.context_length);
  c.set("rms_norm_eps", m.norm_eps);
  write_rope(m, c);
  c.set("attention_dropout", 0.0);
  c.set("tie_word_embeddings", m.tie_embeddings);
}

void write_llama_config(const ModelConfig& m, HfConfigWriter& c) {
  write_llama_family("llama", m, c);
  c.set("head_dim", m.n_embd / m.n_head);
  c.set("attention_bias", false);
  c.set("mlp_bias", false);
}

void write_qwen2_config(const ModelConfig& m, HfConfigWriter& c) {
  write_llama_family("qwen2", m, c);
  c.set("use_sliding_window", false);
  c.set_null("sliding_window");
  c.set("max_window_layers", m.n_layer);
}

void write_qwen3_attention(const char* model_type, const ModelConfig& m, HfConfigWriter& c) {
  write_llama_family(model_type, m, c);
  c.set("head_dim", head_size(m));
  c.set("attention_bias", false);
  c.set("use_sliding_window", false);
  c.set_null("sliding_window");
}

void write_qwen3_config(const ModelConfig& m, HfConfigWriter& c) { write_qwen3_attention("qwen3", m, c); }

void write_moe(const ModelConfig& m, HfConfigWriter& c) {
  c.set("num_experts_per_tok", m.moe.top_k);
  c.set("router_aux_loss_coef", m.moe.aux_loss_coef);
  c.set("output_router_logits", false);
}

void write_qwen3_moe_config(const ModelConfig& m, HfConfigWriter& c) {
  write_qwen3_attention("qwen3_moe", m, c);
  c.set("num_experts", m.moe.num_experts);
  write_moe(m, c);
  c.set("moe_intermediate_size", m.moe.expert_ffn_hidden);
  c.set("norm_topk_prob", m.moe.norm_topk_prob);
  c.set("decoder_sparse_step", m.moe.sparse_step);
  c.set_list("mlp_only_layers", m.moe.dense_layers);
}

void write_mixtral_config(const ModelConfig& m, HfConfigWriter& c) {
  write_llama_family("mixtral", m, c);
  c.set("intermediate_size", m.moe.expert_ffn_hidden);  // Mixtral's experts' width; no dense layer
  c.set("num_local_experts", m.moe.num_experts);
  write_moe(m, c);
  c.set_null("sliding_window");
}

// Stacked experts (nn/moe.hpp): fsdpp's "layers.3.mlp.experts.gate_proj.weight" holds Hugging Face's
// "model.layers.3.mlp.experts.<e>.gate_proj.weight" for every expert e (Mixtral: block_sparse_moe.experts.<e>.w1).
constexpr const char* kExperts = ".experts.";

std::string hf_expert_key_of(const std::string& fsdpp_name, int expert) {
  const std::size_t at = fsdpp_name.find(kExperts);
  if (at == std::string::npos) return "";
  const std::size_t tail = at + std::strlen(kExperts);
  return "model." + fsdpp_name.substr(0, tail) + std::to_string(expert) + "." + fsdpp_name.substr(tail);
}

std::optional<std::pair<std::string, int>> stacked_of_hf_key(const std::string& hf_key) {
  const std::size_t at = hf_key.find(kExperts);
  if (at == std::string::npos || hf_key.rfind("model.", 0) != 0) return std::nullopt;
  const std::size_t first = at + std::strlen(kExperts);
  std::size_t end = first;
  while (end < hf_key.size() && std::isdigit(static_cast<unsigned char>(hf_key[end]))) ++end;
  if (end == first || end >= hf_key.size() || hf_key[end] != '.' || end - first > 6) return std::nullopt;
  return std::make_pair(hf_key.substr(6, first - 6) + hf_key.substr(end + 1), std::stoi(hf_key.substr(first, end - first)));
}

}  // namespace

std::optional<std::string> fsdpp_name_of_hf_llama_key(const std::string& hf_key) {
  const std::string tail = ".rotary_emb.inv_freq";
  if (hf_key.size() >= tail.size() && hf_key.compare(hf_key.size() - tail.size(), tail.size(), tail) == 0)
    return std::nullopt;  // a buffer RoPE recomputes
  return hf_key.rfind("model.", 0) == 0 ? hf_key.substr(6) : hf_key;
}

std::string hf_llama_key_of(const std::string& fsdpp_name) {
  return fsdpp_name == "lm_head.weight" ? fsdpp_name : "model." + fsdpp_name;
}

const HfNaming& hf_llama_naming() {
  static const HfNaming naming{"Llama", "llama", "LlamaForCausalLM", ModelArch::llama, fsdpp_name_of_hf_llama_key,
                               hf_llama_key_of, never_transposed, false, read_llama_config, write_llama_config, nullptr, nullptr};
  return naming;
}

const HfNaming& hf_qwen2_naming() {
  static const HfNaming naming{"Qwen2", "qwen2", "Qwen2ForCausalLM", ModelArch::qwen2, fsdpp_name_of_hf_llama_key,
                               hf_llama_key_of, never_transposed, false, read_qwen2_config, write_qwen2_config, nullptr, nullptr};
  return naming;
}

const HfNaming& hf_qwen3_naming() {
  static const HfNaming naming{"Qwen3", "qwen3", "Qwen3ForCausalLM", ModelArch::qwen3, fsdpp_name_of_hf_llama_key,
                               hf_llama_key_of, never_transposed, false, read_qwen3_config, write_qwen3_config,
                               nullptr, nullptr};
  return naming;
}

const HfNaming& hf_qwen3_moe_naming() {
  static const HfNaming naming{"Qwen3-MoE", "qwen3_moe", "Qwen3MoeForCausalLM", ModelArch::qwen3_moe,
                               fsdpp_name_of_hf_llama_key, hf_llama_key_of, never_transposed, false,
                               read_qwen3_moe_config, write_qwen3_moe_config, hf_expert_key_of, stacked_of_hf_key};
  return naming;
}

const HfNaming& hf_mixtral_naming() {
  static const HfNaming naming{"Mixtral", "mixtral", "MixtralForCausalLM", ModelArch::mixtral,
                               fsdpp_name_of_hf_llama_key, hf_llama_key_of, never_transposed, false,
                               read_mixtral_config, write_mixtral_config, hf_expert_key_of, stacked_of_hf_key};
  return naming;
}

void import_hf_llama(const std::string& safetensors, const std::string& out, const ModelConfig& config) {
  // On meta: names and shapes only.
  const std::unique_ptr<LanguageModel> model = make_model(config);
  ShapeMap expected;
  for (Parameter* p : model->parameters()) expected[p->name()] = p->shape();
  import_hf(safetensors, out, expected);
}

}  // namespace fsdpp
