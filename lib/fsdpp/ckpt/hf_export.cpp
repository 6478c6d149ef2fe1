#include "fsdpp/ckpt/hf_export.hpp"

#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/hf_config.hpp"
#include "fsdpp/ckpt/hf_convert.hpp"
#include "fsdpp/ckpt/hf_folder.hpp"
#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/ckpt/safetensors.hpp"
#include "fsdpp/ckpt/tensor_entries.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/staged_output.hpp"
#include "fsdpp/nn/make_model.hpp"
#include "fsdpp/version.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>

namespace fsdpp {
namespace {

namespace fs = std::filesystem;

// An fsdpp checkpoint (sharded) or weights file (whole tensors), read whole tensor by whole tensor.
class FsdppWeights {
 public:
  explicit FsdppWeights(const std::string& path) : path_(path), file_(h5::open_file(path, MPI_COMM_NULL)) {
    const std::string format = h5::get_string(h5::open_group(file_, "/meta", path), "format", path + " /meta");
    consolidated_ = format == "fsdpp-consolidated";
    FSDPP_REQUIRE(consolidated_ || format == "fsdpp-checkpoint", "{}: not an fsdpp checkpoint or weights file", path);
    if (!consolidated_) require_sound_layout(path);  // the offsets and rows below are trusted only after this
    model_ = h5::open_group(file_, "/model", path);
    for (const std::string& name : h5::children(model_)) {
      std::vector<std::int64_t> shape;
      if (consolidated_) {
        for (auto d : h5::dataset_dims(h5::open_dataset(model_, name, path))) shape.push_back(static_cast<std::int64_t>(d));
      } else {
        shape = h5::get_ints(h5::open_group(model_, name, path), "global_shape", path + " /model/" + name);
      }
      shapes_[name] = shape;
      names_.push_back(name);
    }
  }
  const std::vector<std::string>& names() const { return names_; }
  const std::map<std::string, std::vector<std::int64_t>>& shapes() const { return shapes_; }

  std::vector<float> read(const std::string& name) const {
    const auto& shape = shapes_.at(name);
    std::int64_t row = 1;
    for (std::size_t d = 1; d < shape.size(); ++d) row *= shape[d];
    std::vector<float> whole(static_cast<std::size_t>(shape.front() * row));
    const std::string where = path_ + " /model/" + name;
    if (consolidated_) {
      h5::read_rows(h5::open_dataset(model_, name, path_), 0, static_cast<std::uint64_t>(shape.front()),
                    static_cast<std::uint64_t>(row), whole.data(), where);
      return whole;
    }
    h5::Handle g = h5::open_group(model_, name, path_);
    for (std::int64_t k = 0, shards = h5::get_int(g, "shards", where); k < shards; ++k) {
      h5::Handle ds = h5::open_dataset(g, fmt::format("shard_{}", k), path_);
      const std::int64_t offset = h5::get_int(ds, "offset", where), rows = h5::get_int(ds, "rows", where);
      h5::read_rows(ds, 0, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(row), whole.data() + offset * row,
                    where);
    }
    return whole;
  }

 private:
  std::string path_;
  h5::Handle file_, model_;
  bool consolidated_ = false;
  std::vector<std::string> names_;
  std::map<std::string, std::vector<std::int64_t>> shapes_;
};

std::uint64_t numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (const std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::map<std::string, std::string> safetensors_metadata(const std::string& source) {
  return {{"format", "pt"}, {"producer", fmt::format("fsdpp {}", FSDPP_VERSION)}, {"source", source}};
}

// The files of a tokenizer folder that transformers' AutoTokenizer reads.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
                                           "tokenizer.model",    "vocab.json",            "merges.txt",
                                           "added_tokens.json",  "chat_template.jinja",   "chat_template.json"};

// Copies the tokenizer into `dir`; returns the files written and the token ids the source folder's configs give.
std::vector<std::string> copy_tokenizer(const std::string& source, const std::string& dir, HfTokenIds& ids) {
  std::vector<std::string> copied;
  std::error_code ec;
  auto copy = [&](const fs::path& from, const std::string& name) {
    fs::copy_file(from, fs::path(dir) / name, fs::copy_options::overwrite_existing, ec);
    FSDPP_REQUIRE(!ec, "{}: cannot copy the tokenizer file to {} ({})", from.string(), dir, ec.message());
    copied.push_back(name);
  };
  if (!is_model_folder(source)) {
    FSDPP_REQUIRE(fs::is_regular_file(source, ec), "--tokenizer {}: no such file or folder", source);
    const std::string name = fs::path(source).filename().string();
    // A SentencePiece model is tokenizer.model in a Hugging Face folder, whatever its own name.
    copy(source, name.size() > 6 && name.compare(name.size() - 6, 6, ".model") == 0 ? "tokenizer.model" : name);
    return copied;
  }
  for (const char* name : kTokenizerFiles)
    if (fs::is_regular_file(fs::path(source) / name, ec)) copy(fs::path(source) / name, name);
  FSDPP_REQUIRE(!copied.empty(), "--tokenizer {}: the folder holds no tokenizer file (tokenizer.json, "
                "tokenizer.model, vocab.json, ...)", source);
  const std::string config = read_folder_file(source, kHfConfigFile, true);
  const std::string generation = read_folder_file(source, kHfGenerationConfigFile, true);
  if (!config.empty() || !generation.empty()) ids = read_hf_token_ids(config, generation, source);
  return copied;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  FSDPP_CHECK(!out.fail(), "{}: writing failed; check free disk space", path);
}

}  // namespace

std::uint64_t parse_shard_size(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::toupper(c); });
  static const std::map<std::string, std::uint64_t> scale = {
      {"", 1},         {"B", 1},          {"KB", 1000},       {"MB", 1000'000},  {"GB", 1000'000'000},
      {"TB", 1000'000'000'000}, {"KIB", 1ull << 10}, {"MIB", 1ull << 20}, {"GIB", 1ull << 30}, {"TIB", 1ull << 40}};
  const auto it = scale.find(unit);
  std::uint64_t n = 0;
  const bool ok = digits > 0 && digits <= 15 && it != scale.end() &&
                  !__builtin_mul_overflow(std::stoull(text.substr(0, digits)), it->second, &n) && n > 0;
  FSDPP_REQUIRE(ok, "--max-shard-size '{}': expected a size as transformers writes it, e.g. 5GB (5 x 10^9 bytes), "
                "500MB, 2GiB, or a number of bytes", text);
  return n;
}

std::string hf_shard_name(int index, int count) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

std::vector<std::vector<std::size_t>> plan_shards(const std::vector<std::uint64_t>& tensor_bytes, std::uint64_t max_bytes) {
  std::vector<std::vector<std::size_t>> shards;
  std::vector<std::size_t> current;
  std::uint64_t current_bytes = 0;
  for (std::size_t i = 0; i < tensor_bytes.size(); ++i) {
    if (tensor_bytes[i] > max_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + tensor_bytes[i] > max_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += tensor_bytes[i];
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

const char* export_hf(const std::string& weights, const std::string& out, const std::string& dtype) {
  FSDPP_REQUIRE(dtype == "F32" || dtype == "BF16", "export dtype '{}': expected F32 or BF16", dtype);
  const FsdppWeights in(weights);
  const HfNaming& naming = hf_naming_for(in.names());
  StagedOutput staged(out, StagedOutput::Kind::file);
  {
    SafetensorsWriter writer(staged.staging(), safetensors_metadata(weights));
    for (const std::string& name : in.names())
      for (const HfPiece& piece : hf_pieces(naming, name, in.shapes().at(name)))
        writer.declare(piece.key, piece.shape, dtype);
    for (const std::string& name : in.names()) {
      const std::vector<float> whole = in.read(name);
      for (const HfPiece& piece : hf_pieces(naming, name, in.shapes().at(name))) {
        const std::vector<float> data = hf_piece_data(naming, name, piece, whole);
        writer.write(piece.key, data.data(), data.size());
      }
    }
    writer.finish();
  }
  staged.commit();
  return naming.model;
}

HfFolderWritten export_hf_folder(const std::string& weights, const ModelConfig& model, const std::string& out_dir,
                                 const HfFolderExport& options) {
  FSDPP_REQUIRE(options.dtype == "F32" || options.dtype == "BF16", "export dtype '{}': expected F32 or BF16",
                options.dtype);
  const FsdppWeights in(weights);
  const HfNaming& naming = hf_naming_of(model.arch);
  // The file's tensors must be the model's, in the model's order (embeddings, blocks in order, head), which
  // keeps each block's tensors together in the shards as transformers' own order does.
  const auto meta_model = make_model(model);
  std::vector<std::string> names;
  std::string problems;
  for (const Parameter* p : meta_model->parameters()) {
    const auto it = in.shapes().find(p->name());
    if (it == in.shapes().end()) problems += fmt::format("\n  missing from the file: {} {}", p->name(), shape_text(p->shape()));
    else if (it->second != p->shape())
      problems += fmt::format("\n  {}: file shape {}, model {}", p->name(), shape_text(it->second), shape_text(p->shape()));
    names.push_back(p->name());
  }
  for (const std::string& name : in.names())
    if (std::find(names.begin(), names.end(), name) == names.end())
      problems += fmt::format("\n  in the file but not in the model: {}", name);
  FSDPP_REQUIRE(problems.empty(), "{} does not hold the weights of the deck's model ({}):{}\nexport a checkpoint "
                "with the deck that wrote it", weights, meta_model->describe(), problems);

  const std::uint64_t element = options.dtype == "BF16" ? 2 : 4;
  std::vector<std::uint64_t> bytes;
  for (const std::string& name : names) bytes.push_back(numel(in.shapes().at(name)) * element);
  const auto shards = plan_shards(bytes, options.max_shard_bytes);

  StagedOutput staged(out_dir, StagedOutput::Kind::folder);
  const fs::path dir(staged.staging());
  HfFolderWritten written{naming.model, {}, 0};
  HfTokenIds ids;
  if (!options.tokenizer.empty()) written.files = copy_tokenizer(options.tokenizer, dir.string(), ids);
  for (const auto& list : {ids.bos, ids.eos})
    for (const int id : list)
      FSDPP_REQUIRE(id >= 0 && id < model.vocab_size, "--tokenizer {}: its special token id {} is outside the model's "
                    "vocabulary of {} (model.vocab_size): pass the tokenizer the model was trained with",
                    options.tokenizer, id, model.vocab_size);

  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::uint64_t parameters = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? kHfWeightsFile : hf_shard_name(static_cast<int>(s),
                                                                                  static_cast<int>(shards.size()));
    SafetensorsWriter writer((dir / file).string(), safetensors_metadata(weights));
    for (const std::size_t i : shards[s])
      for (const HfPiece& piece : hf_pieces(naming, names[i], in.shapes().at(names[i]))) {
        writer.declare(piece.key, piece.shape, options.dtype);
        weight_map[piece.key] = file;
      }
    for (const std::size_t i : shards[s]) {
      const auto& shape = in.shapes().at(names[i]);
      const std::vector<float> whole = in.read(names[i]);
      for (const HfPiece& piece : hf_pieces(naming, names[i], shape)) {
        const std::vector<float> data = hf_piece_data(naming, names[i], piece, whole);
        writer.write(piece.key, data.data(), data.size());
      }
      written.tensor_bytes += static_cast<std::int64_t>(bytes[i]);
      parameters += numel(shape);
    }
    writer.finish();
    written.files.push_back(file);
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json sorted = nlohmann::ordered_json::object();  // transformers writes the map sorted
    std::map<std::string, std::string> by_key;
    for (const auto& [key, file] : weight_map.items()) by_key[key] = file.get<std::string>();
    for (const auto& [key, file] : by_key) sorted[key] = file;
    nlohmann::ordered_json index = {{"metadata", {{"total_parameters", parameters}, {"total_size", written.tensor_bytes}}},
                                    {"weight_map", sorted}};
    write_text((dir / kHfIndexFile).string(), index.dump(2) + "\n");
    written.files.push_back(kHfIndexFile);
  }
  write_text((dir / kHfConfigFile).string(), hf_config_json(model, options.dtype, ids));
  write_text((dir / kHfGenerationConfigFile).string(), hf_generation_config_json(ids));
  written.files.push_back(kHfConfigFile);
  written.files.push_back(kHfGenerationConfigFile);
  staged.commit();
  return written;
}

}  // namespace fsdpp
