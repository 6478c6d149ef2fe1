#pragma once
// Module: a node of the model tree that owns named parameters and named children, and is run through ONE
// door, its call operator, for both passes:
//     block(flow);                  // forward
//     block(flow, Pass::backward);  // backward
// There is no autograd: each module implements forward and backward side by side and keeps the activations
// its backward needs. Hooks registered on a module run before and after each pass; fully_shard uses them to
// all-gather parameters before a pass and reshard / reduce-scatter gradients after it.
//
// Activation checkpointing (torch's checkpoint_wrapper): a module set to recompute in backward keeps only its
// input from forward; its backward pass first re-runs its own forward() on that input, to rebuild the
// activations, then runs backward(). Only forward() is re-run, not the forward hooks: in backward, the
// pre-backward hooks (fully_shard's all-gather) have already run, so the recomputation costs FLOPs but no
// communication, as under FSDP2 + checkpoint_wrapper. The replay is the same kernels on the same inputs, so
// the gradients are bitwise those without checkpointing. The input must stay untouched from forward to
// backward: in a residual stack it is the previous module's output, which that module keeps anyway.
//
// The saving comes from where the module keeps its recomputable activations. The pattern, in a few lines:
//   struct MyActivations {                       // everything backward needs that forward can rebuild
//     View1<float> h, ...;
//     void ensure(const std::string& label, int B, int T);   // grow-only: allocate once for the largest shape
//     std::int64_t bytes() const;
//   };
//   class MyBlock : public Module {
//     RecomputableActivations<MyActivations> acts_;   // built with the model's one shared_ptr<MyActivations>
//     void forward(Flow& f) override  { MyActivations& a = acts_.get(*this, f.B, f.T); ... }
//     void backward(Flow& f) override { MyActivations& a = acts_.get(*this, f.B, f.T); ... }
//   };
// A module that does not recompute uses a set of its own; every module that does draws from the one set the
// model shares among them (only one module's backward runs at a time, and each rebuilds the set first), so L
// checkpointed blocks hold one block's activations instead of L. What the module hands on (its output) it
// keeps in its own buffers either way; while is_recomputing() it may skip the work that only makes that output.
// `apply_activation_checkpointing` (parallel/parallelize.hpp) sets the flag on the blocks from the deck.
// dry_run has nothing to replay: a recomputation changes no hook's schedule, so `fsdpp plan`'s events stand;
// only the activation bytes change (count the shared set once).
#include "fsdpp/nn/parameter.hpp"
#include "fsdpp/tensor/piece_batch.hpp"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdpp {

struct DecodeStep;            // nn/kv_cache.hpp
class WeightGradientStash;  // nn/weight_gradient_stash.hpp

// What flows between modules of a language model: tokens in, the residual stream through, a loss out, and
// the gradient of the residual stream back.
struct Flow {
  int B = 0, T = 0;
  View1<const std::int32_t> tokens;   // (B*T)
  View1<const std::int32_t> targets;  // (B*T)
  View1<float> x;                     // residual stream (B,T,C); each module reads its input here, leaves its output
  View1<float> dx;                    // gradient of the residual stream (B,T,C), the same way backwards
  bool training = true;               // forward also prepares the loss gradient (fused cross-entropy)
  double loss = 0.0;                  // mean cross-entropy over B*T positions
  float loss_scale = 1.0f;            // d(total objective)/d(loss): 1/accumulation_steps under accumulation
  DecodeStep* decode = nullptr;       // set: a decode forward with a KV cache (nn/kv_cache.hpp), not training's
  // Set: backward leaves the Linear weight gradients here for a later Pass::backward_weight (zero_bubble's split).
  WeightGradientStash* weight_stash = nullptr;
};

// backward_weight: the weight gradients a backward left in flow.weight_stash (nn/weight_gradient_stash.hpp). Hooks
// see it as a second backward of the same micro-batch (fully_shard keeps the gradients whole between the two).
enum class Pass { forward, backward, backward_weight };

class Module;

// Called around each pass of the module it is registered on.
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual void before(Module&, Pass, Flow&) {}
  virtual void after(Module&, Pass, Flow&) {}
};

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  void operator()(Flow& flow, Pass pass = Pass::forward);
  // The hooks of this module and every descendant in the order a pass runs them, with no computation:
  // forward visits children in registration order, backward in reverse (models register children in the
  // order their forward calls them). `fsdpp plan` replays fully_shard's schedule this way on meta.
  void dry_run(Flow& flow, Pass pass);
  // Whether a pass of this module runs `child` (dry_run asks): false for the blocks of a pipeline chunk not
  // selected (LanguageModel::select_pipeline_chunk).
  virtual bool runs_child(const Module& /*child*/) const { return true; }

  const std::string& path() const { return path_; }  // "" for the root, "h.0" for the first block
  const std::string& type_name() const { return type_name_; }
  std::string display_name() const { return path_.empty() ? type_name_ + " (root)" : path_; }
  Module* parent() const { return parent_; }

  std::vector<Parameter*> parameters(bool recurse = true);
  std::vector<const Parameter*> parameters(bool recurse = true) const;
  std::vector<Module*> children() const { return children_; }
  std::vector<Module*> modules();  // this module and every descendant, parents first

  void add_hooks(std::shared_ptr<ModuleHooks> hooks) { hooks_.push_back(std::move(hooks)); }
  template <class H> H* find_hooks() const {
    for (const auto& h : hooks_)
      if (auto* found = dynamic_cast<H*>(h.get())) return found;
    return nullptr;
  }
  std::vector<Parameter*> local_parameters() { return parameters(false); }

  // Activation checkpointing (above): forward keeps only the input; backward re-runs forward() first.
  // The replay is a timeline span and Kokkos region "fsdpp::recompute <path>" (observe/timeline.hpp), named here once.
  void set_recompute_in_backward(bool on) {
    recompute_in_backward_ = on;
    recompute_region_ = "fsdpp::recompute " + display_name();
  }
  bool recomputes_in_backward() const { return recompute_in_backward_; }
  bool is_recomputing() const { return recomputing_; }  // inside backward's replay of forward()

  // Storage and values for every parameter that has none yet (see parameter.hpp). Gradients start at zero.
  void to_empty();
  void reset_parameters(std::uint64_t seed);
  // Every gradient to zero: one kernel for all the device gradients (offloaded ones on the host).
  void zero_grad();

  // Activation slots (pipeline parallelism, train/pipeline_step.hpp): what a forward leaves for its backward, kept
  // for each micro-batch in flight. select_activation_slot(s), here and in every descendant, makes slot s the one
  // the modules compute in: the state of the slot left is kept aside, that of slot s (empty at first: the next
  // forward allocates it) comes back. Slot 0 is the one everything else (evaluation, generation) uses.
  void select_activation_slot(int slot);

  // Pipeline parallelism (nn/language_model.hpp, keep_pipeline_stage): a stage's model keeps only what it runs. A
  // dropped parameter stays declared (its owner may still name it) but leaves parameters(): nothing shards,
  // allocates, initializes, trains or saves it on this rank. A removed child leaves the tree the same way.
  void drop_parameter(const Parameter& p) { dropped_.push_back(&p); }
  void remove_child(const Module& child);

  // Registers a parameter named `local_name` under this module's path. Models call it from their constructors,
  // and so do the parts they are built from (nn/layers.hpp's Linear and Norm) for the module that owns them.
  Parameter& add_parameter(const std::string& local_name, std::vector<std::int64_t> shape, InitRule init,
                           ParamRole role);

 protected:
  void add_child(Module& child, const std::string& name);
  virtual void forward(Flow& flow) = 0;
  virtual void backward(Flow& flow) = 0;
  // Pass::backward_weight: the weight gradients this module's backward recorded in flow.weight_stash, and its
  // children's (in backward order). Modules without Linear weights have none.
  virtual void backward_weight(Flow& flow) { (void)flow; }
  // The module's own per-micro-batch state (its activations, its output) into slot `from`'s keeping, and slot
  // `to`'s back (select_activation_slot). Modules that keep none have nothing to do.
  virtual void swap_activation_slot(int from, int to) {
    (void)from;
    (void)to;
  }

 private:
  void set_path(const std::string& path);
  void recompute(const Flow& flow);

  std::string type_name_;
  std::string path_;
  std::string name_in_parent_;  // add_child's name: the part of path_ this module's parent does not give
  Module* parent_ = nullptr;
  std::deque<Parameter> parameters_;  // deque: parameter addresses stay valid as more are added
  std::vector<Module*> children_;
  std::vector<const Parameter*> dropped_;  // drop_parameter's: declared, not held
  std::vector<std::shared_ptr<ModuleHooks>> hooks_;
  bool recompute_in_backward_ = false;
  bool recomputing_ = false;
  std::string recompute_region_;
  View1<float> checkpoint_input_;  // recompute_in_backward_: forward's flow.x, after the forward hooks
  int slot_ = 0;                            // the activation slot in use
  std::vector<View1<float>> slot_inputs_;   // checkpoint_input_ of the other slots
  PieceBatch<float, float> zero_grads_;  // zero_grad's table of gradients, reused every step
};

// Where a module keeps the activations its backward needs and forward can rebuild (see the top of this file):
// its own set, or, while it recomputes in backward, the one set shared by every module that does.
// `Set` has ensure(label, shape...) (grow-only) and bytes().
template <class Set> class RecomputableActivations {
 public:
  explicit RecomputableActivations(std::shared_ptr<Set> shared) : shared_(std::move(shared)) {}
  template <class... Shape> Set& get(const Module& m, const Shape&... shape) {
    const bool shared = m.recomputes_in_backward();
    Set& set = shared ? *shared_ : own_;
    set.ensure(shared ? "recomputed" : m.path(), shape...);
    return set;
  }
  std::int64_t own_bytes() const { return own_.bytes(); }  // the shared set is the model's to count, once
  Set& own() { return own_; }  // the module's own set (activation slots swap it)

 private:
  std::shared_ptr<Set> shared_;
  Set own_;
};

// The states of the activation slots a module is not computing in (Module::select_activation_slot): swap(current,
// from, to) keeps `current` as slot `from`'s and hands back slot `to`'s (a default State the first time).
template <class State> class SlotStates {
 public:
  void swap(State& current, int from, int to) {
    const std::size_t need = static_cast<std::size_t>(std::max(from, to)) + 1;
    if (kept_.size() < need) kept_.resize(need);
    kept_[static_cast<std::size_t>(from)] = std::move(current);
    current = std::move(kept_[static_cast<std::size_t>(to)]);
    kept_[static_cast<std::size_t>(to)] = State{};
  }

 private:
  std::vector<State> kept_;
};

}  // namespace fsdpp
