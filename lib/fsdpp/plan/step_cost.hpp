#pragma once
// `fsdpp plan --machine`: the time of one training step of a deck on N ranks of a machine (plan/machine.hpp),
// from the same dry step as the memory plan (plan/memory_plan.hpp). fully_shard reports its schedule as it runs
// dry (fsdp/time_events.hpp: passes, collectives issued and waited for, copy kernels); each unit's pass is
// priced from its GEMM shapes and elementwise bytes, tensor-parallel collectives are placed where the blocks
// issue them (blocking in forward; in backward overlapped with the weight-gradient GEMMs under comm.overlap),
// each collective from its bytes and the link class its group spans, then the step is replayed on one compute
// stream and one stream per communicator (plan/simulate.hpp). docs/performance-model.md has the formulas.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/plan/machine.hpp"
#include "fsdpp/plan/simulate.hpp"
#include "fsdpp/plan/memory_plan.hpp"

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace fsdpp {

struct StepTime {
  std::string machine;             // the description's name
  std::string precision;           // the deck's GEMM precision ("bf16"), the peak MFU is quoted against
  double peak_tflops = 0;          // the machine's peak in that precision
  double ms_per_step = 0;
  double compute_ms = 0;           // the compute stream's busy time
  double comm_ms = 0;              // every communicator's busy time, summed
  double tokens_per_s_per_device = 0, tokens_per_s = 0;
  double mfu = 0;                  // model FLOPs (the trainer's formula) per second per device over the peak
  double model_flops_per_rank = 0; // per step: flops_per_token x this rank's tokens / tp
  double priced_flops_per_rank = 0;  // per step: the FLOPs the units were priced with, recomputation excluded
  std::string critical_resource;   // "compute", or "<mesh dim> (intra-node|inter-node)"
  std::map<std::string, double> exposed_comm_ms;  // per mesh dimension (and host_link)
  std::map<std::string, double> busy_comm_ms;     // per mesh dimension
  std::map<std::string, double> compute_ms_by_what;  // forward, backward, recompute, copies, optimizer, backward_weight (zero_bubble's W)
  std::map<std::string, std::string> link_of;     // mesh dimension -> "intra-node" / "inter-node"
  std::map<std::string, double> comm_bytes;       // per mesh dimension: this rank's payload per step (observe's
                                                  // traffic table counts the same: count x dtype, all_gather's input)
};

struct StepPlan {
  MemoryPlan memory;
  StepTime time;
};

// UsageError as plan_memory's when the deck cannot run on `ranks`. mesh.pp 1 (a pipeline: plan_pipeline_step).
StepPlan plan_step(const Deck& deck, int ranks, const Machine& machine);

// One dry step priced: `run` plans its memory with the step's recorder listening (plan_memory for the job, or
// plan_stage_memory for a pipeline stage: pipeline_plan.hpp), and the recorded schedule is replayed.
StepPlan price_step(const Deck& deck, int ranks, const Machine& machine,
                    const std::function<MemoryPlan(std::shared_ptr<FsdpMemoryListener>)>& run);

// The "Predicted time" section of `fsdpp plan`'s table.
std::string format_step_time(const StepTime& t);

}  // namespace fsdpp
