// fsdpp ckpt inspect / verify: read a checkpoint serially, without the model that wrote it.
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/h5.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <set>

namespace fsdpp {
namespace {

// Every tensor group under /model and /optim: the groups that carry a "shards" attribute. Each group is visited
// once, whatever links lead to it: a hard link back to a parent would otherwise recurse until the stack runs out
// (found by fuzzing, tests/fuzz/regressions/ckpt_meta/).
void tensor_groups(hid_t file, const std::string& path, std::vector<std::string>& out, const std::string& name,
                   std::set<std::string>& seen) {
  h5::Handle g = h5::open_group(file, path, name);
  if (!seen.insert(h5::object_key(g)).second) return;
  if (h5::has_attr(g, "shards")) {
    out.push_back(path);
    return;
  }
  for (const std::string& child : h5::children(g))
    if (child.rfind("shard_", 0) != 0) tensor_groups(file, path + "/" + child, out, name, seen);
}

// A saved global_shape is usable when it has a dimension, none negative, and its byte size fits 64 bits; `numel`
// and `row` (elements per dim-0 row) are then set. A corrupt file must give a report, not an overflow.
bool valid_shape(const std::vector<std::int64_t>& shape, std::int64_t& numel, std::int64_t& row) {
  if (shape.empty()) return false;
  numel = 1;
  row = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || __builtin_mul_overflow(numel, shape[i], &numel)) return false;
    if (i > 0 && __builtin_mul_overflow(row, shape[i], &row)) return false;  // [0, huge, huge]: numel 0, row not
  }
  std::int64_t bytes = 0;
  return !__builtin_mul_overflow(numel, std::int64_t{4}, &bytes);
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += fmt::format("{}{}", i ? "," : "", shape[i]);
  return text + "]";
}

std::vector<std::string> all_tensor_groups(hid_t file, const std::string& name) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const char* root : {"/model", "/optim"})
    if (h5::exists(file, root)) tensor_groups(file, root, out, name, seen);
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
    std::int64_t numel = 0, row = 0;
    const bool valid = valid_shape(shape, numel, row);
    if (valid && __builtin_add_overflow(total, numel * 4, &total)) total = -1;
    out += fmt::format("  {:<44} {:>16} {:>7} {:>12}\n", group, shape_text(shape), h5::get_int(g, "shards", path),
                       valid ? fmt::format("{}", numel * 4) : std::string("invalid"));
  }
  out += fmt::format("  total {} bytes ({:.2f} MiB)\n", total, total / 1048576.0);
  out += "---- deck ----\n" + h5::get_string(meta, "deck", path);
  return out;
}

// Every attribute is checked before it sizes anything: a shard is read only when its rows match its dataset and
// the bytes the file holds for it (fuzzing found negative, overflowing and made-up sizes read as real ones).
std::vector<std::string> verify_checkpoint(const std::string& path) {
  std::vector<std::string> problems;
  h5::Handle file = h5::open_file(path, MPI_COMM_NULL);
  for (const std::string& group : all_tensor_groups(file, path)) {
    h5::Handle g = h5::open_group(file, group, path);
    const auto shape = h5::get_ints(g, "global_shape", path);
    std::int64_t numel = 0, row = 0, covered = 0;
    if (!valid_shape(shape, numel, row)) {
      problems.push_back(fmt::format("{}: invalid global_shape {}", group, shape_text(shape)));
      continue;
    }
    const std::int64_t shards = h5::get_int(g, "shards", path);
    const std::size_t links = h5::children(g).size();
    if (shards < 1 || static_cast<std::uint64_t>(shards) > links) {
      problems.push_back(fmt::format("{}: {} shards, but the group holds {} objects", group, shards, links));
      continue;
    }
    for (std::int64_t k = 0; k < shards; ++k) {
      const std::string object = fmt::format("{}/shard_{}", group, k);
      if (!h5::exists(g, fmt::format("shard_{}", k))) {
        problems.push_back(object + ": missing");
        continue;
      }
      h5::Handle ds = h5::open_dataset(g, fmt::format("shard_{}", k), path);
      const std::int64_t rows = h5::get_int(ds, "rows", path), offset = h5::get_int(ds, "offset", path);
      const auto dims = h5::dataset_dims(ds);
      const bool fits = !dims.empty() && rows >= 0 && static_cast<std::uint64_t>(rows) == dims[0];
      if (!fits || offset != covered)
        problems.push_back(fmt::format("{}: holds {} rows at offset {}, expected {} at {}", object,
                                       dims.empty() ? 0 : dims[0], offset, rows, covered));
      if (__builtin_add_overflow(offset, rows, &covered)) covered = -1;
      if (!fits) continue;
      std::int64_t count = 0;
      if (__builtin_mul_overflow(rows, row, &count) || count > numel ||
          h5::storage_bytes(ds) != static_cast<std::uint64_t>(count) * 4) {
        problems.push_back(fmt::format("{}: stores {} bytes, but {} rows of {} need {}", object, h5::storage_bytes(ds),
                                       rows, shape_text(shape), count > numel ? std::string("more than the tensor")
                                                                              : fmt::format("{}", count * 4)));
        continue;
      }
      std::vector<float> data(static_cast<std::size_t>(count));
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
