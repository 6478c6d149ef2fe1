#include "fsdpp/ckpt/hf_convert.hpp"

#include "fsdpp/ckpt/hf_gpt2.hpp"
#include "fsdpp/ckpt/hf_llama.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/finite.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/ckpt/hf_config.hpp"
#include "fsdpp/ckpt/hf_folder.hpp"
#include "fsdpp/ckpt/safetensors.hpp"
#include "fsdpp/ckpt/tensor_entries.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/staged_output.hpp"
#include "fsdpp/version.hpp"

#include <fmt/format.h>

#include <climits>
#include <filesystem>
#include <map>

namespace fsdpp {

std::vector<float> transposed(const std::vector<float>& in, std::int64_t rows, std::int64_t cols) {
  std::vector<float> out(in.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[static_cast<std::size_t>(c * rows + r)] = in[static_cast<std::size_t>(r * cols + c)];
  return out;
}

std::vector<HfPiece> hf_pieces(const HfNaming& naming, const std::string& name, const std::vector<std::int64_t>& shape) {
  const bool stacked = naming.hf_expert_key && !naming.hf_expert_key(name, 0).empty();
  if (!stacked) {
    std::vector<std::int64_t> stored = shape;
    if (naming.transposed(name) && stored.size() == 2) std::swap(stored[0], stored[1]);
    return {HfPiece{naming.hf_key(name), stored, 0}};
  }
  FSDPP_CHECK(shape.size() == 3, "{}: a stacked expert parameter is (experts, rows, cols), not {}", name, shape_text(shape));
  std::vector<HfPiece> pieces;
  for (std::int64_t e = 0; e < shape[0]; ++e)
    pieces.push_back(HfPiece{naming.hf_expert_key(name, static_cast<int>(e)), {shape[1], shape[2]}, e * shape[1] * shape[2]});
  return pieces;
}

std::vector<float> hf_piece_data(const HfNaming& naming, const std::string& name, const HfPiece& piece,
                                 const std::vector<float>& parameter) {
  std::int64_t n = 1;
  for (const std::int64_t d : piece.shape) n *= d;
  std::vector<float> data(parameter.begin() + piece.offset, parameter.begin() + piece.offset + n);
  // The file's shape is [in, out] for a transposed weight: fsdpp's is [out, in] = [shape[1], shape[0]].
  if (naming.transposed(name) && piece.shape.size() == 2) data = transposed(data, piece.shape[1], piece.shape[0]);
  return data;
}

namespace {

// A safetensors file's tensors, or a model folder's shards', mapped to fsdpp names and checked against
// `expected` (every problem listed at once), read lazily. A stacked expert parameter is made of one tensor per
// expert (HfNaming::stacked_of_hf_key), each checked against one expert's block of it.
struct HfWeights {
  const HfNaming& naming;
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  struct Tensor {
    const SafetensorsReader* reader;
    const SafetensorInfo* info;
  };
  std::map<std::string, std::vector<Tensor>> by_name;  // fsdpp name -> where its tensor is (stacked: one per expert)

  HfWeights(const HfWeightFiles& files, const ShapeMap& expected, const HfNaming& naming_) : naming(naming_) {
    std::string problems;
    std::map<std::string, std::string> seen_in;  // HF name -> the file holding it
    for (const std::string& path : files.files) readers.push_back(std::make_unique<SafetensorsReader>(path));
    for (const auto& reader : readers)
      for (const SafetensorInfo& t : reader->tensors()) {
        if (!files.index.empty()) {
          const auto listed = files.shard_of.find(t.name);
          if (listed == files.shard_of.end()) {
            problems += fmt::format("\n  {}: holds '{}', which the index does not list", reader->path(), t.name);
            continue;
          }
          if (listed->second != reader->path()) continue;  // reported below as missing from its own shard
        }
        if (const auto [at, fresh] = seen_in.emplace(t.name, reader->path()); !fresh) {
          problems += fmt::format("\n  '{}' is in both {} and {}", t.name, at->second, reader->path());
          continue;
        }
        check(*reader, t, expected, problems);
      }
    for (const auto& [tensor, shard] : files.shard_of)
      if (!seen_in.count(tensor))
        problems += fmt::format("\n  {}: the index places '{}' in {}, which does not hold it", files.index, tensor, shard);
    for (const auto& [name, shape] : expected) {
      const auto found = by_name.find(name);
      const std::vector<HfPiece> pieces = hf_pieces(naming, name, shape);
      for (std::size_t i = 0; i < pieces.size(); ++i)
        if (found == by_name.end() || !found->second[i].info)
          problems += fmt::format("\n  missing from {}: {} ({})", files.what, pieces[i].key, shape_text(pieces[i].shape));
    }
    FSDPP_REQUIRE(problems.empty(), "{} does not match the {} model it should hold:{}{}", files.what, naming.model,
                  problems, !files.folder ? ""
                                : fmt::format("\n{}/config.json and the weights beside it must describe one model",
                                              files.what));
  }

  // The tensor in fsdpp's layout (a stacked one: its experts' tensors one after another).
  std::vector<float> read(const std::string& name) const {
    std::vector<float> whole;
    for (const Tensor& where : by_name.at(name)) {
      const SafetensorInfo& t = *where.info;
      std::vector<float> data = where.reader->read_f32(t);
      if (const auto bad = first_non_finite(data.data(), data.size()))
        throw UsageError(fmt::format("{}: tensor '{}' {}: {} weights must be finite; refusing to import or start "
                                     "from them", where.reader->path(), t.name,
                                     describe_non_finite(*bad, t.shape, data[*bad]), naming.model));
      if (naming.transposed(name) && t.shape.size() == 2) data = transposed(data, t.shape[0], t.shape[1]);
      whole.insert(whole.end(), data.begin(), data.end());
    }
    return whole;
  }

 private:
  void check(const SafetensorsReader& reader, const SafetensorInfo& t, const ShapeMap& expected, std::string& problems) {
    std::optional<std::string> name;
    int expert = -1;
    if (naming.stacked_of_hf_key) {
      if (const auto stacked = naming.stacked_of_hf_key(t.name)) name = stacked->first, expert = stacked->second;
    }
    if (!name) name = naming.fsdpp_name(t.name);
    if (!name) return;
    if (*name == "lm_head.weight" && !expected.count(*name) && naming.drops_head_when_tied) return;
    if (*name == "lm_head.weight" && !expected.count(*name)) {
      problems += fmt::format("\n  {}: the file's model has its own LM head, the deck's shares the embedding "
                              "(set model.tie_embeddings: false)", t.name);
      return;
    }
    const auto it = expected.find(*name);
    if (it == expected.end()) {
      problems += fmt::format("\n  {}: not a parameter of this model", t.name);
      return;
    }
    const std::vector<HfPiece> pieces = hf_pieces(naming, *name, it->second);
    const bool stacked = naming.hf_expert_key && !naming.hf_expert_key(*name, 0).empty();
    const std::size_t index = expert < 0 ? 0 : static_cast<std::size_t>(expert);
    if (stacked != (expert >= 0) || index >= pieces.size()) {
      problems += stacked ? fmt::format("\n  {}: the model holds its {} experts one tensor each ({} ...)", t.name,
                                        pieces.size(), pieces.front().key)
                          : fmt::format("\n  {}: not a parameter of this model (expert {} of {}, which has {})", t.name,
                                        expert, *name, pieces.size());
      return;
    }
    if (stacked && t.shape != pieces[index].shape)
      problems += fmt::format("\n  {}: file shape {}, the model's experts {} (stacked in {} {})", t.name,
                              shape_text(t.shape), shape_text(pieces[index].shape), *name, shape_text(it->second));
    auto shape = t.shape;  // in fsdpp's layout
    if (naming.transposed(*name) && shape.size() == 2) std::swap(shape[0], shape[1]);
    if (!stacked && shape != it->second)
      problems += fmt::format("\n  {}: file shape {} (as {}), model {}", t.name, shape_text(t.shape), shape_text(shape),
                              shape_text(it->second));
    std::vector<Tensor>& slots = by_name[*name];
    slots.resize(pieces.size(), Tensor{nullptr, nullptr});
    slots[index] = {&reader, &t};
  }
};

HfWeightFiles weight_files_of(const std::string& path) {
  return is_model_folder(path) ? hf_weight_files(path) : hf_weight_file(path);
}

}  // namespace

const HfNaming& hf_naming_for(const std::vector<std::string>& fsdpp_names) {
  bool llama = false, qk_norm = false, mixtral = false, qwen3_moe = false;
  const auto ends_with = [](const std::string& n, const std::string& tail) {
    return n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (const std::string& n : fsdpp_names) {
    if (ends_with(n, "self_attn.q_proj.bias")) return hf_qwen2_naming();
    llama = llama || n == "embed_tokens.weight";
    qk_norm = qk_norm || ends_with(n, "self_attn.q_norm.weight");
    mixtral = mixtral || ends_with(n, "block_sparse_moe.gate.weight");
    qwen3_moe = qwen3_moe || ends_with(n, "mlp.gate.weight");
  }
  if (mixtral) return hf_mixtral_naming();
  if (qwen3_moe) return hf_qwen3_moe_naming();
  if (qk_norm) return hf_qwen3_naming();
  return llama ? hf_llama_naming() : hf_gpt2_naming();
}

const HfNaming& hf_naming_of(ModelArch arch) {
  switch (arch) {
    case ModelArch::gpt2: return hf_gpt2_naming();
    case ModelArch::llama: return hf_llama_naming();
    case ModelArch::qwen2: return hf_qwen2_naming();
    case ModelArch::qwen3: return hf_qwen3_naming();
    case ModelArch::qwen3_moe: return hf_qwen3_moe_naming();
    case ModelArch::mixtral: return hf_mixtral_naming();
  }
  throw Error("hf_naming_of: unknown architecture");
}

const HfNaming* hf_naming_of_model_type(const std::string& model_type) {
  for (const HfNaming* n : {&hf_gpt2_naming(), &hf_llama_naming(), &hf_qwen2_naming(), &hf_qwen3_naming(),
                            &hf_qwen3_moe_naming(), &hf_mixtral_naming()})
    if (model_type == n->model_type) return n;
  return nullptr;
}

const char* import_hf(const std::string& source, const std::string& out, const ShapeMap& expected) {
  std::vector<std::string> names;
  for (const auto& [name, shape] : expected) names.push_back(name);
  const HfWeights weights(weight_files_of(source), expected, hf_naming_for(names));
  StagedOutput staged(out, StagedOutput::Kind::file);  // no half-written weights file for init_from to pick up
  {
    ConsolidatedWriter writer(staged.staging(), source, 0);
    for (const auto& [name, shape] : expected) writer.add(name, shape, weights.read(name).data());
  }
  staged.commit();
  return weights.naming.model;
}

void load_hf_weights(MPI_Comm comm, const std::string& path, const std::vector<Parameter*>& params) {
  ShapeMap expected;
  std::vector<std::string> names;
  for (const Parameter* p : params) expected[p->name()] = p->shape(), names.push_back(p->name());
  std::unique_ptr<HfWeights> weights;
  root_does(comm, [&] { weights = std::make_unique<HfWeights>(weight_files_of(path), expected, hf_naming_for(names)); });
  for (Parameter* p : params) {
    std::vector<float> whole(static_cast<std::size_t>(p->global_numel()));
    // Every rank hears whether rank 0's read worked before the broadcast it would otherwise wait in.
    root_does(comm, [&] { whole = weights->read(p->name()); });
    broadcast_into_shard(comm, whole, *p);
  }
}

void check_hf_folder_config(MPI_Comm comm, const std::string& folder, const ModelConfig& model) {
  root_does(comm, [&] {
    const std::string where = folder + "/" + kHfConfigFile;
    const std::vector<std::string> conflicts = model_conflicts(model, read_hf_model_config(read_folder_file(folder, kHfConfigFile), where));
    FSDPP_REQUIRE(conflicts.empty(), "{} describes another model than the deck's:\n  {}\nthe folder's weights are "
                  "that model's: give the deck model.from_hf: {} instead of those keys, or start from weights of the "
                  "deck's model", where, fmt::join(conflicts, "\n  "), folder);
  });
}

}  // namespace fsdpp
