// Loading a checkpoint into (possibly differently) sharded parameters: rank 0 checks the layout first, then
// every rank reads the intersection of its rows with each saved shard.
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

LoadReport load_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointContents& contents,
                           LoadOptions options) {
  const auto t0 = std::chrono::steady_clock::now();
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Before any collective on the file: one serial check of every attribute the reads below trust, agreed on
  // every rank. A damaged file is then one clear error, not a read past a dataset's end on some ranks.
  root_does(comm, [&] { require_sound_layout(path); });
  LoadReport report;
  std::string error;
  // Every rank opens and validates alike, so every rank reaches the same verdict.
  h5::Handle file = h5::open_file(path, comm);
  h5::Handle meta = h5::open_group(file, "/meta", path);
  report.saved_world_size = h5::get_int(meta, "world_size", path + " /meta");
  report.saved_mesh = h5::get_string(meta, "mesh", path + " /meta");

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
  for (const std::string& name : h5::children(model))
    if (!model_names.count(name)) report.unexpected.push_back(name);
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

  CheckpointContents found = contents;
  found.params = present;
  const std::vector<TensorEntry> tensors = tensors_of(found);
  try {
    for (std::size_t t = 0; t < tensors.size() && error.empty(); ++t) {
      const Parameter& p = *tensors[t].param;
      const RowSplit mine = split_of(p);
      const std::int64_t first = mine.offset_of(mine.mine), count = mine.rows_of(mine.mine), row = p.row_size();
      std::vector<float> host(static_cast<std::size_t>(count * row));
      h5::Handle g = h5::open_group(file, tensors[t].group, path);
      const std::int64_t shards = h5::get_int(g, "shards", path + " " + tensors[t].group);
      for (std::int64_t k = 0; k < shards; ++k) {
        const std::string object = fmt::format("{}/shard_{}", tensors[t].group, k);
        h5::Handle ds = h5::open_dataset(g, fmt::format("shard_{}", k), path);
        const std::int64_t offset = h5::get_int(ds, "offset", path + " " + object);
        const std::int64_t rows = h5::get_int(ds, "rows", path + " " + object);
        // Only the rows this rank owns: the intersection of its range with the shard's.
        const std::int64_t lo = std::max(first, offset), hi = std::min(first + count, offset + rows);
        if (lo < hi) {
          h5::read_rows(ds, static_cast<std::uint64_t>(lo - offset), static_cast<std::uint64_t>(hi - lo),
                        static_cast<std::uint64_t>(row), host.data() + (lo - first) * row, path + " " + object);
          report.bytes += (hi - lo) * row * 4;
        }
        // One rank per shard reads it whole to check its checksum: one shard's buffer at a time.
        if (static_cast<int>((t * 131 + static_cast<std::size_t>(k)) % static_cast<std::size_t>(size)) == rank) {
          std::vector<float> whole(static_cast<std::size_t>(rows * row));
          h5::read_rows(ds, 0, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(row), whole.data(), path + " " + object);
          if (checksum(whole.data(), whole.size()) != h5::get_uint(ds, "checksum", path + " " + object)) {
            error = fmt::format("{}: checksum mismatch in {}: the file is corrupted; load an earlier checkpoint", path, object);
            break;
          }
        }
      }
      if (const auto bad = first_non_finite(host.data(), host.size()); bad && error.empty())
        error = fmt::format("{}: {} {}: the checkpoint holds non-finite values (did training diverge before it was "
                            "saved?); resume from an earlier checkpoint", path, tensors[t].group,
                            describe_non_finite(static_cast<std::size_t>(first * row) + *bad, p.shape(), host[*bad]));
      if (count > 0)
        Kokkos::deep_copy(Kokkos::subview(tensors[t].view, std::make_pair<std::size_t, std::size_t>(0, host.size())),
                          HostView1<float>(host.data(), host.size()));
    }
  } catch (const std::exception& e) {
    error = e.what();  // a read that failed on this rank only: every rank hears of it below
  }
  agree_on_error(comm, error);

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
  if (contents.optimizer) contents.optimizer->set_steps(h5::get_int(h5::open_group(file, "/optim", path), "steps", path + " /optim"));
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace fsdpp
