#pragma once
// fully_shard's memory schedule as events: every transient buffer an FsdpGroup allocates or frees during a
// step is reported, at the moment it happens, to the listeners of its root. The same events drive
//   - FsdpStats (unsharded bytes now and at their peak, for the log and the tests), during training, and
//   - `fsdpp plan` (plan/memory_plan.cpp), which runs one dry step of the real FsdpGroups on a planning mesh
//     (no communication, no storage) and sums the events,
// so the plan cannot drift from what fully_shard does: there is one schedule, and this is its output.
#include "fsdpp/fsdp/time_events.hpp"

#include <cstdint>
#include <string>

namespace fsdpp {

enum class FsdpBuffer {
  all_gather,          // the flat all-gather buffer, in param_dtype (one slot per rank)
  staged_shards,       // CPU offload: shards copied to the device for an all-gather
  unsharded_params,    // whole (padded) f32 parameters, copied out of the all-gather
  post_forward_slice,  // reshard_after_forward = k: the 1/k of the whole parameters kept for backward
  unsharded_grads,     // whole (padded) f32 gradients, before their reduction
  reduce_scatter,      // the flat reduce-scatter input and output, in reduce_dtype
  reduced_f32,         // the reduce-scatter output widened to f32 before it is added to the shards
  partial_reduction,   // HSDP with the all-reduce skipped: shard gradients summed until it runs
};
const char* fsdp_buffer_name(FsdpBuffer buffer);

struct FsdpMemoryEvent {
  FsdpBuffer buffer;
  std::int64_t bytes = 0;           // > 0 allocated, < 0 freed
  const std::string* unit = nullptr;  // the group's module display name ("h.3", "GPT (root)")
  bool in_backward = false;
};

class FsdpMemoryListener {
 public:
  virtual ~FsdpMemoryListener() = default;
  virtual void on_memory(const FsdpMemoryEvent& event) = 0;
  // The time side of the same schedule (fsdp/time_events.hpp): passes, collectives issued and waited for, copy
  // kernels. `fsdpp plan --machine` prices them; listeners that only count memory ignore them.
  virtual void on_schedule(const FsdpScheduleEvent& /*event*/) {}
};

}  // namespace fsdpp
