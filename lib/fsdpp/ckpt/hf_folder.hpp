#pragma once
// A Hugging Face model folder, as the Hub and save_pretrained lay it out:
//
//   config.json                       the model (hf_config.hpp)
//   generation_config.json            optional: generation's token ids (eos_token_id: the stop tokens)
//   model.safetensors                 the weights in one file, or
//   model.safetensors.index.json      {"weight_map": {tensor: shard file}} with the shards it names,
//   model-00001-of-0000n.safetensors  each a file of the folder
//   tokenizer.json, ...               optional: the tokenizer
//
// The folder is untrusted input: the index may name only plain file names of the folder (no '/', no '..', no
// absolute path), every shard it names must exist, every tensor must be in the shard the index says and
// nowhere else. Every problem is a UsageError naming the file, the field or tensor, and what to do.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdpp {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfGenerationConfigFile = "generation_config.json";
inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";

// Where a model's safetensors weights are: one file, or a folder's shards and the index that maps them.
struct HfWeightFiles {
  std::string what;                // the folder or the file, for messages
  bool folder = false;             // a model folder (with its config.json), not a lone file
  std::vector<std::string> files;  // paths, in order
  std::string index;               // the index's path; empty for one file
  std::map<std::string, std::string> shard_of;  // HF tensor name -> shard path (empty without an index)
};

// A directory (rather than a file): a Hugging Face model folder, for import, init_from, generate and eval.
bool is_model_folder(const std::string& path);

// The text of a file of the folder; `optional`: "" when it is absent. UsageError naming the path otherwise.
std::string read_folder_file(const std::string& folder, const std::string& name, bool optional = false);

// The folder's weights: model.safetensors when present (as transformers prefers), else the index and its
// shards, checked as the header says. A folder with only pytorch_model.bin is refused (safetensors only).
HfWeightFiles hf_weight_files(const std::string& folder);

// The weights of a single .safetensors file.
HfWeightFiles hf_weight_file(const std::string& path);

}  // namespace fsdpp
