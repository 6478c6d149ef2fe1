#pragma once
// Internal to lib/fsdpp/ckpt (checkpoint.cpp): what a save writes, as one list. Every group and shard dataset
// of the file with its attributes, in the order they are created, each attribute marked whether the layout
// digest covers it (layout.hpp: what says where data goes or how to read it). The same list feeds the
// attribute writes and the digest, so the two cannot disagree; the reader (check_checkpoint_layout) recomputes
// the digest from the file.
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/h5.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace fsdpp::ckpt_detail {

using AttributeValue = std::variant<std::string, std::int64_t, std::uint64_t, double, std::vector<std::int64_t>>;

struct FileAttribute {
  std::string name;
  AttributeValue value;
  bool in_digest = true;  // false: informative (versions, wall time, the deck, placements, hyperparameters)
};

// A group, or a shard: an f32 dataset of `dims` inside the group listed last before it.
struct FileObject {
  std::string path;                                   // "/meta", "/model/wte.weight", "/model/wte.weight/shard_0"
  std::optional<std::vector<std::uint64_t>> dims;     // set for a shard dataset
  std::size_t tensor = 0, shard = 0;                  // a shard: snapshot.tensors[tensor].shards[shard]
  std::vector<FileAttribute> attributes;              // in the order they are written
};

// A shard dataset's dims: the tensor's shape with `rows` rows (a scalar is one row).
std::vector<std::uint64_t> dims_with_rows(const std::vector<std::int64_t>& shape, std::int64_t rows);

// Everything a save of `snapshot` by `world_size` ranks writes, but the bytes of the shards: /meta (with
// layout_xxh64 filled in from the rest), every tensor group and shard, /train, /optim. `checksums` holds each
// shard's in snapshot order (tensor by tensor, shard by shard). Pure: every rank computes the same list.
std::vector<FileObject> checkpoint_objects(const CheckpointSnapshot& snapshot, const std::vector<std::uint64_t>& checksums,
                                           int world_size, const std::string& wall_time);

// The layout digest of the list: the attributes marked in_digest and each shard's dims.
std::uint64_t layout_digest(const std::vector<FileObject>& objects);

// Creates every object of the list in an open (parallel) file and writes its attributes: collective. Returns,
// for each shard this rank writes, where its bytes go (PreparedSave::writes).
std::vector<PreparedSave::Write> write_objects(hid_t file, const std::vector<FileObject>& objects,
                                               const CheckpointSnapshot& snapshot, const std::string& path);

}  // namespace fsdpp::ckpt_detail
