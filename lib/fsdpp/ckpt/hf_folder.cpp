#include "fsdpp/ckpt/hf_folder.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace fsdpp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool is_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);  // follows symlinks: the Hub's cache links its snapshots to blobs
}

// A name the index may give a shard: a file of the folder itself.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

bool is_model_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

std::string read_folder_file(const std::string& folder, const std::string& name, bool optional) {
  const std::string path = (fs::path(folder) / name).string();
  if (optional && !fs::exists(path)) return "";
  std::ifstream in(path, std::ios::binary);
  FSDPP_REQUIRE(in.good(), "{}: cannot read the model folder's {} ({}); a Hugging Face model folder holds config.json "
                "and its weights", path, name, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

HfWeightFiles hf_weight_file(const std::string& path) {
  HfWeightFiles w;
  w.what = path;
  w.files.push_back(path);
  return w;
}

HfWeightFiles hf_weight_files(const std::string& folder) {
  FSDPP_REQUIRE(is_model_folder(folder), "{}: not a folder; a Hugging Face model folder holds config.json and its "
                "weights", folder);
  const fs::path dir(folder);
  HfWeightFiles w;
  w.what = folder;
  w.folder = true;
  if (is_file((dir / kHfWeightsFile).string())) {
    w.files.push_back((dir / kHfWeightsFile).string());
    return w;
  }
  w.index = (dir / kHfIndexFile).string();
  if (!is_file(w.index)) {
    const bool pickles = is_file((dir / "pytorch_model.bin").string()) ||
                         is_file((dir / "pytorch_model.bin.index.json").string());
    throw UsageError(pickles ? fmt::format("{}: the weights are PyTorch pickles (pytorch_model.bin); fsdpp reads "
                                           "safetensors only: save the model with save_pretrained(..., "
                                           "safe_serialization=True), or download its .safetensors files", folder)
                             : fmt::format("{}: no weights: expected {} or {} with the shards it names", folder,
                                           kHfWeightsFile, kHfIndexFile));
  }
  json index;
  try {
    index = json::parse(read_folder_file(folder, kHfIndexFile));
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{}: not valid JSON ({}); the index is {{\"weight_map\": {{tensor: shard file}}}}",
                                 w.index, e.what()));
  }
  FSDPP_REQUIRE(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
                "{}: no \"weight_map\" object; the index is {{\"weight_map\": {{tensor: shard file}}}}", w.index);
  std::map<std::string, std::vector<std::string>> tensors_of;  // shard name -> its tensors, for messages
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    FSDPP_REQUIRE(shard.is_string(), "{}: weight_map['{}'] is {}; expected the file name of a shard", w.index, tensor,
                  shard.dump());
    const std::string name = shard.get<std::string>();
    FSDPP_REQUIRE(plain_file_name(name), "{}: weight_map['{}'] is '{}', which is not a file of the model folder: the "
                  "index may name only files beside it (e.g. model-00001-of-00002.safetensors); refusing to read "
                  "outside {}", w.index, tensor, name, folder);
    w.shard_of[tensor] = (dir / name).string();
    tensors_of[name].push_back(tensor);
  }
  FSDPP_REQUIRE(!w.shard_of.empty(), "{}: weight_map is empty; the index names no tensor", w.index);
  for (const auto& [name, tensors] : tensors_of) {
    const std::string path = (dir / name).string();
    FSDPP_REQUIRE(is_file(path), "{}: names shard '{}' (holding '{}'{}), but {} does not exist: the folder is "
                  "incomplete; download the missing shard", w.index, name, tensors.front(),
                  tensors.size() > 1 ? fmt::format(" and {} more", tensors.size() - 1) : "", path);
    w.files.push_back(path);
  }
  return w;
}

}  // namespace fsdpp
