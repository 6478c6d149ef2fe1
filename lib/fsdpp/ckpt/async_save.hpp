#pragma once
// Asynchronous checkpoint saves (checkpoint.async): training pauses only to copy the shards into host
// buffers (stage_checkpoint); a background thread writes them through its own duplicated communicator while
// training goes on. At most one save is in flight: the next one waits for it. A failed write is reported by
// wait(), which every rank calls at the same points (the next save, the end of training), so every rank
// learns of it together instead of one rank leaving the others in a collective.
#include "fsdpp/ckpt/checkpoint.hpp"

#include <future>
#include <optional>
#include <thread>

namespace fsdpp {

class AsyncCheckpointer {
 public:
  explicit AsyncCheckpointer(MPI_Comm comm);  // collective: duplicates `comm` for the writer
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Waits for the save in flight, if any (rethrowing its error), then starts writing `snapshot`.
  void start(CheckpointSnapshot snapshot, const std::string& dir, int keep_last);
  // Blocks until the save in flight is written and committed; rethrows its error. nullopt when none was.
  std::optional<SaveResult> wait();
  // True once the save in flight has finished (successfully or not); does not block or throw.
  bool finished() const;
  bool in_flight() const { return result_.valid(); }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::future<SaveResult> result_;
};

}  // namespace fsdpp
