#include "fsdpp/comm/communicator.hpp"

#include "fsdpp/observe/collective_faults.hpp"
#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/runtime/error.hpp"

namespace fsdpp {

std::uint64_t ring_bytes_sent(CollectiveOp op, std::size_t count, DType dtype, int ranks, int rank, int root,
                              CommBackend backend) {
  if (ranks <= 1) return 0;
  const std::uint64_t n = static_cast<std::uint64_t>(ranks), bytes = count * dtype_size(dtype);
  switch (op) {
    case CollectiveOp::all_gather: return (n - 1) * bytes;
    case CollectiveOp::reduce_scatter: {
      const std::uint64_t later_hop = backend == CommBackend::mpi && dtype == DType::bf16 ? count * 4 : bytes;
      return bytes + (n - 2) * later_hop;
    }
    case CollectiveOp::all_reduce: return 2 * (n - 1) * bytes / n;
    case CollectiveOp::broadcast: return (rank + 1) % ranks == root ? 0 : bytes;
    case CollectiveOp::barrier: return 0;
    case CollectiveOp::all_to_all: return 0;  // per-peer counts: all_to_all_bytes_to_peers
    case CollectiveOp::send: return bytes;      // to its one peer
    case CollectiveOp::receive: return 0;
  }
  return 0;
}

std::size_t all_to_all_send_total(const AllToAllCounts& counts, int ranks) {
  std::size_t total = 0;
  for (int p = 0; p < ranks; ++p) total += counts.send_counts[p];
  return total;
}

std::uint64_t all_to_all_bytes_to_peers(const AllToAllCounts& counts, int ranks, int rank, DType dtype) {
  std::uint64_t elements = 0;
  for (int p = 0; p < ranks; ++p)
    if (p != rank) elements += counts.send_counts[p];
  return elements * dtype_size(dtype);
}

namespace {

// The handle of a collective a test's fault switch made this rank skip: there is nothing to wait for.
class SkippedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

// While a timeline records (run.trace): the handle of an asynchronous collective whose wait() is a "wait" span
// on the compute track (observe/timeline.hpp).
class TimedWork final : public Work {
 public:
  TimedWork(WorkHandle work, const CollectiveTicket& ticket) : work_(std::move(work)), ticket_(ticket) {}
  void wait() override {
    const double t0 = FlightRecorder::now_s();
    work_->wait();
    if (!waited_) Timeline::waited(ticket_, t0, FlightRecorder::now_s(), false);
    waited_ = true;
  }
  bool is_completed() override { return work_->is_completed(); }

 private:
  WorkHandle work_;
  CollectiveTicket ticket_;
  bool waited_ = false;
};

}  // namespace

Communicator::Communicator(CommBackend backend)
    : flight_id_(FlightRecorder::register_comm(comm_backend_name(backend))) {}

void Communicator::set_label(std::string label) {
  FlightRecorder::set_label(flight_id_, label);
  label_ = std::move(label);
}

void Communicator::set_members(std::vector<int> world_ranks) {
  FlightRecorder::set_members(flight_id_, std::move(world_ranks), rank());
}

std::optional<CollectiveTicket> Communicator::issue(CollectiveOp op, std::size_t count, DType dtype, int root,
                                                    std::optional<std::uint64_t> bytes_out) {
  const std::uint64_t seq = issued_.load(std::memory_order_relaxed) + 1;
  if (collective_fault_armed() && take_collective_skip(label_, seq)) return std::nullopt;
  issued_.store(seq, std::memory_order_relaxed);
  return FlightRecorder::issue(flight_id_, seq, op, count, dtype,
                               bytes_out ? *bytes_out : ring_bytes_sent(op, count, dtype, size(), rank(), root, backend()));
}

// A backend that throws before the collective starts (a bad argument) leaves a failed record, not one that
// looks in flight forever.
template <class Start>
WorkHandle Communicator::issue_async(CollectiveOp op, std::size_t count, DType dtype, int root, Start&& start,
                                     std::optional<std::uint64_t> bytes_out) {
  const std::optional<CollectiveTicket> ticket = issue(op, count, dtype, root, bytes_out);
  if (!ticket) return std::make_unique<SkippedWork>();
  try {
    WorkHandle work = start(*ticket);
    if (Timeline::recording()) return std::make_unique<TimedWork>(std::move(work), *ticket);
    return work;
  } catch (...) {
    FlightRecorder::failed(*ticket);
    throw;
  }
}

template <class Run>
void Communicator::issue_blocking(CollectiveOp op, std::size_t count, DType dtype, int root, Run&& run,
                                  std::optional<std::uint64_t> bytes_out) {
  const std::optional<CollectiveTicket> ticket = issue(op, count, dtype, root, bytes_out);
  if (!ticket) return;
  const bool timed = Timeline::recording();
  const double t0 = timed ? FlightRecorder::now_s() : 0;
  try {
    run(*ticket);
  } catch (...) {
    FlightRecorder::failed(*ticket);
    throw;
  }
  if (timed) Timeline::waited(*ticket, t0, FlightRecorder::now_s(), true);
}

WorkHandle Communicator::all_gather_async(const void* send, void* recv, std::size_t count, DType dtype) {
  return issue_async(CollectiveOp::all_gather, count, dtype, -1,
                     [&](const CollectiveTicket& t) { return start_all_gather(send, recv, count, dtype, t); });
}

WorkHandle Communicator::reduce_scatter_async(const void* send, void* recv, std::size_t count, DType dtype,
                                              ReduceScatterOptions options) {
  return issue_async(CollectiveOp::reduce_scatter, count, dtype, -1, [&](const CollectiveTicket& t) {
    return start_reduce_scatter(send, recv, count, dtype, options, t);
  });
}

WorkHandle Communicator::all_reduce_async(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  return issue_async(CollectiveOp::all_reduce, count, dtype, -1,
                     [&](const CollectiveTicket& t) { return start_all_reduce(buf, count, dtype, op, t); });
}

WorkHandle Communicator::barrier_async() {
  return issue_async(CollectiveOp::barrier, 0, DType::bytes, -1,
                     [&](const CollectiveTicket& t) { return start_barrier(t); });
}

void Communicator::all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
  issue_blocking(CollectiveOp::all_gather, count, dtype, -1,
                 [&](const CollectiveTicket& t) { run_all_gather(send, recv, count, dtype, t); });
}

void Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                  ReduceScatterOptions options) {
  issue_blocking(CollectiveOp::reduce_scatter, count, dtype, -1,
                 [&](const CollectiveTicket& t) { run_reduce_scatter(send, recv, count, dtype, options, t); });
}

void Communicator::all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  issue_blocking(CollectiveOp::all_reduce, count, dtype, -1,
                 [&](const CollectiveTicket& t) { run_all_reduce(buf, count, dtype, op, t); });
}

void Communicator::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  issue_blocking(CollectiveOp::broadcast, count, dtype, root,
                 [&](const CollectiveTicket& t) { run_broadcast(buf, count, dtype, root, t); });
}

void Communicator::barrier() {
  issue_blocking(CollectiveOp::barrier, 0, DType::bytes, -1, [&](const CollectiveTicket& t) { run_barrier(t); });
}

WorkHandle Communicator::all_to_all_v_async(const void* send, void* recv, const AllToAllCounts& counts, DType dtype) {
  FSDPP_CHECK(counts.send_counts && counts.send_displs && counts.recv_counts && counts.recv_displs,
              "all_to_all_v on {}: every per-peer array (send/recv counts and displacements) must be given", label_);
  return issue_async(
      CollectiveOp::all_to_all, all_to_all_send_total(counts, size()), dtype, -1,
      [&](const CollectiveTicket& t) { return start_all_to_all_v(send, recv, counts, dtype, t); },
      all_to_all_bytes_to_peers(counts, size(), rank(), dtype));
}

void Communicator::all_to_all_v(const void* send, void* recv, const AllToAllCounts& counts, DType dtype) {
  FSDPP_CHECK(counts.send_counts && counts.send_displs && counts.recv_counts && counts.recv_displs,
              "all_to_all_v on {}: every per-peer array (send/recv counts and displacements) must be given", label_);
  issue_blocking(
      CollectiveOp::all_to_all, all_to_all_send_total(counts, size()), dtype, -1,
      [&](const CollectiveTicket& t) { run_all_to_all_v(send, recv, counts, dtype, t); },
      all_to_all_bytes_to_peers(counts, size(), rank(), dtype));
}

WorkHandle Communicator::send_async(const void* buf, std::size_t count, DType dtype, int peer, int tag) {
  FSDPP_CHECK(peer >= 0 && peer < size() && peer != rank(), "send on {}: peer {} of ranks 0..{} (this one {})", label_,
              peer, size() - 1, rank());
  return issue_async(CollectiveOp::send, count, dtype, peer, [&](const CollectiveTicket& t) {
    return start_send(buf, count, dtype, peer, tag, t);
  });
}

WorkHandle Communicator::receive_async(void* buf, std::size_t count, DType dtype, int peer, int tag) {
  FSDPP_CHECK(peer >= 0 && peer < size() && peer != rank(), "receive on {}: peer {} of ranks 0..{} (this one {})",
              label_, peer, size() - 1, rank());
  return issue_async(CollectiveOp::receive, count, dtype, peer, [&](const CollectiveTicket& t) {
    return start_receive(buf, count, dtype, peer, tag, t);
  });
}

WorkHandle Communicator::start_send(const void*, std::size_t, DType, int, int, const CollectiveTicket&) {
  throw Error(fmt::format("send: the {} communicator of {} has no point-to-point messages ({})",
                          comm_backend_name(backend()), label_, describe()));
}

WorkHandle Communicator::start_receive(void*, std::size_t, DType, int, int, const CollectiveTicket&) {
  throw Error(fmt::format("receive: the {} communicator of {} has no point-to-point messages ({})",
                          comm_backend_name(backend()), label_, describe()));
}

WorkHandle Communicator::start_all_to_all_v(const void*, void*, const AllToAllCounts&, DType, const CollectiveTicket&) {
  throw Error(fmt::format("all_to_all_v: the {} communicator of {} has no all-to-all ({})",
                          comm_backend_name(backend()), label_, describe()));
}

}  // namespace fsdpp
