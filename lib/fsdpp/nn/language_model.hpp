#pragma once
// LanguageModel: what the trainer, the parallelizer, the planner, the evaluator and the checkpoint code need
// from a causal language model, whatever its architecture (GPT-2: gpt.hpp, Llama: llama.hpp). Code outside
// nn/ holds a LanguageModel& and never asks which architecture it is; build_model.hpp's make_model is the one
// place that reads model.arch.
//
// The model is a Module tree: the root owns the embeddings, the final norm and the LM head; each transformer
// block is a child, the unit fully_shard wraps. Forward takes tokens and targets in a Flow and leaves the mean
// loss in it; backward leaves every parameter's gradient.
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/nn/module.hpp"
#include "fsdpp/nn/tensor_parallel.hpp"
#include "fsdpp/runtime/error.hpp"

#include <memory>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// Model FLOPs utilization: the model's FLOP/s per device (flops_per_token x tokens per second, over the devices;
// recomputation and padding not counted) over the device's peak FLOP/s; 0 without a peak. The trainer quotes it
// against the measured sgemm peak, `fsdpp plan --machine` against the machine's peak in the deck's precision.
inline double mfu(double model_flops_per_s_per_device, double peak_flops_per_s) {
  return peak_flops_per_s > 0 ? model_flops_per_s_per_device / peak_flops_per_s : 0;
}

class RouterStatistics;
class ExpertParallelGroup;
class ContextParallelGroup;
struct ContextParallelStats;

// What one pipeline rank runs of a model (mesh.pp, parallel/pipeline_parallel.hpp): a run of consecutive blocks for
// each stage it holds (its chunks, in forward order: one, or pipeline.virtual_stages under interleaving) and, on the
// first rank, the embedding before chunk 0, on the last the final norm, the head and the loss after its last chunk.
// The whole model is one chunk of every block.
struct BlockRange {
  int first = 0;
  int end = -1;  // one past the last block; -1: through the last block
};
struct PipelineStagePart {
  std::vector<BlockRange> chunks = {BlockRange{}};
  bool embedding = true;  // tokens in (else the residual stream arrives in flow.x)
  bool head = true;       // loss out (else the residual stream leaves in flow.x, and its gradient arrives in flow.dx)
  int count() const { return static_cast<int>(chunks.size()); }
  bool embeds(int chunk) const { return embedding && chunk == 0; }
  bool heads(int chunk) const { return head && chunk == count() - 1; }
};

class LanguageModel : public Module {
 public:
  using Module::Module;

  // Pipeline parallelism: keep only `part` of the model, on meta, before anything else (parallelize, storage).
  // Every kept parameter keeps its whole-model name, so checkpoints are the same at any pp.
  // A sparse model's balancing losses span the stages: its pipeline payload (below) travels between them.
  virtual void keep_pipeline_stage(const PipelineStagePart& part) = 0;
  const PipelineStagePart& pipeline_stage() const { return stage_; }
  // Which of the kept chunks the next forward and backward run (0 .. count-1): the embedding only before chunk 0,
  // the head only after the last. A chunk's activations live in activation slots of its own (module.hpp), so that
  // chunks in flight together do not share buffers: pipeline_step.hpp numbers them.
  void select_pipeline_chunk(int chunk) {
    FSDPP_CHECK(chunk >= 0 && chunk < stage_.count(), "pipeline chunk {} of a rank holding {}", chunk, stage_.count());
    chunk_ = chunk;
  }
  int pipeline_chunk() const { return chunk_; }
  // The floats of the residual stream this rank holds for B sequences of T tokens (what a stage hands on):
  // its T / cp rows of each sequence, 1 / tp of them under sequence parallelism, times C.
  virtual std::size_t residual_elements(int B, int T) const = 0;
  // The floats one micro-batch of B sequences of T tokens leaves, in the selected chunk's backward, in a
  // weight-gradient stash under zero_bubble (nn/weight_gradient_stash.hpp): its blocks' output-gradient copies, of
  // the rows this rank computes on (T / cp of each sequence).
  virtual std::int64_t weight_stash_elements(int B, int T) const = 0;

  // The transformer blocks in forward order: fully_shard wraps each, then the root.
  virtual std::vector<Module*> block_modules() const = 0;
  // Per-position losses of the last forward, (B*T), for evaluation code that wants more than the mean.
  virtual View1<float> losses() const = 0;
  // Activations and backward scratch held for the last batch shape, over the whole model.
  virtual std::int64_t activation_bytes() const = 0;
  // What activation_bytes() will be after a forward and backward of B sequences of T tokens when
  // `recomputing_blocks` of the blocks recompute in backward (activation checkpointing, module.hpp), from the
  // shapes alone (fsdpp plan; exact, the plan is checked against measured peaks).
  std::int64_t activation_bytes_for(int B, int T, int recomputing_blocks = 0) const {
    return activation_split(B, T, recomputing_blocks).with_slots({});
  }
  // The same bytes, split: what one micro-batch in flight keeps in each chunk's activation slot (its blocks'
  // outputs and own activation sets, the head's buffers: per chunk of pipeline_stage()), and what every slot
  // shares (the backward scratch, the recomputation set, RoPE's tables, the ring's buffers).
  struct ActivationSplit {
    std::int64_t shared = 0;
    std::vector<std::int64_t> per_slot;  // per chunk
    // With `slots[c]` slots in chunk c (empty: one each), as a pipeline stage allocates them.
    std::int64_t with_slots(const std::vector<int>& slots) const {
      std::int64_t total = shared;
      for (std::size_t c = 0; c < per_slot.size(); ++c) total += per_slot[c] * (slots.empty() ? 1 : slots[c]);
      return total;
    }
  };
  virtual ActivationSplit activation_split(int B, int T, int recomputing_blocks = 0) const = 0;
  // Blocks set to recompute in backward (parallelize's apply_activation_checkpointing sets them).
  int recomputing_blocks() const {
    int n = 0;
    for (const Module* b : block_modules()) n += b->recomputes_in_backward() ? 1 : 0;
    return n;
  }
  // Document masks in packed sequences (config/deck_rules.hpp DocumentMasks; data.document_mask): attention
  // within each document, positions reset per document if asked. Before the first forward; the per-row document
  // starts are then a buffer of the model's (counted by activation_bytes_for).
  virtual void set_document_masks(const DocumentMasks& masks) = 0;
  virtual std::int64_t parameter_count() const = 0;
  // Training FLOPs per token at sequence length T: 6 x the parameters that multiply + 12 x L x T x C (the
  // attention products), the convention MFU is quoted in: the sum of flops_per_token_by_piece.
  double flops_per_token(int T) const {
    const FlopsByPiece f = flops_per_token_by_piece(T);
    double total = f.before + f.after;
    for (double b : f.blocks) total += b;
    return total;
  }
  // The same FLOPs by where they are spent, in forward order: before the blocks (the embedding), each block,
  // after them (the final norm, the head and the loss). A pipeline's stages are balanced with them.
  struct FlopsByPiece {
    double before = 0;
    std::vector<double> blocks;
    double after = 0;
  };
  virtual FlopsByPiece flops_per_token_by_piece(int T) const = 0;
  virtual int vocab_size() const = 0;
  // Mixture-of-experts models: what the router did in the last training forward (nn/moe.hpp); nullptr otherwise.
  virtual const RouterStatistics* router_statistics() const { return nullptr; }
  virtual RouterStatistics* router_statistics() { return nullptr; }
  // Totals the router statistics as they stand (RouterStatistics::finish, over the cp ranks when a sequence is
  // split): a pipeline stage does so with the whole forward's, restored, before its backward.
  virtual void finish_router_statistics(float loss_scale) { (void)loss_scale; }
  // Pipeline parallelism's payload: what a model needs to travel with a micro-batch's activations from stage to
  // stage and back with their gradient, besides the residual stream (a sparse model's router statistics, whose
  // balancing losses span every stage's layers: RouterStatistics::state, nn/moe.hpp). The pipeline moves it as
  // pipeline_payload_size() doubles without reading them, and keeps the last stage's per micro-batch in flight.
  virtual std::size_t pipeline_payload_size() const { return 0; }  // 0: nothing travels
  // After a training forward of the selected chunk: the payload to send on with its output (the last stage's: what
  // its backward reads), resized to pipeline_payload_size().
  virtual void write_pipeline_payload(std::vector<double>& out) const { out.clear(); }
  // Before a training forward of a chunk whose input arrived: the payload the earlier stages sent with it.
  virtual void read_forward_payload(const std::vector<double>& in) { (void)in; }
  // Before a training backward: the payload that came back with the output gradient (on the last stage, what its
  // own forward wrote), made ready for the selected chunk's backward, of a loss scaled by `loss_scale`.
  virtual void read_backward_payload(const std::vector<double>& in, float loss_scale) { (void)in, (void)loss_scale; }
  // A step's routing figures (mixture of experts), summed over its micro-batches' training forwards.
  struct RoutingTotals {
    double aux = 0;                  // the balancing loss, before its coefficient
    double dropped = 0;              // (token, choice) pairs a capacity dropped
    std::vector<double> selections;  // (sparse layers, E): tokens per expert
  };
  // Adds the last training forward's figures, over every layer, to `totals`; nothing for a dense model.
  virtual void add_routing_totals(RoutingTotals& totals) const { (void)totals; }
  // model.moe.balance: bias, after an optimizer step: moves each sparse layer's routing bias toward an even load.
  // `tokens`: (sparse layers, E), the step's tokens per expert over every rank (the same on every rank).
  virtual void balance_expert_load(const std::vector<double>& tokens) { (void)tokens; }
  virtual int context_length() const = 0;
  // One line for banners and plans, e.g. "GPT-2, V 50257 T 1024 C 768 L 12 NH 12 (tied embeddings)".
  virtual std::string describe() const = 0;

  // Reproducible mode's token chunks (gradient_chunks.hpp) of `rows` token rows each (0: off): gradient sums over
  // tokens chunk by chunk into exact words, and under cp attention in a fixed order. After tp and cp, before
  // fully_shard. UsageError for a model that has none.
  virtual void apply_reproducible_chunks(int rows) {
    FSDPP_REQUIRE(rows == 0, "train.reproducible_chunks: {} has no token chunks; use 1", describe());
  }
  // Tensor parallelism (tensor_parallel.hpp): sets the placement of every parameter it splits and computes
  // with the TP-local shapes from then on. On meta, before fully_shard; parallelize calls it for mesh.tp > 1.
  // UsageError for an architecture without a tensor-parallel plan, or shapes tp does not divide.
  virtual void apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp);
  // The group applied (a group of one rank when none was).
  virtual TensorParallelGroup& tensor_parallel() { return no_tensor_parallel_; }
  // Expert parallelism (expert_parallel.hpp): every sparse block keeps its share of the experts and exchanges its
  // routed rows over `ep`. On meta, before fully_shard; parallelize calls it for mesh.ep > 1 and gives each module
  // returned (a block's routed experts) a group of its own on the experts' data-parallel ranks. UsageError for a
  // model without experts. `per_source`: reproducible mode (MoeFeedForward::use_expert_parallel).
  virtual std::vector<Module*> apply_expert_parallel(std::shared_ptr<ExpertParallelGroup> ep, bool per_source = false);
  // Context parallelism (context_parallel.hpp): forward takes whole sequences and computes on this rank's chunks,
  // attention as a ring over `cp`. After tensor parallelism, before fully_shard (it shards nothing: the cp ranks
  // hold the same parameters). UsageError for a model it cannot run on (a learned position table).
  virtual void apply_context_parallel(std::shared_ptr<ContextParallelGroup> cp);
  // Its ring's exchanges and times so far (context_parallel.hpp); nullptr without context parallelism.
  virtual const ContextParallelStats* context_parallel_stats() const { return nullptr; }

 protected:
  PipelineStagePart stage_;
  int chunk_ = 0;

 private:
  TensorParallelGroup no_tensor_parallel_;
};

}  // namespace fsdpp
