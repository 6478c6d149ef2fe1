#include "fsdpp/comm/mpi_communicator.hpp"

#include "fsdpp/comm/group_members.hpp"
#include "fsdpp/comm/large_count.hpp"
#include "fsdpp/comm/mpi_algorithms.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/observe/watchdog.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace fsdpp {
namespace {

class MpiWork final : public Work {
 public:
  explicit MpiWork(std::shared_ptr<TaskState> state) : state_(std::move(state)) {}
  ~MpiWork() override {
    if (!waited_) state_->wait_quietly();
  }
  void wait() override {
    waited_ = true;
    state_->wait();
  }
  bool is_completed() override { return state_->done(); }

 private:
  std::shared_ptr<TaskState> state_;
  bool waited_ = false;
};

// A message's requests (MPI_Isend / MPI_Irecv pieces): wait() is MPI_Waitall, inside the watchdog's scope so
// that a message that never comes is named and timed out like a collective.
// A receive dropped unwaited (a step that failed part-way) is cancelled; a send is waited for.
class MpiMessageWork final : public Work {
 public:
  MpiMessageWork(std::vector<MPI_Request> requests, const CollectiveTicket& ticket, bool receive)
      : requests_(std::move(requests)), ticket_(ticket), receive_(receive) {}
  ~MpiMessageWork() override {
    if (waited_) return;
    if (receive_)
      for (MPI_Request& r : requests_) MPI_Cancel(&r);
    MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    if (waited_) return;
    const CollectiveWatchdog::Scope watched(ticket_);
    FSDPP_MPI_CHECK(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
    waited_ = true;
  }
  bool is_completed() override {
    int done = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0;
  }

 private:
  std::vector<MPI_Request> requests_;
  CollectiveTicket ticket_;
  bool receive_ = false;
  bool waited_ = false;
};

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

std::size_t env_bytes(const char* name, std::size_t fallback, std::size_t minimum) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const unsigned long long bytes = std::strtoull(text, &end, 10);
  FSDPP_REQUIRE(end && *end == '\0' && bytes >= minimum, "{}='{}': expected a byte count >= {}", name, text, minimum);
  return bytes;
}

void check_buffer(const void* p, std::size_t count, const char* what, const char* op) {
  FSDPP_CHECK(count == 0 || p != nullptr, "{}: {} buffer is null but count is {}", op, what, count);
}

void check_reducible(DType dtype, const char* op) {
  FSDPP_CHECK(dtype_is_arithmetic(dtype), "{}: cannot reduce dtype '{}'; use f32, f64, bf16 or i64", op, dtype_name(dtype));
}

}  // namespace

MpiAlgorithms MpiAlgorithms::from_environment() {
  MpiAlgorithms a;
  const std::string ag = env_or("FSDPP_MPI_ALLGATHER", "native");
  const std::string rs = env_or("FSDPP_MPI_REDUCE_SCATTER", "ring");
  FSDPP_REQUIRE(ag == "native" || ag == "ring", "FSDPP_MPI_ALLGATHER='{}': expected 'native' or 'ring'", ag);
  FSDPP_REQUIRE(rs == "native" || rs == "ring", "FSDPP_MPI_REDUCE_SCATTER='{}': expected 'native' or 'ring'", rs);
  const std::string ar = env_or("FSDPP_MPI_ALLREDUCE", "ring");
  FSDPP_REQUIRE(ar == "native" || ar == "ring", "FSDPP_MPI_ALLREDUCE='{}': expected 'native' or 'ring'", ar);
  a.all_reduce = ar == "native" ? AllReduce::native : AllReduce::ring;
  a.all_gather = ag == "ring" ? AllGather::ring : AllGather::native;
  a.reduce_scatter = rs == "native" ? ReduceScatter::native : ReduceScatter::ring;
  a.segment_bytes = env_bytes("FSDPP_MPI_SEGMENT_BYTES", a.segment_bytes, 64);
  a.ring_all_reduce_min_bytes = env_bytes("FSDPP_MPI_ALLREDUCE_RING_MIN_BYTES", a.ring_all_reduce_min_bytes, 0);
  return a;
}

std::string MpiAlgorithms::describe() const {
  return fmt::format("all_gather={} reduce_scatter={} all_reduce={} (ring from {} KiB) segment={} KiB",
                     all_gather == AllGather::ring ? "ring" : "native",
                     reduce_scatter == ReduceScatter::ring ? "ring" : "native",
                     all_reduce == AllReduce::ring ? "ring" : "native", ring_all_reduce_min_bytes / 1024,
                     segment_bytes / 1024);
}

MpiCommunicator::MpiCommunicator(MPI_Comm group, MpiAlgorithms algorithms)
    : Communicator(CommBackend::mpi), algorithms_(algorithms), executor_([] {
        int level = MPI_THREAD_SINGLE;
        MPI_Query_thread(&level);
        return level >= MPI_THREAD_MULTIPLE;
      }()) {
  FSDPP_MPI_CHECK(MPI_Comm_dup(group, &comm_));
  // Errors come back to fsdpp (FSDPP_MPI_CHECK throws; the rank then aborts through abort_job, with the flight
  // recorder's dumps) instead of Open MPI ending the job at once with its own message.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  set_label(fmt::format("a group of {} ranks", size_));
  set_members(world_ranks_of(comm_));
}

MpiCommunicator::~MpiCommunicator() {
  executor_.run_inline([] {});  // collectives still queued must finish before their communicator goes
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string MpiCommunicator::describe() const {
  return fmt::format("mpi (size {}, {}, {})", size_, algorithms_.describe(),
                     executor_.threaded() ? "async on a communication thread" : "async runs eagerly: MPI lacks THREAD_MULTIPLE");
}

namespace {
// Messages of more than max_message_elements elements (or INT_MAX bytes, MPI's count) go as several, which MPI
// keeps in order (same peer and tag).
template <class Post>
std::vector<MPI_Request> post_pieces(std::size_t count, DType dtype, std::size_t max_elements, Post&& post) {
  const std::size_t size = dtype_size(dtype), bytes = count * size;
  const std::size_t max_bytes = std::min<std::size_t>(max_elements, static_cast<std::size_t>(INT_MAX) / size) * size;
  std::vector<MPI_Request> requests;
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(max_bytes, bytes - at);
    requests.emplace_back();
    post(at, static_cast<int>(n), &requests.back());
    at += n;
  } while (at < bytes);
  return requests;
}
}  // namespace

WorkHandle MpiCommunicator::start_send(const void* buf, std::size_t count, DType dtype, int peer, int tag,
                                       const CollectiveTicket& ticket) {
  check_buffer(buf, count, "send", "send");
  const auto* bytes = static_cast<const unsigned char*>(buf);
  return std::make_unique<MpiMessageWork>(
      post_pieces(count, dtype, algorithms_.max_message_elements,
                  [&](std::size_t at, int n, MPI_Request* r) {
                    FSDPP_MPI_CHECK(MPI_Isend(bytes + at, n, MPI_BYTE, peer, tag, comm_, r));
                  }),
      ticket, false);
}

WorkHandle MpiCommunicator::start_receive(void* buf, std::size_t count, DType dtype, int peer, int tag,
                                          const CollectiveTicket& ticket) {
  check_buffer(buf, count, "receive", "receive");
  auto* bytes = static_cast<unsigned char*>(buf);
  return std::make_unique<MpiMessageWork>(
      post_pieces(count, dtype, algorithms_.max_message_elements,
                  [&](std::size_t at, int n, MPI_Request* r) {
                    FSDPP_MPI_CHECK(MPI_Irecv(bytes + at, n, MPI_BYTE, peer, tag, comm_, r));
                  }),
      ticket, true);
}

WorkHandle MpiCommunicator::start(std::function<void()> task) {
  return std::make_unique<MpiWork>(executor_.submit(std::move(task)));
}

void MpiCommunicator::do_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                                    const CollectiveTicket& t) {
  const CollectiveWatchdog::Scope watched(t);
  const mpi_algorithms::Context c{comm_, rank_, size_, algorithms_.segment_bytes, algorithms_.max_message_elements, &scratch_};
  if (algorithms_.all_gather == MpiAlgorithms::AllGather::ring) mpi_algorithms::all_gather_ring(c, send, recv, count, dtype);
  else mpi_algorithms::all_gather_native(c, send, recv, count, dtype);
}

void MpiCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                        ReduceScatterOptions o, const CollectiveTicket& t) {
  const CollectiveWatchdog::Scope watched(t);
  const mpi_algorithms::Context c{comm_, rank_, size_, algorithms_.segment_bytes, algorithms_.max_message_elements, &scratch_};
  const double post = o.post_scale / (o.op == ReduceOp::avg ? size_ : 1);
  if (algorithms_.reduce_scatter == MpiAlgorithms::ReduceScatter::ring)
    mpi_algorithms::reduce_scatter_ring(c, send, recv, count, dtype, o.pre_scale, post);
  else
    mpi_algorithms::reduce_scatter_native(c, send, recv, count, dtype, o.pre_scale, post);
}

void MpiCommunicator::do_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op, const CollectiveTicket& t) {
  const CollectiveWatchdog::Scope watched(t);
  const mpi_algorithms::Context c{comm_, rank_, size_, algorithms_.segment_bytes, algorithms_.max_message_elements, &scratch_};
  if (algorithms_.all_reduce == MpiAlgorithms::AllReduce::ring &&
      count * dtype_size(dtype) >= algorithms_.ring_all_reduce_min_bytes)
    mpi_algorithms::all_reduce_ring(c, buf, count, dtype, op);
  else
    mpi_algorithms::all_reduce_native(c, buf, count, dtype, op);
}

void MpiCommunicator::do_broadcast(void* buf, std::size_t count, DType dtype, int root, const CollectiveTicket& t) {
  const CollectiveWatchdog::Scope watched(t);
  const mpi_algorithms::Context c{comm_, rank_, size_, algorithms_.segment_bytes, algorithms_.max_message_elements, &scratch_};
  mpi_algorithms::broadcast_native(c, buf, count, dtype, root);
}

// Arguments are checked on the caller's thread, so a misuse throws at the call site, not at wait().
#define FSDPP_CHECK_ALL_GATHER()                                                                         \
  check_buffer(send, count, "send", "all_gather");                                                       \
  check_buffer(recv, count, "recv", "all_gather")
#define FSDPP_CHECK_REDUCE_SCATTER()                                                                     \
  check_buffer(send, count, "send", "reduce_scatter");                                                   \
  check_buffer(recv, count, "recv", "reduce_scatter");                                                   \
  check_reducible(dtype, "reduce_scatter");                                                              \
  FSDPP_CHECK(options.op != ReduceOp::max, "reduce_scatter supports sum and avg, not max")
#define FSDPP_CHECK_ALL_REDUCE()                                                                         \
  check_buffer(buf, count, "", "all_reduce");                                                            \
  check_reducible(dtype, "all_reduce")
#define FSDPP_CHECK_BROADCAST()                                                                          \
  check_buffer(buf, count, "", "broadcast");                                                             \
  FSDPP_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group of {}", root, size_)

WorkHandle MpiCommunicator::start_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                                             const CollectiveTicket& t) {
  FSDPP_CHECK_ALL_GATHER();
  return start([=] { do_all_gather(send, recv, count, dtype, t); });
}
void MpiCommunicator::run_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                                     const CollectiveTicket& t) {
  FSDPP_CHECK_ALL_GATHER();
  executor_.run_inline([&] { do_all_gather(send, recv, count, dtype, t); });
}

WorkHandle MpiCommunicator::start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                                 ReduceScatterOptions options, const CollectiveTicket& t) {
  FSDPP_CHECK_REDUCE_SCATTER();
  return start([=] { do_reduce_scatter(send, recv, count, dtype, options, t); });
}
void MpiCommunicator::run_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                         ReduceScatterOptions options, const CollectiveTicket& t) {
  FSDPP_CHECK_REDUCE_SCATTER();
  executor_.run_inline([&] { do_reduce_scatter(send, recv, count, dtype, options, t); });
}

WorkHandle MpiCommunicator::start_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op,
                                             const CollectiveTicket& t) {
  FSDPP_CHECK_ALL_REDUCE();
  return start([=] { do_all_reduce(buf, count, dtype, op, t); });
}
void MpiCommunicator::run_all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op, const CollectiveTicket& t) {
  FSDPP_CHECK_ALL_REDUCE();
  executor_.run_inline([&] { do_all_reduce(buf, count, dtype, op, t); });
}

WorkHandle MpiCommunicator::start_broadcast(void* buf, std::size_t count, DType dtype, int root,
                                            const CollectiveTicket& t) {
  FSDPP_CHECK_BROADCAST();
  return start([=] { do_broadcast(buf, count, dtype, root, t); });
}
void MpiCommunicator::run_broadcast(void* buf, std::size_t count, DType dtype, int root, const CollectiveTicket& t) {
  FSDPP_CHECK_BROADCAST();
  executor_.run_inline([&] { do_broadcast(buf, count, dtype, root, t); });
}

void MpiCommunicator::do_barrier(const CollectiveTicket& t) {
  const CollectiveWatchdog::Scope watched(t);
  FSDPP_MPI_CHECK(MPI_Barrier(comm_));
}
WorkHandle MpiCommunicator::start_barrier(const CollectiveTicket& t) {
  return start([this, t] { do_barrier(t); });
}
void MpiCommunicator::run_barrier(const CollectiveTicket& t) {
  executor_.run_inline([&] { do_barrier(t); });
}

// One exchange per peer: MPI_Alltoallv when its int counts can say it, else the pieces of each block posted as
// nonblocking sends and receives (one tag, matched in order: MPI keeps the order of messages between two ranks).
void MpiCommunicator::do_all_to_all_v(const void* send, void* recv, const AllToAllCounts& k, DType dtype,
                                      const CollectiveTicket& t) {
  const CollectiveWatchdog::Scope watched(t);
  const std::size_t limit = std::min<std::size_t>(algorithms_.max_message_elements, INT_MAX);
  bool fits = true;
  for (int p = 0; p < size_; ++p)
    fits = fits && k.send_counts[p] <= limit && k.send_displs[p] <= limit && k.recv_counts[p] <= limit &&
           k.recv_displs[p] <= limit;
  const MPI_Datatype type = mpi_algorithms::wire_type(dtype);
  if (fits) {
    alltoall_ints_.resize(4 * static_cast<std::size_t>(size_));
    int* sc = alltoall_ints_.data();
    int *sd = sc + size_, *rc = sd + size_, *rd = rc + size_;
    for (int p = 0; p < size_; ++p) {
      sc[p] = static_cast<int>(k.send_counts[p]);
      sd[p] = static_cast<int>(k.send_displs[p]);
      rc[p] = static_cast<int>(k.recv_counts[p]);
      rd[p] = static_cast<int>(k.recv_displs[p]);
    }
    FSDPP_MPI_CHECK(MPI_Alltoallv(send, sc, sd, type, recv, rc, rd, type, comm_));
    return;
  }
  const std::size_t elem = dtype_size(dtype);
  constexpr int kTag = 37;
  alltoall_requests_.clear();
  for (int p = 0; p < size_; ++p) {
    unsigned char* in = static_cast<unsigned char*>(recv) + k.recv_displs[p] * elem;
    PiecePlan(k.recv_counts[p], limit).for_each([&](Piece piece) {
      alltoall_requests_.emplace_back();
      FSDPP_MPI_CHECK(MPI_Irecv(in + piece.offset * elem, piece.count, type, p, kTag, comm_, &alltoall_requests_.back()));
    });
  }
  for (int p = 0; p < size_; ++p) {
    const unsigned char* out = static_cast<const unsigned char*>(send) + k.send_displs[p] * elem;
    PiecePlan(k.send_counts[p], limit).for_each([&](Piece piece) {
      alltoall_requests_.emplace_back();
      FSDPP_MPI_CHECK(
          MPI_Isend(out + piece.offset * elem, piece.count, type, p, kTag, comm_, &alltoall_requests_.back()));
    });
  }
  FSDPP_MPI_CHECK(MPI_Waitall(static_cast<int>(alltoall_requests_.size()), alltoall_requests_.data(),
                              MPI_STATUSES_IGNORE));
}

// The task reads the caller's count arrays on the communication thread: they must live until wait()
// (AllToAllCounts, communicator.hpp).
#define FSDPP_CHECK_ALL_TO_ALL()                                                                         \
  for (int p = 0; p < size_; ++p) {                                                                      \
    check_buffer(send, counts.send_counts[p], "send", "all_to_all_v");                                  \
    check_buffer(recv, counts.recv_counts[p], "recv", "all_to_all_v");                                  \
  }

WorkHandle MpiCommunicator::start_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                                               const CollectiveTicket& t) {
  FSDPP_CHECK_ALL_TO_ALL();
  return start([this, send, recv, counts, dtype, t] { do_all_to_all_v(send, recv, counts, dtype, t); });
}
void MpiCommunicator::run_all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype,
                                       const CollectiveTicket& t) {
  FSDPP_CHECK_ALL_TO_ALL();
  executor_.run_inline([&] { do_all_to_all_v(send, recv, counts, dtype, t); });
}

}  // namespace fsdpp
