#pragma once
// PipelineTransport: the activations and their gradients between stages (pipeline_parallel.hpp), as messages on the
// pp group's own communicator (NCCL between GPUs, else MPI): non-blocking sends whose buffers it keeps, receives
// posted ahead in the schedule's posting order (pipeline_messages.hpp) into landing buffers it keeps, and the time
// this rank waited in them.
#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/parallel/pipeline_messages.hpp"
#include "fsdpp/parallel/pipeline_schedule.hpp"
#include "fsdpp/parallel/pipeline_topology.hpp"
#include "fsdpp/tensor/types.hpp"

#include <memory>
#include <optional>
#include <vector>

namespace fsdpp {

class PipelineTransport {
 public:
  // Collective over the topology's pp group; `backend`: the deck's comm.backend.
  PipelineTransport(const PipelineTopology& topology, CommBackend backend);
  ~PipelineTransport();
  PipelineTransport(const PipelineTransport&) = delete;
  PipelineTransport& operator=(const PipelineTransport&) = delete;

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
  // This rank's part of the schedule's posting order (PipelineScheduler::build's), for post_receives.
  void set_message_plan(RankMessagePlan plan) { message_plan_ = std::move(plan); }
  // The receives the schedule's posting order (pipeline_messages.hpp) posts before action `action` of the
  // schedule's actions, each into a landing buffer of `capacity` floats (message_floats) until receive() waits on
  // it. Training calls it before every action; receive() takes a message posted so, or receives it there (an
  // evaluation's).
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

 private:
  const PipelineTopology& topology_;
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
  std::unique_ptr<Communicator> messages_;  // on the pp group: the activations and gradients
  bool device_messages_ = false;            // messages_ moves device memory (NCCL)
  bool buffers_in_views_ = false;           // buffers_in_compute_memory
  std::vector<MessageBuffer> sends_;  // reused step to step: no allocation once the pipeline is full
  std::size_t sends_in_flight_ = 0;
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
};

}  // namespace fsdpp
