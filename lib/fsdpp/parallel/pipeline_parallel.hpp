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

#include <mpi.h>

#include <memory>
#include <vector>

namespace fsdpp {

// The deck as one stage sees it: mesh.pp 1, and fully_shard's reshard_after_forward false unless the deck sets it
// (every micro-batch reuses the parameters: torchtitan's choice under pp).
Deck pipeline_stage_deck(const Deck& deck);

class PipelineParallel {
 public:
  // Collective over `world`. `whole`: the deck's whole model on meta (its per-block FLOPs balance the stages).
  // UsageError, on every rank alike, for what the pipeline does not run yet.
  PipelineParallel(MPI_Comm world, const Deck& deck, const LanguageModel& whole);
  ~PipelineParallel();
  PipelineParallel(const PipelineParallel&) = delete;
  PipelineParallel& operator=(const PipelineParallel&) = delete;

  // This stage's ranks: the world of everything inside the stage (parallelize, the data feed, checkpoints).
  MPI_Comm stage_comm() const { return stage_comm_; }
  // This rank's place in the pipeline, 0 .. pp - 1 (the stage of its ranks; under interleaving it holds global
  // stages stage() + c pp for chunks c = 0 .. v - 1).
  int stage() const { return stage_; }
  int stages() const { return stages_; }  // pp
  int virtual_stages() const { return virtual_stages_; }  // v: chunks per rank
  int global_stage(int chunk) const { return chunk * stages_ + stage_; }
  int local_chunk_of(int global_stage) const { return global_stage / stages_; }  // inverse of global_stage
  bool first() const { return stage_ == 0; }  // holds the embedding (global stage 0)
  bool last() const { return stage_ == stages_ - 1; }  // holds the head (global stage pp v - 1)
  bool last_stage(int global) const { return global == stages_ * virtual_stages_ - 1; }
  const StageSplit& split() const { return split_; }  // over the pp x v global stages
  PipelineStagePart part() const;  // what this rank's model keeps: its chunks
  Deck stage_deck(const Deck& deck) const { return pipeline_stage_deck(deck); }

  // This rank's actions of the deck's schedule over `microbatches` (replayed against every rank's first).
  const std::vector<PipelineAction>& actions(int microbatches);
  PipelineScheduleKind schedule_kind() const { return kind_; }
  // The timeline span of action k of those ("fsdpp::pipeline F3@s1": `fsdpp report --trace` draws the schedule as
  // it ran from them), built with the list.
  const std::string& action_region(std::size_t k) const { return action_regions_[k]; }
  // The bubble of that schedule with equal stages and free transfers (its replay): what the schedule itself costs.
  double ideal_bubble() const { return ideal_bubble_; }

  // What action `a` of this rank receives before it runs and sends after (pipeline_messages.hpp's one rule): an
  // evaluation's or a decode's forward is a forward action too.
  std::optional<PipelineMessage> message_into(const PipelineAction& a) const;
  std::optional<PipelineMessage> message_out_of(const PipelineAction& a) const;
  // Point to point on the pp group between global stages (the rank of stage s: s mod pp). `x` holds `count`
  // floats; sends copy it and return at once. `trailer`: doubles that travel in the same message (a sparse model's
  // router statistics); the receiver's is sized to what it expects.
  void send(const View1<float>& x, std::size_t count, const PipelineMessage& m,
            const std::vector<double>* trailer = nullptr);
  void receive(const View1<float>& x, std::size_t count, const PipelineMessage& m,
               std::vector<double>* trailer = nullptr);
  void wait_sends();  // the step's sends have completed (their buffers are free again)
  // The receives the schedule's posting order (pipeline_messages.hpp) posts before action `action` of actions(),
  // each into a landing buffer of `capacity` floats (message_floats) until receive() waits on it. Training calls
  // it before every action; receive() takes a message posted so, or receives it there (an evaluation's).
  void post_receives(std::size_t action, std::size_t capacity);
  void check_no_posted_receives() const;  // at a step's end: every posted receive was waited on
  // The floats a message of `count` floats and a trailer of `trailer_doubles` doubles takes.
  static std::size_t message_floats(std::size_t count, std::size_t trailer_doubles);
  // Whether the message buffers are Views of the compute memory, and so count in a rank's measured peak: where the
  // transport moves device memory (NCCL), or on a host build, whose compute memory MPI reads directly. On a GPU
  // build with MPI they are host copies.
  static bool buffers_in_compute_memory(CommBackend backend);
  // The message buffers a rank keeps, allocated in its first step and reused: a copy of each of the step's sends
  // (they complete at its end, wait_sends) and a landing buffer for each receive posted and not yet waited on at
  // once (RankMessagePlan::most_pending), which an evaluation's receives reuse. The planner counts these.
  static int kept_buffers(const std::vector<PipelineAction>& actions, const PipelineShape& shape,
                          const RankMessagePlan& plan);
  // Seconds this rank has spent waiting in receives since construction: the pipeline's bubble as this rank saw it
  // (with the transfers' own time, which the bubble's formula leaves out).
  double waited_s() const { return waited_s_; }

  // The pp group (one rank per stage) for scalars: the loss from the last stage, gradient norms.
  Communicator& stages_group() { return *pp_group_; }
  double from_last_stage(double value);  // the last stage's value on every stage
  void from_last_stage(std::vector<double>& values);  // the same for a vector of the same size on every stage
  // After sharding: in reproducible mode, the tied embedding's words summed over its two copies at each step's end
  // (FsdpGroup::exchange_exact_words); a no-op otherwise.
  void tie_gradients(LanguageModel& model);
  // The tied embedding's gradient summed over its two copies (first and last stage); a no-op without one, and in
  // reproducible mode (tie_gradients summed them).
  void sum_tied_gradient(LanguageModel& model);
  // The parameter whose gradient norm another stage counts (the last stage's tied embedding), or null.
  const Parameter* counted_elsewhere(LanguageModel& model) const;

 private:
  int stages_ = 1, stage_ = 0, virtual_stages_ = 1;
  PipelineScheduleKind kind_ = PipelineScheduleKind::one_f_one_b;
  int configured_microbatches_ = 0;  // pipeline.microbatches (0: the step's)
  // What a step's micro-batch count comes from, for the message that refuses another pipeline.microbatches.
  int global_batch_ = 0, forward_batch_ = 1;
  const char* forward_batch_key_ = "train.micro_batch";
  bool reproducible_units_ = false;
  StageSplit split_;
  bool tied_ = false;
  bool exact_ = false;  // train.reproducible
  MPI_Comm stage_comm_ = MPI_COMM_NULL;
  MPI_Comm pp_comm_ = MPI_COMM_NULL;
  MPI_Comm tied_comm_ = MPI_COMM_NULL;  // the first and the last stage's ranks of one place, when tied
  std::unique_ptr<MpiCommunicator> pp_group_;
  std::unique_ptr<MpiCommunicator> tied_group_;  // on tied_comm_
  int schedule_microbatches_ = 0;
  std::vector<PipelineAction> actions_;
  std::vector<std::string> action_regions_;
  double ideal_bubble_ = 0;
  // A message's floats where its transport reads them: a View of the compute memory (buffers_in_compute_memory),
  // else host memory.
  struct MessageBuffer {
    std::vector<float> host;
    View1<float> view;
    WorkHandle work;  // the send's (sends_)
    float* ensure(std::size_t floats, bool in_view);
  };
  void fill(MessageBuffer& buffer, const View1<float>& x, std::size_t count, const std::vector<double>* trailer);
  void empty(const MessageBuffer& buffer, const View1<float>& x, std::size_t count, std::vector<double>* trailer);
  std::unique_ptr<Communicator> messages_;  // on pp_comm_: the activations and gradients
  bool device_messages_ = false;            // messages_ moves device memory (NCCL)
  bool buffers_in_views_ = false;           // buffers_in_compute_memory
  std::vector<MessageBuffer> sends_;  // reused step to step: no allocation once the pipeline is full
  std::size_t sends_in_flight_ = 0;
  std::vector<float> tied_buffer_;    // the tied embedding's gradient, staged for its MPI group
  std::vector<std::int64_t> tied_words_;  // reproducible mode: its words, the same way
  std::vector<float> trailer_floats_;
  RankMessagePlan message_plan_;  // this rank's part of the schedule's posting order
  struct PostedReceive {
    PipelineMessage message;
    int landing = -1;  // index into landings_
    std::size_t capacity = 0;
    WorkHandle work;
  };
  std::vector<PostedReceive> posted_;     // posted, not yet waited on
  PostedReceive post_now_;                // a receive posted as it is waited on
  std::vector<MessageBuffer> landings_;   // reused step to step (at most RankMessagePlan::most_pending)
  std::vector<int> free_landings_;
  int take_landing();  // a free landing buffer (a new one when none is)
  double waited_s_ = 0;
  std::vector<int> stage_world_ranks_;  // the world rank of this place in each stage (messages name it)
  int tag_limit_ = 32767;  // MPI_TAG_UB: the standard's least
  int tag_of(int from_stage, int microbatch, bool gradient) const;
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
