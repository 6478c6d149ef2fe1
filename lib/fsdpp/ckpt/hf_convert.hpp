#pragma once
// Hugging Face safetensors in, for any architecture whose parameter names map 1:1 onto HF keys: the mapping is
// an HfNaming (hf_gpt2.hpp, hf_llama.hpp); the rest (shape checks listing every mismatch, finiteness, one file or
// a folder's shards, init_from) is shared here. Out: hf_export.hpp.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/parameter.hpp"

#include <mpi.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

class HfConfigReader;
class HfConfigWriter;

// One architecture's Hugging Face conventions: its parameter names, and its config.json (hf_config.hpp).
struct HfNaming {
  const char* model;  // "GPT-2", "Llama", "Qwen2": for messages
  const char* model_type;    // config.json's "gpt2", "llama", "qwen2"
  const char* architecture;  // config.json's architectures: "GPT2LMHeadModel", "LlamaForCausalLM", ...
  ModelArch arch;
  std::optional<std::string> (*fsdpp_name)(const std::string& hf_key);  // nullopt: not a parameter (buffers)
  std::string (*hf_key)(const std::string& fsdpp_name);
  bool (*transposed)(const std::string& fsdpp_name);  // HF stores this 2-D weight [in, out]
  // HF's GPT-2 files always hold lm_head.weight, a copy of the tied wte: dropped for a tied model. A Llama file
  // with a head is an untied model, refused by a tied deck.
  bool drops_head_when_tied;
  // config.json -> the model (every field read, checked or refused), and back.
  void (*read_config)(HfConfigReader& config, ModelConfig& model);
  void (*write_config)(const ModelConfig& model, HfConfigWriter& config);
  // Mixture-of-experts models (nn/moe.hpp) stack the E experts' matrices of a layer in one (E, rows, cols)
  // parameter; the Hub's files hold one tensor per expert. nullptr for the dense architectures.
  //   hf_expert_key: the key of expert e's tensor, or "" when the parameter is not stacked;
  //   stacked_of_hf_key: the stacked parameter and the expert a key holds, or nullopt when it holds none.
  std::string (*hf_expert_key)(const std::string& fsdpp_name, int expert);
  std::optional<std::pair<std::string, int>> (*stacked_of_hf_key)(const std::string& hf_key);
};

// One tensor of a Hugging Face file and where its values lie in an fsdpp parameter (`offset` floats in): a whole
// parameter (transposed when the naming says so), or one expert of a stacked one.
struct HfPiece {
  std::string key;
  std::vector<std::int64_t> shape;  // as the file stores it
  std::int64_t offset = 0;
};
std::vector<HfPiece> hf_pieces(const HfNaming& naming, const std::string& fsdpp_name,
                               const std::vector<std::int64_t>& shape);
// A parameter's values (fsdpp's layout) as the piece's tensor holds them, and back.
std::vector<float> hf_piece_data(const HfNaming& naming, const std::string& fsdpp_name, const HfPiece& piece,
                                 const std::vector<float>& parameter);

// The naming of the model whose fsdpp parameter names these are (Qwen2's q_proj biases, else Llama's
// embed_tokens.weight, else GPT-2's).
const HfNaming& hf_naming_for(const std::vector<std::string>& fsdpp_names);
const HfNaming& hf_naming_of(ModelArch arch);
const HfNaming* hf_naming_of_model_type(const std::string& model_type);  // nullptr: not one fsdpp implements

using ShapeMap = std::map<std::string, std::vector<std::int64_t>>;  // fsdpp name -> shape

// A 2-D [rows, cols] tensor as [cols, rows] (the Conv1D weights HF's GPT-2 stores transposed).
std::vector<float> transposed(const std::vector<float>& in, std::int64_t rows, std::int64_t cols);

// A .safetensors file, or a model folder's weights (hf_folder.hpp: one file or an index and its shards), into
// an fsdpp weights file (whole tensors at /model/<name>, for checkpoint.init_from), every tensor checked against
// `expected`, every mismatch listed; `out` appears whole or not at all. Serial. Returns the model's name.
const char* import_hf(const std::string& source, const std::string& out, const ShapeMap& expected);

// checkpoint.init_from with a .safetensors file or a model folder: rank 0 reads and maps each tensor, every rank
// keeps its rows.
void load_hf_weights(MPI_Comm comm, const std::string& path, const std::vector<Parameter*>& params);

// A model folder's config.json describes `model` (the deck's): UsageError naming each contradiction (the deck key
// and the config field, both values). Collective: rank 0 reads.
void check_hf_folder_config(MPI_Comm comm, const std::string& folder, const ModelConfig& model);

}  // namespace fsdpp
