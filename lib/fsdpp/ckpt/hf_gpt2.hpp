#pragma once
// Hugging Face GPT-2 weights in and out, through safetensors. HF names carry an optional "transformer." prefix,
// and its Conv1D layers (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj weights) store [in, out] where fsdpp
// stores [out, in]: those are transposed both ways. HF's lm_head.weight is the tied wte and is dropped when
// embeddings are tied; the attention-mask buffers (attn.bias, attn.masked_bias) of older files are ignored.
#include "fsdpp/ckpt/hf_convert.hpp"
#include "fsdpp/ckpt/hf_export.hpp"
#include "fsdpp/nn/gpt.hpp"

#include <mpi.h>

#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

// The fsdpp parameter name of an HF key; nullopt for keys that are not parameters (mask buffers).
std::optional<std::string> fsdpp_name_of_hf_key(const std::string& hf_key);
std::string hf_key_of(const std::string& fsdpp_name);        // "transformer.h.0.attn.c_attn.weight"
bool stored_transposed_by_hf(const std::string& fsdpp_name);  // a Conv1D weight

// `fsdpp ckpt import`: a GPT-2 safetensors file into an fsdpp weights file (whole tensors at /model/<name>,
// load it with checkpoint.init_from). Validates every shape against `config`, listing every mismatch. Serial.
void import_hf_gpt2(const std::string& safetensors, const std::string& out, const ModelConfig& config);

// `fsdpp ckpt export` (export_hf): an fsdpp checkpoint or weights file into HF GPT-2 safetensors (dtype F32 or BF16), one
// tensor at a time. Serial.
void export_hf_gpt2(const std::string& weights, const std::string& out, const std::string& dtype);

struct HfNaming;
const HfNaming& hf_gpt2_naming();  // the three functions above, for hf_convert.hpp

}  // namespace fsdpp
