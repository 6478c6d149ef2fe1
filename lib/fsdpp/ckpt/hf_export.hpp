#pragma once
// fsdpp weights out to Hugging Face: one .safetensors file, or a model folder that transformers'
// from_pretrained loads as it is (hf_folder.hpp's layout). Serial, one whole tensor in memory at a time; the
// output appears whole or not at all (runtime/staged_output.hpp).
#include "fsdpp/config/deck.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// An fsdpp checkpoint or weights file into HF safetensors (dtype F32 or BF16); the naming follows the parameter
// names in the file. Returns the model's name ("GPT-2", "Llama", "Qwen2").
const char* export_hf(const std::string& weights, const std::string& out, const std::string& dtype);

struct HfFolderExport {
  std::string dtype = "F32";                         // or BF16
  std::uint64_t max_shard_bytes = 5'000'000'000;     // transformers' default max_shard_size, "5GB"
  std::string tokenizer;  // a tokenizer file, or a folder whose tokenizer files (and token ids) are copied; "": none
};

struct HfFolderWritten {
  const char* model;               // "GPT-2", ...
  std::vector<std::string> files;  // written, in the folder
  std::int64_t tensor_bytes = 0;
};

// The weights of `model` (every name and shape checked against it), written as a model folder: config.json,
// generation_config.json, model.safetensors or shards of at most max_shard_bytes (a larger tensor gets a shard
// of its own, as in transformers) with model.safetensors.index.json, and the tokenizer's files.
HfFolderWritten export_hf_folder(const std::string& weights, const ModelConfig& model, const std::string& out_dir,
                                 const HfFolderExport& options);

// "5GB" (5 x 10^9 bytes, as transformers' max_shard_size), "500MB", "2GiB", "1000" (bytes). UsageError otherwise.
std::uint64_t parse_shard_size(const std::string& text);

// The shard file names transformers gives n shards: model-00001-of-0000n.safetensors, ...
std::string hf_shard_name(int index, int count);

// Which tensors go into which shard: in order, a new shard when the next tensor would pass max_bytes, a tensor
// larger than max_bytes alone in its own (transformers' split_torch_state_dict_into_shards).
std::vector<std::vector<std::size_t>> plan_shards(const std::vector<std::uint64_t>& tensor_bytes, std::uint64_t max_bytes);

}  // namespace fsdpp
