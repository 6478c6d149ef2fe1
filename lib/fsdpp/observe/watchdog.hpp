#pragma once
// The collective watchdog (comm.timeout_s): a collective that has not finished after the timeout means a rank
// is stuck or gone, and every other rank would wait forever. A monitor thread looks at the collectives in
// progress on this rank a few times a second; when one has run past the timeout it names it (operation, mesh
// dimension, sequence number, FSDP unit or tensor-parallel site, training step) and ends the job through
// abort_job (runtime/fatal.hpp), which first has the flight recorder dump every rank's last collectives, so that
// `fsdpp debug flight` can say which rank never arrived.
//
// Two kinds of collective are watched:
//  - those the host runs (MPI): the thread that runs one opens a Scope around it;
//  - those a device runs (NCCL): the communicator hands over a DeviceCompletion, which the monitor polls (event
//    queries, ncclCommGetAsyncError) until it is done. An asynchronous error ends the job at once; a timeout
//    aborts the device communicator (ncclCommAbort: its kernels stop) before the job.
// Until start() or with a timeout of 0, a Scope costs one atomic load and device collectives are not tracked.
#include "fsdpp/observe/flight_recorder.hpp"

#include <memory>
#include <string>

namespace fsdpp {

// A collective running on a device, as its communicator can observe it.
class DeviceCompletion {
 public:
  enum class Progress { queued, running, done, failed };
  virtual ~DeviceCompletion() = default;
  virtual Progress poll(std::string& error) = 0;  // on failure, `error` says what the library reported
  virtual void abort() = 0;  // stop the communicator's device work (ncclCommAbort); the job is ending
};

class CollectiveWatchdog {
 public:
  // Starts watching with `timeout_s` seconds (0 or less: nothing is watched). Not thread-safe against itself:
  // call from the main thread, as train() does.
  static void start(double timeout_s);
  static void stop();  // joins the monitor thread; collectives are no longer watched
  static bool running();

  // A collective the host runs, from its start to its end (the flight record's started and completed times).
  class Scope {
   public:
    explicit Scope(const CollectiveTicket& ticket);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CollectiveTicket ticket_;
    int exceptions_;        // in flight when it began: more at its end means the collective threw
    std::uint64_t id_ = 0;  // 0: not watched
  };

  // Work that is collective without going through a Communicator - a checkpoint save (parallel HDF5 over
  // MPI-IO) - watched with the same timeout: `what` names it in the message ("checkpoint save of step 8").
  class Region {
   public:
    explicit Region(std::string what);
    ~Region();
    Region(const Region&) = delete;
    Region& operator=(const Region&) = delete;

   private:
    std::uint64_t id_ = 0;  // 0: not watched
  };

  // A collective enqueued on a device: watched until `completion` reports it done (or failed).
  static void watch_device(const CollectiveTicket& ticket, std::shared_ptr<DeviceCompletion> completion);
  // Stops polling the device collectives of communicator `comm` (flight_id), which is about to be destroyed.
  static void forget_communicator(std::uint32_t comm);

  // Stops the watchdog when it goes out of scope (train() returning or throwing).
  struct Running {
    explicit Running(double timeout_s) { start(timeout_s); }
    ~Running() { stop(); }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;
  };
};

// "all_gather over dp_shard (#12, h.1 forward all-gather)": a collective as messages name it.
std::string describe_collective(const CollectiveTicket& ticket);

}  // namespace fsdpp
