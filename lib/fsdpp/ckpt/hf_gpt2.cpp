#include "fsdpp/ckpt/hf_gpt2.hpp"

#include "fsdpp/ckpt/hf_config.hpp"
#include "fsdpp/ckpt/hf_convert.hpp"
#include "fsdpp/runtime/error.hpp"

#include <string>

namespace fsdpp {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// GPT2Config, with transformers' defaults for absent fields.
void read_gpt2_config(HfConfigReader& c, ModelConfig& m) {
  m.arch = ModelArch::gpt2;
  c.take("vocab_size", "model.vocab_size", m.vocab_size, 50257);
  c.take("n_positions", "model.context_length", m.context_length, 1024);  // the rows of wpe
  c.take("n_embd", "model.n_embd", m.n_embd, 768);
  c.take("n_layer", "model.n_layer", m.n_layer, 12);
  c.take("n_head", "model.n_head", m.n_head, 12);
  c.take("tie_word_embeddings", "model.tie_embeddings", m.tie_embeddings, true);
  c.require("n_inner", {"null", std::to_string(4 * m.n_embd)}, "an MLP of width 4 x n_embd");
  c.require("activation_function", {"\"gelu_new\"", "\"gelu_pytorch_tanh\""}, "GELU's tanh approximation");
  c.require("layer_norm_epsilon", {"1e-05"}, "LayerNorm with eps 1e-5");
  c.require("scale_attn_weights", {"true"}, "attention scores scaled by 1/sqrt(head size)");
  c.require("scale_attn_by_inverse_layer_idx", {"false"}, "the same attention scale in every layer");
  c.require("reorder_and_upcast_attn", {"false"}, "attention as GPT-2 does");
  c.ignore("n_ctx");  // older configs' copy of n_positions, which transformers does not read
  // Dropout acts in training only, and fsdpp trains without it.
  for (const char* dropout : {"attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout"}) c.ignore(dropout);
  // The multiple-choice head of GPT2DoubleHeadsModel, not part of the language model.
  for (const char* summary : {"summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels"})
    c.ignore(summary);
}

void write_gpt2_config(const ModelConfig& m, HfConfigWriter& c) {
  c.set("model_type", "gpt2");
  c.set("vocab_size", m.vocab_size);
  c.set("n_positions", m.context_length);
  c.set("n_ctx", m.context_length);  // read by older tools (llama.cpp's converter)
  c.set("n_embd", m.n_embd);
  c.set("n_layer", m.n_layer);
  c.set("n_head", m.n_head);
  c.set_null("n_inner");
  c.set("activation_function", "gelu_new");
  c.set("layer_norm_epsilon", 1e-5);
  c.set("scale_attn_weights", true);
  c.set("scale_attn_by_inverse_layer_idx", false);
  c.set("reorder_and_upcast_attn", false);
  for (const char* dropout : {"attn_pdrop", "embd_pdrop", "resid_pdrop"}) c.set(dropout, 0.0);  // as trained
  c.set("tie_word_embeddings", m.tie_embeddings);
}

}  // namespace

std::optional<std::string> fsdpp_name_of_hf_key(const std::string& hf_key) {
  std::string name = hf_key.rfind("transformer.", 0) == 0 ? hf_key.substr(12) : hf_key;
  if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) return std::nullopt;  // mask buffers
  return name;
}

std::string hf_key_of(const std::string& fsdpp_name) {
  return fsdpp_name == "lm_head.weight" ? fsdpp_name : "transformer." + fsdpp_name;
}

bool stored_transposed_by_hf(const std::string& fsdpp_name) {
  return ends_with(fsdpp_name, "attn.c_attn.weight") || ends_with(fsdpp_name, "attn.c_proj.weight") ||
         ends_with(fsdpp_name, "mlp.c_fc.weight") || ends_with(fsdpp_name, "mlp.c_proj.weight");
}

const HfNaming& hf_gpt2_naming() {
  static const HfNaming naming{"GPT-2",          "gpt2",          "GPT2LMHeadModel", ModelArch::gpt2,
                               fsdpp_name_of_hf_key, hf_key_of, stored_transposed_by_hf, true,
                               read_gpt2_config, write_gpt2_config, nullptr, nullptr};
  return naming;
}

void import_hf_gpt2(const std::string& safetensors, const std::string& out, const ModelConfig& config) {
  Gpt model(config);  // on meta: names and shapes only
  ShapeMap expected;
  for (Parameter* p : model.parameters()) expected[p->name()] = p->shape();
  import_hf(safetensors, out, expected);
}

void export_hf_gpt2(const std::string& weights, const std::string& out, const std::string& dtype) {
  const std::string model = export_hf(weights, out, dtype);
  FSDPP_REQUIRE(model == hf_gpt2_naming().model, "{} holds {} weights, not GPT-2's: export them with fsdpp ckpt "
                "export, which follows the file", weights, model);
}

}  // namespace fsdpp
