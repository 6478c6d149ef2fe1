// Saving a checkpoint: stage, prepare (collective metadata), write shards (local), commit (rank 0). Loading
// is in load.cpp, the folder (latest, retention) in directory.cpp, the layout digest in layout.cpp.
#include "fsdpp/ckpt/checkpoint.hpp"

#include "fsdpp/ckpt/directory.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/save_faults.hpp"
#include "fsdpp/ckpt/save_layout.hpp"
#include "fsdpp/ckpt/tensor_entries.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/runtime/staged_output.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <chrono>
#include <climits>
#include <ctime>
#include <filesystem>
#include <thread>

namespace fsdpp {
namespace fs = std::filesystem;
using namespace ckpt_detail;

namespace {

using Slab = CheckpointSnapshot::Tensor::Slab;

// The rows of `view` (p's storage layout) that `piece` covers, whole-width, staged on the host.
StagedFloats stage_rows(const View1<float>& view, const Parameter& p, const GlobalPiece& piece) {
  StagedFloats out(static_cast<std::size_t>(piece.rows * p.row_size()));
  if (!out.empty())
    Kokkos::deep_copy(HostView1<float>(out.data(), out.size()),
                      Kokkos::subview(view, std::make_pair(static_cast<std::size_t>(piece.local_row * p.row_size()),
                                                           static_cast<std::size_t>((piece.local_row + piece.rows) * p.row_size()))));
  return out;
}

// Shard(1) under tensor parallelism: the tp ranks' column blocks of the same rows, gathered to tp rank 0 as
// whole rows (empty elsewhere). Collective over `tp`.
StagedFloats gather_columns(MPI_Comm tp, const Parameter& p, StagedFloats local) {
  int ranks = 1, me = 0;
  MPI_Comm_size(tp, &ranks);
  MPI_Comm_rank(tp, &me);
  const std::int64_t rows = p.placement() ? p.placement()->local_rows : p.rows(), stride = p.global_row_size();
  std::vector<int> counts(static_cast<std::size_t>(ranks)), displs(static_cast<std::size_t>(ranks));
  std::vector<GlobalPiece> blocks;
  for (int t = 0, at = 0; t < ranks; ++t) {
    TensorParallelPlacement placement = *p.tensor_parallel();
    placement.rank = t;
    blocks.push_back(global_pieces_of(p.shape(), placement, 0, 1).front());
    counts[static_cast<std::size_t>(t)] = static_cast<int>(rows * blocks.back().cols);
    displs[static_cast<std::size_t>(t)] = at;
    at += counts[static_cast<std::size_t>(t)];
  }
  FSDPP_CHECK(static_cast<std::int64_t>(rows) * stride < INT_MAX, "{}: {} rows of {} columns gathered in one MPI call",
              p.name(), rows, stride);
  std::vector<float> gathered(me == 0 ? static_cast<std::size_t>(rows * stride) : 0);
  MPI_Gatherv(local.data(), static_cast<int>(local.size()), MPI_FLOAT, gathered.data(), counts.data(), displs.data(),
              MPI_FLOAT, 0, tp);
  StagedFloats whole(gathered.size());
  if (me == 0)
    for (int t = 0; t < ranks; ++t) {
      const GlobalPiece& b = blocks[static_cast<std::size_t>(t)];
      for (std::int64_t r = 0; r < rows; ++r)
        std::copy_n(gathered.data() + displs[static_cast<std::size_t>(t)] + r * b.cols, b.cols,
                    whole.data() + r * stride + b.global_col);
    }
  return whole;
}

// The shards of the file for `p` (every rank's, sorted by offset), and this rank's index of each of its own.
std::vector<Slab> file_shards(const Parameter& p) {
  const int dp_ranks = p.placement() ? p.placement()->ranks : 1;
  const auto& tp = p.tensor_parallel();
  const std::int64_t global_rows = p.shape().empty() ? 1 : p.shape()[0];
  std::vector<Slab> out;
  if (!tp || tp->dim == 1) {  // dim 0 is whole on every tp rank: the dp_shard row chunks
    const std::int64_t chunk = p.placement() ? p.placement()->chunk_rows : global_rows;
    for (int k = 0; k < dp_ranks; ++k)
      out.push_back({std::min<std::int64_t>(k * chunk, global_rows), std::clamp<std::int64_t>(global_rows - k * chunk, 0, chunk)});
    return out;
  }
  for (int t = 0; t < tp->ranks; ++t) {
    TensorParallelPlacement placement = *tp;
    placement.rank = t;
    const std::int64_t local_rows = tensor_parallel_shape(p.shape(), placement)[0];
    const std::int64_t chunk = chunk_rows(local_rows, dp_ranks);
    for (int d = 0; d < dp_ranks; ++d) {
      const std::int64_t first = std::min<std::int64_t>(d * chunk, local_rows);
      for (const GlobalPiece& piece : global_pieces_of(p.shape(), placement, first, std::clamp<std::int64_t>(local_rows - d * chunk, 0, chunk)))
        out.push_back({piece.global_row, piece.rows});
    }
  }
  std::sort(out.begin(), out.end(), [](const Slab& a, const Slab& b) { return a.offset < b.offset; });
  return out;
}

// DTensor-style, one entry per mesh dimension, from the placements' own mesh dimensions: "tp: Shard(1),
// dp_shard: Shard(0)"; under HSDP "dp_replicate: Replicate(), dp_shard: Shard(0)".
std::string placements_text(const Parameter& p) {
  std::vector<std::string> entries;
  if (const auto& tp = p.tensor_parallel()) entries.push_back(tp->mesh_dim + ": " + tp->describe());
  if (const auto& shard = p.placement())
    for (std::size_t d = 0; d < shard->mesh_dims.size(); ++d)
      entries.push_back(shard->mesh_dims[d].name + (d + 1 == shard->mesh_dims.size() ? ": Shard(0)" : ": Replicate()"));
  return entries.empty() ? "Replicate()" : fmt::format("{}", fmt::join(entries, ", "));
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

// HDF5 cannot survive a failed close (h5::CloseFailed), and a full disk is what makes one fail: so the room a
// file needs is checked before HDF5 writes anything, and a full disk is an ordinary error naming the folder.
std::string lacks_space(const std::string& dir, std::uint64_t needed, const std::string& what) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return fmt::format("cannot check free space in '{}': {}", dir, std::strerror(errno));
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
  if (free_bytes >= needed) return {};
  return fmt::format("'{}' has {:.2f} MiB free but {} needs {:.2f} MiB: {}; free space or point checkpoint.dir "
                     "elsewhere", dir, free_bytes / 1048576.0, what, needed / 1048576.0, std::strerror(ENOSPC));
}

// Room for a file's metadata: groups, datasets and attributes, generously.
std::uint64_t metadata_bytes(const CheckpointSnapshot& s) {
  std::uint64_t datasets = 0;
  for (const auto& t : s.tensors) datasets += static_cast<std::uint64_t>(t.shards.size()) + 1;
  return (1u << 20) + datasets * 4096 + s.meta.deck.size();
}

// Rank 0, after every shard is written: /full (virtual datasets built from what the file says about its
// shards), fsync, rename, `latest`, retention. Throws on failure; the caller removes what is left.
void commit(const PreparedSave& save, std::uint64_t room) {
  const std::string& partial = save.partial;
  if (const std::string e = lacks_space(save.dir, room, "adding /full to " + partial); !e.empty()) throw UsageError(e);
  {
    h5::Handle file = h5::open_file(partial, MPI_COMM_NULL, true);
    {
      h5::Handle full = h5::create_group(file, "/full", partial);
      h5::Handle model = h5::open_group(file, "/model", partial);
      for (const std::string& name : h5::children(model)) {
        h5::Handle g = h5::open_group(model, name, partial);
        const std::string group = "/model/" + name;
        const auto shape = h5::get_ints(g, "global_shape", partial + " " + group);
        std::vector<std::string> sources;
        std::vector<std::uint64_t> offsets, rows;
        for (std::int64_t k = 0, shards = h5::get_int(g, "shards", partial + " " + group); k < shards; ++k) {
          h5::Handle ds = h5::open_dataset(g, fmt::format("shard_{}", k), partial);
          sources.push_back(fmt::format("{}/shard_{}", group, k));
          offsets.push_back(h5::get_uint(ds, "offset", partial + " " + sources.back()));
          rows.push_back(h5::get_uint(ds, "rows", partial + " " + sources.back()));
        }
        h5::create_virtual_rows(full, name, dims_with_rows(shape, shape.empty() ? 1 : shape.front()), sources, offsets,
                                rows, partial);
      }
    }
    h5::close_file(file, partial);
  }
  if (const int e = fault_at(SavePoint::close)) throw Error(fmt::format("fsync of {} failed: {}", partial, std::strerror(e)));
  fsync_path(partial);
  const int injected = fault_at(SavePoint::rename);
  if (injected || ::rename(partial.c_str(), save.final_path.c_str()) != 0)
    throw Error(fmt::format("cannot rename {} to {}: {}", partial, save.final_path, std::strerror(injected ? injected : errno)));
  const std::string name = fs::path(save.final_path).filename().string();
  try {
    write_latest(save.dir, name);
  } catch (const Error& e) {
    throw Error(fmt::format("{} is complete, but 'latest' still names the previous checkpoint: {}", save.final_path, e.what()));
  }
  const Retention r = apply_retention(save.dir, name, save.keep_last);
  for (const auto& f : r.failed) Log::warn("checkpoint.keep_last: could not delete {}", f);
}

// Rank 0: a failed save leaves no .partial behind (best effort: the folder may be gone).
void remove_partial(MPI_Comm comm, const PreparedSave& save) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::error_code ec;
  if (rank == 0 && !save.partial.empty()) fs::remove(save.partial, ec);
}

// Every rank throws the same UsageError if any has an error, after rank 0 removed the .partial file.
void agree_or_clean_up(MPI_Comm comm, const PreparedSave& save, const std::string& error) {
  try {
    agree_on_error(comm, error);
  } catch (const UsageError&) {
    remove_partial(comm, save);
    throw;
  }
}

// on_error: continue turns an agreed save error into a warning; every rank sees the same error, so every
// rank takes the same branch.
template <class Save> SaveResult with_policy(CheckpointOnError on_error, const std::string& dir, std::int64_t step,
                                             Save&& save) {
  if (on_error == CheckpointOnError::abort) return save();
  try {
    return save();
  } catch (const UsageError& e) {
    SaveResult failed;
    failed.error = e.what();
    report_failed_save(dir, step, failed.error);
    return failed;
  }
}

}  // namespace

void report_failed_save(const std::string& dir, std::int64_t step, const std::string& error) {
  const LatestHint latest = read_latest(dir);
  Log::warn("checkpoint: saving step {} failed: {}\ntraining continues (checkpoint.on_error: continue); {}", step, error,
            latest.name ? fmt::format("'latest' still names {}", (fs::path(dir) / *latest.name).string())
                        : std::string("no checkpoint has been committed yet"));
}

template <class T> T* MappedAllocator<T>::allocate(std::size_t n) {
  if (n == 0) return nullptr;
  void* p = ::mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return static_cast<T*>(p);
}
template <class T> void MappedAllocator<T>::deallocate(T* p, std::size_t n) {
  if (p) ::munmap(p, n * sizeof(T));
}
template struct MappedAllocator<float>;

std::string checkpoint_file_name(std::int64_t step) { return fmt::format("step_{:08d}.h5", step); }

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  const LatestHint hint = read_latest(dir);
  if (!hint.name) return std::nullopt;
  const fs::path path = fs::path(dir) / *hint.name;
  if (!fs::exists(path)) return std::nullopt;
  return path.string();
}

CheckpointSnapshot stage_checkpoint(const CheckpointContents& contents, const TrainProgress& progress,
                                    const CheckpointMeta& meta, int rank) {
  CheckpointSnapshot snapshot;
  snapshot.progress = progress;
  snapshot.meta = meta;
  if (contents.optimizer) {
    snapshot.optimizer_kind = contents.optimizer->kind();
    snapshot.optimizer_steps = contents.optimizer->steps();
    snapshot.optimizer_hyperparameters = contents.optimizer->hyperparameters();
  }
  int tp_rank = 0;
  if (contents.tensor_parallel != MPI_COMM_NULL) MPI_Comm_rank(contents.tensor_parallel, &tp_rank);
  for (const TensorEntry& e : tensors_of(contents)) {
    const Parameter& p = *e.param;
    CheckpointSnapshot::Tensor t;
    t.group = e.group;
    t.shape = p.shape();
    t.placements = placements_text(p);
    t.shards = file_shards(p);
    const auto& tp = p.tensor_parallel();
    // Who writes: one replica (HSDP); of the tp ranks, each its own rows of a Shard(0) parameter, else tp rank 0
    // (experts split over ep are the same on every tp rank).
    const bool writer = contents.writes_shards && (p.placement() || rank == 0);
    const bool split_rows = tp && tp->dim == 0 && !tp->expert;
    const bool gathers_columns = tp && tp->dim == 1;
    if (writer && (split_rows || tp_rank == 0 || gathers_columns)) {
      for (const GlobalPiece& piece : p.global_pieces()) {
        StagedFloats rows = stage_rows(e.view, p, piece);
        if (gathers_columns) rows = gather_columns(contents.tensor_parallel, p, std::move(rows));
        if (gathers_columns && tp_rank != 0) continue;
        const auto at = std::find_if(t.shards.begin(), t.shards.end(), [&](const Slab& s) { return s.offset == piece.global_row; });
        FSDPP_CHECK(at != t.shards.end() && at->rows == piece.rows, "{}: rows {}+{} are not a shard of the file",
                    e.group, piece.global_row, piece.rows);
        t.mine.push_back({static_cast<int>(at - t.shards.begin()), std::move(rows)});
      }
    }
    snapshot.tensors.push_back(std::move(t));
  }
  return snapshot;
}

namespace {

// A tensor's file layout as text, for the stages to exchange: group, shape, placements and shards.
nlohmann::json layout_json(const CheckpointSnapshot::Tensor& t) {
  nlohmann::json shards = nlohmann::json::array();
  for (const Slab& s : t.shards) shards.push_back({s.offset, s.rows});
  return {{"group", t.group}, {"shape", t.shape}, {"placements", t.placements}, {"shards", shards}};
}

CheckpointSnapshot::Tensor tensor_of(const nlohmann::json& j) {
  CheckpointSnapshot::Tensor t;
  t.group = j.at("group").get<std::string>();
  t.shape = j.at("shape").get<std::vector<std::int64_t>>();
  t.placements = j.at("placements").get<std::string>();
  for (const auto& s : j.at("shards")) t.shards.push_back({s.at(0).get<std::int64_t>(), s.at(1).get<std::int64_t>()});
  return t;
}

// Every rank's text, gathered on every rank of `comm`.
std::vector<std::string> all_gather_text(MPI_Comm comm, const std::string& mine) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(size)), starts(static_cast<std::size_t>(size));
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm);
  int total = 0;
  for (int r = 0; r < size; ++r) starts[static_cast<std::size_t>(r)] = total, total += lengths[static_cast<std::size_t>(r)];
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), starts.data(), MPI_CHAR, comm);
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r)
    out.push_back(all.substr(static_cast<std::size_t>(starts[static_cast<std::size_t>(r)]),
                             static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)])));
  return out;
}

}  // namespace

void merge_stage_snapshots(MPI_Comm world, const CheckpointContents& contents, CheckpointSnapshot& snapshot) {
  if (contents.stage == MPI_COMM_NULL) return;
  int stage_rank = 0;
  MPI_Comm_rank(contents.stage, &stage_rank);
  // One rank of each stage describes the stage's tensors (its other ranks hold the same layouts).
  nlohmann::json described = {{"stage", contents.stage_index}, {"tensors", nlohmann::json::array()}};
  if (stage_rank == 0)
    for (const auto& t : snapshot.tensors) described["tensors"].push_back(layout_json(t));
  std::vector<CheckpointSnapshot::Tensor> merged;
  std::map<std::string, int> owner;  // group -> the stage that writes it
  for (const std::string& text : all_gather_text(world, stage_rank == 0 ? described.dump() : std::string("{}"))) {
    const nlohmann::json stage = nlohmann::json::parse(text);
    if (!stage.contains("tensors")) continue;
    for (const auto& j : stage.at("tensors")) {
      CheckpointSnapshot::Tensor t = tensor_of(j);
      const auto [at, added] = owner.emplace(t.group, stage.at("stage").get<int>());
      if (added) {
        merged.push_back(std::move(t));
        continue;
      }
      const auto same = std::find_if(merged.begin(), merged.end(), [&](const auto& m) { return m.group == t.group; });
      FSDPP_CHECK(layout_json(*same) == layout_json(t), "checkpoint: pipeline stages {} and {} lay out {} differently",
                  at->second, stage.at("stage").get<int>(), t.group);
    }
  }
  // This rank's shards go with the tensors its stage writes; the file's others are other stages' to write.
  for (CheckpointSnapshot::Tensor& t : snapshot.tensors) {
    if (owner.at(t.group) != contents.stage_index) continue;
    const auto at = std::find_if(merged.begin(), merged.end(), [&](const auto& m) { return m.group == t.group; });
    at->mine = std::move(t.mine);
  }
  snapshot.tensors = std::move(merged);
}

SaveResult save_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointContents& contents,
                           const TrainProgress& progress, const CheckpointMeta& meta, int keep_last,
                           CheckpointOnError on_error) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const auto t0 = std::chrono::steady_clock::now();
  if (contents.stage != MPI_COMM_NULL) MPI_Comm_rank(contents.stage, &rank);  // the writer of whole tensors
  CheckpointSnapshot snapshot = stage_checkpoint(contents, progress, meta, rank);
  merge_stage_snapshots(comm, contents, snapshot);
  SaveResult r = write_checkpoint(comm, dir, snapshot, keep_last, on_error);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

namespace {

// The file a save of `snapshot` makes, and the bytes of its tensors.
PreparedSave plan_save(const std::string& dir, const CheckpointSnapshot& snapshot, int keep_last) {
  PreparedSave save;
  save.dir = dir;
  save.keep_last = keep_last;
  save.final_path = (fs::path(dir) / checkpoint_file_name(snapshot.progress.step)).string();
  for (const auto& t : snapshot.tensors) {
    std::int64_t numel = 1;
    for (auto d : t.shape) numel *= d;
    save.bytes += numel * 4;
  }
  return save;
}

// Rank 0 makes the folder and checks that it has room for the whole file; every rank hears the verdict.
void require_room(MPI_Comm comm, const PreparedSave& save, const CheckpointSnapshot& snapshot) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string error;
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(save.dir, ec);
    if (ec) error = fmt::format("cannot create checkpoint.dir '{}': {}", save.dir, ec.message());
    else error = lacks_space(save.dir, static_cast<std::uint64_t>(save.bytes) + metadata_bytes(snapshot),
                             "checkpoint " + save.final_path);
  }
  agree_on_error(comm, error);
}

// Every shard's checksum, tensor by tensor, on every rank (checksums are attributes, and attributes are written
// collectively): each writer hashes its own shards, and a sum over the ranks fills in everyone else's.
std::vector<std::uint64_t> shard_checksums(MPI_Comm comm, const CheckpointSnapshot& snapshot) {
  const auto& tensors = snapshot.tensors;
  std::vector<std::size_t> first_slot(tensors.size() + 1, 0);
  for (std::size_t t = 0; t < tensors.size(); ++t) first_slot[t + 1] = first_slot[t] + tensors[t].shards.size();
  std::vector<std::uint64_t> sums(first_slot.back(), 0);
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (const auto& m : tensors[t].mine)
      sums[first_slot[t] + static_cast<std::size_t>(m.shard)] = checksum(m.data.data(), m.data.size());
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T, MPI_SUM, comm, &request);
  wait_gently(request);
  // An empty shard (a rank with no rows) has the checksum of no bytes, whoever holds it.
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (std::size_t k = 0; k < tensors[t].shards.size(); ++k)
      if (tensors[t].shards[k].rows == 0) sums[first_slot[t] + k] = checksum(nullptr, 0);
  return sums;
}

// <final path>.partial, created by every rank (collective); a failure anywhere is every rank's error.
h5::Handle create_partial(MPI_Comm comm, PreparedSave& save) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string error;
  if (const int e = fault_at(SavePoint::stage))
    error = fmt::format("rank {}: cannot create {}: {}", rank, save.final_path + ".partial", std::strerror(e));
  agree_on_error(comm, error);
  save.partial = save.final_path + ".partial";
  h5::Handle file;
  try {
    file = h5::create_file(save.partial, comm);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_clean_up(comm, save, error);
  return file;
}

}  // namespace

PreparedSave prepare_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointSnapshot& snapshot, int keep_last) {
  begin_save();
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  PreparedSave save = plan_save(dir, snapshot, keep_last);
  require_room(comm, save, snapshot);
  const std::vector<std::uint64_t> checksums = shard_checksums(comm, snapshot);
  const std::string wall_time = broadcast_string(comm, rank == 0 ? utc_now() : std::string());
  // Every object and attribute of the file, the layout digest among them, computed alike on every rank.
  const std::vector<FileObject> objects = checkpoint_objects(snapshot, checksums, size, wall_time);
  h5::Handle file = create_partial(comm, save);
  std::string error;
  try {
    save.writes = write_objects(file, objects, snapshot, save.partial);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_clean_up(comm, save, error);  // a failure closes the file on every rank (collectively) as it unwinds
  h5::close_file(file, save.partial);
  return save;
}

void write_shards(const PreparedSave& save, const CheckpointSnapshot& snapshot) {
  if (save.writes.empty()) return;
  const int fd = ::open(save.partial.c_str(), O_WRONLY);
  if (fd < 0) throw Error(fmt::format("cannot open {} to write shards: {}", save.partial, std::strerror(errno)));
  for (const auto& w : save.writes) {
    const auto& data = snapshot.tensors[w.tensor].mine[w.mine].data;
    const char* bytes = reinterpret_cast<const char*>(data.data());
    std::size_t left = data.size() * sizeof(float);
    std::uint64_t at = w.file_offset;
    while (left > 0) {
      const int injected = fault_at(SavePoint::write);
      const ssize_t n = injected ? -1 : ::pwrite(fd, bytes, left, static_cast<off_t>(at));
      if (n <= 0) {
        const std::string why = n == 0 ? "no bytes written" : std::strerror(injected ? injected : errno);
        ::close(fd);
        throw Error(fmt::format("writing {} into {} failed: {}", snapshot.tensors[w.tensor].group, save.partial, why));
      }
      bytes += n, left -= static_cast<std::size_t>(n), at += static_cast<std::uint64_t>(n);
    }
  }
  int injected = fault_at(SavePoint::close);
  const bool synced = !injected && ::fdatasync(fd) == 0;
  int why = injected ? injected : errno;
  const bool closed = ::close(fd) == 0;
  if (synced && !closed) why = errno;
  if (!synced || !closed)
    throw Error(fmt::format("{} of {} failed: {}", synced ? "close" : "fdatasync", save.partial, std::strerror(why)));
}

SaveResult commit_checkpoint(MPI_Comm comm, const PreparedSave& save, const std::string& write_error) {
  const auto t0 = std::chrono::steady_clock::now();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // Also the barrier: every rank's shards are on disk.
  agree_or_clean_up(comm, save, write_error.empty() ? write_error : fmt::format("rank {}: {}", rank, write_error));
  std::string error;
  if (rank == 0) {
    try {
      commit(save, (1u << 20) + static_cast<std::uint64_t>(save.writes.size() + 64) * 4096);
    } catch (const h5::CloseFailed&) {
      throw;  // not recoverable: the job stops (see h5.hpp)
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_or_clean_up(comm, save, error);
  SaveResult result;
  result.path = save.final_path;
  result.bytes = save.bytes;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

SaveResult write_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointSnapshot& snapshot, int keep_last,
                            CheckpointOnError on_error) {
  return with_policy(on_error, dir, snapshot.progress.step, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const PreparedSave save = prepare_checkpoint(comm, dir, snapshot, keep_last);
    std::string error;
    try {
      write_shards(save, snapshot);
    } catch (const std::exception& e) {
      error = e.what();
    }
    SaveResult result = commit_checkpoint(comm, save, error);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return result;
  });
}

}  // namespace fsdpp
