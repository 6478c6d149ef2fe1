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
      const std::int64_t row = p.row_size(), stride = p.global_row_size();
      std::vector<float> host(static_cast<std::size_t>(p.local_numel()));
      h5::Handle g = h5::open_group(file, tensors[t].group, path);
      const std::int64_t shards = h5::get_int(g, "shards", path + " " + tensors[t].group);
      std::vector<h5::Handle> datasets;
      std::vector<std::pair<std::int64_t, std::int64_t>> slabs;  // (offset, rows) of each shard
      for (std::int64_t k = 0; k < shards; ++k) {
        const std::string object = fmt::format("{}/shard_{}", tensors[t].group, k);
        datasets.push_back(h5::open_dataset(g, fmt::format("shard_{}", k), path));
        slabs.emplace_back(h5::get_int(datasets.back(), "offset", path + " " + object),
                           h5::get_int(datasets.back(), "rows", path + " " + object));
      }
      // Each piece of this rank's storage (one, or a strided shard's few, or a Shard(1) column block): the whole
      // rows it lies in, read from the shards that hold them, then its columns kept.
      std::vector<float> rows;
      for (const GlobalPiece& piece : p.global_pieces()) {
        const std::int64_t first = piece.global_row, count = piece.rows;
        const bool whole_rows = piece.cols == stride;
        float* into = host.data() + piece.local_row * row;
        if (!whole_rows) rows.assign(static_cast<std::size_t>(count * stride), 0.0f);
        float* target = whole_rows ? into : rows.data();
        for (std::int64_t k = 0; k < shards; ++k) {
          const auto [offset, n] = slabs[static_cast<std::size_t>(k)];
          // Only the rows this piece needs: the intersection of its range with the shard's.
          const std::int64_t lo = std::max(first, offset), hi = std::min(first + count, offset + n);
          if (lo >= hi) continue;
          h5::read_rows(datasets[static_cast<std::size_t>(k)], static_cast<std::uint64_t>(lo - offset),
                        static_cast<std::uint64_t>(hi - lo), static_cast<std::uint64_t>(stride),
                        target + (lo - first) * stride, path + fmt::format(" {}/shard_{}", tensors[t].group, k));
          report.bytes += (hi - lo) * stride * 4;
        }
        if (!whole_rows)
          for (std::int64_t r = 0; r < count; ++r)
            std::copy_n(rows.data() + r * stride + piece.global_col, piece.cols, into + r * row);
      }
      for (std::int64_t k = 0; k < shards; ++k) {
        const std::string object = fmt::format("{}/shard_{}", tensors[t].group, k);
        const auto [offset, n] = slabs[static_cast<std::size_t>(k)];
        // One rank per shard reads it whole to check its checksum: one shard's buffer at a time.
        if (static_cast<int>((t * 131 + static_cast<std::size_t>(k)) % static_cast<std::size_t>(size)) == rank) {
          std::vector<float> whole(static_cast<std::size_t>(n * stride));
          h5::read_rows(datasets[static_cast<std::size_t>(k)], 0, static_cast<std::uint64_t>(n),
                        static_cast<std::uint64_t>(stride), whole.data(), path + " " + object);
          if (checksum(whole.data(), whole.size()) != h5::get_uint(datasets[static_cast<std::size_t>(k)], "checksum", path + " " + object)) {
            error = fmt::format("{}: checksum mismatch in {}: the file is corrupted; load an earlier checkpoint", path, object);
            break;
          }
        }
      }
      if (const auto bad = first_non_finite(host.data(), host.size()); bad && error.empty())
        error = fmt::format("{}: {} {}: the checkpoint holds non-finite values (did training diverge before it was "
                            "saved?); resume from an earlier checkpoint", path, tensors[t].group,
                            describe_non_finite(global_index_of(p, *bad), p.shape(), host[*bad]));
      if (!host.empty())
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
