#pragma once
// `fsdpp plan`: the per-rank memory a deck will need on N ranks, worked out from shapes alone: no MPI job
// beyond the calling process, no model storage. The model is built on meta; parallelize_for_planning shards it
// exactly as training would (the same function over a planning mesh); and the unsharded memory is what the real
// FsdpGroups report, as memory events, while one training step runs dry through them (Module::dry_run) under
// the deck's reshard_after_forward, prefetch and gradient accumulation.
//
// What it predicts is what MemoryAccounting measures: bytes in Views of the compute memory space. The trainer
// prints the measured peak at the end of a run, and tests/cli/plan_vs_measured.sh holds the two within 1%.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/fsdp/memory_events.hpp"
#include "fsdpp/mesh/device_mesh.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpp {

struct PlannedUnit {
  std::string name;                 // "h.0", or the root's display name
  std::int64_t parameters = 0;      // elements of the unit's parameters (unpadded)
  std::int64_t sharded_bytes = 0;   // per rank: padded f32 shards
  std::int64_t unsharded_bytes = 0; // per rank while gathered: the whole (padded) f32 parameters
};

// Bytes per rank by category. The unsharded and communication figures are those at the step's peak.
struct PlannedMemory {
  std::int64_t parameters = 0;          // f32 shards (or whole parameters under no_shard)
  std::int64_t gradients = 0;           // f32, the same shape as the parameters
  std::int64_t optimizer = 0;           // AdamW m and v, or SGD momentum
  std::int64_t unsharded_parameters = 0;
  std::int64_t unsharded_gradients = 0;
  std::int64_t comm_buffers = 0;        // all-gather and reduce-scatter flat buffers in flight
  std::int64_t pool_cached = 0;         // fully_shard's buffer pool: reserved beyond the live peak (free blocks)
  std::int64_t activations = 0;         // saved activations, logits and backward scratch of one micro-batch
  std::int64_t batch = 0;               // the micro-batch's tokens and targets
  // A pipeline stage: the activations it received, kept until their backward, and its output's gradient.
  std::int64_t pipeline_messages = 0;
  // zero_bubble: the weight-gradient stashes (nn/weight_gradient_stash.hpp) of the micro-batches between I and W.
  std::int64_t weight_stash = 0;
  std::int64_t total() const {
    return parameters + gradients + optimizer + unsharded_parameters + unsharded_gradients + comm_buffers +
           pool_cached + activations + batch + pipeline_messages + weight_stash;
  }
};

struct MemoryPlan {
  int ranks = 1;
  std::string strategy;
  std::vector<MeshDim> mesh;            // resolved sizes (no_shard: dp_replicate=N x dp_shard=1)
  int shard_ranks = 1;                  // ranks a parameter is split over
  int micro_batch = 1, accum_steps = 1;
  std::vector<PlannedUnit> units;       // in the order they run forward; root last
  PlannedMemory memory;
  std::string peak_moment;              // where in the step the peak falls
  std::int64_t per_sequence_bytes = 0;  // what one more sequence per micro-batch adds
  // mesh.cp > 1: what the attention ring sends per rank and step (ContextParallelGroup::ring_bytes_per_step)
  std::int64_t ring_bytes_per_step = 0;
  int recomputing_blocks = 0;           // train.activation_checkpointing: blocks that recompute in backward
  int pipeline_stage = -1;              // plan_stage_memory: the pipeline rank planned (ranks: its stage's)
  std::vector<int> pipeline_slots;      // ... and its activation slots per chunk (micro-batches in flight)
  std::vector<int> pipeline_stashes;    // ... and its weight-gradient stashes per chunk (zero_bubble: Is before their W)
  std::int64_t pipeline_message_bytes = 0;  // ... and one message between stages (a micro-batch's residual stream)
  std::int64_t activations_without_checkpointing = 0;  // memory.activations had no block recomputed
  // fsdp.forward_prefetch / backward_prefetch and comm.overlap: with overlap, a unit's reduce-scatter buffers
  // stay live through the next unit's backward, and the dry step counts them there.
  PrefetchSetting forward_prefetch, backward_prefetch;
  bool reduce_scatter_in_flight = true;
  std::int64_t fixed_bytes() const { return memory.total() - micro_batch * per_sequence_bytes; }
  // The most sequences per micro-batch that fit in `bytes` (0: not even one).
  std::int64_t largest_micro_batch(std::int64_t bytes) const;
};

// UsageError when the deck cannot run on `ranks` (mesh sizes, batch divisibility), with the same words the
// trainer would use.
// `schedule`, when given, also hears every event of the dry step (the time model, plan/step_cost.hpp, prices
// them); it sees the model while the step runs, and the model is gone when this returns.
MemoryPlan plan_memory(const Deck& deck, int ranks, std::shared_ptr<FsdpMemoryListener> schedule = nullptr);
// mesh.pp > 1: the memory of a rank of pipeline stage `stage` (0 .. pp - 1): the stage's model (its blocks, the
// embedding or the head) sharded over the stage's ranks / pp ranks as parallel/pipeline_parallel.hpp shards it,
// and one step of its schedule's actions run dry, with the activations of the micro-batches its chunks hold in
// flight and the messages it keeps. The ranks of one stage need the same; stages differ.
MemoryPlan plan_stage_memory(const Deck& deck, int ranks, int stage,
                             std::shared_ptr<FsdpMemoryListener> schedule = nullptr);
// The model states alone: mesh, units, parameters, gradients and optimizer state on `ranks`, without a step
// (micro_batch and accum_steps stay 1, the batch-dependent figures 0). For building a model without training
// it (fsdpp init), so training's rules, the batch split among them, do not apply.
MemoryPlan plan_model_states(const Deck& deck, int ranks);

// "80GiB", "512 MiB", "1.5T", "4096" (bytes) -> bytes. Binary units; UsageError naming `what` otherwise.
std::int64_t parse_byte_size(std::string_view text, std::string_view what);

// "largest micro-batch that fits in 80.00 GiB: 12 sequences; ... use train.micro_batch 4", or "...: none; the
// model states alone need ...": the plan's advice for `mem_per_rank` bytes per rank.
std::string largest_micro_batch_text(const Deck& deck, const MemoryPlan& plan, std::int64_t mem_per_rank);

// "1.50 GiB", "512.0 MiB".
std::string bytes_text(std::int64_t bytes);

// The report `fsdpp plan` prints.
std::string format_memory_plan(const Deck& deck, const MemoryPlan& plan, std::optional<std::int64_t> mem_per_rank);

}  // namespace fsdpp
