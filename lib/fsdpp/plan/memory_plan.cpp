#include "fsdpp/plan/memory_plan.hpp"

#include "fsdpp/nn/context_parallel.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/parallel/pipeline_gradient_sync.hpp"
#include "fsdpp/parallel/pipeline_parallel.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/nn/make_model.hpp"
#include "fsdpp/nn/moe.hpp"
#include "fsdpp/nn/weight_gradient_stash.hpp"
#include "fsdpp/optim/deck_optimizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>

namespace fsdpp {
namespace {

// Sums fully_shard's memory events over a dry step, and keeps the high-water mark of the transient buffers
// with what it was made of and when it happened.
class PeakOfEvents final : public FsdpMemoryListener {
 public:
  void on_memory(const FsdpMemoryEvent& e) override {
    live_[category(e.buffer)] += e.bytes;
    const std::int64_t total = live_[0] + live_[1] + live_[2];
    if (e.bytes > 0 && total > peak_) {
      peak_ = total;
      at_peak_ = live_;
      moment_ = fmt::format("{}: {} of {} allocated", e.in_backward ? "backward" : "forward",
                            fsdp_buffer_name(e.buffer), *e.unit);
    }
  }
  std::int64_t unsharded_parameters() const { return at_peak_[0]; }
  std::int64_t unsharded_gradients() const { return at_peak_[1]; }
  std::int64_t comm_buffers() const { return at_peak_[2]; }
  const std::string& moment() const { return moment_; }

 private:
  static int category(FsdpBuffer b) {
    switch (b) {
      case FsdpBuffer::unsharded_params:
      case FsdpBuffer::post_forward_slice: return 0;
      case FsdpBuffer::unsharded_grads: return 1;
      default: return 2;  // all-gather, staging, reduce-scatter, reduction scratch
    }
  }
  std::array<std::int64_t, 3> live_{}, at_peak_{};
  std::int64_t peak_ = 0;
  std::string moment_ = "no unsharded memory";
};

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

}  // namespace

std::string bytes_text(std::int64_t bytes) {
  if (bytes >= (std::int64_t{1} << 30)) return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
  return fmt::format("{:.1f} MiB", mib(bytes));
}

std::int64_t MemoryPlan::largest_micro_batch(std::int64_t bytes) const {
  if (per_sequence_bytes <= 0 || bytes <= fixed_bytes()) return 0;
  return (bytes - fixed_bytes()) / per_sequence_bytes;
}

namespace {

// The model on meta, sharded on a planning mesh as a launch of `ranks` would shard it.
struct PlannedModel {
  std::unique_ptr<LanguageModel> shapes;
  std::unique_ptr<Parallelism> par;
  MemoryPlan plan;
};

// The mesh, the units and the model states (parameters, gradients, optimizer state): what building the model
// needs, and no batch. `shapes`: the model to shard (a pipeline stage's), or null for the deck's whole model.
PlannedModel plan_sharding(const Deck& deck, int ranks, std::unique_ptr<LanguageModel> shapes = nullptr) {
  FSDPP_REQUIRE(ranks >= 1, "--ranks is {}; it must be at least 1", ranks);
  PlannedModel out;
  // Shapes only: a model on meta allocates nothing, and its groups run dry on a planning mesh.
  out.shapes = shapes ? std::move(shapes) : make_model(deck);
  out.par = parallelize_for_planning(*out.shapes, deck, ranks);
  MemoryPlan& plan = out.plan;
  plan.ranks = ranks;
  plan.strategy = std::string(to_string(deck.fsdp.strategy));
  plan.forward_prefetch = deck.fsdp.forward_prefetch;
  plan.backward_prefetch = deck.fsdp.backward_prefetch;
  plan.reduce_scatter_in_flight = deck.comm.overlap;
  plan.mesh = out.par->mesh().shape();
  plan.shard_ranks = plan.mesh.back().size;
  PlannedMemory& m = plan.memory;
  for (const UnitSummary& u : out.par->units()) {
    PlannedUnit unit;
    unit.name = u.name;
    unit.parameters = u.parameters;
    unit.sharded_bytes = u.sharded_numel * 4;
    unit.unsharded_bytes = u.unsharded_numel * 4;
    plan.units.push_back(unit);
    m.parameters += unit.sharded_bytes;
  }
  m.gradients = m.parameters;
  m.optimizer = optimizer_state_copies(deck.optim) * m.parameters;
  return out;
}

// mesh.cp > 1: what the attention ring sends per rank and step (ContextParallelGroup::ring_bytes_per_step).
std::int64_t ring_bytes(const Deck& deck, const Parallelism& par, const MemoryPlan& plan) {
  const int cp = par.layout().cp;
  if (cp <= 1) return 0;
  const int kv_width = ContextParallelGroup::kv_width_of(deck.model, par.layout().tp);
  return plan.accum_steps * static_cast<std::int64_t>(ContextParallelGroup::ring_bytes_per_step(
                                cp, plan.micro_batch, deck.model.context_length / cp, kv_width, deck.model.n_layer));
}

// One training step of fully_shard's real schedule, dry (`passes` runs the model's forwards and backwards on a
// flow of the plan's micro-batch): its events are the unsharded memory.
// Hands a listener the events of the second dry step only (run_dry_step).
struct SecondStepOnly : FsdpMemoryListener {
  SecondStepOnly(std::shared_ptr<FsdpMemoryListener> memory, std::shared_ptr<FsdpMemoryListener> schedule)
      : memory(std::move(memory)), schedule(std::move(schedule)) {}
  void on_memory(const FsdpMemoryEvent& event) override {
    if (!listening) return;
    memory->on_memory(event);
    if (schedule) schedule->on_memory(event);
  }
  void on_schedule(const FsdpScheduleEvent& event) override {
    if (!listening) return;
    memory->on_schedule(event);
    if (schedule) schedule->on_schedule(event);
  }
  std::shared_ptr<FsdpMemoryListener> memory, schedule;
  bool listening = false;
};

template <class Passes>
void run_dry_step(PlannedModel& planned, std::shared_ptr<FsdpMemoryListener> schedule, const Passes& passes) {
  MemoryPlan& plan = planned.plan;
  Parallelism& par = *planned.par;
  PlannedMemory& m = plan.memory;
  Flow flow;
  flow.B = plan.micro_batch;
  flow.T = planned.shapes->context_length();
  auto step = [&] {
    passes(flow);
    if (par.layout().exact_reduction)  // as TrainStep does before the optimizer
      finish_exact_gradients(par.root().module(), std::int64_t{plan.accum_steps} * par.data_parallel_size());
    else
      finish_gradient_reduction(par.root().module());
  };
  // A first step fills the buffer pool as training's first does; the step after it, the one the listeners hear,
  // can still grow it where the first step's blocks serve its requests in another order.
  auto peak = std::make_shared<PeakOfEvents>();
  auto second = std::make_shared<SecondStepOnly>(peak, std::move(schedule));
  par.root().add_memory_listener(second);
  step();
  second->listening = true;
  step();
  m.unsharded_parameters = peak->unsharded_parameters();
  m.unsharded_gradients = peak->unsharded_gradients();
  m.comm_buffers = peak->comm_buffers();
  // The dry groups ran the buffer pool's rule too: what it reserves beyond the live peak is cached free blocks.
  const FsdpStats pool = fsdp_stats(par.root().module());
  m.pool_cached = pool.pool_peak_reserved_bytes - pool.pool_peak_live_bytes;
  plan.peak_moment = peak->moment();
}

// One training step on top: the batch split, activations, and fully_shard's unsharded memory at its peak.
void plan_training_step(const Deck& deck, PlannedModel& planned, std::shared_ptr<FsdpMemoryListener> schedule) {
  MemoryPlan& plan = planned.plan;
  LanguageModel& shapes = *planned.shapes;
  Parallelism& par = *planned.par;
  grad_accum_steps(deck.train, par.data_parallel_size());  // the deck's split (reproducible mode too)
  plan.micro_batch = training_forward_batch(deck.train);   // reproducible mode: a unit per pass
  plan.accum_steps = grad_accum_steps(deck.train.global_batch, plan.micro_batch, par.data_parallel_size());
  PlannedMemory& m = plan.memory;
  const int T = deck.model.context_length;
  // parallelize_for_planning set which blocks recompute in backward, as training will.
  plan.recomputing_blocks = shapes.recomputing_blocks();
  m.activations = shapes.activation_bytes_for(plan.micro_batch, T, plan.recomputing_blocks);
  plan.activations_without_checkpointing = shapes.activation_bytes_for(plan.micro_batch, T, 0);
  m.batch = std::int64_t{2} * plan.micro_batch * T * 4;
  plan.per_sequence_bytes = shapes.activation_bytes_for(1, T, plan.recomputing_blocks) + std::int64_t{2} * T * 4;
  plan.ring_bytes_per_step = ring_bytes(deck, par, plan);
  run_dry_step(planned, std::move(schedule), [&](Flow& flow) {
    for (int a = 0; a < plan.accum_steps; ++a) {
      par.before_micro_batch(a, plan.accum_steps);
      shapes.dry_run(flow, Pass::forward);
      shapes.dry_run(flow, Pass::backward);
    }
  });
}

// A pipeline stage's step: pipeline rank `stage`'s actions in its schedule's order, each on its chunk, with the
// gradient synchronization and the parameters kept whole between micro-batches as train/pipeline_step.cpp runs
// them; the activation slots its chunks fill and the messages it keeps, counted as that file allocates them.
void plan_stage_step_memory(const Deck& deck, PlannedModel& planned, int stage,
                            std::shared_ptr<FsdpMemoryListener> schedule) {
  MemoryPlan& plan = planned.plan;
  LanguageModel& shapes = *planned.shapes;
  Parallelism& par = *planned.par;
  PlannedMemory& m = plan.memory;
  const int pp = deck.mesh.pp, v = deck.pipeline.virtual_stages, T = deck.model.context_length;
  plan.micro_batch = training_forward_batch(deck.train);
  plan.accum_steps = grad_accum_steps(deck.train.global_batch, plan.micro_batch, par.data_parallel_size());
  plan.pipeline_stage = stage;
  const PipelineShape shape{pp, v, plan.accum_steps};
  const PipelineSchedule every_rank = make_pipeline_schedule(deck.pipeline.schedule, shape);
  const std::vector<PipelineAction>& actions = every_rank[sz(stage)];
  // Slots per chunk: the most of its micro-batches in flight at once.
  // Stashes per chunk: the most of its micro-batches between their I and their W (pipeline_step.cpp makes one each).
  std::vector<int> slots(sz(v), 0), in_flight(sz(v), 0), stashes(sz(v), 0), pending(sz(v), 0);
  for (const PipelineAction& a : actions) {
    const std::size_t c = sz(a.stage / pp);
    if (a.op == PipelineOp::forward) slots[c] = std::max(slots[c], ++in_flight[c]);
    else if (a.op == PipelineOp::backward_input) stashes[c] = std::max(stashes[c], ++pending[c]);
    else --in_flight[c];
    if (a.op == PipelineOp::backward_weight) --pending[c];
  }
  plan.pipeline_stashes = stashes;
  auto stash_bytes = [&](int B) {
    std::int64_t bytes = 0;
    for (int c = 0; c < v; ++c) {
      shapes.select_pipeline_chunk(c);
      bytes += stashes[sz(c)] * shapes.weight_stash_elements(B, T) * 4;
    }
    shapes.select_pipeline_chunk(0);
    return bytes;
  };
  plan.pipeline_slots = slots;
  // Messages kept: a received input per slot of each stage after the first, and
  // one output gradient buffer where a stage before the last runs.
  int messages = 0;
  bool gradient = false;
  for (int c = 0; c < v; ++c) {
    const int s = c * pp + stage;
    if (s > 0) messages += slots[sz(c)];
    gradient = gradient || s < pp * v - 1;
  }
  messages += gradient ? 1 : 0;
  auto residual_bytes = [&](int B) { return static_cast<std::int64_t>(shapes.residual_elements(B, T)) * 4; };
  // The transport's own buffers, where they are Views of the compute memory: one message each (the residual stream
  // and a mixture of experts' router statistics), as pipeline_transport.cpp keeps them.
  const int kept = PipelineTransport::buffers_in_compute_memory(choose_backend(deck.comm.backend))
                       ? PipelineTransport::kept_buffers(actions, shape,
                                                         plan_pipeline_messages(every_rank, shape)[sz(stage)])
                       : 0;
  const std::size_t payload_doubles = shapes.pipeline_payload_size();
  auto kept_bytes = [&](int B) {
    return kept * static_cast<std::int64_t>(PipelineTransport::message_floats(shapes.residual_elements(B, T),
                                                                               payload_doubles)) * 4;
  };
  plan.recomputing_blocks = shapes.recomputing_blocks();
  m.activations = shapes.activation_split(plan.micro_batch, T, plan.recomputing_blocks).with_slots(slots);
  plan.activations_without_checkpointing = shapes.activation_split(plan.micro_batch, T, 0).with_slots(slots);
  plan.pipeline_message_bytes = residual_bytes(plan.micro_batch);
  m.pipeline_messages = messages * plan.pipeline_message_bytes + kept_bytes(plan.micro_batch);
  m.weight_stash = stash_bytes(plan.micro_batch);
  m.batch = std::int64_t{2} * plan.micro_batch * T * 4;
  plan.per_sequence_bytes = shapes.activation_split(1, T, plan.recomputing_blocks).with_slots(slots) +
                            messages * residual_bytes(1) + kept_bytes(1) + stash_bytes(1) + std::int64_t{2} * T * 4;
  plan.ring_bytes_per_step = ring_bytes(deck, par, plan);
  PipelineGradientSync sync(actions, pp, plan.accum_steps);
  WeightGradientStash stash;  // a dry run records nothing in it: set, it marks an I for fully_shard's listeners
  run_dry_step(planned, std::move(schedule), [&](Flow& flow) {
    for (std::size_t k = 0; k < actions.size(); ++k) {
      const PipelineAction& a = actions[k];
      shapes.select_pipeline_chunk(a.stage / pp);
      if (a.op == PipelineOp::forward) {
        shapes.dry_run(flow, Pass::forward);
        continue;
      }
      sync.before(par, k);
      flow.weight_stash = a.op == PipelineOp::backward_input ? &stash : nullptr;
      shapes.dry_run(flow, a.op == PipelineOp::backward_weight ? Pass::backward_weight : Pass::backward);
      flow.weight_stash = nullptr;
    }
    shapes.select_pipeline_chunk(0);
  });
}

}  // namespace

MemoryPlan plan_stage_memory(const Deck& deck, int ranks, int stage, std::shared_ptr<FsdpMemoryListener> schedule) {
  check_job_size(deck.mesh, ranks);
  check_pipeline(deck.model, deck.mesh, deck.pipeline);
  const int pp = deck.mesh.pp;
  FSDPP_REQUIRE(pp > 1 && stage >= 0 && stage < pp, "pipeline stage {} of mesh.pp {}", stage, pp);
  std::unique_ptr<LanguageModel> shapes = make_model(deck);
  const StageSplit split = split_stages(shapes->flops_per_token_by_piece(deck.model.context_length),
                                        pp * deck.pipeline.virtual_stages, deck.pipeline.split);
  shapes->keep_pipeline_stage(pipeline_stage_part(split, pp, stage));
  PlannedModel planned = plan_sharding(pipeline_stage_deck(deck), ranks / pp, std::move(shapes));
  plan_stage_step_memory(deck, planned, stage, std::move(schedule));
  return std::move(planned.plan);
}

MemoryPlan plan_model_states(const Deck& deck, int ranks) { return plan_sharding(deck, ranks).plan; }

MemoryPlan plan_memory(const Deck& deck, int ranks, std::shared_ptr<FsdpMemoryListener> schedule) {
  PlannedModel planned = plan_sharding(deck, ranks);
  plan_training_step(deck, planned, std::move(schedule));
  return std::move(planned.plan);
}

std::int64_t parse_byte_size(std::string_view text, std::string_view what) {
  std::string s(text);
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }), s.end());
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  if (unit.size() > 1 && unit.back() == 'b') unit.pop_back();  // "GiB", "GB" and "G" all mean 2^30 here
  if (unit.size() > 1 && unit.back() == 'i') unit.pop_back();
  const std::string units = "kmgtp";
  double scale = 1;
  if (unit == "b") unit.clear();
  if (!unit.empty()) {
    const auto at = units.find(unit);
    if (unit.size() != 1 || at == std::string::npos) value = -1;
    else scale = std::pow(1024.0, static_cast<double>(at + 1));
  }
  FSDPP_REQUIRE(used > 0 && value > 0 && std::isfinite(value * scale) && value * scale < 9e18,
                "{} '{}' is not a memory size; write a positive number with a binary unit, e.g. 80GiB, 512MiB or "
                "1.5TiB", what, text);
  return static_cast<std::int64_t>(value * scale);
}

std::string largest_micro_batch_text(const Deck& deck, const MemoryPlan& plan, std::int64_t mem_per_rank) {
  const std::int64_t largest = plan.largest_micro_batch(mem_per_rank);
  const std::int64_t per_rank = deck.train.global_batch / plan.ranks;
  std::int64_t usable = 0;  // the largest that also divides this rank's share of the global batch
  for (std::int64_t b = std::min(largest, per_rank); b >= 1 && !usable; --b)
    if (per_rank % b == 0) usable = b;
  if (largest == 0)
    return fmt::format("largest micro-batch that fits in {}: none; the model states alone need {}; use more ranks",
                       bytes_text(mem_per_rank), bytes_text(plan.fixed_bytes() + plan.per_sequence_bytes));
  return fmt::format("largest micro-batch that fits in {}: {} sequences; with train.global_batch {} on {} ranks "
                     "({} per rank) use train.micro_batch {}",
                     bytes_text(mem_per_rank), largest, deck.train.global_batch, plan.ranks, per_rank, usable);
}

std::string format_memory_plan(const Deck& deck, const MemoryPlan& plan, std::optional<std::int64_t> mem_per_rank) {
  const int T = deck.model.context_length;
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  std::int64_t parameters = 0;
  for (const PlannedUnit& u : plan.units) parameters += u.parameters;
  line(fmt::format("model: {}, {} parameters", make_model(deck.model)->describe(), parameters));
  std::string mesh;
  for (const MeshDim& d : plan.mesh) mesh += fmt::format("{}{}={}", mesh.empty() ? "" : " x ", d.name, d.size);
  line(fmt::format("mesh: {} ({} ranks, fsdp.strategy {}, reshard_after_forward {}, param {} / reduce {})",
                   mesh.empty() ? "none" : mesh, plan.ranks, plan.strategy, to_string(deck.fsdp.reshard_after_forward),
                   dtype_name(deck.fsdp.param_dtype), dtype_name(deck.fsdp.reduce_dtype)));
  line(fmt::format("{}", schedule_text(plan.forward_prefetch, plan.backward_prefetch, plan.reduce_scatter_in_flight)));
  int same_sequences = 1;  // the tp and cp ranks of one data-parallel rank read the same sequences
  for (const MeshDim& d : plan.mesh) same_sequences *= d.name == "tp" || d.name == "cp" ? d.size : 1;
  line(fmt::format("batch: {} sequences x {} tokens per step; {} data-parallel rank(s) x {} micro-batch(es) of {}{}",
                   deck.train.global_batch, T, plan.ranks / same_sequences, plan.accum_steps, plan.micro_batch,
                   deck.mesh.cp > 1 ? fmt::format(" (each rank {} tokens of each: mesh.cp {})", T / deck.mesh.cp,
                                                  deck.mesh.cp) : std::string()));
  line("");
  line(plan.shard_ranks == 1 && plan.ranks > 1 ? "Units (no_shard: replicated on every rank, DDP), per rank:"
                                               : "FSDP units (fully_shard per block, then the root), per rank:");
  line(fmt::format("  {:<12} {:>12} {:>14} {:>16}", "unit", "parameters", "sharded MiB", "unsharded MiB"));
  for (const PlannedUnit& u : plan.units)
    line(fmt::format("  {:<12} {:>12} {:>14.2f} {:>16.2f}", u.name, u.parameters, mib(u.sharded_bytes), mib(u.unsharded_bytes)));
  line("");
  const PlannedMemory& m = plan.memory;
  line("Per-rank memory at the step's peak (MiB):");
  auto row = [&](const std::string& what, std::int64_t bytes) { line(fmt::format("  {:<61} {:>10.1f}", what, mib(bytes))); };
  row("sharded parameters (f32)", m.parameters);
  row("gradients (f32)", m.gradients);
  row(deck.optim.name == OptimizerKind::adamw ? "optimizer state (AdamW m, v; f32)" : "optimizer state (SGD momentum; f32)", m.optimizer);
  row("unsharded parameters (whole, gathered)", m.unsharded_parameters);
  row("unsharded gradients (whole, before reduce-scatter)", m.unsharded_gradients);
  row(plan.reduce_scatter_in_flight ? "communication buffers (all-gather, reduce-scatter in flight)"
                                    : "communication buffers (all-gather, reduce-scatter)", m.comm_buffers);
  row("cached in fully_shard's buffer pool (reserved, free)", m.pool_cached);
  std::string slots;  // a pipeline stage keeps the activations of each micro-batch in flight
  for (int k : plan.pipeline_slots) slots += fmt::format("{}{}", slots.empty() ? "" : " + ", k);
  row(plan.pipeline_slots.empty()
          ? fmt::format("activations and backward scratch ({} sequences)", plan.micro_batch)
          : fmt::format("activations ({} sequences x {} micro-batches in flight)", plan.micro_batch, slots),
      m.activations);
  row("batch tokens and targets", m.batch);
  if (plan.pipeline_stage >= 0)
    row("pipeline messages (inputs in flight, output gradient, transport buffers)", m.pipeline_messages);
  if (m.weight_stash > 0)
    row(fmt::format("weight-gradient stashes ({} micro-batches between I and W)", fmt::join(plan.pipeline_stashes, " + ")),
        m.weight_stash);
  line(fmt::format("  {:<61} {:>10}", "", "----------"));
  std::string verdict;
  if (mem_per_rank)
    verdict = fmt::format("   of {} per rank: {} ({:.0f}%)", bytes_text(*mem_per_rank),
                          m.total() <= *mem_per_rank ? "fits" : "DOES NOT FIT", 100.0 * m.total() / *mem_per_rank);
  line(fmt::format("  {:<61} {:>10.1f}{}", "total per rank", mib(m.total()), verdict));
  line(fmt::format("peak: {}", plan.peak_moment));
  if (plan.recomputing_blocks > 0)
    line(fmt::format("activation checkpointing {} ({} of {} blocks recompute in backward): activations {:.1f} MiB "
                     "instead of {:.1f} MiB, {:.1f} MiB saved; their forward runs again in backward",
                     to_string(deck.train.activation_checkpointing), plan.recomputing_blocks, deck.model.n_layer,
                     mib(m.activations), mib(plan.activations_without_checkpointing),
                     mib(plan.activations_without_checkpointing - m.activations)));
  if (const GemmPrecision g = resolved_gemm_precision(deck); g == GemmPrecision::bf16 || (g == GemmPrecision::tf32 && !tf32_is_native()))
    line(fmt::format("not counted: {} GEMMs pack their rounded inputs into scratch that grows to the largest "
                     "product's (M + N) x 512 values (tensor/matmul.cpp); matmul.precision=f32 has none",
                     gemm_precision_name(g)));
  line(fmt::format("each sequence per micro-batch adds {:.2f} MiB (activations {:.2f} MiB, tokens {:.3f} MiB)",
                   mib(plan.per_sequence_bytes), mib(plan.per_sequence_bytes - 2 * T * 4),
                   mib(2 * T * 4)));
  if (plan.ring_bytes_per_step > 0)
    line(fmt::format("context parallel ring: {:.2f} MiB sent per rank and step (per layer and micro-batch: {} hops "
                     "forward, {} of key/value blocks and {} of their gradients backward)",
                     mib(plan.ring_bytes_per_step), deck.mesh.cp - 1, deck.mesh.cp - 1, deck.mesh.cp));
  if (mem_per_rank) line(largest_micro_batch_text(deck, plan, *mem_per_rank));
  line("Not counted: host memory for the data (token windows), MPI's own buffers, checkpoint staging, and the CUDA "
       "context on GPU builds.");
  return out;
}

}  // namespace fsdpp
