// The objects and attributes of a checkpoint file, as one list (save_layout.hpp), its digest and its writing.
#include "fsdpp/ckpt/save_layout.hpp"

#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/version.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <type_traits>

namespace fsdpp::ckpt_detail {
namespace {

using Slab = CheckpointSnapshot::Tensor::Slab;

FileObject group(std::string path, std::vector<FileAttribute> attributes) {
  return {std::move(path), std::nullopt, 0, 0, std::move(attributes)};
}

// /meta: what wrote the file and how it was sharded. layout_xxh64 is filled in once the rest is known.
FileObject meta_object(const CheckpointMeta& meta, int world_size, const std::string& wall_time) {
  return group("/meta", {{"format", std::string("fsdpp-checkpoint")},
                         {"mesh", meta.mesh},
                         {"strategy", meta.strategy},
                         {"param_dtype", meta.param_dtype},
                         {"reduce_dtype", meta.reduce_dtype},
                         {"format_version", kCheckpointFormatVersion},
                         {"fsdpp_version", std::string(FSDPP_VERSION), false},
                         {"world_size", std::int64_t{world_size}},
                         {"wall_time", wall_time, false},
                         {"deck", meta.deck, false},
                         {"layout_xxh64", std::uint64_t{0}, false}});
}

// A tensor's group, then one dataset per shard of its rows.
void add_tensor(std::vector<FileObject>& out, const CheckpointSnapshot::Tensor& tensor, std::size_t index,
                const std::uint64_t* checksums) {
  out.push_back(group(tensor.group, {{"global_shape", tensor.shape},
                                     {"dtype", std::string("f32")},
                                     {"shard_dim", std::int64_t{0}},
                                     {"shards", static_cast<std::int64_t>(tensor.shards.size())},
                                     {"placements", tensor.placements, false}}));
  for (std::size_t k = 0; k < tensor.shards.size(); ++k) {
    const Slab& slab = tensor.shards[k];
    out.push_back({fmt::format("{}/shard_{}", tensor.group, k), dims_with_rows(tensor.shape, slab.rows), index, k,
                   {{"offset", slab.offset}, {"rows", slab.rows}, {"checksum", checksums[k]}}});
  }
}

// /train: the step and the other scalars of training state; /optim: the optimizer's kind, steps and settings.
void add_state(std::vector<FileObject>& out, const CheckpointSnapshot& s) {
  FileObject train = group("/train", {{"step", s.progress.step}});
  for (const auto& [key, value] : s.progress.scalars)
    train.attributes.push_back({key, std::visit([](auto v) { return AttributeValue(v); }, value)});
  out.push_back(std::move(train));
  if (s.optimizer_kind.empty()) return;
  FileObject optim = group("/optim", {{"kind", s.optimizer_kind}, {"steps", s.optimizer_steps}});
  for (const auto& [name, value] : s.optimizer_hyperparameters) optim.attributes.push_back({name, value, false});
  out.push_back(std::move(optim));
}

// The digest's text of a value: what h5::numeric_attrs_as_text and the layout check read back.
void add_to_digest(LayoutDigest& digest, const std::string& object, const FileAttribute& a) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, double>) digest.add(object, a.name, fmt::format("{:.17g}", v));
        else if constexpr (std::is_same_v<T, std::uint64_t>) digest.add(object, a.name, fmt::format("{}", v));
        else digest.add(object, a.name, v);
      },
      a.value);
}

// Creates /a/b/c group by group, opening those that exist (metadata: collective in a parallel file).
h5::Handle create_groups(hid_t file, const std::string& path, const std::string& file_name) {
  std::size_t at = 1;
  h5::Handle last;
  while (at <= path.size()) {
    const std::size_t next = std::min(path.find('/', at), path.size());
    const std::string prefix = path.substr(0, next);
    last = h5::exists(file, prefix) ? h5::open_group(file, prefix, file_name) : h5::create_group(file, prefix, file_name);
    at = next + 1;
  }
  return last;
}

}  // namespace

std::vector<std::uint64_t> dims_with_rows(const std::vector<std::int64_t>& shape, std::int64_t rows) {
  std::vector<std::uint64_t> dims(shape.begin(), shape.end());
  if (dims.empty()) dims.push_back(1);
  dims[0] = static_cast<std::uint64_t>(rows);
  return dims;
}

std::vector<FileObject> checkpoint_objects(const CheckpointSnapshot& snapshot, const std::vector<std::uint64_t>& checksums,
                                           int world_size, const std::string& wall_time) {
  std::vector<FileObject> out;
  out.push_back(meta_object(snapshot.meta, world_size, wall_time));
  std::size_t first = 0;  // the tensor's first shard in `checksums`
  for (std::size_t t = 0; t < snapshot.tensors.size(); ++t) {
    FSDPP_CHECK(first + snapshot.tensors[t].shards.size() <= checksums.size(), "{} checksums for the shards of {} "
                "tensors", checksums.size(), snapshot.tensors.size());
    add_tensor(out, snapshot.tensors[t], t, checksums.data() + first);
    first += snapshot.tensors[t].shards.size();
  }
  add_state(out, snapshot);
  out.front().attributes.back().value = layout_digest(out);  // layout_xxh64, last of /meta's
  return out;
}

std::uint64_t layout_digest(const std::vector<FileObject>& objects) {
  LayoutDigest digest;
  for (const FileObject& o : objects) {
    for (const FileAttribute& a : o.attributes)
      if (a.in_digest) add_to_digest(digest, o.path, a);
    if (o.dims) digest.add(o.path, "dims", std::vector<std::int64_t>(o.dims->begin(), o.dims->end()));
  }
  return digest.value();
}

std::vector<PreparedSave::Write> write_objects(hid_t file, const std::vector<FileObject>& objects,
                                               const CheckpointSnapshot& snapshot, const std::string& path) {
  std::vector<PreparedSave::Write> writes;
  h5::Handle parent;        // the group listed last: where the shards that follow it go
  std::string parent_path;
  for (const FileObject& o : objects) {
    h5::Handle object;
    if (o.dims) {
      FSDPP_CHECK(o.path.rfind(parent_path + "/", 0) == 0, "{}: a shard listed outside its group {}", o.path, parent_path);
      object = h5::create_dataset_f32(parent, o.path.substr(parent_path.size() + 1), *o.dims, path);
    } else {
      object = create_groups(file, o.path, path);
    }
    for (const FileAttribute& a : o.attributes) std::visit([&](const auto& v) { h5::set_attr(object, a.name, v); }, a.value);
    if (!o.dims) {
      parent = std::move(object);
      parent_path = o.path;
      continue;
    }
    // Contiguous and allocated at creation: the shard's bytes have a fixed place in the file.
    const auto& mine = snapshot.tensors[o.tensor].mine;
    for (std::size_t m = 0; m < mine.size(); ++m)
      if (static_cast<std::size_t>(mine[m].shard) == o.shard && !mine[m].data.empty())
        writes.push_back({h5::file_offset(object), o.tensor, m});
  }
  return writes;
}

}  // namespace fsdpp::ckpt_detail
