#include "fsdpp/parallel/pipeline_parallel.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/nn/causal_lm.hpp"
#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/observe/watchdog.hpp"
#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <cstring>

namespace fsdpp {

namespace {

MPI_Comm split_comm(MPI_Comm comm, int color, int key) {
  MPI_Comm out = MPI_COMM_NULL;
  MPI_Comm_split(comm, color, key, &out);
  return out;
}

void free_comm(MPI_Comm& comm) {
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

// What a pipeline does not run yet: refused on every rank alike, before any communicator is made.
void check_runnable(const Deck& deck) {
  // The tied embedding's two gradients are summed after each stage has rounded its own, where one rank sums them
  // within each unit's backward: the same on any pp > 1, but not bitwise pp 1's.
  FSDPP_REQUIRE(!deck.train.reproducible || !deck.model.tie_embeddings, "train.reproducible with mesh.pp {} and a "
                "tied embedding (model.tie_embeddings: true): its copies on the first and the last stage would round "
                "their gradients apart, so the bits would differ from mesh.pp: 1; use model.tie_embeddings: false, or "
                "mesh.pp: 1", deck.mesh.pp);
  FSDPP_REQUIRE(deck.train.sample_interval == 0, "train.sample_interval with mesh.pp {}: samples are not generated "
                "through a pipeline yet; set train.sample_interval: 0 (`fsdpp generate` reads the checkpoint at any "
                "mesh)", deck.mesh.pp);
}

}  // namespace

PipelineParallel::PipelineParallel(MPI_Comm world, const Deck& deck, const LanguageModel& whole)
    : stages_(deck.mesh.pp), virtual_stages_(deck.pipeline.virtual_stages), kind_(deck.pipeline.schedule),
      configured_microbatches_(deck.pipeline.microbatches),
      replay_reason_(pipeline_replay_reason(deck.model, deck.mesh)) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  check_runnable(deck);
  check_job_size(deck.mesh, size);
  check_pipeline(deck.model, deck.mesh, deck.pipeline);
  const int per_stage = size / stages_;
  stage_ = rank / per_stage;
  const int place = rank % per_stage;
  split_ = split_stages(whole.flops_per_token_by_piece(deck.model.context_length), stages_ * virtual_stages_,
                        deck.pipeline.split);
  tied_ = deck.model.tie_embeddings;
  stage_comm_ = split_comm(world, stage_, place);
  pp_comm_ = split_comm(world, place, stage_);
  tied_comm_ = split_comm(world, tied_ && (first() || last()) ? place : MPI_UNDEFINED, stage_);
  pp_group_ = std::make_unique<MpiCommunicator>(pp_comm_);
  pp_group_->set_label("pp");  // the flight recorder's and the traffic table's name for it
  if (tied_comm_ != MPI_COMM_NULL) {
    tied_group_ = std::make_unique<MpiCommunicator>(tied_comm_);
    tied_group_->set_label("pp (tied embedding)");
  }
  int* tag_ub = nullptr;
  int has_tag_ub = 0;
  MPI_Comm_get_attr(pp_comm_, MPI_TAG_UB, &tag_ub, &has_tag_ub);
  if (has_tag_ub && tag_ub) tag_limit_ = *tag_ub;
  stage_world_ranks_.resize(static_cast<std::size_t>(stages_));
  MPI_Allgather(&rank, 1, MPI_INT, stage_world_ranks_.data(), 1, MPI_INT, pp_comm_);
}

PipelineParallel::~PipelineParallel() {
  for (PendingSend& s : sends_)
    if (s.request != MPI_REQUEST_NULL) MPI_Wait(&s.request, MPI_STATUS_IGNORE);
  for (PostedReceive& p : posted_) {  // a step that failed part-way: its receives are withdrawn
    MPI_Cancel(&p.request);
    MPI_Wait(&p.request, MPI_STATUS_IGNORE);
  }
  pp_group_.reset();
  tied_group_.reset();
  free_comm(tied_comm_);
  free_comm(pp_comm_);
  free_comm(stage_comm_);
}

PipelineStagePart PipelineParallel::part() const { return pipeline_stage_part(split_, stages_, stage_); }

Deck pipeline_stage_deck(const Deck& deck) {
  Deck d = deck;
  d.mesh.pp = 1;
  d.pipeline = {};  // the stage runs no pipeline of its own
  if (d.fsdp.reshard_after_forward.kind == ReshardAfterForward::Kind::automatic)
    d.fsdp.reshard_after_forward.kind = ReshardAfterForward::Kind::no;
  return d;
}

const std::vector<PipelineAction>& PipelineParallel::actions(int microbatches) {
  if (microbatches == schedule_microbatches_) return actions_;
  // The step's micro-batches are the pipeline's: a different pipeline.microbatches would be ignored, so it is refused.
  FSDPP_REQUIRE(configured_microbatches_ == 0 || configured_microbatches_ == microbatches,
                "pipeline.microbatches is {}, but each step has {} micro-batches (train.global_batch / (train.micro_batch "
                "x the stage's data-parallel ranks)), and those are what flows through the pipeline: set "
                "pipeline.microbatches: 0, or change train.micro_batch", configured_microbatches_, microbatches);
  const PipelineShape shape{stages_, virtual_stages_, microbatches};
  const int last_tag = tag_of(shape.stages() - 1, microbatches - 1, true);  // every rank alike: before any message
  FSDPP_REQUIRE(last_tag <= tag_limit_, "pipeline: {} micro-batches through {} stages need message tags up to {}, "
                "above this MPI's MPI_TAG_UB {}; use fewer micro-batches or stages", microbatches, shape.stages(),
                last_tag, tag_limit_);
  const PipelineSchedule schedule = make_pipeline_schedule(kind_, shape);
  ideal_bubble_ = simulate_pipeline(schedule, shape, PipelineCosts::uniform(shape.stages())).bubble;  // refuses a hang
  actions_ = schedule[static_cast<std::size_t>(stage_)];
  message_plan_ = plan_pipeline_messages(schedule, shape)[static_cast<std::size_t>(stage_)];
  action_regions_.clear();
  for (const PipelineAction& a : actions_) action_regions_.push_back("fsdpp::pipeline " + to_string(a));
  schedule_microbatches_ = microbatches;
  return actions_;
}

int PipelineParallel::tag_of(int from_stage, int microbatch, bool gradient) const {
  return (microbatch * stages_ * virtual_stages_ + from_stage) * 2 + (gradient ? 1 : 0);
}

std::size_t PipelineParallel::message_floats(std::size_t count, std::size_t trailer_doubles) {
  return count + trailer_doubles * sizeof(double) / sizeof(float);
}

void PipelineParallel::post_receives(std::size_t action, std::size_t capacity) {
  for (const PipelineMessage& m : message_plan_.receives_before[action]) {
    if (free_landings_.empty()) {
      free_landings_.push_back(static_cast<int>(landings_.size()));
      landings_.emplace_back();
    }
    PostedReceive posted{m, free_landings_.back(), MPI_REQUEST_NULL};
    free_landings_.pop_back();
    std::vector<float>& landing = landings_[static_cast<std::size_t>(posted.landing)];
    landing.resize(capacity);
    MPI_Irecv(landing.data(), static_cast<int>(capacity), MPI_FLOAT, m.from_stage % stages_,
              tag_of(m.from_stage, m.microbatch, m.gradient), pp_comm_, &posted.request);
    posted_.push_back(posted);
  }
}

void PipelineParallel::check_no_posted_receives() const {
  FSDPP_CHECK(posted_.empty(), "pipeline stage {}: {} receive(s) posted for this step were never waited on", stage_,
              posted_.size());
}

void PipelineParallel::send(const View1<float>& x, std::size_t count, int from_stage, int to_stage, int microbatch,
                            bool gradient, const std::vector<double>* trailer) {
  if (sends_in_flight_ == sends_.size()) sends_.emplace_back();
  PendingSend& s = sends_[sends_in_flight_++];
  const std::size_t total = message_floats(count, trailer ? trailer->size() : 0);
  s.data.resize(total);
  Kokkos::deep_copy(HostView1<float>(s.data.data(), count), Kokkos::subview(x, std::make_pair(std::size_t{0}, count)));
  if (trailer) std::memcpy(s.data.data() + count, trailer->data(), trailer->size() * sizeof(double));
  MPI_Isend(s.data.data(), static_cast<int>(total), MPI_FLOAT, to_stage % stages_,
            tag_of(from_stage, microbatch, gradient), pp_comm_, &s.request);
}

void PipelineParallel::receive(const View1<float>& x, std::size_t count, int at_stage, int from_stage, int microbatch,
                               bool gradient, std::vector<double>* trailer) {
  const std::size_t total = message_floats(count, trailer ? trailer->size() : 0);
  const double start = MPI_Wtime();
  const int from_rank = from_stage % stages_;
  // Watched with comm.timeout_s: a stage that never sends ends the job, naming the stage it waits on.
  const CollectiveWatchdog::Region watched(fmt::format(
      "pipeline stage {} waiting for {} of micro-batch {} from stage {} (world rank {})", at_stage,
      gradient ? "the output gradient" : "the activations", microbatch, from_stage,
      stage_world_ranks_[static_cast<std::size_t>(from_rank)]));
  // Posted early by post_receives (training), or received here (an evaluation's, which has no plan).
  const PipelineMessage wanted{from_stage, at_stage, microbatch, gradient};
  const auto posted = std::find_if(posted_.begin(), posted_.end(), [&](const PostedReceive& p) {
    return p.message == wanted;
  });
  const float* landed = nullptr;
  {
    const TimelineScope waiting(timeline_names::pipeline_receive);
    MPI_Status status;
    if (posted != posted_.end()) {
      MPI_Wait(&posted->request, &status);
      landed = landings_[static_cast<std::size_t>(posted->landing)].data();
    } else {
      receive_buffer_.resize(total);
      MPI_Recv(receive_buffer_.data(), static_cast<int>(total), MPI_FLOAT, from_rank,
               tag_of(from_stage, microbatch, gradient), pp_comm_, &status);
      landed = receive_buffer_.data();
    }
    int got = 0;
    MPI_Get_count(&status, MPI_FLOAT, &got);
    FSDPP_CHECK(static_cast<std::size_t>(got) == total, "pipeline stage {}: {} floats arrived from stage {} for "
                "micro-batch {}, {} were expected", at_stage, got, from_stage, microbatch, total);
  }
  waited_s_ += MPI_Wtime() - start;
  if (trailer) std::memcpy(trailer->data(), landed + count, trailer->size() * sizeof(double));
  Kokkos::deep_copy(Kokkos::subview(x, std::make_pair(std::size_t{0}, count)), HostView1<const float>(landed, count));
  if (posted != posted_.end()) {
    free_landings_.push_back(posted->landing);
    posted_.erase(posted);
  }
}

void PipelineParallel::wait_sends() {
  for (std::size_t i = 0; i < sends_in_flight_; ++i) MPI_Wait(&sends_[i].request, MPI_STATUS_IGNORE);
  sends_in_flight_ = 0;
}

double PipelineParallel::from_last_stage(double value) {
  static const std::string name = "pipeline loss from the last stage";  // FlightSite keeps a pointer to it
  const FlightSite site(name);
  pp_group_->broadcast(&value, 1, stages_ - 1);
  return value;
}

void PipelineParallel::from_last_stage(std::vector<double>& values) {
  static const std::string name = "pipeline statistics from the last stage";  // FlightSite keeps a pointer to it
  const FlightSite site(name);
  pp_group_->broadcast(values.data(), values.size(), stages_ - 1);
}

namespace {
Parameter* tied_embedding(LanguageModel& model) { return &static_cast<CausalLM&>(model).token_embedding; }
}  // namespace

void PipelineParallel::sum_tied_gradient(LanguageModel& model) {
  if (!tied_group_) return;
  Parameter* p = tied_embedding(model);
  FSDPP_CHECK(p, "pipeline stage {}: a tied embedding was expected on the first and the last stage", stage_);
  const std::size_t n = p->grad().extent(0);
  receive_buffer_.resize(n);
  Kokkos::fence();
  const HostView1<float> host(receive_buffer_.data(), n);
  Kokkos::deep_copy(host, p->grad());
  static const std::string name = "pipeline tied embedding gradient";  // FlightSite keeps a pointer to it
  const FlightSite site(name);
  tied_group_->all_reduce(receive_buffer_.data(), n, ReduceOp::sum);  // host staging: an MPI group
  Kokkos::deep_copy(p->grad(), host);
}

const Parameter* PipelineParallel::counted_elsewhere(LanguageModel& model) const {
  return tied_ && last() ? tied_embedding(model) : nullptr;
}

}  // namespace fsdpp
