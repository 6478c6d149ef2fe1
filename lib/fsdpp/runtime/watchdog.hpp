#pragma once
// The collective watchdog (comm.timeout_s): a collective that has not finished after the timeout means a rank
// is stuck or gone, and every other rank would wait forever. A monitor thread looks at the collectives in
// progress on this rank (each one inside a CollectiveWatchdog::Scope) a few times a second; when one has run
// past the timeout it prints what it was (the operation, the mesh dimension, the training step) and aborts the
// job with MPI_Abort, so that the launcher ends every rank within seconds instead of at the job's time limit.
//
// MPI communicators open a Scope around each collective, on whichever thread runs it (the communication
// thread or the caller); the trainer sets the step. Until start() or with a timeout of 0, a Scope costs one
// atomic load.
#include <cstdint>
#include <string>

namespace fsdpp {

class CollectiveWatchdog {
 public:
  // Starts watching with `timeout_s` seconds (0 or less: nothing is watched). Not thread-safe against itself:
  // call from the main thread, as train() does.
  static void start(double timeout_s);
  static void stop();  // joins the monitor thread; collectives are no longer watched
  static void set_step(std::int64_t step);  // the optimizer step now running, for the message (0: none)

  // A collective in progress: `op` ("all_gather") over the group `group` ("dp_shard").
  class Scope {
   public:
    Scope(const char* op, const std::string& group);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::uint64_t id_ = 0;  // 0: not watched
  };

  // Stops the watchdog when it goes out of scope (train() returning or throwing).
  struct Running {
    explicit Running(double timeout_s) { start(timeout_s); }
    ~Running() { stop(); }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;
  };
};

}  // namespace fsdpp
