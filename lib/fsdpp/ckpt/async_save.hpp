#pragma once
// Asynchronous checkpoint saves (checkpoint.async). Training pauses to copy the shards into host buffers and
// to create the file's metadata (collective, no tensor bytes); a background thread then writes this rank's
// shards into their places in the file with plain POSIX writes, and no MPI, so it never contends with
// training's communication. Every rank calls poll() at the same points (each step boundary): once every
// rank's shards are on disk, the save is committed (rank 0: /full, rename, latest). At most one save is in
// flight; start() completes the previous one first. A failed write is reported collectively at commit:
// on_error abort throws it (the same UsageError on every rank); continue logs it (report_failed_save) and
// training goes on with the previous checkpoint kept.
#include "fsdpp/ckpt/checkpoint.hpp"

#include <chrono>
#include <future>
#include <optional>

namespace fsdpp {

class AsyncCheckpointer {
 public:
  // Collective: duplicates `comm`.
  explicit AsyncCheckpointer(MPI_Comm comm, CheckpointOnError on_error = CheckpointOnError::abort);
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Collective. Completes the save in flight, if any, then starts `snapshot`.
  void start(CheckpointSnapshot snapshot, const std::string& dir, int keep_last);
  // Collective and cheap: commits the save in flight if every rank has written its shards. A save that failed
  // under on_error: continue gives nullopt (it was logged).
  std::optional<SaveResult> poll();
  // Collective: blocks until the save in flight is written, then commits it. nullopt when none was in flight.
  std::optional<SaveResult> wait();
  bool in_flight() const { return writing_.valid(); }

 private:
  std::optional<SaveResult> finish();

  MPI_Comm comm_ = MPI_COMM_NULL;
  CheckpointOnError on_error_ = CheckpointOnError::abort;
  CheckpointSnapshot snapshot_;
  PreparedSave save_;
  std::future<std::string> writing_;  // the background write's error text, empty on success
  std::chrono::steady_clock::time_point started_;  // start(): the whole save is timed from here to its commit
  double write_seconds_ = 0;          // set by the writer thread; read after writing_.get()
};

}  // namespace fsdpp
