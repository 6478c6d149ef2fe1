#pragma once
// PipelineParallel: a rank's place in the pipeline of mesh.pp (torchtitan's pipeline_parallel.py).
//
// pp is the outermost mesh dimension: the job's N ranks are pp stages of N / pp consecutive ranks (so that a
// stage's ranks share nodes), and each stage is a job of its own for everything inside it: parallelize shards the
// stage's blocks over the stage's ranks (dp, cp, tp), the data feed deals the same sequences to every stage.
// Pipeline rank r of a stage talks to the rank of the same place in the stages before and after it:
//
//     world ranks 0..N/pp-1 = stage 0 | N/pp..2N/pp-1 = stage 1 | ...     pp group: {k, k + N/pp, k + 2N/pp, ...}
//
// Under interleaving (pipeline.virtual_stages v > 1) the blocks are cut into pp x v stages and pipeline rank r holds
// stages r, r + pp, r + 2 pp, ... as its chunks (LanguageModel::select_pipeline_chunk); stage pp v - 1 hands
// nothing on, and stage pp - 1's output goes round to rank 0's chunk 1.
//
// Activations go forward and their gradients back as MPI messages on the pp group, (rows, C) floats each (and, for
// a mixture of experts, the router's statistics: RouterStatistics::state),
// tagged by micro-batch and sending stage; sends are non-blocking (issued as soon as a forward or backward ends,
// completed at the step's end), and receives are posted ahead, in an order every rank agrees on
// (pipeline_messages.hpp), and waited on by the action that needs them. Every rank builds the same schedule (pipeline_schedule.hpp) and
// replays it before the first step, so a schedule that would hang is refused instead.
//
// PipelineParallel is the composition of four parts, each with one job: PipelineTopology (pipeline_topology.hpp:
// the stages, this rank's, the split, the stage and pp groups), PipelineScheduler (this rank's actions of the
// deck's schedule), PipelineTransport (pipeline_transport.hpp: the messages) and PipelineTiedEmbedding (below).
//
// A tied embedding (GPT-2's wte) lives on the first stage (the lookup) and the last (the head): both copies start
// equal, their gradients are summed over the two after each step's reduction (in reproducible mode their exact
// words, before they become floats: tie_gradients), and the same optimizer step keeps them equal. The gradient
// norm counts the first stage's copy.
#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/tensor/types.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/kv_cache.hpp"
#include "fsdpp/nn/language_model.hpp"
#include "fsdpp/parallel/pipeline_messages.hpp"
#include "fsdpp/parallel/pipeline_schedule.hpp"
#include "fsdpp/parallel/pipeline_stages.hpp"
#include "fsdpp/parallel/pipeline_topology.hpp"
#include "fsdpp/parallel/pipeline_transport.hpp"

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace fsdpp {

// The deck as one stage sees it: mesh.pp 1, and fully_shard's reshard_after_forward false unless the deck sets it
// (every micro-batch reuses the parameters: torchtitan's choice under pp).
Deck pipeline_stage_deck(const Deck& deck);

// This rank's part of the deck's pipeline.schedule, built (and replayed against every rank's) for a step's count
// of micro-batches.
class PipelineScheduler {
 public:
  PipelineScheduler(const Deck& deck, const PipelineTopology& topology);

  // Builds this rank's actions over `microbatches` (replayed, so that a schedule that would hang is refused) and
  // returns its part of the schedule's posting order (PipelineTransport::set_message_plan). UsageError for a
  // pipeline.microbatches other than `microbatches`.
  RankMessagePlan build(int microbatches);
  int microbatches() const { return microbatches_; }  // of the last build; 0 before any
  const std::vector<PipelineAction>& actions() const { return actions_; }  // the last build's
  PipelineScheduleKind kind() const { return kind_; }
  // The timeline span of action k of those ("fsdpp::pipeline F3@s1": `fsdpp report --trace` draws the schedule as
  // it ran from them), built with the list.
  const std::string& action_region(std::size_t k) const { return action_regions_[k]; }
  // The bubble of that schedule with equal stages and free transfers (its replay): what the schedule itself costs.
  double ideal_bubble() const { return ideal_bubble_; }

 private:
  const PipelineTopology& topology_;
  PipelineScheduleKind kind_ = PipelineScheduleKind::one_f_one_b;
  int configured_microbatches_ = 0;  // pipeline.microbatches (0: the step's)
  // What a step's micro-batch count comes from, for the message that refuses another pipeline.microbatches.
  int global_batch_ = 0, forward_batch_ = 1;
  const char* forward_batch_key_ = "train.micro_batch";
  bool reproducible_units_ = false;
  int microbatches_ = 0;
  std::vector<PipelineAction> actions_;
  std::vector<std::string> action_regions_;
  double ideal_bubble_ = 0;
};

// The tied embedding's two copies (the first stage's lookup, the last stage's head) and the group of the two.
class PipelineTiedEmbedding {
 public:
  // Collective over `world` (every rank, tied or not).
  PipelineTiedEmbedding(MPI_Comm world, const Deck& deck, const PipelineTopology& topology);
  ~PipelineTiedEmbedding();
  PipelineTiedEmbedding(const PipelineTiedEmbedding&) = delete;
  PipelineTiedEmbedding& operator=(const PipelineTiedEmbedding&) = delete;

  // After sharding: in reproducible mode, the tied embedding's words summed over its two copies at each step's end
  // (FsdpGroup::exchange_exact_words); a no-op otherwise.
  void tie_gradients(LanguageModel& model);
  // The tied embedding's gradient summed over its two copies (first and last stage); a no-op without one, and in
  // reproducible mode (tie_gradients summed them).
  void sum_tied_gradient(LanguageModel& model);
  // The parameter whose gradient norm another stage counts (the last stage's tied embedding), or null.
  const Parameter* counted_elsewhere(LanguageModel& model) const;

 private:
  const PipelineTopology& topology_;
  bool tied_ = false;
  bool exact_ = false;  // train.reproducible
  MPI_Comm tied_comm_ = MPI_COMM_NULL;  // the first and the last stage's ranks of one place, when tied
  std::unique_ptr<MpiCommunicator> tied_group_;  // on tied_comm_
  std::vector<float> tied_buffer_;    // the tied embedding's gradient, staged for its MPI group
  std::vector<std::int64_t> tied_words_;  // reproducible mode: its words, the same way
};

class PipelineParallel {
 public:
  // Collective over `world`. `whole`: the deck's whole model on meta (its per-block FLOPs balance the stages).
  // UsageError, on every rank alike, for what the pipeline does not run yet.
  PipelineParallel(MPI_Comm world, const Deck& deck, const LanguageModel& whole);
  ~PipelineParallel();
  PipelineParallel(const PipelineParallel&) = delete;
  PipelineParallel& operator=(const PipelineParallel&) = delete;

  const PipelineTopology& topology() const { return topology_; }
  const PipelineScheduler& schedule() const { return schedule_; }
  PipelineTransport& transport() { return transport_; }
  PipelineTiedEmbedding& tied_embedding() { return tied_; }
  // This rank's actions of the deck's schedule over `microbatches` (replayed against every rank's first), with the
  // transport's posting order built alongside.
  const std::vector<PipelineAction>& actions(int microbatches);

 private:
  // Built in this order (their collectives alike on every rank), destroyed in the reverse.
  PipelineTopology topology_;
  PipelineTiedEmbedding tied_;
  PipelineScheduler schedule_;
  PipelineTransport transport_;
};

// A decode forward through the pipeline (samples during training, nn/kv_cache.hpp): each chunk's rows from the
// stage before and to the stage after, as an evaluation's activations go, and the last stage's logits broadcast to
// every stage, so that every stage chooses the same tokens.
class PipelineDecodeLink final : public DecodeStageLink {
 public:
  explicit PipelineDecodeLink(PipelineParallel& pipeline) : pipeline_(pipeline) {}
  void receive(const View1<float>& x, std::size_t count, int chunk) override;
  void send(const View1<float>& x, std::size_t count, int chunk) override;
  void share_logits(std::vector<float>& logits) override;

 private:
  PipelineParallel& pipeline_;
};

}  // namespace fsdpp
