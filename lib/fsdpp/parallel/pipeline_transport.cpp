#include "fsdpp/parallel/pipeline_transport.hpp"

#include "fsdpp/comm/make_communicator.hpp"
#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/observe/watchdog.hpp"
#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <cstring>

namespace fsdpp {

PipelineTransport::PipelineTransport(const PipelineTopology& topology, CommBackend backend)
    : topology_(topology) {
  // The messages go on the stage's own transport: NCCL between GPUs (device memory, no host staging), else MPI.
  messages_ = make_communicator(backend, topology_.pp_comm());
  messages_->set_label("pp (messages)");
  device_messages_ = messages_->stream_ordered();
  buffers_in_views_ = buffers_in_compute_memory(messages_->backend());
}

PipelineTransport::~PipelineTransport() {
  for (MessageBuffer& s : sends_) s.work.reset();  // waits
  posted_.clear();  // a step that failed part-way: its receives are withdrawn (MPI) or waited on
  post_now_.work.reset();
  messages_.reset();
}

std::size_t PipelineTransport::message_floats(std::size_t count, std::size_t trailer_doubles) {
  return count + trailer_doubles * sizeof(double) / sizeof(float);
}

bool PipelineTransport::buffers_in_compute_memory(CommBackend backend) {
#ifdef FSDPP_DEVICE_BUILD
  return backend == CommBackend::nccl;
#else
  (void)backend;
  return true;
#endif
}

int PipelineTransport::kept_buffers(const std::vector<PipelineAction>& actions, const PipelineShape& shape,
                                    const RankMessagePlan& plan) {
  int sends = 0;
  for (const PipelineAction& a : actions) sends += fsdpp::message_out_of(a, shape) ? 1 : 0;
  return sends + plan.most_pending;
}

float* PipelineTransport::MessageBuffer::ensure(std::size_t floats, bool in_view) {
  if (!in_view) {
    host.resize(floats);
    return host.data();
  }
  if (view.extent(0) < floats) view = uninitialized<float>("fsdpp::pipeline_message", floats);
  return view.data();
}

void PipelineTransport::fill(MessageBuffer& buffer, const View1<float>& x, std::size_t count,
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

void PipelineTransport::empty(const MessageBuffer& buffer, const View1<float>& x, std::size_t count,
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

int PipelineTransport::take_landing() {
  if (free_landings_.empty()) {
    free_landings_.push_back(static_cast<int>(landings_.size()));
    landings_.emplace_back();
  }
  const int landing = free_landings_.back();
  free_landings_.pop_back();
  return landing;
}

void PipelineTransport::post_receives(std::size_t action, std::size_t capacity) {
  for (const PipelineMessage& m : message_plan_.receives_before[action]) {
    PostedReceive posted{m, take_landing(), capacity, nullptr};
    float* data = landings_[static_cast<std::size_t>(posted.landing)].ensure(capacity, buffers_in_views_);
    posted.work = messages_->receive_async(data, capacity, DType::f32, m.from_stage % topology_.stages(),
                                           topology_.message_tag(m.from_stage, m.microbatch, m.gradient));
    posted_.push_back(std::move(posted));
  }
}

void PipelineTransport::check_no_posted_receives() const {
  FSDPP_CHECK(posted_.empty(), "pipeline stage {}: {} receive(s) posted for this step were never waited on",
              topology_.stage(), posted_.size());
}

std::optional<PipelineMessage> PipelineTransport::message_into(const PipelineAction& a) const {
  return fsdpp::message_into(a, topology_.shape(1));
}

std::optional<PipelineMessage> PipelineTransport::message_out_of(const PipelineAction& a) const {
  return fsdpp::message_out_of(a, topology_.shape(1));
}

void PipelineTransport::send(const View1<float>& x, std::size_t count, const PipelineMessage& m,
                             const std::vector<double>* trailer) {
  if (sends_in_flight_ == sends_.size()) sends_.emplace_back();
  MessageBuffer& s = sends_[sends_in_flight_++];
  fill(s, x, count, trailer);
  const std::size_t total = message_floats(count, trailer ? trailer->size() : 0);
  s.work = messages_->send_async(buffers_in_views_ ? s.view.data() : s.host.data(), total, DType::f32,
                                 m.to_stage % topology_.stages(),
                                 topology_.message_tag(m.from_stage, m.microbatch, m.gradient));
}

void PipelineTransport::receive(const View1<float>& x, std::size_t count, const PipelineMessage& m,
                                std::vector<double>* trailer) {
  const int at_stage = m.to_stage, from_stage = m.from_stage, microbatch = m.microbatch;
  const bool gradient = m.gradient;
  const std::size_t total = message_floats(count, trailer ? trailer->size() : 0);
  const double start = MPI_Wtime();
  const int from_rank = from_stage % topology_.stages();
  // Watched with comm.timeout_s: a stage that never sends ends the job, naming the stage it waits on.
  const CollectiveWatchdog::Region watched(fmt::format(
      "pipeline stage {} waiting for {} of micro-batch {} from stage {} (world rank {})", at_stage,
      gradient ? "the output gradient" : "the activations", microbatch, from_stage,
      topology_.stage_world_rank(from_rank)));
  // Posted early by post_receives (training), or posted here (an evaluation's, which has no plan).
  auto posted = std::find_if(posted_.begin(), posted_.end(), [&](const PostedReceive& p) { return p.message == m; });
  if (posted == posted_.end()) {  // into a landing buffer training keeps (kept_buffers)
    post_now_.message = m;
    post_now_.landing = take_landing();
    post_now_.work = messages_->receive_async(
        landings_[static_cast<std::size_t>(post_now_.landing)].ensure(total, buffers_in_views_), total, DType::f32,
        from_rank, topology_.message_tag(from_stage, microbatch, gradient));
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

void PipelineTransport::wait_sends() {
  for (std::size_t i = 0; i < sends_in_flight_; ++i) sends_[i].work->wait();
  sends_in_flight_ = 0;
}

}  // namespace fsdpp
