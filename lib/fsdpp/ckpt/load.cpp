// Loading a checkpoint into (possibly differently) sharded parameters, in phases: rank 0 checks the layout;
// every rank matches the file against the model (names, shapes, optimizer), reads the intersection of its rows
// with each saved shard and verifies a share of the checksums; then the /train and /optim scalars.
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/finite.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/ckpt/tensor_entries.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <chrono>
#include <set>

namespace fsdpp {
using namespace ckpt_detail;

namespace {

// The parameters of `contents` the file holds. Names missing on either side go to the report; a shape or
// optimizer that does not match, or (strict) any missing name, is one UsageError listing every mismatch.
std::vector<Parameter*> match_model(hid_t file, const std::string& path, const CheckpointContents& contents,
                                    LoadOptions options, LoadReport& report) {
  std::vector<std::string> problems;
  std::set<std::string> model_names;
  std::vector<Parameter*> present;
  h5::Handle model = h5::open_group(file, "/model", path);
  for (Parameter* p : contents.params) {
    model_names.insert(p->name());
    if (!h5::exists(model, p->name())) {
      report.missing.push_back(p->name());
      continue;
    }
    h5::Handle g = h5::open_group(model, p->name(), path);
    const auto shape = h5::get_ints(g, "global_shape", path + " /model/" + p->name());
    if (shape != p->shape())
      problems.push_back(fmt::format("{}: checkpoint shape {}, model {}", p->name(), shape_text(shape), shape_text(p->shape())));
    present.push_back(p);
  }
  for (const std::string& name : h5::children(model))  // under a pipeline the others are other stages' to load
    if (!model_names.count(name) && contents.stage == MPI_COMM_NULL) report.unexpected.push_back(name);
  if (contents.optimizer) {
    const bool has = h5::exists(file, "/optim");
    const std::string kind = has ? h5::get_string(h5::open_group(file, "/optim", path), "kind", path + " /optim") : "";
    if (kind != contents.optimizer->kind())
      problems.push_back(has ? fmt::format("optimizer: checkpoint holds {} state, the run uses {}", kind, contents.optimizer->kind())
                             : "optimizer: the checkpoint holds no optimizer state");
  }
  std::string listing;
  for (const auto& s : problems) listing += "\n  " + s;
  if (options.strict) {
    for (const auto& s : report.missing) listing += "\n  missing from the checkpoint: " + s;
    for (const auto& s : report.unexpected) listing += "\n  in the checkpoint but not in the model: " + s;
  }
  FSDPP_REQUIRE(listing.empty(), "{} does not match the model:{}\nthe checkpoint was written for another model or "
                "optimizer: use the deck it was written with (fsdpp ckpt inspect {} prints it), or start this model "
                "fresh with checkpoint.resume: false and another checkpoint.dir", path, listing, path);
  return present;
}

// One tensor group's shard datasets, with the rows each holds.
struct SavedShards {
  std::string group;
  std::vector<h5::Handle> datasets;
  std::vector<std::pair<std::int64_t, std::int64_t>> slabs;  // (offset, rows) of each shard
};

SavedShards open_shards(hid_t file, const std::string& group, const std::string& path) {
  SavedShards out;
  out.group = group;
  h5::Handle g = h5::open_group(file, group, path);
  const std::int64_t shards = h5::get_int(g, "shards", path + " " + group);
  for (std::int64_t k = 0; k < shards; ++k) {
    const std::string object = fmt::format("{}/shard_{}", group, k);
    out.datasets.push_back(h5::open_dataset(g, fmt::format("shard_{}", k), path));
    out.slabs.emplace_back(h5::get_int(out.datasets.back(), "offset", path + " " + object),
                           h5::get_int(out.datasets.back(), "rows", path + " " + object));
  }
  return out;
}

// This rank's elements of `p` (local_numel, in its storage's layout) into `host`: each piece of its storage (one,
// a strided shard's few, or a Shard(1) column block) from the whole rows it lies in, read from the shards that
// hold them (only their intersection), its columns kept. Returns the bytes read.
std::int64_t read_local_rows(const SavedShards& saved, const Parameter& p, std::vector<float>& host,
                             const std::string& path) {
  const std::int64_t row = p.row_size(), stride = p.global_row_size();
  std::int64_t bytes = 0;
  std::vector<float> rows;
  for (const GlobalPiece& piece : p.global_pieces()) {
    const std::int64_t first = piece.global_row, count = piece.rows;
    const bool whole_rows = piece.cols == stride;
    float* into = host.data() + piece.local_row * row;
    if (!whole_rows) rows.assign(static_cast<std::size_t>(count * stride), 0.0f);
    float* target = whole_rows ? into : rows.data();
    for (std::size_t k = 0; k < saved.slabs.size(); ++k) {
      const auto [offset, n] = saved.slabs[k];
      const std::int64_t lo = std::max(first, offset), hi = std::min(first + count, offset + n);
      if (lo >= hi) continue;
      h5::read_rows(saved.datasets[k], static_cast<std::uint64_t>(lo - offset), static_cast<std::uint64_t>(hi - lo),
                    static_cast<std::uint64_t>(stride), target + (lo - first) * stride,
                    path + fmt::format(" {}/shard_{}", saved.group, k));
      bytes += (hi - lo) * stride * 4;
    }
    if (!whole_rows)
      for (std::int64_t r = 0; r < count; ++r)
        std::copy_n(rows.data() + r * stride + piece.global_col, piece.cols, into + r * row);
  }
  return bytes;
}

// Tensor `t`'s shards that fall to this rank (spread over the ranks), read whole, one buffer at a time, and
// compared with their checksums. The first mismatch as an error text, or empty.
std::string verify_checksums(const SavedShards& saved, std::size_t t, std::int64_t stride, int rank, int size,
                             const std::string& path) {
  for (std::size_t k = 0; k < saved.slabs.size(); ++k) {
    if (static_cast<int>((t * 131 + k) % static_cast<std::size_t>(size)) != rank) continue;
    const std::string object = fmt::format("{}/shard_{}", saved.group, k);
    const std::int64_t n = saved.slabs[k].second;
    std::vector<float> whole(static_cast<std::size_t>(n * stride));
    h5::read_rows(saved.datasets[k], 0, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(stride), whole.data(),
                  path + " " + object);
    if (checksum(whole.data(), whole.size()) != h5::get_uint(saved.datasets[k], "checksum", path + " " + object))
      return fmt::format("{}: checksum mismatch in {}: the file is corrupted; load an earlier checkpoint", path, object);
  }
  return {};
}

// Every tensor of `tensors` into this rank's storage: its rows, a share of the checksums, a finiteness check.
// The first problem on this rank as an error text (the caller makes every rank agree), or empty.
std::string read_tensors(hid_t file, const std::string& path, const std::vector<TensorEntry>& tensors, MPI_Comm comm,
                         LoadReport& report) {
  int rank = 0, size = 1;  // the ranks that share the checksum reads: those holding the same tensors
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  try {
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const Parameter& p = *tensors[t].param;
      const SavedShards saved = open_shards(file, tensors[t].group, path);
      std::vector<float> host(static_cast<std::size_t>(p.local_numel()));
      report.bytes += read_local_rows(saved, p, host, path);
      if (std::string e = verify_checksums(saved, t, p.global_row_size(), rank, size, path); !e.empty()) return e;
      if (const auto bad = first_non_finite(host.data(), host.size()))
        return fmt::format("{}: {} {}: the checkpoint holds non-finite values (did training diverge before it was "
                           "saved?); resume from an earlier checkpoint", path, tensors[t].group,
                           describe_non_finite(global_index_of(p, *bad), p.shape(), host[*bad]));
      if (!host.empty())
        Kokkos::deep_copy(Kokkos::subview(tensors[t].view, std::make_pair<std::size_t, std::size_t>(0, host.size())),
                          HostView1<float>(host.data(), host.size()));
    }
  } catch (const std::exception& e) {
    return e.what();  // a read that failed on this rank only: every rank hears of it from the caller
  }
  return {};
}

// /train's step and the scalars `contents` asks for (with the types it gives), and the optimizer's step count.
void read_train_state(hid_t file, const std::string& path, const CheckpointContents& contents, LoadReport& report) {
  h5::Handle tr = h5::open_group(file, "/train", path);
  const std::string where = path + " /train";
  report.progress.step = h5::get_int(tr, "step", where);
  for (const auto& [key, expected] : contents.scalars) {
    StateScalar value = expected;
    if (std::holds_alternative<std::int64_t>(expected)) value = h5::get_int(tr, key, where);
    else if (std::holds_alternative<std::uint64_t>(expected)) value = h5::get_uint(tr, key, where);
    else value = h5::get_double(tr, key, where);
    report.progress.scalars.emplace_back(key, value);
  }
  if (contents.optimizer)
    contents.optimizer->set_steps(h5::get_int(h5::open_group(file, "/optim", path), "steps", path + " /optim"));
}

}  // namespace

LoadReport load_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointContents& contents,
                           LoadOptions options) {
  const auto t0 = std::chrono::steady_clock::now();
  // Before any collective on the file: one serial check of every attribute the reads below trust, agreed on
  // every rank. A damaged file is then one clear error, not a read past a dataset's end on some ranks.
  root_does(comm, [&] { require_sound_layout(path); });
  LoadReport report;
  // Every rank opens and validates alike, so every rank reaches the same verdict.
  h5::Handle file = h5::open_file(path, comm);
  h5::Handle meta = h5::open_group(file, "/meta", path);
  report.saved_world_size = h5::get_int(meta, "world_size", path + " /meta");
  report.saved_mesh = h5::get_string(meta, "mesh", path + " /meta");
  CheckpointContents found = contents;
  found.params = match_model(file, path, contents, options, report);
  const MPI_Comm sharing = contents.stage != MPI_COMM_NULL ? contents.stage : comm;  // a pipeline: the stage's ranks
  agree_on_error(comm, read_tensors(file, path, tensors_of(found), sharing, report));
  read_train_state(file, path, contents, report);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace fsdpp
