#include "fsdpp/ckpt/hf_llama.hpp"

namespace fsdpp {
namespace {

bool never_transposed(const std::string&) { return false; }

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
  static const HfNaming naming{"Llama", fsdpp_name_of_hf_llama_key, hf_llama_key_of, never_transposed, false};
  return naming;
}

const HfNaming& hf_qwen2_naming() {
  static const HfNaming naming{"Qwen2", fsdpp_name_of_hf_llama_key, hf_llama_key_of, never_transposed, false};
  return naming;
}

void import_hf_llama(const std::string& safetensors, const std::string& out, const ModelConfig& config) {
  // On meta: names and shapes only.
  const std::unique_ptr<CausalLM> model = config.arch == ModelArch::qwen2 ? std::unique_ptr<CausalLM>(new Qwen2(config))
                                                                          : std::unique_ptr<CausalLM>(new Llama(config));
  ShapeMap expected;
  for (Parameter* p : model->parameters()) expected[p->name()] = p->shape();
  import_hf(safetensors, out, expected);
}

}  // namespace fsdpp
