#include "fsdpp/train/periodic_part.hpp"

#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/observe/watchdog.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/train/step_metrics.hpp"

#include <chrono>

namespace fsdpp {

void run_part(PeriodicPart& part, const StepEnd& step, StepMetrics& metrics) {
  const PartFrame frame = part.frame(step);
  if (frame.section) metrics.timers().mark(kOther);
  const auto t0 = std::chrono::steady_clock::now();
  {
    // Collective work outside a Communicator (a checkpoint save over parallel HDF5): a rank lost in it must not
    // hang the others either.
    std::optional<CollectiveWatchdog::Region> watched;
    if (!frame.watched.empty()) watched.emplace(frame.watched);
    std::optional<TimelineScope> span;
    if (frame.span) span.emplace(*frame.span);
    part.run(step);
  }
  part.report(step);
  if (frame.evaluation_time) metrics.add_eval_seconds(seconds_since(t0));
  if (frame.section) metrics.timers().mark(*frame.section);
}

}  // namespace fsdpp
