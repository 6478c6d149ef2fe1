#include "fsdpp/ckpt/hf_gpt2.hpp"

#include "fsdpp/ckpt/hf_convert.hpp"
#include "fsdpp/runtime/error.hpp"

namespace fsdpp {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
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
  static const HfNaming naming{"GPT-2", fsdpp_name_of_hf_key, hf_key_of, stored_transposed_by_hf, true};
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
