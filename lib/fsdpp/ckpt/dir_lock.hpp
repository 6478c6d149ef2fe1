#pragma once
// One writer per checkpoint folder. Two runs saving into one checkpoint.dir interleave their files (a
// committed checkpoint of mixed runs, `latest` naming a file the other run's keep_last deleted), so a run
// that saves takes an exclusive flock on <dir>/.lock on rank 0 for its whole life and writes its host and
// PID there; a second run on the same folder stops at start, on every rank, with a message naming them.
//
// File systems without flock (some Lustre and NFS mounts, stack-notes §4.5: ENOLCK, EOPNOTSUPP) get a
// warning and no lock: a second run there is not detected. The lock file is left in place (removing it
// would race with the next run taking it); only the lock, not the file, says the folder is in use.
#include <mpi.h>

#include <string>

namespace fsdpp {

class CheckpointDirLock {
 public:
  // Collective over `comm`. `enabled` false: takes nothing (a run that saves no checkpoints). Creates `dir`
  // if needed. Throws the same UsageError on every rank when another process holds the lock.
  CheckpointDirLock(MPI_Comm comm, const std::string& dir, bool enabled = true);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  bool held() const { return fd_ >= 0; }  // rank 0 only; false elsewhere and where flock is unsupported

 private:
  int fd_ = -1;
};

}  // namespace fsdpp
