#pragma once
// Hugging Face safetensors in and out, for any architecture whose parameter names map 1:1 onto HF keys: the
// mapping is an HfNaming (hf_gpt2.hpp, hf_llama.hpp); the rest (shape checks listing every mismatch, finiteness,
// F32/BF16 export, init_from a .safetensors file) is shared here.
#include "fsdpp/nn/parameter.hpp"

#include <mpi.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

struct HfNaming {
  const char* model;  // "GPT-2", "Llama", "Qwen2": for messages
  std::optional<std::string> (*fsdpp_name)(const std::string& hf_key);  // nullopt: not a parameter (buffers)
  std::string (*hf_key)(const std::string& fsdpp_name);
  bool (*transposed)(const std::string& fsdpp_name);  // HF stores this 2-D weight [in, out]
  // HF's GPT-2 files always hold lm_head.weight, a copy of the tied wte: dropped for a tied model. A Llama file
  // with a head is an untied model, refused by a tied deck.
  bool drops_head_when_tied;
};

// The naming of the model whose fsdpp parameter names these are (Qwen2's q_proj biases, else Llama's
// embed_tokens.weight, else GPT-2's).
const HfNaming& hf_naming_for(const std::vector<std::string>& fsdpp_names);

using ShapeMap = std::map<std::string, std::vector<std::int64_t>>;  // fsdpp name -> shape

// A safetensors file into an fsdpp weights file (whole tensors at /model/<name>, for checkpoint.init_from),
// every tensor checked against `expected`, every mismatch listed. Serial. Returns the model's name.
const char* import_hf(const std::string& safetensors, const std::string& out, const ShapeMap& expected);

// An fsdpp checkpoint or weights file into HF safetensors (dtype F32 or BF16), one tensor at a time; the naming
// follows the parameter names in the file. Serial. Returns the model's name ("GPT-2", "Llama").
const char* export_hf(const std::string& weights, const std::string& out, const std::string& dtype);

// checkpoint.init_from with a .safetensors file: rank 0 reads and maps each tensor, every rank keeps its rows.
void load_hf_safetensors(MPI_Comm comm, const std::string& path, const std::vector<Parameter*>& params);

}  // namespace fsdpp
