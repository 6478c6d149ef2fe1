#include "fsdpp/parallel/pipeline_parallel.hpp"

#include "fsdpp/comm/make_communicator.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/parallel/parallelize.hpp"
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

}  // namespace

PipelineParallel::PipelineParallel(MPI_Comm world, const Deck& deck, const LanguageModel& whole)
    : stages_(deck.mesh.pp), virtual_stages_(deck.pipeline.virtual_stages), kind_(deck.pipeline.schedule),
      configured_microbatches_(deck.pipeline.microbatches), global_batch_(deck.train.global_batch),
      forward_batch_(training_forward_batch(deck.train)), forward_batch_key_(training_forward_batch_key(deck.train)),
      reproducible_units_(deck.train.reproducible) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  check_job_size(deck.mesh, size);
  check_pipeline(deck.model, deck.mesh, deck.pipeline);
  const int per_stage = size / stages_;
  stage_ = rank / per_stage;
  const int place = rank % per_stage;
  split_ = split_stages(whole.flops_per_token_by_piece(deck.model.context_length), stages_ * virtual_stages_,
                        deck.pipeline.split);
  tied_ = deck.model.tie_embeddings;
  exact_ = deck.train.reproducible;
  stage_comm_ = split_comm(world, stage_, place);
  pp_comm_ = split_comm(world, place, stage_);
  tied_comm_ = split_comm(world, tied_ && (first() || last()) ? place : MPI_UNDEFINED, stage_);
  pp_group_ = std::make_unique<MpiCommunicator>(pp_comm_);
  pp_group_->set_label("pp");  // the flight recorder's and the traffic table's name for it
  // The messages go on the stage's own transport: NCCL between GPUs (device memory, no host staging), else MPI.
  messages_ = make_communicator(choose_backend(deck.comm.backend), pp_comm_);
  messages_->set_label("pp (messages)");
  device_messages_ = messages_->stream_ordered();
  buffers_in_views_ = buffers_in_compute_memory(messages_->backend());
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
  for (MessageBuffer& s : sends_) s.work.reset();  // waits
  posted_.clear();  // a step that failed part-way: its receives are withdrawn (MPI) or waited on
  post_now_.work.reset();
  messages_.reset();
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


std::size_t PipelineParallel::message_floats(std::size_t count, std::size_t trailer_doubles) {
  return count + trailer_doubles * sizeof(double) / sizeof(float);
}

bool PipelineParallel::buffers_in_compute_memory(CommBackend backend) {
#ifdef FSDPP_DEVICE_BUILD
  return backend == CommBackend::nccl;
#else
  (void)backend;
  return true;
#endif
}

int PipelineParallel::kept_buffers(const std::vector<PipelineAction>& actions, const PipelineShape& shape,
                                   const RankMessagePlan& plan) {
  int sends = 0;
  for (const PipelineAction& a : actions) sends += fsdpp::message_out_of(a, shape) ? 1 : 0;
  return sends + plan.most_pending;
}

float* PipelineParallel::MessageBuffer::ensure(std::size_t floats, bool in_view) {
  if (!in_view) {
    host.resize(floats);
    return host.data();
  }
  if (view.extent(0) < floats) view = uninitialized<float>("fsdpp::pipeline_message", floats);
  return view.data();
}

void PipelineParallel::fill(MessageBuffer& buffer, const View1<float>& x, std::size_t count,
                            const std::vector<double>* trailer) {
  const std::size_t total = message_floats(count, trailer ? trailer->size() : 0);
  float* data = buffer.ensure(total, buffers_in_views_);
  const auto head = std::make_pair(std::size_t{0}, count);
  if (buffers_in_views_) Kokkos::deep_copy(Kokkos::subview(buffer.view, head), Kokkos::subview(x, head));
  else Kokkos::deep_copy(HostView1<float>(data, count), Kokkos::subview(x, head));
  if (!trailer || trailer->empty()) return;
  trailer_floats_.resize(total - count);
  std::memcpy(trailer_floats_.data(), trailer->data(), trailer->size() * sizeof(double));
  if (buffers_in_views_)
    Kokkos::deep_copy(Kokkos::subview(buffer.view, std::make_pair(count, total)),
                      HostView1<const float>(trailer_floats_.data(), total - count));
  else std::memcpy(data + count, trailer_floats_.data(), (total - count) * sizeof(float));
}

void PipelineParallel::empty(const MessageBuffer& buffer, const View1<float>& x, std::size_t count,
                             std::vector<double>* trailer) {
  const auto head = std::make_pair(std::size_t{0}, count);
  if (buffers_in_views_) Kokkos::deep_copy(Kokkos::subview(x, head), Kokkos::subview(buffer.view, head));
  else Kokkos::deep_copy(Kokkos::subview(x, head), HostView1<const float>(buffer.host.data(), count));
  if (!trailer || trailer->empty()) return;
  const std::size_t total = message_floats(count, trailer->size());
  trailer_floats_.resize(total - count);
  if (buffers_in_views_)
    Kokkos::deep_copy(HostView1<float>(trailer_floats_.data(), total - count),
                      Kokkos::subview(buffer.view, std::make_pair(count, total)));
  else std::memcpy(trailer_floats_.data(), buffer.host.data() + count, (total - count) * sizeof(float));
  std::memcpy(trailer->data(), trailer_floats_.data(), trailer->size() * sizeof(double));
}

int PipelineParallel::take_landing() {
  if (free_landings_.empty()) {
    free_landings_.push_back(static_cast<int>(landings_.size()));
    landings_.emplace_back();
  }
  const int landing = free_landings_.back();
  free_landings_.pop_back();
  return landing;
}

void PipelineParallel::post_receives(std::size_t action, std::size_t capacity) {
  for (const PipelineMessage& m : message_plan_.receives_before[action]) {
    PostedReceive posted{m, take_landing(), capacity, nullptr};
    float* data = landings_[static_cast<std::size_t>(posted.landing)].ensure(capacity, buffers_in_views_);
    posted.work = messages_->receive_async(data, capacity, DType::f32, m.from_stage % stages_,
                                           tag_of(m.from_stage, m.microbatch, m.gradient));
    posted_.push_back(std::move(posted));
  }
}

void PipelineParallel::check_no_posted_receives() const {
  FSDPP_CHECK(posted_.empty(), "pipeline stage {}: {} receive(s) posted for this step were never waited on", stage_,
              posted_.size());
}

int PipelineParallel::tag_of(int from_stage, int microbatch, bool gradient) const {
  return (microbatch * stages_ * virtual_stages_ + from_stage) * 2 + (gradient ? 1 : 0);
}

std::optional<PipelineMessage> PipelineParallel::message_into(const PipelineAction& a) const {
  return fsdpp::message_into(a, PipelineShape{stages_, virtual_stages_, 1});
}

std::optional<PipelineMessage> PipelineParallel::message_out_of(const PipelineAction& a) const {
  return fsdpp::message_out_of(a, PipelineShape{stages_, virtual_stages_, 1});
}

void PipelineParallel::send(const View1<float>& x, std::size_t count, const PipelineMessage& m,
                            const std::vector<double>* trailer) {
  if (sends_in_flight_ == sends_.size()) sends_.emplace_back();
  MessageBuffer& s = sends_[sends_in_flight_++];
  fill(s, x, count, trailer);
  const std::size_t total = message_floats(count, trailer ? trailer->size() : 0);
  s.work = messages_->send_async(buffers_in_views_ ? s.view.data() : s.host.data(), total, DType::f32,
                                 m.to_stage % stages_, tag_of(m.from_stage, m.microbatch, m.gradient));
}

void PipelineParallel::receive(const View1<float>& x, std::size_t count, const PipelineMessage& m,
                               std::vector<double>* trailer) {
  const int at_stage = m.to_stage, from_stage = m.from_stage, microbatch = m.microbatch;
  const bool gradient = m.gradient;
  const std::size_t total = message_floats(count, trailer ? trailer->size() : 0);
  const double start = MPI_Wtime();
  const int from_rank = from_stage % stages_;
  // Watched with comm.timeout_s: a stage that never sends ends the job, naming the stage it waits on.
  const CollectiveWatchdog::Region watched(fmt::format(
      "pipeline stage {} waiting for {} of micro-batch {} from stage {} (world rank {})", at_stage,
      gradient ? "the output gradient" : "the activations", microbatch, from_stage,
      stage_world_ranks_[static_cast<std::size_t>(from_rank)]));
  // Posted early by post_receives (training), or posted here (an evaluation's, which has no plan).
  auto posted = std::find_if(posted_.begin(), posted_.end(), [&](const PostedReceive& p) { return p.message == m; });
  if (posted == posted_.end()) {  // into a landing buffer training keeps (kept_buffers)
    post_now_.message = m;
    post_now_.landing = take_landing();
    post_now_.work = messages_->receive_async(
        landings_[static_cast<std::size_t>(post_now_.landing)].ensure(total, buffers_in_views_), total, DType::f32,
        from_rank, tag_of(from_stage, microbatch, gradient));
    post_now_.capacity = total;
  }
  PostedReceive& r = posted != posted_.end() ? *posted : post_now_;
  FSDPP_CHECK(r.capacity == total, "pipeline stage {}: a receive of {} floats was posted for micro-batch {} from stage "
              "{}, but {} are expected", at_stage, r.capacity, microbatch, from_stage, total);
  {
    const TimelineScope waiting(timeline_names::pipeline_receive);
    r.work->wait();
    if (device_messages_) Kokkos::fence();  // the message is in: the wait above only ordered the device after it
  }
  waited_s_ += MPI_Wtime() - start;
  empty(landings_[static_cast<std::size_t>(r.landing)], x, count, trailer);
  r.work.reset();
  free_landings_.push_back(r.landing);
  if (posted != posted_.end()) posted_.erase(posted);
}

void PipelineParallel::wait_sends() {
  for (std::size_t i = 0; i < sends_in_flight_; ++i) sends_[i].work->wait();
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

void PipelineParallel::tie_gradients(LanguageModel& model) {
  if (!tied_group_ || !exact_) return;
  // Reproducible mode: each copy's words are exact sums of its part's cuts; their sum is one rank's (whose head part
  // is cut apart from the lookup's, nn/causal_lm.cpp), and both copies convert it to the same floats.
  FsdpGroup* root = fsdp_group(model);
  FSDPP_CHECK(root, "pipeline stage {}: the tied embedding's stage is not sharded", stage_);
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

void PipelineParallel::sum_tied_gradient(LanguageModel& model) {
  if (!tied_group_ || exact_) return;  // reproducible mode summed the words (tie_gradients)
  Parameter* p = tied_embedding(model);
  FSDPP_CHECK(p, "pipeline stage {}: a tied embedding was expected on the first and the last stage", stage_);
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
  const PipelineAction forward{PipelineOp::forward, pipeline_.global_stage(chunk), 0};
  pipeline_.receive(x, count, pipeline_.message_into(forward).value());
}

void PipelineDecodeLink::send(const View1<float>& x, std::size_t count, int chunk) {
  const PipelineAction forward{PipelineOp::forward, pipeline_.global_stage(chunk), 0};
  pipeline_.send(x, count, pipeline_.message_out_of(forward).value());
}

void PipelineDecodeLink::share_logits(std::vector<float>& logits) {
  pipeline_.wait_sends();  // this forward's sends are done: their buffers serve the next forward
  static const std::string name = "pipeline logits from the last stage";  // FlightSite keeps a pointer to it
  const FlightSite site(name);
  pipeline_.stages_group().broadcast(logits.data(), logits.size(), pipeline_.stages() - 1);
}

const Parameter* PipelineParallel::counted_elsewhere(LanguageModel& model) const {
  return tied_ && last() ? tied_embedding(model) : nullptr;
}

}  // namespace fsdpp
