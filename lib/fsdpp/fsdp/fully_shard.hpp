#pragma once
// fully_shard: FSDP2's per-module sharding (docs/fsdp2-semantics.md §1-5) on fsdpp Modules.
//
//   for (Block* b : model.blocks()) fully_shard(*b, mesh);   // one communication group per block...
//   fully_shard(model, mesh);                                // ...then the root: what is left (wte, wpe, ln_f)
//   model.to_empty(); model.reset_parameters(seed);          // only local shards are ever allocated
//   AdamW opt(model.parameters(), ...);                      // the optimizer sees the shards
//
// Each call makes one group: the module's parameters not already claimed by a sharded descendant, split along
// dim 0 like torch.chunk (chunk = ceil(rows / N), padded; trailing ranks may hold fewer rows or none). The
// group is all-gathered (one collective) before its module's forward and backward, the next group's
// all-gather is issued ahead (prefetch), unsharded storage is freed after forward per reshard_after_forward
// and after backward, and gradients are reduce-scattered (one collective), averaged over the ranks.
//
// Two special cases keep the same schedule with less work:
//   - a shard group of one rank (one-rank FSDP, or no_shard as a (replicas x 1) HSDP mesh: DDP) with f32
//     compute and shards on the device needs no all-gather: the shard is the whole parameter, used in place;
//     its gradients are all-reduced over the replicas parameter by parameter (DDP without buckets);
//   - on a planning mesh (DeviceMesh::planning, parameters on meta) every group runs dry: no storage, no
//     collectives, only the memory events (memory_events.hpp) that `fsdpp plan` sums.
#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/fsdp/buffer_pool.hpp"
#include "fsdpp/fsdp/flat_buffers.hpp"
#include "fsdpp/fsdp/memory_events.hpp"
#include "fsdpp/mesh/device_mesh.hpp"
#include "fsdpp/nn/module.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

// FSDP2's MixedPrecisionPolicy. On CPU builds compute stays f32, on the bf16-rounded parameters.
struct MixedPrecisionPolicy {
  DType param_dtype = DType::f32;   // all-gathered and computed-on parameters (bf16 halves the all-gather)
  DType reduce_dtype = DType::f32;  // reduce-scatter (and HSDP all-reduce) element type
  DType output_dtype = DType::f32;  // the residual stream a module hands on is rounded to this
  bool cast_forward_inputs = true;  // round the residual stream entering the module to param_dtype
};

// FSDP2's CPUOffloadPolicy: sharded parameters, gradients and optimizer state in host memory (pinned on CUDA
// builds), the optimizer step on the host; each all-gather stages the shards to the device first, and each
// reduce-scatter's output is copied back. Host builds run the same path with host-to-host copies.
struct CpuOffloadPolicy {
  bool cpu = false;
  bool pin_memory = true;
};

struct FullyShardOptions {
  // Unset: false for the root, true for every other group (decided when the root first runs forward).
  std::optional<bool> reshard_after_forward;
  // FSDP2's int k (1 < k < shard size, dividing it): after forward keep a 1/k slice of the whole parameters and
  // all-gather in backward over k consecutive ranks only (node-local under a block launch). 0: unused.
  int reshard_after_forward_ranks = 0;
  MixedPrecisionPolicy mp_policy;
  CpuOffloadPolicy offload_policy;
  // Read from the root's options when it first runs forward, for every group under it:
  // true: a unit's gradient reduce-scatter (and the HSDP all-reduce after it) is issued when its backward ends
  // and waited for in the next unit's post-backward (FSDP2's schedule); false: each reduction blocks.
  bool overlap_reduction = true;
  // All-gathers started ahead of use, in units: 0 none (each unit gathers when it runs), 1 the next unit (FSDP2),
  // 2 the next two. Units given explicit lists (set_modules_to_*_prefetch) prefetch those instead.
  int forward_prefetch = 1, backward_prefetch = 1;
  // Reproducible mode (docs/reproducible.md): each backward's whole gradients are cut into fixed-point words
  // (tensor/fixed_point.hpp), reduce-scattered as exact int64 sums and added to a sharded word accumulator;
  // finish_exact_gradients then all-reduces it over HSDP replicas and converts it to the shard gradients once.
  // Every backward must synchronize (gradient sync on), in f32 (reduce_dtype f32).
  bool exact_reduction = false;
  // With exact_reduction, the model cuts parts of its gradients into words during backward: each token chunk's
  // (train.reproducible_chunks), or a tied embedding's head part before the lookup adds its own (nn/causal_lm.hpp).
  // Each backward's group words are then allocated when it starts and handed to the parameters
  // (Parameter::grad_words); what the model still writes to the f32 gradients is cut and added at the end.
  bool exact_words_in_backward = false;
  // A pipeline stage's root between the first and the last stage (parallel/pipeline_parallel.hpp) holds no
  // parameters of its own, but still drives its blocks' groups: a group of none is allowed for it only.
  bool allow_no_parameters = false;
};

// What the groups under one root did since the last reset: collective counts (tests compare them with FSDP2's
// formulas), bytes, the time the compute thread spent blocked on communication, and unsharded memory.
struct FsdpStats {
  int forward_all_gathers = 0, backward_all_gathers = 0, reduce_scatters = 0, all_reduces = 0;
  std::int64_t all_gather_bytes = 0;      // gathered output bytes
  std::int64_t reduce_scatter_bytes = 0;  // reduce-scatter input bytes
  std::int64_t all_reduce_bytes = 0;      // all-reduced bytes over the HSDP / no_shard replicas
  std::int64_t host_to_device_bytes = 0;  // CPU offload: shards staged for all-gathers
  std::int64_t device_to_host_bytes = 0;  // CPU offload: reduced gradient shards copied back
  double all_gather_wait_s = 0;           // exposed: waiting for all-gathers not hidden behind compute
  double reduce_scatter_s = 0;            // waited for reduce-scatters (all of their time when blocking)
  double all_reduce_s = 0;                // waited for all-reduces
  // Unsharded memory, now and at its peak: whole parameters with their all-gather buffers, and whole
  // gradients with their reduce-scatter buffers.
  std::int64_t unsharded_param_bytes = 0, peak_unsharded_param_bytes = 0;
  std::int64_t unsharded_grad_bytes = 0, peak_unsharded_grad_bytes = 0;
  std::int64_t peak_unsharded_bytes = 0;  // of the sum
  // The caching pool those buffers come from (buffer_pool.hpp), shared by the groups under the root: bytes
  // handed out now, bytes it holds from Kokkos (in use or cached), their peaks since the model was sharded,
  // and the Kokkos allocations it has made (constant after the first step).
  std::int64_t pool_live_bytes = 0, pool_reserved_bytes = 0, pool_peak_live_bytes = 0, pool_peak_reserved_bytes = 0;
  std::int64_t pool_allocations = 0;
  double exposed_comm_s() const { return all_gather_wait_s + reduce_scatter_s + all_reduce_s; }
};

struct FsdpContext;  // shared by the groups under one root: forward order, prefetch, counters

// The FSDP state of one sharded module; fully_shard registers it on the module as its hooks.
class FsdpGroup final : public ModuleHooks {
 public:
  FsdpGroup(Module& module, const DeviceMesh& mesh, FullyShardOptions options);
  ~FsdpGroup() override;

  void before(Module& module, Pass pass, Flow& flow) override;
  void after(Module& module, Pass pass, Flow& flow) override;

  // Gather the whole parameters (async: start the all-gather; the next pass or wait_for_unshard finishes it).
  void unshard(bool async = false);
  void wait_for_unshard();
  void reshard();  // free the whole parameters; value/grad point at the shards again
  bool unsharded() const { return unsharded_; }  // value/grad point at the whole parameters

  // Off: backward leaves gradients whole and unreduced, accumulating over micro-batches; the next backward
  // with sync on reduce-scatters the sum (FSDP2's no_sync).
  // `recurse`: also every sharded module below this one (FSDP2's default).
  void set_requires_gradient_sync(bool value, bool recurse = true);
  // HSDP (FSDP2's set_requires_all_reduce): off, backward still reduce-scatters (with gradient sync on) but skips
  // the all-reduce over the replicas, summing the reduced shards into a partial gradient; the next backward with
  // it on adds that sum and all-reduces once (deck fsdp.replica_all_reduce: last_micro_batch). Without replicas
  // it changes nothing. `recurse`: also every sharded module below this one (FSDP2's default).
  void set_requires_all_reduce(bool value, bool recurse = true);
  // FSDP2's set_reshard_after_backward: off, backward leaves the parameters whole (and the root's end of backward
  // leaves every group's), so the next micro-batch's forward and backward gather nothing. Pipeline stages keep
  // them between micro-batches and reshard after the step's last backward. `recurse`: every group below too.
  void set_reshard_after_backward(bool value, bool recurse = true);
  void set_gradient_divide_factor(double factor) { divide_factor_ = factor; }
  // Exact reduction: units > 0: the next backward is the only one of its step (no accumulation), so its reduced
  // words are the step's sum of `units` units (one per data-parallel rank; the cp ranks of one share it): they are
  // converted when the reduction completes, and no word accumulator is kept. 0: the words accumulate.
  // `recurse`: every sharded module below this one too.
  void set_exact_single_backward(std::int64_t units, bool recurse = true);
  // Reproducible mode: a copy of parameter `p` of this group elsewhere (a tied embedding on another pipeline stage,
  // parallel/pipeline_parallel.hpp) whose words are summed with this one's before either becomes floats. `sum`
  // adds the other copy's words of this rank's shard of `p` in place, on both copies in the same step; the words
  // then always accumulate to the step's end (a single backward's early conversion could stall the pipeline).
  void exchange_exact_words(const Parameter& p, std::function<void(const View1<std::int64_t>&)> sum);
  void set_modules_to_forward_prefetch(std::vector<Module*> modules) { forward_prefetch_ = std::move(modules); }
  void set_modules_to_backward_prefetch(std::vector<Module*> modules) { backward_prefetch_ = std::move(modules); }

  Module& module() const { return module_; }
  const std::vector<Parameter*>& parameters() const { return params_; }
  bool is_root() const { return is_root_; }
  std::int64_t sharded_numel() const { return flat_numel_; }   // per rank, padded
  std::int64_t unsharded_numel() const { return flat_numel_ * ranks_; }
  // Root only, before its first forward: also report every memory event of the groups under it here.
  void add_memory_listener(std::shared_ptr<FsdpMemoryListener> listener);

 private:
  friend struct FsdpContext;
  friend FsdpStats fsdp_stats(Module& root);
  friend void reset_fsdp_stats(Module& root);
  friend void empty_fsdp_cache(Module& root);
  friend void finish_gradient_reduction(Module& root);
  friend void abandon_gradient_reduction(Module& root);
  friend void finish_exact_gradients(Module& root, std::int64_t units);
  // A transient buffer and the bytes it was reported with: a block of the pool, viewed as T (its View stays
  // empty when the group runs dry).
  template <class T> struct Tracked {
    View1<T> view;
    std::int64_t bytes = 0;
    PoolBlock block;
  };
  // A gradient reduction in flight (FsdpContext::pending): the buffers the collective reads and writes stay
  // here until it was waited for. Stage reduce_scatter: `work` is the reduce-scatter (in/out in reduce_dtype);
  // stage all_reduce: `work` is the HSDP all-reduce of `reduced`, or `per_param` the DDP all-reduces of `whole`.
  // Dry groups keep the buffers (for the memory events) and no work. The works are declared last, so they are
  // destroyed (waited for, quietly) before the buffers they write.
  struct PendingReduction {
    enum class Stage { reduce_scatter, all_reduce } stage = Stage::reduce_scatter;
    Tracked<float> in_f32, out_f32;
    Tracked<bf16> in_bf16, out_bf16;
    Tracked<float> reduced;
    std::vector<Tracked<float>> whole;
    Tracked<std::int64_t> in_words, out_words;  // exact reduction: the words reduce-scattered
    bool all_reduce = true;  // requires_all_reduce_ when issued
    int id = -1;             // the collective in flight, as schedule events name it
    std::int64_t single_backward = 0;  // exact reduction: exact_single_backward_ (its units) when issued
    std::string site;        // the flight recorder's name for the collectives issued at completion
    WorkHandle work;
    std::vector<WorkHandle> per_param;
  };
  template <class T> void allocate(Tracked<T>& buffer, FsdpBuffer kind, std::int64_t count, const std::string& label,
                                   bool zeroed = false);
  template <class T> void release(Tracked<T>& buffer, FsdpBuffer kind);
  void note(FsdpBuffer kind, std::int64_t bytes);  // reports to FsdpStats and the root's listeners
  // Schedule events (fsdp/time_events.hpp) to the root's listeners; no-ops without listeners.
  void schedule(FsdpScheduleEvent event);
  void schedule_pass(FsdpScheduleEvent::Kind kind, Pass pass, bool defers_weight_gradients = false);
  void schedule_kernel(std::int64_t bytes);
  void schedule_host_copy(std::int64_t bytes);
  // Returns the collective's id (`id` when given: several issues waited for together).
  int schedule_issue(CollectiveOp op, std::int64_t bytes, const Communicator& comm, const std::string& group, int id = -1);
  void schedule_wait(int id);

  void lazy_init();
  // A forward during the root's backward: a checkpointed ancestor replays its forward (module.hpp, activation
  // checkpointing), and this group, a unit inside it (a block's experts), runs its forward hooks again. It gathers
  // as in forward, but neither prefetches nor records the forward order, and keeps its parameters whole for the
  // backward that follows.
  bool replaying_forward() const;
  template <class T> PieceBatch<T, float>& copy_in();   // f32 tensors -> T buffers
  template <class T> PieceBatch<float, T>& copy_out();  // T buffers -> f32 tensors
  void start_all_gather();
  template <class T> void all_gather_flat(Tracked<T>& flat, Tracked<T>& kept, bool in_backward);
  void keep_post_forward_slice();
  void reduce_scatter_gradients();
  template <class T> void issue_reduce_scatter();
  void issue_whole_gradient_all_reduces();
  void issue_exact_reduce_scatter();
  void accumulate_words(const View1<std::int64_t>& words);
  void convert_exact_sum(std::int64_t units);
  void convert_words(Tracked<std::int64_t>& words, FsdpBuffer kind, std::int64_t units);
  void complete_reduce_scatter(PendingReduction& pending);
  void complete_all_reduce(PendingReduction& pending);
  bool reduce_over_replicas(PendingReduction& pending);  // true: its all-reduce is now in flight
  void accumulate_reduced(const View1<float>& reduced);
  void accumulate_offloaded_gradients(const View1<float>& reduced);  // CPU offload: into the host shards
  FsdpGroup* group_of(Module* m) const;
  void prefetch(const std::vector<Module*>& chosen, const std::vector<FsdpGroup*>& order, int step);

  Module& module_;
  std::string unit_name_;  // module_.display_name(), named in memory events
  // The unit's timeline spans and Kokkos regions, pre-hook to post-hook (observe/timeline.hpp): built once.
  std::string forward_region_, backward_region_;
  DeviceMesh mesh_;
  Communicator& comm_;                         // the shard group: the mesh's last dimension
  Communicator* replicate_comm_ = nullptr;     // HSDP: the mesh's first dimension
  std::unique_ptr<DeviceMesh> post_forward_mesh_;  // reshard_after_forward = k: groups of k consecutive ranks
  int ranks_ = 1, rank_ = 0;
  FullyShardOptions options_;
  std::vector<Parameter*> params_;
  fsdp_detail::FlatLayout layout_;
  std::int64_t flat_numel_ = 0;
  bool dry_ = false;             // planning mesh: memory events only
  bool shard_is_whole_ = false;  // one-rank shard group, f32 compute, device shards: no all-gather needed
  std::vector<View1<float>> shard_value_, shard_grad_;    // the padded local shards (what the optimizer owns)
  std::vector<Tracked<float>> full_value_, full_grad_;    // whole tensors, padded to ranks * chunk rows
  Tracked<float> gather_f32_;                             // (ranks, slot) all-gather buffer in f32 ...
  Tracked<bf16> gather_bf16_;                             // ... or in bf16 (param_dtype bf16)
  Tracked<float> post_forward_f32_;                       // reshard_after_forward = k: this rank's ranks/k slots
  Tracked<bf16> post_forward_bf16_;
  Tracked<float> partial_reduction_;                      // HSDP with the all-reduce skipped: summed shards
  Tracked<std::int64_t> exact_sum_;                       // exact reduction: this step's summed shard words
  Tracked<std::int64_t> chunk_words_;                     // exact_words_in_backward: this backward's whole words
  // One kernel per copy-in, copy-out, accumulation or zeroing of the group's pieces (flat_buffers.hpp).
  PieceBatch<float, float> pieces_f32_;
  PieceBatch<bf16, float> pieces_to_bf16_;
  PieceBatch<float, bf16> pieces_from_bf16_;
  // CPU offload: copies on their own stream. Optional, because a default ExecSpace is a Kokkos::Cuda instance on
  // GPU builds, which `fsdpp plan` (dry groups, Kokkos never started, no driver needed) must not construct.
  std::optional<ExecSpace> offload_copies_;
  OffloadBuffer offload_staging_;                         // CPU offload on GPUs: reduced shards, pinned
  std::vector<std::shared_ptr<FsdpMemoryListener>> listeners_;  // root: handed to the context at lazy init
  std::shared_ptr<BufferPool> pool_;  // every Tracked buffer's storage; the root's, shared, after lazy init
  WorkHandle pending_gather_;
  int gather_id_ = -1;  // the all-gather in flight, as schedule events name it
  bool gather_started_ = false;
  bool unsharded_ = false;
  bool grads_unsharded_ = false;  // full_grad_ holds unreduced gradients (gradient sync off)
  bool requires_gradient_sync_ = true;
  bool reshard_after_backward_ = true;
  void set_flag(bool FsdpGroup::*flag, bool value, bool recurse);
  bool requires_all_reduce_ = true;
  std::int64_t exact_single_backward_ = 0;  // set_exact_single_backward's units
  struct WordsExchange {
    std::size_t param = 0;  // index in params_
    std::function<void(const View1<std::int64_t>&)> sum;
  };
  std::optional<WordsExchange> words_exchange_;  // exchange_exact_words
  double divide_factor_ = 0;  // 0: average over the data-parallel ranks
  std::vector<Module*> forward_prefetch_, backward_prefetch_;
  bool is_root_ = false;
  bool initialized_ = false;
  std::shared_ptr<FsdpContext> context_;
};

// Shards `module` over `mesh`: 1-D (shard), or 2-D (replicate x shard) for HSDP, and returns its state.
// UsageError when a descendant is sharded after its ancestor, or the module has nothing left to shard.
FsdpGroup& fully_shard(Module& module, const DeviceMesh& mesh, FullyShardOptions options = {});
FsdpGroup* fsdp_group(Module& module);  // nullptr when the module is not sharded

// The whole tensor of a (possibly sharded) parameter, on every rank of its group: for tests and export. `mesh`
// is the mesh fully_shard sharded over (the data-parallel one); under tensor parallelism the tp ranks' parts are
// gathered over `tensor_parallel` too (collective over it).
std::vector<float> gather_full_parameter(const Parameter& p, const DeviceMesh& mesh,
                                         Communicator* tensor_parallel = nullptr);

FsdpStats fsdp_stats(Module& root);
// Waits for every gradient reduction still in flight under the root and adds the results to the gradients.
// Gradients are complete only after it; the root's post-backward (FSDP2's final callback) and its next forward
// call it too, so it is a no-op after a whole backward. Collective over the data-parallel groups.
void finish_gradient_reduction(Module& root);
// Teardown after an error: waits for reductions in flight without using their results (no kernels, quiet), so
// that no collective outlives its communicator.
void abandon_gradient_reduction(Module& root);
// Reproducible mode, after the step's last backward: waits for the reductions in flight, all-reduces each
// group's word sums over the HSDP replicas, and adds their mean over `units` (the step's computation units) to
// the shard gradients. Collective over the data-parallel groups.
void finish_exact_gradients(Module& root, std::int64_t units);
void reset_fsdp_stats(Module& root);  // keeps the current unsharded bytes; restarts the peaks from them
// Returns the cached free blocks of the root's buffer pool to Kokkos (torch.cuda.empty_cache); the next step
// allocates them again.
void empty_fsdp_cache(Module& root);


}  // namespace fsdpp
