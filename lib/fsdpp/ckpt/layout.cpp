#include "fsdpp/ckpt/layout.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <functional>
#include <set>

namespace fsdpp {

std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

namespace {

// Each group is visited once, whatever links lead to it: a hard link back to a parent would otherwise recurse
// until the stack runs out (found by fuzzing, tests/fuzz/regressions/ckpt_meta/).
void tensor_groups(hid_t file, const std::string& group, std::vector<std::string>& out, const std::string& path,
                   std::set<std::string>& seen) {
  h5::Handle g = h5::open_group(file, group, path);
  if (!seen.insert(h5::object_key(g)).second) return;
  if (h5::has_attr(g, "shards")) {
    out.push_back(group);
    return;
  }
  for (const std::string& child : h5::children(g))
    if (child.rfind("shard_", 0) != 0) tensor_groups(file, group + "/" + child, out, path, seen);
}

// Reads one attribute into the digest; a missing or unreadable one becomes a problem.
struct Reader {
  const std::string& path;
  LayoutDigest& digest;
  std::vector<std::string>& problems;
  bool attempt(const std::string& object, const std::function<void()>& read) {
    try {
      read();
      return true;
    } catch (const std::exception& e) {
      problems.push_back(fmt::format("{}: {}", object, e.what()));
      return false;
    }
  }
  std::int64_t integer(hid_t o, const std::string& object, const char* name, bool* ok = nullptr) {
    std::int64_t v = 0;
    const bool read = attempt(object, [&] { v = h5::get_int(o, name, path + " " + object); });
    if (read) digest.add(object, name, v);
    if (ok) *ok = read;
    return v;
  }
  std::string text(hid_t o, const std::string& object, const char* name) {
    std::string v;
    if (attempt(object, [&] { v = h5::get_string(o, name, path + " " + object); })) digest.add(object, name, v);
    return v;
  }
};

void check_tensor(hid_t file, const std::string& group, Reader& read, std::vector<std::string>& problems) {
  const std::string& path = read.path;
  h5::Handle g = h5::open_group(file, group, path);
  std::vector<std::int64_t> shape;
  bool shape_ok = read.attempt(group, [&] { shape = h5::get_ints(g, "global_shape", path + " " + group); });
  if (shape_ok) read.digest.add(group, "global_shape", shape);
  if (shape_ok && (shape.empty() || std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 0; }))) {
    problems.push_back(fmt::format("{}: global_shape {} is not a tensor shape", group, shape_text(shape)));
    shape_ok = false;
  }
  const std::string dtype = read.text(g, group, "dtype");
  if (!dtype.empty() && dtype != "f32") problems.push_back(fmt::format("{}: dtype '{}' (only f32 is written)", group, dtype));
  bool ok = true;
  const std::int64_t shard_dim = read.integer(g, group, "shard_dim", &ok);
  if (ok && shard_dim != 0) problems.push_back(fmt::format("{}: shard_dim {} (only 0 is written)", group, shard_dim));
  const std::int64_t shards = read.integer(g, group, "shards", &ok);
  if (!ok) return;
  if (shards < 1 || shards > (std::int64_t{1} << 24)) {
    problems.push_back(fmt::format("{}: shards is {}", group, shards));
    return;
  }
  // Every child named shard_<k> must be one of the `shards` the group declares, and each of those must exist.
  std::set<std::string> expected;
  for (std::int64_t k = 0; k < shards; ++k) expected.insert(fmt::format("shard_{}", k));
  for (const std::string& child : h5::children(g))
    if (!expected.count(child))
      problems.push_back(fmt::format("{}/{}: not one of the {} shards the group declares", group, child, shards));
  std::int64_t covered = 0;
  for (std::int64_t k = 0; k < shards; ++k) {
    const std::string name = fmt::format("shard_{}", k), object = group + "/" + name;
    if (!h5::exists(g, name)) {
      problems.push_back(object + ": missing (the group declares " + std::to_string(shards) + " shards)");
      covered = -1;
      continue;
    }
    h5::Handle ds;
    if (!read.attempt(object, [&] { ds = h5::open_dataset(g, name, path); })) {
      covered = -1;
      continue;
    }
    bool offset_ok = true, rows_ok = true;
    const std::int64_t offset = read.integer(ds, object, "offset", &offset_ok);
    const std::int64_t rows = read.integer(ds, object, "rows", &rows_ok);
    std::uint64_t sum = 0;
    if (read.attempt(object, [&] { sum = h5::get_uint(ds, "checksum", path + " " + object); }))
      read.digest.add(object, "checksum", fmt::format("{}", sum));
    std::vector<std::int64_t> dims;
    for (auto d : h5::dataset_dims(ds)) dims.push_back(static_cast<std::int64_t>(d));
    read.digest.add(object, "dims", dims);
    if (!offset_ok || !rows_ok) {
      covered = -1;
      continue;
    }
    if (dims.empty() || rows < 0 || dims[0] != rows)
      problems.push_back(fmt::format("{}: rows attribute says {} but the dataset holds {}", object, rows,
                                     dims.empty() ? 0 : dims[0]));
    if (shape_ok && (dims.size() != shape.size() || !std::equal(dims.begin() + 1, dims.end(), shape.begin() + 1)))
      problems.push_back(fmt::format("{}: dataset shape {} does not fit global_shape {}", object, shape_text(dims),
                                     shape_text(shape)));
    if (covered >= 0 && offset != covered)
      problems.push_back(fmt::format("{}: offset {} but the shards before it end at row {}", object, offset, covered));
    covered = covered >= 0 ? offset + rows : covered;
  }
  if (shape_ok && covered >= 0 && covered != shape[0])
    problems.push_back(fmt::format("{}: the shards cover {} of its {} rows", group, covered, shape[0]));
}

}  // namespace

void LayoutDigest::add(const std::string& object, const std::string& attribute, const std::string& value) {
  lines_[object + " " + attribute] = value;
}
void LayoutDigest::add(const std::string& object, const std::string& attribute, std::int64_t value) {
  add(object, attribute, std::to_string(value));
}
void LayoutDigest::add(const std::string& object, const std::string& attribute, const std::vector<std::int64_t>& value) {
  add(object, attribute, shape_text(value));
}

std::uint64_t LayoutDigest::value() const {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (const auto& [key, value] : lines_) {
    const std::string line = key + " " + value + "\n";
    XXH64_update(state, line.data(), line.size());
  }
  const std::uint64_t digest = XXH64_digest(state);
  XXH64_freeState(state);
  return digest;
}

std::vector<std::string> checkpoint_tensor_groups(hid_t file, const std::string& path) {
  std::set<std::string> seen;
  std::vector<std::string> out;
  for (const char* root : {"/model", "/optim"})
    if (h5::exists(file, root)) tensor_groups(file, root, out, path, seen);
  return out;
}

LayoutCheck check_checkpoint_layout(const std::string& path) {
  LayoutCheck check;
  h5::Handle file = h5::open_file(path, MPI_COMM_NULL);
  LayoutDigest digest;
  Reader read{path, digest, check.problems};
  try {
    h5::Handle meta = h5::open_group(file, "/meta", path);
    const std::string format = read.text(meta, "/meta", "format");
    if (format != "fsdpp-checkpoint") {
      check.refusal = fmt::format("not an fsdpp checkpoint (format '{}')", format);
      check.problems.push_back(check.refusal);
      return check;
    }
    check.format_version = read.integer(meta, "/meta", "format_version");
    if (check.format_version > kCheckpointFormatVersion) {
      check.refusal = fmt::format("checkpoint format_version {} is newer than this fsdpp reads ({}); load it with a "
                                  "newer fsdpp", check.format_version, kCheckpointFormatVersion);
      check.problems.push_back(check.refusal);
      return check;
    }
    read.integer(meta, "/meta", "world_size");
    for (const char* name : {"mesh", "strategy", "param_dtype", "reduce_dtype"}) read.text(meta, "/meta", name);
    h5::Handle train = h5::open_group(file, "/train", path);
    check.step = read.integer(train, "/train", "step");
    // The other scalars of training state (the sampler's position, tokens seen, ...), whatever parts saved
    // them: every numeric attribute but the step, by name.
    std::vector<std::pair<std::string, std::string>> scalars;
    read.attempt("/train", [&] { scalars = h5::numeric_attrs_as_text(train, path + " /train"); });
    for (const auto& [name, text] : scalars)
      if (name != "step") digest.add("/train", name, text);
    if (h5::exists(file, "/optim")) {
      h5::Handle optim = h5::open_group(file, "/optim", path);
      read.text(optim, "/optim", "kind");
      read.integer(optim, "/optim", "steps");
    }
    if (!h5::exists(file, "/model")) check.problems.push_back("/model: missing");
    for (const std::string& group : checkpoint_tensor_groups(file, path)) check_tensor(file, group, read, check.problems);
    check.has_digest = h5::has_attr(meta, "layout_xxh64");
    if (check.has_digest) {
      std::uint64_t stored = 0;
      if (read.attempt("/meta", [&] { stored = h5::get_uint(meta, "layout_xxh64", path + " /meta"); }) &&
          stored != digest.value())
        check.problems.push_back("/meta layout_xxh64: the metadata (shapes, offsets, rows, shard counts, dtypes, mesh, "
                                 "format version or step) was changed after the file was written");
    } else if (check.format_version >= 2) {
      check.problems.push_back("/meta: layout_xxh64 is missing (format_version 2 files carry it)");
    }
  } catch (const std::exception& e) {
    check.problems.push_back(e.what());
  }
  return check;
}

void require_sound_layout(const std::string& path) {
  const LayoutCheck check = check_checkpoint_layout(path);
  FSDPP_REQUIRE(check.refusal.empty(), "{}: {}", path, check.refusal);
  std::string listing;
  for (const auto& p : check.problems) listing += "\n  " + p;
  FSDPP_REQUIRE(listing.empty(), "{}: the checkpoint's metadata is damaged:{}\nnothing was loaded from it; load an "
                "earlier checkpoint (fsdpp ckpt verify <file> checks one)", path, listing);
}

}  // namespace fsdpp
