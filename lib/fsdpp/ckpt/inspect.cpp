// fsdpp ckpt inspect / verify: read a checkpoint serially, without the model that wrote it.
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/h5.hpp"

#include <fmt/format.h>
#include <xxhash.h>

namespace fsdpp {
namespace {

// Every tensor group under /model and /optim: the groups that carry a "shards" attribute.
void tensor_groups(hid_t file, const std::string& path, std::vector<std::string>& out, const std::string& name) {
  h5::Handle g = h5::open_group(file, path, name);
  if (h5::has_attr(g, "shards")) {
    out.push_back(path);
    return;
  }
  for (const std::string& child : h5::children(g))
    if (child.rfind("shard_", 0) != 0) tensor_groups(file, path + "/" + child, out, name);
}

std::vector<std::string> all_tensor_groups(hid_t file, const std::string& name) {
  std::vector<std::string> out;
  for (const char* root : {"/model", "/optim"})
    if (h5::exists(file, root)) tensor_groups(file, root, out, name);
  return out;
}

}  // namespace

std::string inspect_checkpoint(const std::string& path) {
  h5::Handle file = h5::open_file(path, MPI_COMM_NULL);
  h5::Handle meta = h5::open_group(file, "/meta", path);
  h5::Handle train = h5::open_group(file, "/train", path);
  std::string out = fmt::format("checkpoint {}\n", path);
  out += fmt::format("  format {} v{}, written by fsdpp {} at {}\n", h5::get_string(meta, "format", path),
                     h5::get_int(meta, "format_version", path), h5::get_string(meta, "fsdpp_version", path),
                     h5::get_string(meta, "wall_time", path));
  out += fmt::format("  world size {}, mesh {}, strategy {}, param_dtype {}, reduce_dtype {}\n",
                     h5::get_int(meta, "world_size", path), h5::get_string(meta, "mesh", path),
                     h5::get_string(meta, "strategy", path), h5::get_string(meta, "param_dtype", path),
                     h5::get_string(meta, "reduce_dtype", path));
  out += fmt::format("  step {}, tokens seen {}, lr {:.4g}\n", h5::get_int(train, "step", path),
                     h5::get_int(train, "tokens_seen", path), h5::get_double(train, "lr", path));
  std::int64_t total = 0;
  out += fmt::format("  {:<44} {:>16} {:>7} {:>12}\n", "tensor", "shape", "shards", "bytes");
  for (const std::string& group : all_tensor_groups(file, path)) {
    h5::Handle g = h5::open_group(file, group, path);
    const auto shape = h5::get_ints(g, "global_shape", path);
    std::int64_t numel = 1;
    std::string text = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) {
      numel *= shape[i];
      text += fmt::format("{}{}", i ? "," : "", shape[i]);
    }
    total += numel * 4;
    out += fmt::format("  {:<44} {:>16} {:>7} {:>12}\n", group, text + "]", h5::get_int(g, "shards", path), numel * 4);
  }
  out += fmt::format("  total {} bytes ({:.2f} MiB)\n", total, total / 1048576.0);
  out += "---- deck ----\n" + h5::get_string(meta, "deck", path);
  return out;
}

std::vector<std::string> verify_checkpoint(const std::string& path) {
  std::vector<std::string> problems;
  h5::Handle file = h5::open_file(path, MPI_COMM_NULL);
  for (const std::string& group : all_tensor_groups(file, path)) {
    h5::Handle g = h5::open_group(file, group, path);
    const auto shape = h5::get_ints(g, "global_shape", path);
    std::int64_t row = 1, covered = 0;
    for (std::size_t i = 1; i < shape.size(); ++i) row *= shape[i];
    const std::int64_t shards = h5::get_int(g, "shards", path);
    for (std::int64_t k = 0; k < shards; ++k) {
      const std::string object = fmt::format("{}/shard_{}", group, k);
      if (!h5::exists(g, fmt::format("shard_{}", k))) {
        problems.push_back(object + ": missing");
        continue;
      }
      h5::Handle ds = h5::open_dataset(g, fmt::format("shard_{}", k), path);
      const std::int64_t rows = h5::get_int(ds, "rows", path), offset = h5::get_int(ds, "offset", path);
      const auto dims = h5::dataset_dims(ds);
      if (dims.empty() || static_cast<std::int64_t>(dims[0]) != rows || offset != covered)
        problems.push_back(fmt::format("{}: holds {} rows at offset {}, expected {} at {}", object,
                                       dims.empty() ? 0 : dims[0], offset, rows, covered));
      covered = offset + rows;
      std::vector<float> data(static_cast<std::size_t>(rows * row));
      try {
        h5::read_rows(ds, 0, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(row), data.data(), object);
      } catch (const std::exception& e) {
        problems.push_back(e.what());
        continue;
      }
      if (XXH64(data.data(), data.size() * sizeof(float), 0) != h5::get_uint(ds, "checksum", path))
        problems.push_back(object + ": checksum mismatch (corrupted bytes)");
    }
    if (covered != shape.front()) problems.push_back(fmt::format("{}: shards cover {} of {} rows", group, covered, shape.front()));
  }
  return problems;
}

}  // namespace fsdpp
