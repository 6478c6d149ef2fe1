#pragma once
// The layout of a checkpoint file, checked before anything trusts it. Every attribute that says where data
// goes or how to read it (format, format_version, world size, mesh, dtypes, each tensor's global_shape, dtype,
// shard_dim and shard count, each shard's offset, rows, dims and checksum, the /train and /optim counters) is
// one line "<object> <attribute> <value>"; the lines, sorted, are hashed with XXH64 into /meta's layout_xxh64.
// The writer computes the digest from what it writes, the reader recomputes it from what it reads: an edited
// offset, rows or shard count is a digest mismatch, and a file that does not add up (rows that do not match
// the dataset, shards that leave gaps, missing shards) is reported even without one.
//
// Files of format_version 1 carry no digest: they still load, after the structural checks (a damaged v1 file
// whose numbers still add up cannot be told from a sound one). Any file that has a digest is checked against it.
#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdpp {

// How a tensor shape is written in every checkpoint message and in `fsdpp ckpt inspect`: "[768,3072]".
std::string shape_text(const std::vector<std::int64_t>& shape);

class LayoutDigest {
 public:
  void add(const std::string& object, const std::string& attribute, const std::string& value);
  void add(const std::string& object, const std::string& attribute, std::int64_t value);
  void add(const std::string& object, const std::string& attribute, const std::vector<std::int64_t>& value);
  std::uint64_t value() const;

 private:
  std::map<std::string, std::string> lines_;
};

struct LayoutCheck {
  std::vector<std::string> problems;  // empty: the layout is sound
  std::string refusal;                // set when the file is not one this fsdpp reads (another format, newer version)
  std::int64_t format_version = 0;
  std::int64_t step = -1;             // /train step, when readable
  bool has_digest = false;
};

// Serial: opens `path` read-only, walks every tensor group and shard, recomputes the digest. Never throws for
// a damaged file (its problems are listed); throws only if the file cannot be opened as HDF5 at all.
LayoutCheck check_checkpoint_layout(const std::string& path);

// check_checkpoint_layout as one UsageError (every problem listed, what to do), or nothing when sound.
void require_sound_layout(const std::string& path);

// Every tensor group (/model/<name>, /optim/<name>/<state>) of an open file: the groups with a "shards" attribute.
std::vector<std::string> checkpoint_tensor_groups(hid_t file, const std::string& path);

}  // namespace fsdpp
