#include "fsdpp/ckpt/hf_convert.hpp"

#include "fsdpp/ckpt/hf_gpt2.hpp"
#include "fsdpp/ckpt/hf_llama.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/finite.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/ckpt/safetensors.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/version.hpp"

#include <fmt/format.h>

#include <climits>
#include <filesystem>
#include <map>

namespace fsdpp {
namespace {

std::string shape_text(const std::vector<std::int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

// [rows, cols] -> [cols, rows]
std::vector<float> transposed(const std::vector<float>& in, std::int64_t rows, std::int64_t cols) {
  std::vector<float> out(in.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[static_cast<std::size_t>(c * rows + r)] = in[static_cast<std::size_t>(r * cols + c)];
  return out;
}

// The HF tensors of `path`, mapped to fsdpp names (validated against `expected`), read lazily.
struct HfFile {
  const HfNaming& naming;
  SafetensorsReader reader;
  std::map<std::string, const SafetensorInfo*> by_name;
  HfFile(const std::string& path, const ShapeMap& expected, const HfNaming& naming_)
      : naming(naming_), reader(path) {
    std::string problems;
    for (const SafetensorInfo& t : reader.tensors()) {
      const auto name = naming.fsdpp_name(t.name);
      if (!name) continue;
      if (*name == "lm_head.weight" && !expected.count(*name) && naming.drops_head_when_tied) continue;
      if (*name == "lm_head.weight" && !expected.count(*name)) {
        problems += fmt::format("\n  {}: the file's model has its own LM head, the deck's shares the embedding "
                                "(set model.tie_embeddings: false)", t.name);
        continue;
      }
      const auto it = expected.find(*name);
      if (it == expected.end()) {
        problems += fmt::format("\n  {}: not a parameter of this model", t.name);
        continue;
      }
      auto shape = t.shape;
      if (naming.transposed(*name) && shape.size() == 2) std::swap(shape[0], shape[1]);
      if (shape != it->second)
        problems += fmt::format("\n  {}: file shape {} (as {}), model {}", t.name, shape_text(t.shape), shape_text(shape),
                                shape_text(it->second));
      by_name[*name] = &t;
    }
    for (const auto& [name, shape] : expected)
      if (!by_name.count(name)) problems += fmt::format("\n  missing from the file: {} ({})", naming.hf_key(name), shape_text(shape));
    FSDPP_REQUIRE(problems.empty(), "{} does not match the deck's {} model:{}", path, naming.model, problems);
  }
  // The tensor in fsdpp's layout.
  std::vector<float> read(const std::string& name) const {
    const SafetensorInfo& t = *by_name.at(name);
    std::vector<float> data = reader.read_f32(t);
    if (const auto bad = first_non_finite(data.data(), data.size()))
      throw UsageError(fmt::format("{}: tensor '{}' {}: {} weights must be finite; refusing to import or start "
                                   "from them", reader.path(), t.name, describe_non_finite(*bad, t.shape, data[*bad]),
                                   naming.model));
    if (naming.transposed(name) && t.shape.size() == 2) data = transposed(data, t.shape[0], t.shape[1]);
    return data;
  }
};

}  // namespace

const HfNaming& hf_naming_for(const std::vector<std::string>& fsdpp_names) {
  bool llama = false;
  for (const std::string& n : fsdpp_names) {
    const std::string bias = "self_attn.q_proj.bias";
    if (n.size() > bias.size() && n.compare(n.size() - bias.size(), bias.size(), bias) == 0) return hf_qwen2_naming();
    llama = llama || n == "embed_tokens.weight";
  }
  return llama ? hf_llama_naming() : hf_gpt2_naming();
}

const char* import_hf(const std::string& safetensors, const std::string& out, const ShapeMap& expected) {
  std::vector<std::string> names;
  for (const auto& [name, shape] : expected) names.push_back(name);
  const HfFile file(safetensors, expected, hf_naming_for(names));
  try {
    ConsolidatedWriter writer(out, safetensors, 0);
    for (const auto& [name, shape] : expected) writer.add(name, shape, file.read(name).data());
  } catch (const std::exception&) {
    std::error_code ec;
    std::filesystem::remove(out, ec);  // no half-written weights file for init_from to pick up
    throw;
  }
  return file.naming.model;
}

const char* export_hf(const std::string& weights, const std::string& out, const std::string& dtype) {
  FSDPP_REQUIRE(dtype == "F32" || dtype == "BF16", "export dtype '{}': expected F32 or BF16", dtype);
  h5::Handle file = h5::open_file(weights, MPI_COMM_NULL);
  const std::string format = h5::get_string(h5::open_group(file, "/meta", weights), "format", weights + " /meta");
  const bool consolidated = format == "fsdpp-consolidated";
  FSDPP_REQUIRE(consolidated || format == "fsdpp-checkpoint", "{}: not an fsdpp checkpoint or weights file", weights);
  if (!consolidated) require_sound_layout(weights);  // the offsets and rows below are trusted only after this
  h5::Handle model = h5::open_group(file, "/model", weights);
  const std::vector<std::string> names = h5::children(model);
  // Shapes first: the safetensors header precedes the data.
  std::vector<std::vector<std::int64_t>> shapes;
  for (const std::string& name : names) {
    std::vector<std::int64_t> shape;
    if (consolidated) {
      for (auto d : h5::dataset_dims(h5::open_dataset(model, name, weights))) shape.push_back(static_cast<std::int64_t>(d));
    } else {
      shape = h5::get_ints(h5::open_group(model, name, weights), "global_shape", weights + " /model/" + name);
    }
    shapes.push_back(shape);
  }
  const HfNaming& naming = hf_naming_for(names);
  SafetensorsWriter writer(out, {{"format", "pt"}, {"producer", fmt::format("fsdpp {}", FSDPP_VERSION)},
                                 {"source", weights}});
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto shape = shapes[i];
    if (naming.transposed(names[i])) std::swap(shape[0], shape[1]);
    writer.declare(naming.hf_key(names[i]), shape, dtype);
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& shape = shapes[i];
    std::int64_t row = 1;
    for (std::size_t d = 1; d < shape.size(); ++d) row *= shape[d];
    std::vector<float> whole(static_cast<std::size_t>(shape.front() * row));
    if (consolidated) {
      h5::read_rows(h5::open_dataset(model, names[i], weights), 0, static_cast<std::uint64_t>(shape.front()),
                    static_cast<std::uint64_t>(row), whole.data(), weights + " /model/" + names[i]);
    } else {
      h5::Handle g = h5::open_group(model, names[i], weights);
      for (std::int64_t k = 0, shards = h5::get_int(g, "shards", weights); k < shards; ++k) {
        h5::Handle ds = h5::open_dataset(g, fmt::format("shard_{}", k), weights);
        const std::int64_t offset = h5::get_int(ds, "offset", weights), rows = h5::get_int(ds, "rows", weights);
        h5::read_rows(ds, 0, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(row), whole.data() + offset * row,
                      weights + " /model/" + names[i]);
      }
    }
    if (naming.transposed(names[i])) whole = transposed(whole, shape[0], shape[1]);
    writer.write(naming.hf_key(names[i]), whole.data(), whole.size());
  }
  writer.finish();
  return naming.model;
}

void load_hf_safetensors(MPI_Comm comm, const std::string& path, const std::vector<Parameter*>& params) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  ShapeMap expected;
  std::vector<std::string> names;
  for (const Parameter* p : params) expected[p->name()] = p->shape(), names.push_back(p->name());
  std::unique_ptr<HfFile> file;
  root_does(comm, [&] { file = std::make_unique<HfFile>(path, expected, hf_naming_for(names)); });
  for (Parameter* p : params) {
    std::vector<float> whole(static_cast<std::size_t>(p->global_numel()));
    // Every rank hears whether rank 0's read worked before the broadcast it would otherwise wait in.
    root_does(comm, [&] { whole = file->read(p->name()); });
    broadcast_into_shard(comm, whole, *p);
  }
}

}  // namespace fsdpp
