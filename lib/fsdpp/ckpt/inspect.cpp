// fsdpp ckpt inspect / verify: read a checkpoint serially, without the model that wrote it.
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/finite.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/layout.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <set>

namespace fsdpp {
namespace {

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
  for (const std::string& group : checkpoint_tensor_groups(file, path)) {
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

std::string checkpoint_deck(const std::string& path) {
  h5::Handle file = h5::open_file(path, MPI_COMM_NULL);
  h5::Handle meta = h5::open_group(file, "/meta", path);
  const std::string format = h5::get_string(meta, "format", path + " /meta");
  FSDPP_REQUIRE(format == "fsdpp-checkpoint", "{} is an {} file, which carries no deck: pass the model's deck with "
                "--deck", path, format);
  return h5::get_string(meta, "deck", path);
}

// Every attribute is checked before it sizes anything: a shard is read only when its rows match its dataset and
// the bytes the file holds for it (fuzzing found negative, overflowing and made-up sizes read as real ones).
std::vector<std::string> verify_checkpoint(const std::string& path) {
  const LayoutCheck layout = check_checkpoint_layout(path);
  std::vector<std::string> problems = layout.problems;
  if (!layout.refusal.empty()) return problems;
  h5::Handle file = h5::open_file(path, MPI_COMM_NULL);
  for (const std::string& group : checkpoint_tensor_groups(file, path)) {
    h5::Handle g = h5::open_group(file, group, path);
    std::vector<std::int64_t> shape;
    try {
      shape = h5::get_ints(g, "global_shape", path);
    } catch (const std::exception&) {
      continue;  // already a layout problem
    }
    std::int64_t offset_rows = 0;
    for (const std::string& name : h5::children(g)) {
      if (name.rfind("shard_", 0) != 0) continue;
      const std::string object = group + "/" + name;
      h5::Handle ds = h5::open_dataset(g, name, path);
      // The data as the dataset holds it, whatever its attributes claim (their problems are listed above).
      const auto dims = h5::dataset_dims(ds);
      std::uint64_t rows = dims.empty() ? 0 : dims[0], row = 1, count = 0;
      bool sized = true;
      for (std::size_t i = 1; i < dims.size(); ++i) sized = sized && !__builtin_mul_overflow(row, dims[i], &row);
      // Made-up dimensions must not size a read: the bytes the file really stores for it must match.
      if (!sized || __builtin_mul_overflow(rows, row, &count) || count > (std::uint64_t{1} << 40) ||
          h5::storage_bytes(ds) != count * 4) {
        problems.push_back(fmt::format("{}: stores {} bytes, but its dimensions need {}", object, h5::storage_bytes(ds),
                                       sized ? fmt::format("{}", count * 4) : std::string("more than 64 bits")));
        continue;
      }
      std::vector<float> data(static_cast<std::size_t>(count));
      try {
        h5::read_rows(ds, 0, rows, row, data.data(), object);
      } catch (const std::exception& e) {
        problems.push_back(e.what());
        continue;
      }
      if (!h5::has_attr(ds, "checksum") || XXH64(data.data(), data.size() * sizeof(float), 0) != h5::get_uint(ds, "checksum", path))
        problems.push_back(object + ": checksum mismatch (corrupted bytes)");
      if (const auto bad = first_non_finite(data.data(), data.size())) {
        const std::int64_t offset = h5::has_attr(ds, "offset") ? h5::get_int(ds, "offset", path) : offset_rows;
        problems.push_back(fmt::format("{}: {}: non-finite value", object,
                                       describe_non_finite(static_cast<std::size_t>(offset) * row + *bad, shape, data[*bad])));
      }
      offset_rows += static_cast<std::int64_t>(rows);
    }
  }
  return problems;
}

}  // namespace fsdpp
