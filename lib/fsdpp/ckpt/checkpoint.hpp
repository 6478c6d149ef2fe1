#pragma once
// Sharded checkpoints in one parallel HDF5 file per save, written by all ranks through MPI-IO, readable with
// h5dump / h5ls / h5py without fsdpp (PyTorch DCP's save/load semantics, docs/fsdp2-semantics.md §10):
//
//   /meta                          attributes: format, format_version, fsdpp version, world size, mesh,
//                                  strategy, dtypes, wall time, the resolved deck
//   /model/<name>/shard_<k>        shard k's rows of parameter <name>; the group carries global_shape, dtype,
//                                  shard_dim, shards; each shard offset, rows and an xxh64 checksum of its bytes
//   /optim/<name>/<state>/shard_<k> optimizer state, laid out the same way; /optim carries kind and step count
//   /train                         step, tokens seen, data sampler state, learning rate
//   /full/<name>                   virtual datasets stitching the shards into whole tensors (h5dump -d /full/..)
//
// Commit protocol (crash-consistent): write <dir>/step_<NNNNNNNN>.h5.partial on all ranks, close, barrier;
// rank 0 adds /full, fsyncs, renames it to step_<NNNNNNNN>.h5, then replaces <dir>/latest atomically
// (temporary file, fsync, rename, folder fsync). A crash at any point leaves the previous checkpoint and
// `latest` intact. Any failed create, write, fsync, close or rename is one UsageError on every rank naming the
// path and the system's reason; the .partial file is removed and `latest` keeps naming the previous checkpoint.
// The free space a file needs is checked before HDF5 writes it (HDF5 cannot recover from a failed close).
//
// Every attribute that says where data goes is covered by /meta's layout_xxh64 digest (layout.hpp), checked
// on rank 0 before any collective of a load, so a damaged file is a clear error on every rank, never a hang.
//
// Load reshards: every rank intersects its own dim-0 rows with the saved shards' rows and reads only those
// hyperslabs, so any world size or mesh can load any checkpoint.
//
// Tensor parallelism (nn/tensor_parallel.hpp) keeps every shard a slab of whole rows, so /full, consolidate,
// export and h5dump read a TP checkpoint like any other: a Shard(0) parameter's shards are each (tp, dp_shard)
// rank's rows (a strided c_attn shard is up to three slabs, one per q, k, v), written by that rank; a Shard(1)
// parameter's shards are its dp_shard row chunks, whose columns the tp ranks gather to tp rank 0, which writes
// them; replicated parameters are written by tp rank 0. Each group's `placements` attribute records the
// DTensor-style placements ("tp: Shard(1), dp_shard: Shard(0)"). A load reads whole rows and keeps its columns.
#include "fsdpp/ckpt/state_dict.hpp"
#include "fsdpp/config/deck_enums.hpp"

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

class Optimizer;
class Parameter;
struct ModelConfig;

// 2: /meta carries layout_xxh64. Version 1 files (no digest) still load, after the structural checks.
inline constexpr std::int64_t kCheckpointFormatVersion = 2;

struct TrainProgress {
  std::int64_t step = 0;         // optimizer steps completed: the file's name and /train step
  StateScalars scalars;          // the other /train attributes, from the Stateful parts of training
};

struct CheckpointMeta {
  std::string mesh;              // "dp_shard=4 (4 ranks, mpi)"
  std::string strategy;          // fsdp.strategy
  std::string param_dtype = "f32", reduce_dtype = "f32";
  std::string deck;              // the resolved deck text
};

// What a save writes and a load fills. Parameters may be sharded (fully_shard) or whole (replicated).
struct CheckpointContents {
  std::vector<Parameter*> params;
  Optimizer* optimizer = nullptr;  // optional
  bool writes_shards = true;       // false on HSDP replicas after the first: they hold copies (deduplicated)
  MPI_Comm tensor_parallel = MPI_COMM_NULL;  // the tp dimension's ranks, under tensor parallelism
  StateScalars scalars;            // load: the /train attributes to read back, with their types
  // Pipeline parallelism (parallel/pipeline_parallel.hpp): this rank's stage (its ranks; null without a pipeline).
  // `params` are then the stage's: a save merges every stage's tensors into the one file (merge_stage_snapshots),
  // a load reads the stage's and leaves the file's others to the other stages, whose ranks verify their checksums.
  MPI_Comm stage = MPI_COMM_NULL;
  int stage_index = 0;
};

struct SaveResult {
  std::string path;
  std::int64_t bytes = 0;          // tensor bytes written by all ranks
  double seconds = 0;
  double write_seconds = 0, commit_seconds = 0;  // asynchronous saves: the background write, the commit
  std::string error;               // set when the save failed and on_error: continue kept training going
};

// Host memory for staged shards, straight from mmap: a snapshot held while training runs must not reshape the
// malloc heap that training's per-step buffers are recycled from (measured: steps ran 25% slower otherwise).
template <class T> struct MappedAllocator {
  using value_type = T;
  MappedAllocator() = default;
  template <class U> MappedAllocator(const MappedAllocator<U>&) {}
  T* allocate(std::size_t n);
  void deallocate(T* p, std::size_t n);
  template <class U> bool operator==(const MappedAllocator<U>&) const { return true; }
  template <class U> bool operator!=(const MappedAllocator<U>&) const { return false; }
};
using StagedFloats = std::vector<float, MappedAllocator<float>>;

// A save's tensors copied to host memory, with everything needed to write them: the only part of a save that
// must pause training (async saves write it from a background thread).
struct CheckpointSnapshot {
  struct Tensor {
    std::string group;                // "/model/<name>" or "/optim/<name>/<state>"
    std::vector<std::int64_t> shape;  // global
    std::string placements;           // "dp_shard: Shard(0)", "tp: Shard(1), dp_shard: Shard(0)"
    struct Slab {
      std::int64_t offset = 0, rows = 0;  // global rows [offset, offset + rows)
    };
    std::vector<Slab> shards;         // every shard of the file, in order of offset, tiling dim 0
    struct Mine {
      int shard = 0;                  // index into shards
      StagedFloats data;              // its rows, whole
    };
    std::vector<Mine> mine;           // the shards this rank writes (HSDP: one replica does)
  };
  std::vector<Tensor> tensors;
  TrainProgress progress;
  CheckpointMeta meta;
  std::string optimizer_kind;         // empty: no optimizer state
  std::int64_t optimizer_steps = 0;
  std::vector<std::pair<std::string, double>> optimizer_hyperparameters;
};

// Local, except under tensor parallelism: the tp ranks then gather the columns of Shard(1) parameters
// (collective over contents.tensor_parallel).
CheckpointSnapshot stage_checkpoint(const CheckpointContents& contents, const TrainProgress& progress,
                                    const CheckpointMeta& meta, int rank);

// Pipeline parallelism: every stage staged its own tensors; the file holds them all, created in one order on every
// rank of `world` (parallel HDF5 creates datasets collectively). The union of the stages' tensors in stage order,
// each from the first stage that holds it: a tensor two stages hold (a tied embedding) is written by the first.
// Collective over `world`; a no-op without contents.stage.
void merge_stage_snapshots(MPI_Comm world, const CheckpointContents& contents, CheckpointSnapshot& snapshot);

// A save in three parts, so that an async save runs only the middle one in the background:
//   prepare_checkpoint  collective, metadata only: the file, every group, dataset and attribute (checksums
//                       included), and where in the file this rank's shards go
//   write_shards        local, no MPI: this rank's shards written at those offsets, then fdatasync
//   commit_checkpoint   collective: once every rank has written, rank 0 adds /full, renames, updates latest
struct PreparedSave {
  std::string dir, partial, final_path;
  int keep_last = 0;
  struct Write {
    std::uint64_t file_offset;
    std::size_t tensor;  // index into the snapshot's tensors
    std::size_t mine;    // index into that tensor's `mine`
  };
  std::vector<Write> writes;
  std::int64_t bytes = 0;  // tensor bytes of the whole checkpoint
};
PreparedSave prepare_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointSnapshot& snapshot, int keep_last);
void write_shards(const PreparedSave& save, const CheckpointSnapshot& snapshot);  // throws fsdpp::Error
// `write_error`: this rank's write_shards failure, if any; every rank then throws the same UsageError.
SaveResult commit_checkpoint(MPI_Comm comm, const PreparedSave& save, const std::string& write_error = {});

// Collective over `comm`: the three parts in a row. keep_last > 0 deletes older checkpoints beyond the newest
// keep_last (never the one just written, nor any of a later step). on_error abort: a failed save throws the
// same UsageError on every rank; continue: it is logged (report_failed_save) and returned in SaveResult::error.
SaveResult write_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointSnapshot& snapshot, int keep_last = 0,
                            CheckpointOnError on_error = CheckpointOnError::abort);

// stage_checkpoint (and merge_stage_snapshots under a pipeline) then write_checkpoint.
SaveResult save_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointContents& contents,
                           const TrainProgress& progress, const CheckpointMeta& meta, int keep_last = 0,
                           CheckpointOnError on_error = CheckpointOnError::abort);

// The warning of a failed save under on_error: continue, naming the checkpoint `latest` still names.
void report_failed_save(const std::string& dir, std::int64_t step, const std::string& error);

struct LoadOptions {
  bool strict = true;  // false: parameters missing from the file, or in the file but not the model, are reported
};

struct LoadReport {
  TrainProgress progress;
  std::vector<std::string> missing, unexpected;  // non-strict loads only
  std::int64_t saved_world_size = 0;
  std::string saved_mesh;
  std::int64_t bytes = 0;  // tensor bytes read by this rank
  double seconds = 0;
};

// Collective over `comm`: rank 0 first checks the file's layout (layout.hpp) and every rank agrees on the
// verdict; then validates names, shapes and dtypes (every mismatch in one UsageError), reads each rank's rows
// of every parameter (and optimizer state), verifies every shard's checksum and that every value is finite.
LoadReport load_checkpoint(MPI_Comm comm, const std::string& path, const CheckpointContents& contents,
                           LoadOptions options = {});

std::string checkpoint_file_name(std::int64_t step);  // step_00000042.h5
// The checkpoint <dir>/latest names, if it names one that exists.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Writes a consolidated file (each whole tensor at /model/<name>) one tensor at a time. Serial.
class ConsolidatedWriter {
 public:
  ConsolidatedWriter(const std::string& path, const std::string& source, std::int64_t step);
  ~ConsolidatedWriter();
  void add(const std::string& name, const std::vector<std::int64_t>& shape, const float* data);

 private:
  std::string path_;
  struct Files;
  std::unique_ptr<Files> files_;
};

// `fsdpp ckpt consolidate`: one plain HDF5 file with each whole parameter at /model/<name> (what other tools
// import). Serial; one parameter in memory at a time.
void consolidate_checkpoint(const std::string& checkpoint, const std::string& out);

// Rank 0's whole tensor `whole` (p.numel() elements on every rank) broadcast to every rank of `comm`, each
// keeping its own rows of `p`. Shared by every whole-tensor import. Collective.
void broadcast_into_shard(MPI_Comm comm, std::vector<float>& whole, Parameter& p);

// Weights only (fine-tuning, checkpoint.init_from): from an fsdpp checkpoint, a consolidated file, a .safetensors
// file or a Hugging Face model folder, into (possibly sharded) parameters. A folder's config.json must describe
// `model` when given (the deck's; every contradiction named). Collective; UsageError lists every mismatch.
// `one_stage`: `params` are one pipeline stage's and `comm` its ranks; the file's other tensors are other stages'.
void load_weights(MPI_Comm comm, const std::string& path, const std::vector<Parameter*>& params,
                  const ModelConfig* model = nullptr, bool one_stage = false);
// Loads a consolidated file into (possibly sharded) parameters: rank 0 reads each whole tensor and broadcasts
// it; every rank keeps its rows (broadcast_from_rank0). Collective; UsageError lists every mismatch.
void load_consolidated(MPI_Comm comm, const std::string& path, const std::vector<Parameter*>& params);

// The resolved deck an fsdpp checkpoint was written with (its model, for fsdpp generate and eval). UsageError for
// another kind of file (a weights file carries no deck). Serial, any rank.
std::string checkpoint_deck(const std::string& path);
// `fsdpp ckpt inspect`: meta, parameters with shapes and shards, bytes, step and deck. Serial, any rank.
std::string inspect_checkpoint(const std::string& path);
// `fsdpp ckpt verify`: the layout (digest, shapes, offsets, rows, shard counts), every checksum, and that every
// value is finite; returns the problems found (empty: sound).
std::vector<std::string> verify_checkpoint(const std::string& path);

}  // namespace fsdpp
