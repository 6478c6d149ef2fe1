#include "fsdpp/train/memory_plan.hpp"

#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/train/build_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>

namespace fsdpp {
namespace {

enum Category { kUnshardedParams, kUnshardedGrads, kCommBuffers, kCategories };

// One FSDP group as the replay sees it: sizes, and which of its transient buffers are live.
struct ReplayGroup {
  std::string name;
  std::int64_t slot = 0;  // elements per rank (sum of padded pieces)
  bool is_root = false;
  bool reshard_after_forward = true;
  bool gather_started = false, unsharded = false, grads_unsharded = false;
  std::int64_t gather_bytes = 0, post_forward_bytes = 0;
};

// Replays fully_shard's allocations and frees for one step (FsdpGroup::before/after, fully_shard.cpp) and
// keeps the high-water mark of their sum, with what it was made of and when it happened.
class StepReplay {
 public:
  StepReplay(std::vector<ReplayGroup> groups, int ranks, const Deck& deck)
      : groups_(std::move(groups)), ranks_(ranks), param_bytes_(dtype_size(deck.fsdp.param_dtype)),
        reduce_bytes_(dtype_size(deck.fsdp.reduce_dtype)), offload_(deck.fsdp.offload == OffloadPolicy::cpu),
        keep_ranks_(deck.fsdp.reshard_after_forward.kind == ReshardAfterForward::Kind::group
                        ? deck.fsdp.reshard_after_forward.group_size : 0) {}

  void run(int accum_steps, bool accumulate_unsharded) {
    // Unsharded accumulation keeps whole gradients from one micro-batch to the next: replaying one micro-batch
    // without sync and one with it covers every case.
    const int replayed = std::min(accum_steps, 2);
    for (int a = 0; a < replayed; ++a) micro_batch(!accumulate_unsharded || a == replayed - 1);
  }
  std::array<std::int64_t, kCategories> at_peak() const { return at_peak_; }
  const std::string& peak_moment() const { return peak_moment_; }

 private:
  ReplayGroup& root() { return groups_.front(); }

  void micro_batch(bool sync) {
    forward_order_.clear();
    in_backward_ = false;
    before_forward(0);
    for (std::size_t b = 1; b < groups_.size(); ++b) {
      before_forward(b);
      after_forward(b);
    }
    after_forward(0);
    in_backward_ = true;
    before_backward(0);
    for (std::size_t b = groups_.size(); b-- > 1;) {
      before_backward(b);
      after_backward(b, sync);
    }
    after_backward(0, sync);
  }

  void allocate(Category c, std::int64_t bytes, const std::string& moment) {
    live_[c] += bytes;
    const std::int64_t total = live_[0] + live_[1] + live_[2];
    if (total > peak_) {
      peak_ = total;
      at_peak_ = live_;
      peak_moment_ = moment;
    }
  }
  void release(Category c, std::int64_t bytes) { live_[c] -= bytes; }

  std::string pass() const { return in_backward_ ? "backward" : "forward"; }

  void start_all_gather(ReplayGroup& g) {
    const std::int64_t kept = in_backward_ ? g.post_forward_bytes : 0;
    g.gather_bytes = g.slot * ranks_ * param_bytes_;
    allocate(kCommBuffers, g.gather_bytes, fmt::format("{}: all-gather of {} issued", pass(), g.name));
    if (offload_ && !kept) {  // shards staged from host memory, freed once packed
      allocate(kCommBuffers, g.slot * 4, fmt::format("{}: {}'s shards staged for its all-gather", pass(), g.name));
      release(kCommBuffers, g.slot * 4);
    }
    g.gather_started = true;
  }
  void wait_for_unshard(ReplayGroup& g) {
    if (g.unsharded) return;
    if (!g.gather_started) start_all_gather(g);
    allocate(kUnshardedParams, g.slot * ranks_ * 4, fmt::format("{}: {} copied out of its all-gather", pass(), g.name));
    release(kCommBuffers, g.gather_bytes);
    release(kUnshardedParams, g.post_forward_bytes);
    g.gather_bytes = g.post_forward_bytes = 0;
    g.gather_started = false;
    g.unsharded = true;
  }
  void reshard(ReplayGroup& g) {
    if (g.gather_started) wait_for_unshard(g);
    if (!g.unsharded) return;
    release(kUnshardedParams, g.slot * ranks_ * 4);
    g.unsharded = false;
  }
  void prefetch(std::size_t target) {
    if (target < groups_.size() && !groups_[target].unsharded && !groups_[target].gather_started)
      start_all_gather(groups_[target]);
  }

  void before_forward(std::size_t i) {
    wait_for_unshard(groups_[i]);
    prefetch(i + 1);  // module-tree order: the root, then each block
  }
  void after_forward(std::size_t i) {
    ReplayGroup& g = groups_[i];
    forward_order_.push_back(i);
    if (keep_ranks_ > 1 && keep_ranks_ < ranks_ && !g.is_root) {
      g.post_forward_bytes = ranks_ / keep_ranks_ * g.slot * param_bytes_;
      allocate(kUnshardedParams, g.post_forward_bytes, fmt::format("forward: {} keeps its 1/{} slice", g.name, keep_ranks_));
    }
    if (g.reshard_after_forward) reshard(g);
  }
  void before_backward(std::size_t i) {
    ReplayGroup& g = groups_[i];
    wait_for_unshard(g);
    if (!g.grads_unsharded)
      allocate(kUnshardedGrads, g.slot * ranks_ * 4, fmt::format("backward: {}'s whole gradients allocated", g.name));
    g.grads_unsharded = true;
    // The group that finished forward just before this one runs backward just after it.
    const auto it = std::find(forward_order_.begin(), forward_order_.end(), i);
    if (it != forward_order_.end() && it != forward_order_.begin()) prefetch(*(it - 1));
  }
  void after_backward(std::size_t i, bool sync) {
    ReplayGroup& g = groups_[i];
    if (sync) {
      const std::int64_t flat = g.slot * ranks_ * reduce_bytes_, shard = g.slot * reduce_bytes_;
      allocate(kCommBuffers, flat + shard, fmt::format("backward: {}'s reduce-scatter buffers packed", g.name));
      release(kUnshardedGrads, g.slot * ranks_ * 4);
      allocate(kCommBuffers, g.slot * 4, fmt::format("backward: {}'s reduce-scatter output widened", g.name));
      release(kCommBuffers, flat + shard + g.slot * 4);
      g.grads_unsharded = false;
    }
    reshard(g);
    if (g.is_root)
      for (ReplayGroup& other : groups_)
        if (!other.is_root) reshard(other);
  }

  std::vector<ReplayGroup> groups_;  // root first, then the blocks: FsdpContext::groups
  std::vector<std::size_t> forward_order_;
  int ranks_;
  std::int64_t param_bytes_, reduce_bytes_;
  bool offload_;
  int keep_ranks_;
  bool in_backward_ = false;
  std::array<std::int64_t, kCategories> live_{}, at_peak_{};
  std::int64_t peak_ = 0;
  std::string peak_moment_ = "no unsharded memory";
};

std::int64_t padded_shard_numel(const Parameter& p, int ranks) { return chunk_rows(p.rows(), ranks) * p.row_size(); }

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

std::string bytes_text(std::int64_t bytes) {
  if (bytes >= (std::int64_t{1} << 30)) return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
  return fmt::format("{:.1f} MiB", mib(bytes));
}

}  // namespace

std::int64_t MemoryPlan::largest_micro_batch(std::int64_t bytes) const {
  if (per_sequence_bytes <= 0 || bytes <= fixed_bytes()) return 0;
  return (bytes - fixed_bytes()) / per_sequence_bytes;
}

MemoryPlan plan_memory(const Deck& deck, int ranks) {
  FSDPP_REQUIRE(ranks >= 1, "--ranks is {}; it must be at least 1", ranks);
  MemoryPlan plan;
  plan.ranks = ranks;
  plan.strategy = std::string(to_string(deck.fsdp.strategy));
  const bool sharded = deck.fsdp.strategy != ShardStrategy::no_shard;
  int data_parallel = ranks;
  if (sharded) {
    plan.mesh = resolve_mesh_shape(deck.mesh.dims(), ranks);
    FSDPP_REQUIRE(deck.fsdp.strategy != ShardStrategy::hybrid_shard || plan.mesh.size() == 2,
                  "fsdp.strategy hybrid_shard needs a 2-D mesh: set mesh.dp_replicate (and mesh.dp_shard)");
    FSDPP_REQUIRE(deck.fsdp.strategy == ShardStrategy::hybrid_shard || plan.mesh.size() == 1,
                  "mesh.dp_replicate is set, which makes a 2-D mesh: use fsdp.strategy hybrid_shard, or remove "
                  "mesh.dp_replicate");
    plan.shard_ranks = plan.mesh.back().size;
    const auto& raf = deck.fsdp.reshard_after_forward;
    FSDPP_REQUIRE(raf.kind != ReshardAfterForward::Kind::group || plan.shard_ranks % raf.group_size == 0,
                  "fsdp.reshard_after_forward = {} must divide the {} ranks of the shard group", raf.group_size,
                  plan.shard_ranks);
  }
  plan.micro_batch = deck.train.micro_batch;
  plan.accum_steps = grad_accum_steps(deck.train, data_parallel);

  // Shapes only: a model on meta allocates nothing.
  Gpt shapes(model_config(deck.model));
  const int R = plan.shard_ranks;
  std::vector<ReplayGroup> groups;
  auto add_unit = [&](const std::string& name, const std::vector<Parameter*>& params, bool is_root) {
    PlannedUnit u;
    u.name = name;
    std::int64_t slot = 0;
    for (const Parameter* p : params) {
      u.parameters += p->numel();
      slot += sharded ? padded_shard_numel(*p, R) : p->numel();
    }
    u.sharded_bytes = slot * 4;
    u.unsharded_bytes = sharded ? slot * R * 4 : slot * 4;
    plan.units.push_back(u);
    ReplayGroup g;
    g.name = name;
    g.slot = slot;
    g.is_root = is_root;
    const auto kind = deck.fsdp.reshard_after_forward.kind;
    g.reshard_after_forward = !is_root && deck.fsdp.strategy != ShardStrategy::shard_grad_op &&
                              kind != ReshardAfterForward::Kind::no &&
                              !(kind == ReshardAfterForward::Kind::group && deck.fsdp.reshard_after_forward.group_size == 1);
    groups.push_back(g);
  };
  std::vector<Parameter*> root_params;
  for (Parameter* p : shapes.parameters(false)) root_params.push_back(p);
  for (Block* b : shapes.blocks()) add_unit(b->display_name(), b->parameters(true), false);
  add_unit(shapes.display_name(), root_params, true);

  PlannedMemory& m = plan.memory;
  for (const PlannedUnit& u : plan.units) m.parameters += u.sharded_bytes;
  m.gradients = m.parameters;
  m.optimizer = deck.optim.name == OptimizerKind::adamw ? 2 * m.parameters
                                                        : (deck.optim.momentum != 0 ? m.parameters : 0);
  const int T = deck.model.context_length;
  m.activations = Gpt::activation_bytes_for(shapes.config(), plan.micro_batch, T);
  m.batch = std::int64_t{2} * plan.micro_batch * T * 4;
  plan.per_sequence_bytes = Gpt::activation_bytes_for(shapes.config(), 1, T) + std::int64_t{2} * T * 4;

  if (sharded) {
    // The replay wants FsdpContext's order: the root first, then the blocks.
    std::rotate(groups.begin(), groups.end() - 1, groups.end());
    StepReplay replay(std::move(groups), R, deck);
    replay.run(plan.accum_steps, deck.fsdp.accumulate == GradAccumulation::unsharded);
    const auto peak = replay.at_peak();
    m.unsharded_parameters = peak[kUnshardedParams];
    m.unsharded_gradients = peak[kUnshardedGrads];
    m.comm_buffers = peak[kCommBuffers];
    plan.peak_moment = replay.peak_moment();
  } else {
    plan.peak_moment = "no_shard: every rank holds whole parameters; gradients are all-reduced in place";
  }
  return plan;
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

std::string format_memory_plan(const Deck& deck, const MemoryPlan& plan, std::optional<std::int64_t> mem_per_rank) {
  const GptConfig c = model_config(deck.model);
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  std::int64_t parameters = 0;
  for (const PlannedUnit& u : plan.units) parameters += u.parameters;
  line(fmt::format("model: GPT-2, V {} T {} C {} L {} NH {} ({} embeddings), {} parameters", c.vocab_size,
                   c.context_length, c.n_embd, c.n_layer, c.n_head, c.tie_embeddings ? "tied" : "untied", parameters));
  std::string mesh;
  for (const MeshDim& d : plan.mesh) mesh += fmt::format("{}{}={}", mesh.empty() ? "" : " x ", d.name, d.size);
  line(fmt::format("mesh: {} ({} ranks, fsdp.strategy {}, reshard_after_forward {}, param {} / reduce {})",
                   mesh.empty() ? "none" : mesh, plan.ranks, plan.strategy, to_string(deck.fsdp.reshard_after_forward),
                   dtype_name(deck.fsdp.param_dtype), dtype_name(deck.fsdp.reduce_dtype)));
  line(fmt::format("batch: {} sequences x {} tokens per step; {} rank(s) x {} micro-batch(es) of {}",
                   deck.train.global_batch, c.context_length, plan.ranks, plan.accum_steps, plan.micro_batch));
  line("");
  line(plan.mesh.empty() ? "Units (no_shard: replicated on every rank):" : "FSDP units (fully_shard per block, then the root), per rank:");
  line(fmt::format("  {:<12} {:>12} {:>14} {:>16}", "unit", "parameters", "sharded MiB", "unsharded MiB"));
  for (const PlannedUnit& u : plan.units)
    line(fmt::format("  {:<12} {:>12} {:>14.2f} {:>16.2f}", u.name, u.parameters, mib(u.sharded_bytes), mib(u.unsharded_bytes)));
  line("");
  const PlannedMemory& m = plan.memory;
  line("Per-rank memory at the step's peak (MiB):");
  auto row = [&](const std::string& what, std::int64_t bytes) { line(fmt::format("  {:<52} {:>10.1f}", what, mib(bytes))); };
  row("sharded parameters (f32)", m.parameters);
  row("gradients (f32)", m.gradients);
  row(deck.optim.name == OptimizerKind::adamw ? "optimizer state (AdamW m, v; f32)" : "optimizer state (SGD momentum; f32)", m.optimizer);
  row("unsharded parameters (whole, gathered)", m.unsharded_parameters);
  row("unsharded gradients (whole, before reduce-scatter)", m.unsharded_gradients);
  row("communication buffers (all-gather, reduce-scatter)", m.comm_buffers);
  row(fmt::format("activations and backward scratch ({} sequences)", plan.micro_batch), m.activations);
  row("batch tokens and targets", m.batch);
  line(fmt::format("  {:<52} {:>10}", "", "----------"));
  std::string verdict;
  if (mem_per_rank)
    verdict = fmt::format("   of {} per rank: {} ({:.0f}%)", bytes_text(*mem_per_rank),
                          m.total() <= *mem_per_rank ? "fits" : "DOES NOT FIT", 100.0 * m.total() / *mem_per_rank);
  line(fmt::format("  {:<52} {:>10.1f}{}", "total per rank", mib(m.total()), verdict));
  line(fmt::format("peak: {}", plan.peak_moment));
  line(fmt::format("each sequence per micro-batch adds {:.2f} MiB (activations {:.2f} MiB, tokens {:.3f} MiB)",
                   mib(plan.per_sequence_bytes), mib(plan.per_sequence_bytes - 2 * c.context_length * 4),
                   mib(2 * c.context_length * 4)));
  if (mem_per_rank) {
    const std::int64_t largest = plan.largest_micro_batch(*mem_per_rank);
    const std::int64_t per_rank = deck.train.global_batch / plan.ranks;
    std::int64_t usable = 0;  // the largest that also divides this rank's share of the global batch
    for (std::int64_t b = std::min(largest, per_rank); b >= 1 && !usable; --b)
      if (per_rank % b == 0) usable = b;
    if (largest == 0)
      line(fmt::format("largest micro-batch that fits in {}: none; the model states alone need {}; use more ranks",
                       bytes_text(*mem_per_rank), bytes_text(plan.fixed_bytes() + plan.per_sequence_bytes)));
    else
      line(fmt::format("largest micro-batch that fits in {}: {} sequences; with train.global_batch {} on {} ranks "
                       "({} per rank) use train.micro_batch {}",
                       bytes_text(*mem_per_rank), largest, deck.train.global_batch, plan.ranks, per_rank, usable));
  }
  line("Not counted: host memory for the data (token windows), MPI's own buffers, checkpoint staging, and the CUDA "
       "context on GPU builds.");
  return out;
}

}  // namespace fsdpp
