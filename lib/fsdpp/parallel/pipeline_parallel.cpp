#include "fsdpp/parallel/pipeline_parallel.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/nn/causal_lm.hpp"
#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/runtime/error.hpp"

namespace fsdpp {

PipelineParallel::PipelineParallel(MPI_Comm world, const Deck& deck, const LanguageModel& whole)
    : topology_(world, deck, whole), tied_(world, deck, topology_), schedule_(deck, topology_),
      transport_(topology_, choose_backend(deck.comm.backend)) {}

PipelineParallel::~PipelineParallel() = default;

const std::vector<PipelineAction>& PipelineParallel::actions(int microbatches) {
  if (microbatches != schedule_.microbatches()) transport_.set_message_plan(schedule_.build(microbatches));
  return schedule_.actions();
}

PipelineTiedEmbedding::PipelineTiedEmbedding(MPI_Comm world, const Deck& deck, const PipelineTopology& topology)
    : topology_(topology), tied_(deck.model.tie_embeddings), exact_(deck.train.reproducible) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  const int place = rank % (size / topology_.stages());
  MPI_Comm_split(world, tied_ && (topology_.first() || topology_.last()) ? place : MPI_UNDEFINED, topology_.stage(),
                 &tied_comm_);
  if (tied_comm_ != MPI_COMM_NULL) {
    tied_group_ = std::make_unique<MpiCommunicator>(tied_comm_);
    tied_group_->set_label("pp (tied embedding)");
  }
}

PipelineTiedEmbedding::~PipelineTiedEmbedding() {
  tied_group_.reset();
  if (tied_comm_ != MPI_COMM_NULL) MPI_Comm_free(&tied_comm_);
}

Deck pipeline_stage_deck(const Deck& deck) {
  Deck d = deck;
  d.mesh.pp = 1;
  d.pipeline = {};  // the stage runs no pipeline of its own
  if (d.fsdp.reshard_after_forward.kind == ReshardAfterForward::Kind::automatic)
    d.fsdp.reshard_after_forward.kind = ReshardAfterForward::Kind::no;
  return d;
}

PipelineScheduler::PipelineScheduler(const Deck& deck, const PipelineTopology& topology)
    : topology_(topology), kind_(deck.pipeline.schedule), configured_microbatches_(deck.pipeline.microbatches),
      global_batch_(deck.train.global_batch), forward_batch_(training_forward_batch(deck.train)),
      forward_batch_key_(training_forward_batch_key(deck.train)), reproducible_units_(deck.train.reproducible) {}

RankMessagePlan PipelineScheduler::build(int microbatches) {
  // The step's micro-batches are the pipeline's: a different pipeline.microbatches would be ignored, so it is refused.
  if (configured_microbatches_ != 0 && configured_microbatches_ != microbatches) {
    const int dp = global_batch_ / (microbatches * forward_batch_);
    throw UsageError(fmt::format(
        "pipeline.microbatches is {}, but each step has {} {} (train.global_batch / ({} x the stage's data-parallel "
        "ranks) = {} / ({} x {})){}, and those are what flows through the pipeline: set pipeline.microbatches: 0, or "
        "change {}", configured_microbatches_, microbatches,
        reproducible_units_ ? "reproducible units" : "micro-batches", forward_batch_key_, global_batch_, forward_batch_,
        dp, reproducible_units_ ? " (in reproducible mode each unit of train.reproducible_unit sequences is one "
                                  "micro-batch of the pipeline)" : "", forward_batch_key_));
  }
  const PipelineShape shape = topology_.shape(microbatches);
  // Every rank alike: before any message.
  const int last_tag = topology_.message_tag(shape.stages() - 1, microbatches - 1, true);
  FSDPP_REQUIRE(last_tag <= topology_.tag_limit(), "pipeline: {} micro-batches through {} stages need message tags "
                "up to {}, above this MPI's MPI_TAG_UB {}; use fewer micro-batches or stages", microbatches,
                shape.stages(), last_tag, topology_.tag_limit());
  const PipelineSchedule schedule = make_pipeline_schedule(kind_, shape);
  ideal_bubble_ = simulate_pipeline(schedule, shape, PipelineCosts::uniform(shape.stages())).bubble;  // refuses a hang
  actions_ = schedule[static_cast<std::size_t>(topology_.stage())];
  RankMessagePlan message_plan = plan_pipeline_messages(schedule, shape)[static_cast<std::size_t>(topology_.stage())];
  action_regions_.clear();
  for (const PipelineAction& a : actions_) action_regions_.push_back("fsdpp::pipeline " + to_string(a));
  microbatches_ = microbatches;
  return message_plan;
}

namespace {
Parameter* tied_embedding(LanguageModel& model) { return &static_cast<CausalLM&>(model).token_embedding; }
}  // namespace

void PipelineTiedEmbedding::tie_gradients(LanguageModel& model) {
  if (!tied_group_ || !exact_) return;
  // Reproducible mode: each copy's words are exact sums of its part's cuts; their sum is one rank's (whose head part
  // is cut apart from the lookup's, nn/causal_lm.cpp), and both copies convert it to the same floats.
  FsdpGroup* root = fsdp_group(model);
  FSDPP_CHECK(root, "pipeline stage {}: the tied embedding's stage is not sharded", topology_.stage());
  root->exchange_exact_words(*tied_embedding(model), [this](const View1<std::int64_t>& words) {
    tied_words_.resize(words.extent(0));
    const HostView1<std::int64_t> host(tied_words_.data(), tied_words_.size());
    Kokkos::deep_copy(host, words);
    static const std::string name = "pipeline tied embedding gradient words";  // FlightSite keeps a pointer to it
    const FlightSite site(name);
    tied_group_->all_reduce(tied_words_.data(), tied_words_.size(), DType::i64, ReduceOp::sum);  // host staging
    Kokkos::deep_copy(words, host);
  });
}

void PipelineTiedEmbedding::sum_tied_gradient(LanguageModel& model) {
  if (!tied_group_ || exact_) return;  // reproducible mode summed the words (tie_gradients)
  Parameter* p = tied_embedding(model);
  FSDPP_CHECK(p, "pipeline stage {}: a tied embedding was expected on the first and the last stage", topology_.stage());
  const std::size_t n = p->grad().extent(0);
  tied_buffer_.resize(n);
  Kokkos::fence();
  const HostView1<float> host(tied_buffer_.data(), n);
  Kokkos::deep_copy(host, p->grad());
  static const std::string name = "pipeline tied embedding gradient";  // FlightSite keeps a pointer to it
  const FlightSite site(name);
  tied_group_->all_reduce(tied_buffer_.data(), n, ReduceOp::sum);  // host staging: an MPI group
  Kokkos::deep_copy(p->grad(), host);
}

void PipelineDecodeLink::receive(const View1<float>& x, std::size_t count, int chunk) {
  const PipelineAction forward{PipelineOp::forward, pipeline_.topology().global_stage(chunk), 0};
  pipeline_.transport().receive(x, count, pipeline_.transport().message_into(forward).value());
}

void PipelineDecodeLink::send(const View1<float>& x, std::size_t count, int chunk) {
  const PipelineAction forward{PipelineOp::forward, pipeline_.topology().global_stage(chunk), 0};
  pipeline_.transport().send(x, count, pipeline_.transport().message_out_of(forward).value());
}

void PipelineDecodeLink::share_logits(std::vector<float>& logits) {
  pipeline_.transport().wait_sends();  // this forward's sends are done: their buffers serve the next forward
  static const std::string name = "pipeline logits from the last stage";  // FlightSite keeps a pointer to it
  const FlightSite site(name);
  pipeline_.topology().stages_group().broadcast(logits.data(), logits.size(), pipeline_.topology().stages() - 1);
}

const Parameter* PipelineTiedEmbedding::counted_elsewhere(LanguageModel& model) const {
  return tied_ && topology_.last() ? tied_embedding(model) : nullptr;
}

}  // namespace fsdpp
