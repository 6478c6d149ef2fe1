#pragma once
// What `fsdpp report <run> --trace` makes of the per-rank timelines of run.trace (observe/timeline.hpp):
//  - <run>/trace/merged.json: every rank's events in one Chrome trace, pid = rank, times shifted by each rank's
//    sync offset (the barrier before the first traced step), so the ranks line up in ui.perfetto.dev;
//  - a table per FSDP unit (the unit is the collective's site prefix that names one of otherData.units; the
//    rest, such as the gradient-norm all-reduce, is "(other)"): collectives, comm ms (started -> completed),
//    in flight ms (issued -> completed: comm ms plus the time queued behind the communicator's earlier
//    collectives), waited ms (the wait and blocking spans of the compute track, joined to their collective on
//    (comm, seq)) and exposed % (waited / in flight), then the same totals by operation and by mesh dimension.
//    Numbers are per rank, averaged over the ranks, summed over the traced steps;
//  - the boxes of trace.png: one row per rank x track, a colour per category (a pipeline's receives as waits);
//  - under a pipeline, each rank's actions (spans "fsdpp::pipeline F3@s1") as they ran, for the schedule's
//    picture (`fsdpp report --trace` draws it with parallel/pipeline_schedule.hpp's draw_pipeline).
#include <string>
#include <vector>

namespace fsdpp {

struct TraceBox {
  int row = 0;            // into TraceReport::rows
  int category = 0;       // into TraceReport::categories
  double start_ms = 0, end_ms = 0;  // from the earliest event of the merged trace
  int depth = 0;          // nesting on the compute track (0: outermost)
};

// One pipeline action as it ran: its span (ms, from the earliest event of the merged trace) and the time it
// waited inside for another stage's message (its "fsdpp::pipeline_receive" spans).
struct TracedAction {
  std::string action;  // "F3@s1"
  double start_ms = 0, end_ms = 0, waited_ms = 0;
};

struct TraceReport {
  std::string merged_path;
  int ranks = 0;
  std::int64_t first_step = 0, last_step = 0;
  std::string table;  // the text summary
  std::string json;   // the same as one JSON object
  std::vector<std::string> rows;        // "r0 compute", "r0 dp_shard (mpi)", ...
  std::vector<std::string> categories;  // "forward", "backward", ..., "all_gather", "wait", "blocking"
  std::vector<TraceBox> boxes;          // by row, then start, outer spans before the ones they hold
  std::vector<std::vector<TracedAction>> pipeline;  // by world rank, in the order they ran; empty without pp
};

// Reads <run>/trace/rank*.json, writes <run>/trace/merged.json. UsageError when there is no trace to read.
TraceReport analyze_trace(const std::string& run_dir);

}  // namespace fsdpp
