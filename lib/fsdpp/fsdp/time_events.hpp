#pragma once
// The time side of fully_shard's schedule, in two forms:
//   - FsdpScheduleEvent: what an FsdpGroup reports to its root's listeners (memory_events.hpp's
//     FsdpMemoryListener::on_schedule) as one step runs, dry on a planning mesh or for real: a unit's pass begins
//     or ends, a collective is issued or waited for, a copy kernel runs. The order is the program order.
//   - TimedOp: the same step priced on a machine (plan/step_cost.cpp turns the first into the second, adding the
//     units' compute and tensor-parallel collectives), which plan/simulate.hpp replays on one compute stream and
//     one stream per communicator.
#include "fsdpp/observe/flight_recorder.hpp"  // CollectiveOp

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

class Module;
enum class Pass;

struct FsdpScheduleEvent {
  enum class Kind;
  explicit FsdpScheduleEvent(Kind k) : kind(k) {}
  enum class Kind {
    pass_begin,  // the unit's own computation starts (its pre-hook finished: parameters gathered)
    pass_end,    // ... and has ended (its post-hook starts)
    issue,       // a collective is started (async; `id` names it)
    wait,        // the compute thread waits for collective `id` (all issued with that id)
    kernel,      // a copy / conversion / accumulation kernel on the compute stream moving `bytes`
    host_copy,   // CPU offload: a blocking host<->device copy of `bytes`
  } kind;
  const Module* module = nullptr;  // pass_begin / pass_end
  Pass pass{};
  // pass_begin of a backward whose Linear weight gradients wait for a Pass::backward_weight of the same unit
  // (zero_bubble's input-gradient pass: nn/weight_gradient_stash.hpp).
  bool defers_weight_gradients = false;
  CollectiveOp op = CollectiveOp::all_gather;
  std::int64_t bytes = 0;          // issue: the full (unsharded) buffer of the operation
  int ranks = 1;                   // issue: ranks in the group
  std::string group;               // issue: the mesh dimension ("dp_shard", "dp_replicate", "post_forward")
  int id = -1;
};

// Compute and a collective running at once on a device whose cores do both (a CPU: the copies, the TCP stack and
// the communicator's thread take cycles from the kernels, and the kernels from them): while the collective runs,
// compute takes (1 + compute_slowdown) times as long; while compute runs, the collective takes
// (1 + collective_slowdown) times as long. A link class's figures (plan/machine.hpp, LinkClass::beside_compute):
// measured by calibrate; 0 for GPUs in the presets (NCCL's copy engines and SMs: not measured here).
struct BesideCompute {
  double compute_slowdown = 0, collective_slowdown = 0;
};

// One step of the priced schedule, in program order (the order the compute thread meets them).
struct TimedOp {
  enum class Kind {
    compute,  // `seconds` on the compute stream
    issue,    // a collective of `seconds` on stream `stream`, starting when both the compute thread reached it and
              // the stream is free
    wait,     // the compute stream waits for every collective issued with `id`; exposed time goes to their streams
  } kind = Kind::compute;
  double seconds = 0;
  std::string stream;  // issue: the communicator ("dp_shard", "tp", "host_link", ...)
  int id = -1;
  std::string what;    // compute: "forward", "backward", "recompute", "optimizer", "copies"; for the breakdown
  BesideCompute beside_compute;  // issue: how this collective and the compute stream slow each other
};

}  // namespace fsdpp
