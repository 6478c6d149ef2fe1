#pragma once
// A per-rank timeline of training steps (run.trace: <first>-<last>), written to <run.output>/trace/rank<r>.json
// in the Chrome trace event format that ui.perfetto.dev and chrome://tracing open (docs/trace.md):
//   - the compute track (tid 0): what the main thread does, as nested spans - each FSDP unit's forward and
//     backward (pre-hook to post-hook), a checkpointed block's recompute, data, grad sync, optimizer, eval,
//     sample, checkpoint - and the time it spent waiting for a collective: "wait <op> <site>" for an
//     asynchronous one (Work::wait), "blocking <op> <site>" for a blocking one;
//   - one track per communicator (tid 1 + its flight-recorder id): each collective from its start to its
//     completion, from the flight recorder's records (observe/flight_recorder.hpp), which tracing keeps.
// A wait span is cut at the collective's completion time, so it is never longer than issue -> completion; the
// thread hand-off after it is in the span's args (handoff_us), shown rather than hidden.
//
// The same names go to Kokkos Tools as regions (Kokkos::Profiling::pushRegion/popRegion), always, so a Kokkos
// tool or nsys (NVTX through the nvtx connector) shows them too. Region names are built once by their owners
// (an FSDP group, a module, the literals below), never per step. With tracing off a scope costs the Kokkos
// region calls (a null-callback check without a tool) and one relaxed atomic load.
// Spans are recorded on the main thread only (regions assume one thread: hazard H5); collectives complete on
// communicator threads, but their times come from the flight recorder under its mutex.
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace fsdpp {

struct CollectiveTicket;

namespace timeline_detail {
inline std::atomic<bool> recording{false};
}

class Timeline {
 public:
  // Records steps first..last (1-based; first = 0: nothing) of this rank into <dir>/rank<rank>.json. Every rank
  // of `comm` configures the same steps: the first traced step starts with a barrier over `comm`.
  static void configure(std::int64_t first, std::int64_t last, std::string dir, MPI_Comm comm);
  // Turns recording off and drops what was recorded and not written.
  static void reset();
  static bool recording() noexcept { return timeline_detail::recording.load(std::memory_order_relaxed); }

  // The trainer, around each optimizer step (collective over the configured comm at the first traced step):
  // begin_step starts recording at `first` (or at the first step after it that runs, when a run resumes);
  // end_step writes the file at `last`. finish() writes what a run stopped early (preemption) recorded.
  static void begin_step(std::int64_t step);
  static void end_step(std::int64_t step);
  static void finish();
  // A counter summed over the traced steps, written to otherData.counters ("fsdp_all_gathers", ...).
  static void add_counter(const char* name, std::int64_t value);

  // A compute span named `name` from enter to the matching leave (main thread; properly nested). `name` must
  // outlive the span. Always pushes/pops the Kokkos region of the same name.
  static void enter(const std::string& name);
  static void leave(const std::string& name);

  // The main thread waited for the collective of `ticket` from t0 to t1 (FlightRecorder::now_s): a "wait"
  // span for Work::wait, a "blocking" span for a blocking collective. Cut to [issued, completed].
  static void waited(const CollectiveTicket& ticket, double t0, double t1, bool blocking);

  // Calls leave(name) when it goes out of scope: for a hook that enters in one call and leaves in another.
  class Leave {
   public:
    explicit Leave(const std::string& name) : name_(name) {}
    ~Leave() { Timeline::leave(name_); }
    Leave(const Leave&) = delete;
    Leave& operator=(const Leave&) = delete;

   private:
    const std::string& name_;
  };

  // Configures for the lifetime of a training run; reset() when it ends, however it ends.
  class Run {
   public:
    Run(std::int64_t first, std::int64_t last, std::string dir, MPI_Comm comm) { configure(first, last, std::move(dir), comm); }
    ~Run() { reset(); }
    Run(const Run&) = delete;
    Run& operator=(const Run&) = delete;
  };
};

// A compute span (and Kokkos region) for the lifetime of the scope. `name` must outlive the scope: a member
// built once or one of the literals in timeline_names.
class TimelineScope {
 public:
  explicit TimelineScope(const std::string& name) : name_(name) { Timeline::enter(name_); }
  ~TimelineScope() { Timeline::leave(name_); }
  TimelineScope(const TimelineScope&) = delete;
  TimelineScope& operator=(const TimelineScope&) = delete;

 private:
  const std::string& name_;
};

namespace timeline_names {
extern const std::string data, grad_sync, optimizer, eval, checkpoint, sample, pipeline_receive;
}
// "fsdpp::<what> <unit>": "fsdpp::forward h.3", "fsdpp::recompute h.1".
std::string timeline_region(const char* what, const std::string& unit);

}  // namespace fsdpp
