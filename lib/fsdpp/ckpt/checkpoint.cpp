#include "fsdpp/ckpt/checkpoint.hpp"

#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/version.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

namespace fsdpp {
namespace fs = std::filesystem;

namespace {

// One tensor of a checkpoint: a parameter's value or one of its optimizer states.
struct TensorEntry {
  std::string group;  // "/model/h.0.ln_1.weight" or "/optim/h.0.ln_1.weight/exp_avg"
  const Parameter* param;
  View1<float> view;
};

// How a parameter's rows are split: `shards` pieces of `chunk` rows (the last may be shorter or empty).
struct RowSplit {
  int shards = 1, mine = 0;
  std::int64_t chunk = 0, rows = 0;
  std::int64_t rows_of(int k) const { return std::clamp<std::int64_t>(rows - k * chunk, 0, chunk); }
  std::int64_t offset_of(int k) const { return std::min<std::int64_t>(k * chunk, rows); }
};

RowSplit split_of(const Parameter& p) {
  if (p.placement) return {p.placement->ranks, p.placement->rank, p.placement->chunk_rows, p.rows()};
  return {1, 0, p.rows(), p.rows()};
}

RowSplit split_of(const CheckpointSnapshot::Tensor& t) {
  return {t.shards, t.mine, t.chunk_rows, t.shape.empty() ? 1 : t.shape.front()};
}

std::vector<std::uint64_t> dims_with_rows(const std::vector<std::int64_t>& shape, std::int64_t rows) {
  std::vector<std::uint64_t> dims(shape.begin(), shape.end());
  if (dims.empty()) dims.push_back(1);
  dims[0] = static_cast<std::uint64_t>(rows);
  return dims;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += fmt::format("{}{}", i ? "," : "", shape[i]);
  return out + "]";
}


std::uint64_t checksum(const float* data, std::size_t count) { return XXH64(data, count * sizeof(float), 0); }

std::vector<TensorEntry> tensors_of(const CheckpointContents& c) {
  std::vector<TensorEntry> out;
  for (const Parameter* p : c.params) out.push_back({"/model/" + p->name(), p, p->value});
  if (c.optimizer)
    for (const Parameter* p : c.params)
      for (auto& [state, view] : c.optimizer->state_tensors(*p)) out.push_back({"/optim/" + p->name() + "/" + state, p, view});
  return out;
}

// Waits for a nonblocking collective by polling with short sleeps. Open MPI's blocking calls spin a core; a
// background save waiting on rank 0's fsync would then take that core from training.
void wait_gently(MPI_Request& request) {
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}


// Creates /a/b/c group by group (metadata: collective in a parallel file).
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

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Rank 0, after the parallel file is closed: virtual datasets, fsync, rename, `latest`, retention.
void commit(const PreparedSave& save) {
  const std::string& dir = save.dir;
  const std::string& partial = save.partial;
  const std::string& final_path = save.final_path;
  const int keep_last = save.keep_last;
  {
    h5::Handle file = h5::open_file(partial, MPI_COMM_NULL, true);
    h5::Handle full = h5::create_group(file, "/full", partial);
    // The virtual datasets are built from what the file says about its shards.
    h5::Handle model = h5::open_group(file, "/model", partial);
    for (const std::string& name : h5::children(model)) {
      h5::Handle g = h5::open_group(model, name, partial);
      CheckpointSnapshot::Tensor t;
      t.group = "/model/" + name;
      t.shape = h5::get_ints(g, "global_shape", partial);
      t.shards = static_cast<int>(h5::get_int(g, "shards", partial));
      t.chunk_rows = t.shards > 0 ? h5::get_int(h5::open_dataset(g, "shard_0", partial), "rows", partial) : 0;
      const RowSplit s = split_of(t);
      std::vector<std::string> sources;
      std::vector<std::uint64_t> offsets, rows;
      for (int k = 0; k < s.shards; ++k) {
        sources.push_back(fmt::format("{}/shard_{}", t.group, k));
        offsets.push_back(static_cast<std::uint64_t>(s.offset_of(k)));
        rows.push_back(static_cast<std::uint64_t>(s.rows_of(k)));
      }
      h5::create_virtual_rows(full, t.group.substr(7), dims_with_rows(t.shape, s.rows), sources, offsets, rows, partial);
    }
  }
  fsync_path(partial);
  std::error_code ec;
  fs::rename(partial, final_path, ec);
  FSDPP_CHECK(!ec, "cannot rename {} to {}: {}", partial, final_path, ec.message());
  const std::string latest = (fs::path(dir) / "latest").string(), temporary = latest + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << fs::path(final_path).filename().string() << "\n";
    FSDPP_CHECK(out.good(), "cannot write {}", temporary);
  }
  fsync_path(temporary);
  fs::rename(temporary, latest, ec);
  FSDPP_CHECK(!ec, "cannot update {}: {}", latest, ec.message());
  fsync_path(dir);
  if (keep_last <= 0) return;
  std::vector<std::string> saved;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) == 0 && entry.path().extension() == ".h5") saved.push_back(name);
  }
  std::sort(saved.begin(), saved.end());  // zero-padded steps sort in time order
  const std::string current = fs::path(final_path).filename().string();
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_last) < saved.size(); ++i)
    if (saved[i] != current) fs::remove(fs::path(dir) / saved[i], ec);
}

int g_saves = 0;  // for the crash test hook

}  // namespace

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
  std::ifstream in((fs::path(dir) / "latest").string());
  std::string name;
  if (!(in >> name)) return std::nullopt;
  const fs::path path = fs::path(dir) / name;
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
  for (const TensorEntry& e : tensors_of(contents)) {
    const Parameter& p = *e.param;
    const RowSplit s = split_of(p);
    CheckpointSnapshot::Tensor t;
    t.group = e.group;
    t.shape = p.shape();
    t.shards = s.shards;
    t.mine = s.mine;
    t.chunk_rows = s.chunk;
    t.writer = contents.writes_shards && (p.placement || rank == 0);
    if (t.writer) {
      t.data.resize(static_cast<std::size_t>(s.rows_of(s.mine) * p.row_size()));
      if (!t.data.empty())
        Kokkos::deep_copy(HostView1<float>(t.data.data(), t.data.size()),
                          Kokkos::subview(e.view, std::make_pair<std::size_t, std::size_t>(0, t.data.size())));
    }
    snapshot.tensors.push_back(std::move(t));
  }
  return snapshot;
}

SaveResult save_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointContents& contents,
                           const TrainProgress& progress, const CheckpointMeta& meta, int keep_last) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const auto t0 = std::chrono::steady_clock::now();
  SaveResult r = write_checkpoint(comm, dir, stage_checkpoint(contents, progress, meta, rank), keep_last);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

PreparedSave prepare_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointSnapshot& snapshot, int keep_last) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const TrainProgress& progress = snapshot.progress;
  const CheckpointMeta& meta = snapshot.meta;
  PreparedSave save;
  save.dir = dir;
  save.keep_last = keep_last;
  save.final_path = (fs::path(dir) / checkpoint_file_name(progress.step)).string();
  save.partial = save.final_path + ".partial";
  std::string error;
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) error = fmt::format("cannot create checkpoint.dir '{}': {}", dir, ec.message());
  }
  agree_on_error(comm, error);

  // Every checksum is an attribute, and attributes are written collectively: gather them first.
  const auto& tensors = snapshot.tensors;
  std::vector<std::size_t> first_slot(tensors.size() + 1, 0);
  for (std::size_t t = 0; t < tensors.size(); ++t) first_slot[t + 1] = first_slot[t] + static_cast<std::size_t>(tensors[t].shards);
  std::vector<std::uint64_t> sums(first_slot.back(), 0);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::int64_t numel = 1;
    for (auto d : tensors[t].shape) numel *= d;
    save.bytes += numel * 4;
    if (tensors[t].writer)
      sums[first_slot[t] + static_cast<std::size_t>(tensors[t].mine)] = checksum(tensors[t].data.data(), tensors[t].data.size());
  }
  {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T, MPI_SUM, comm, &request);
    wait_gently(request);
  }
  const std::string wall_time = broadcast_string(comm, rank == 0 ? utc_now() : std::string());

  h5::Handle file = h5::create_file(save.partial, comm);
  h5::Handle m = h5::create_group(file, "/meta", save.partial);
  h5::set_attr(m, "format", std::string("fsdpp-checkpoint"));
  h5::set_attr(m, "format_version", kCheckpointFormatVersion);
  h5::set_attr(m, "fsdpp_version", std::string(FSDPP_VERSION));
  h5::set_attr(m, "world_size", static_cast<std::int64_t>(size));
  h5::set_attr(m, "mesh", meta.mesh);
  h5::set_attr(m, "strategy", meta.strategy);
  h5::set_attr(m, "param_dtype", meta.param_dtype);
  h5::set_attr(m, "reduce_dtype", meta.reduce_dtype);
  h5::set_attr(m, "wall_time", wall_time);
  h5::set_attr(m, "deck", meta.deck);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto& tensor = tensors[t];
    const RowSplit s = split_of(tensor);
    h5::Handle g = create_groups(file, tensor.group, save.partial);
    h5::set_attr(g, "global_shape", tensor.shape);
    h5::set_attr(g, "dtype", std::string("f32"));
    h5::set_attr(g, "shard_dim", std::int64_t{0});
    h5::set_attr(g, "shards", static_cast<std::int64_t>(s.shards));
    for (int k = 0; k < s.shards; ++k) {
      h5::Handle ds = h5::create_dataset_f32(g, fmt::format("shard_{}", k), dims_with_rows(tensor.shape, s.rows_of(k)), save.partial);
      h5::set_attr(ds, "offset", s.offset_of(k));
      h5::set_attr(ds, "rows", s.rows_of(k));
      h5::set_attr(ds, "checksum", sums[first_slot[t] + static_cast<std::size_t>(k)]);
      // Contiguous and allocated at creation: the shard's bytes have a fixed place in the file.
      if (k == s.mine && tensor.writer && !tensor.data.empty()) save.writes.push_back({h5::file_offset(ds), t});
    }
  }
  h5::Handle tr = h5::create_group(file, "/train", save.partial);
  h5::set_attr(tr, "step", progress.step);
  for (const auto& [key, value] : progress.scalars)
    std::visit([&, &key = key](auto v) { h5::set_attr(tr, key, v); }, value);
  if (!snapshot.optimizer_kind.empty()) {
    h5::Handle o = h5::exists(file, "/optim") ? h5::open_group(file, "/optim", save.partial)
                                              : h5::create_group(file, "/optim", save.partial);
    h5::set_attr(o, "kind", snapshot.optimizer_kind);
    h5::set_attr(o, "steps", snapshot.optimizer_steps);
    for (const auto& [name, value] : snapshot.optimizer_hyperparameters) h5::set_attr(o, name, value);
  }
  return save;  // the file closes (collectively) as its handle goes
}

void write_shards(const PreparedSave& save, const CheckpointSnapshot& snapshot) {
  ++g_saves;
  const char* crash_hook = std::getenv("FSDPP_TEST_CRASH_IN_SAVE");  // tests only: "<save number>"
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const bool crash_here = crash_hook && std::atoi(crash_hook) == g_saves && rank == size - 1;
  if (save.writes.empty()) return;
  const int fd = ::open(save.partial.c_str(), O_WRONLY);
  FSDPP_CHECK(fd >= 0, "cannot open {} to write shards: {}", save.partial, std::strerror(errno));
  int written = 0;
  for (const auto& w : save.writes) {
    const auto& data = snapshot.tensors[w.tensor].data;
    const char* bytes = reinterpret_cast<const char*>(data.data());
    std::size_t left = data.size() * sizeof(float);
    std::uint64_t at = w.file_offset;
    while (left > 0) {
      const ssize_t n = ::pwrite(fd, bytes, left, static_cast<off_t>(at));
      if (n <= 0) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        throw Error(fmt::format("writing {} into {} failed: {}", snapshot.tensors[w.tensor].group, save.partial, why));
      }
      bytes += n, left -= static_cast<std::size_t>(n), at += static_cast<std::uint64_t>(n);
    }
    if (crash_here && ++written == 1) MPI_Abort(MPI_COMM_WORLD, 9);  // a rank dies mid-write
  }
  const bool synced = ::fdatasync(fd) == 0;
  ::close(fd);
  FSDPP_CHECK(synced, "fdatasync of {} failed: {}", save.partial, std::strerror(errno));
}

SaveResult commit_checkpoint(MPI_Comm comm, const PreparedSave& save, const std::string& write_error) {
  const auto t0 = std::chrono::steady_clock::now();
  agree_on_error(comm, write_error);  // also the barrier: every rank's shards are on disk
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string error;
  if (rank == 0) {
    try {
      commit(save);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_on_error(comm, error);
  SaveResult result;
  result.path = save.final_path;
  result.bytes = save.bytes;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

SaveResult write_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointSnapshot& snapshot, int keep_last) {
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
}

LoadReport load_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointContents& contents,
                           LoadOptions options) {
  const auto t0 = std::chrono::steady_clock::now();
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  LoadReport report;
  std::string error;
  // Every rank opens and validates alike, so every rank reaches the same verdict.
  h5::Handle file = h5::open_file(path, comm);
  h5::Handle meta = h5::open_group(file, "/meta", path);
  const std::string format = h5::get_string(meta, "format", path + " /meta");
  FSDPP_REQUIRE(format == "fsdpp-checkpoint", "{}: not an fsdpp checkpoint (format '{}')", path, format);
  const std::int64_t version = h5::get_int(meta, "format_version", path + " /meta");
  FSDPP_REQUIRE(version <= kCheckpointFormatVersion,
                "{}: checkpoint format_version {} is newer than this fsdpp reads ({}); load it with a newer fsdpp",
                path, version, kCheckpointFormatVersion);
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
    const std::string dtype = h5::get_string(g, "dtype", path + " /model/" + p->name());
    if (dtype != "f32") problems.push_back(fmt::format("{}: checkpoint dtype {}, model f32", p->name(), dtype));
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
  FSDPP_REQUIRE(listing.empty(), "{} does not match the model:{}{}", path, listing,
                options.strict && (!report.missing.empty() || !report.unexpected.empty())
                    ? "\n(load with strict: false to skip missing and unexpected parameters)" : "");

  CheckpointContents found = contents;
  found.params = present;
  const std::vector<TensorEntry> tensors = tensors_of(found);
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
    if (count > 0)
      Kokkos::deep_copy(Kokkos::subview(tensors[t].view, std::make_pair<std::size_t, std::size_t>(0, host.size())),
                        HostView1<float>(host.data(), host.size()));
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
