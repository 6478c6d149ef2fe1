// Every collective x dtype x payload size against a naive reference that each rank computes for itself,
// under every MPI algorithm choice, plus a tiny per-call element limit that walks the >2^31 chunking code.
#include "mpi_test.hpp"

#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cmath>
#include <string>
#include <vector>

using namespace fsdpp;

namespace {

// Small integers: exact in f32, f64 and bf16 (|x| <= 256), and so are their sums over <= 4 ranks.
double input_value(int rank, std::size_t i) { return static_cast<double>((rank * 7 + static_cast<int>(i * 13 % 61)) % 61); }

template <class T> T make(double v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16::from_float(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <class T> double read(T v) {
  if constexpr (std::is_same_v<T, bf16>) return v.to_float();
  else return static_cast<double>(v);
}

struct AlgorithmCase {
  std::string name;
  MpiAlgorithms algorithms;
};

std::vector<AlgorithmCase> algorithm_cases() {
  MpiAlgorithms defaults;
  MpiAlgorithms alternatives;
  alternatives.all_gather = MpiAlgorithms::AllGather::ring;
  alternatives.reduce_scatter = MpiAlgorithms::ReduceScatter::native;
  alternatives.all_reduce = MpiAlgorithms::AllReduce::native;
  MpiAlgorithms forced_ring;  // ring all-reduce on every size, with many small segments
  forced_ring.ring_all_reduce_min_bytes = 0;
  forced_ring.segment_bytes = 64;
  MpiAlgorithms chunked = forced_ring;  // every MPI call carries at most 5 elements: the >2^31 code path
  chunked.max_message_elements = 5;
  MpiAlgorithms chunked_native = alternatives;
  chunked_native.max_message_elements = 5;
  return {{"default", defaults}, {"alternatives", alternatives}, {"ring, 64 B segments", forced_ring},
          {"chunked to 5 elements", chunked}, {"native, chunked to 5 elements", chunked_native}};
}

const std::size_t kCounts[] = {0, 1, 7, 64, 1000, 4099};

template <class T>
void check_collectives(MpiCommunicator& comm, const std::string& label) {
  const int n = comm.size(), r = comm.rank();
  const double tol = std::is_same_v<T, bf16> ? 1.0 / 128 : std::is_same_v<T, float> ? 1e-6 : 1e-12;
  for (std::size_t count : kCounts) {
    CAPTURE(label);
    CAPTURE(count);
    // all_gather, out of place and in place
    std::vector<T> send(count), recv(count * n);
    for (std::size_t i = 0; i < count; ++i) send[i] = make<T>(input_value(r, i));
    comm.all_gather(send.data(), recv.data(), count);
    int wrong = 0;
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < count; ++i) wrong += read(recv[q * count + i]) != input_value(q, i);
    CHECK_MESSAGE(wrong == 0, "all_gather");
    std::vector<T> inplace(count * n, make<T>(-1));
    for (std::size_t i = 0; i < count; ++i) inplace[r * count + i] = send[i];
    comm.all_gather(inplace.data() + r * count, inplace.data(), count);
    wrong = 0;
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < count; ++i) wrong += read(inplace[q * count + i]) != input_value(q, i);
    CHECK_MESSAGE(wrong == 0, "all_gather in place");

    // reduce_scatter: sum, avg, and scaled sum
    std::vector<T> full(count * n), part(count);
    for (std::size_t i = 0; i < count * n; ++i) full[i] = make<T>(input_value(r, i));
    auto block_sum = [&](std::size_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += input_value(q, r * count + i);
      return s;
    };
    const struct { ReduceScatterOptions options; double factor; const char* what; } rs_cases[] = {
        {{ReduceOp::sum, 1.0, 1.0}, 1.0, "reduce_scatter sum"},
        {{ReduceOp::avg, 1.0, 1.0}, 1.0 / n, "reduce_scatter avg"},
        {{ReduceOp::sum, 0.5, 3.0}, 1.5, "reduce_scatter pre 0.5 post 3"}};
    for (const auto& c : rs_cases) {
      comm.reduce_scatter(full.data(), part.data(), count, c.options);
      double err = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const double expect = block_sum(i) * c.factor;
        err = std::max(err, std::fabs(read(part[i]) - expect) / std::max(1.0, std::fabs(expect)));
      }
      CHECK_MESSAGE(err <= tol, c.what);
    }

    // all_reduce: sum, avg, max
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      std::vector<T> buf(count);
      for (std::size_t i = 0; i < count; ++i) buf[i] = make<T>(input_value(r, i));
      comm.all_reduce(buf.data(), count, op);
      double err = 0;
      for (std::size_t i = 0; i < count; ++i) {
        double expect = op == ReduceOp::max ? 0 : 0;
        for (int q = 0; q < n; ++q)
          expect = op == ReduceOp::max ? std::max(expect, input_value(q, i)) : expect + input_value(q, i);
        if (op == ReduceOp::avg) expect /= n;
        err = std::max(err, std::fabs(read(buf[i]) - expect) / std::max(1.0, std::fabs(expect)));
      }
      CHECK_MESSAGE(err <= tol, (std::string("all_reduce ") + reduce_op_name(op)));
    }

    // broadcast from the last rank
    std::vector<T> bc(count);
    for (std::size_t i = 0; i < count; ++i) bc[i] = make<T>(input_value(r, i));
    comm.broadcast(bc.data(), count, n - 1);
    wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += read(bc[i]) != input_value(n - 1, i);
    CHECK_MESSAGE(wrong == 0, "broadcast");
  }
}

}  // namespace


#define FSDPP_COLLECTIVES_AT(NP)                                                                         \
  MPI_TEST_CASE("collectives on " #NP " rank(s): ops x dtypes x sizes x algorithms", NP) {               \
    MpiCommunicator comm(test_comm);                                                                     \
    for (const auto& c : algorithm_cases()) {                                                            \
      comm.set_algorithms(c.algorithms);                                                                 \
      check_collectives<float>(comm, c.name + " f32");                                                   \
      check_collectives<double>(comm, c.name + " f64");                                                  \
      check_collectives<bf16>(comm, c.name + " bf16");                                                   \
    }                                                                                                    \
  }
FSDPP_COLLECTIVES_AT(1)
FSDPP_COLLECTIVES_AT(2)
FSDPP_COLLECTIVES_AT(3)
FSDPP_COLLECTIVES_AT(4)

namespace {

// all_to_all_v: how many elements rank `from` sends rank `to` in `trial`, known to every rank without asking:
// a hash, so the counts are irregular, with zeros (a third of them), and in trial 0 every rank sends only to
// rank 0 (so the others receive nothing).
std::size_t exchanged(int trial, int from, int to) {
  if (trial == 0) return to == 0 ? 37 + 5 * from : 0;
  const unsigned h = static_cast<unsigned>(trial * 7919 + from * 104729 + to * 1299709) * 2654435761u;
  return (h >> 7) % 3 == 0 ? 0 : (h >> 11) % 300;
}
// The value of element i of the block `from` sends `to`: exact in f32 and i64, and different for every element.
double exchanged_value(int from, int to, std::size_t i) { return from * 1000000.0 + to * 100000.0 + double(i); }

template <class T>
void check_all_to_all(Communicator& comm, int trial, bool asynchronous) {
  const int n = comm.size(), r = comm.rank();
  // Send blocks in peer order with a one-element gap after each (displacements are honoured, not assumed
  // contiguous); receive blocks in reverse peer order.
  std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
  std::size_t send_total = 0, recv_total = 0;
  for (int p = 0; p < n; ++p) {
    sc[p] = exchanged(trial, r, p);
    sd[p] = send_total;
    send_total += sc[p] + 1;
    rc[p] = exchanged(trial, p, r);
  }
  for (int p = n - 1; p >= 0; --p) {
    rd[p] = recv_total;
    recv_total += rc[p];
  }
  std::vector<T> send(send_total, T(-1)), recv(recv_total, T(-7));
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < sc[p]; ++i) send[sd[p] + i] = static_cast<T>(exchanged_value(r, p, i));
  const AllToAllCounts counts{sc.data(), sd.data(), rc.data(), rd.data()};
  const std::uint64_t issued = comm.issued();
  auto entry = [&] {
    for (const CommEntry& e : FlightRecorder::comms())
      if (e.id == comm.flight_id()) return e;
    return CommEntry{};
  };
  const CommEntry before = entry();
  if (asynchronous) comm.all_to_all_v_async(send.data(), recv.data(), counts, dtype_of_v<T>)->wait();
  else comm.all_to_all_v(send.data(), recv.data(), counts);
  CHECK(comm.issued() == issued + 1);
  // The traffic counters: this rank's payload (all it sends) and the bytes that leave it (to the other ranks).
  const CommEntry after = entry();
  std::size_t to_others = 0;
  for (int p = 0; p < n; ++p) to_others += p == r ? 0 : sc[p];
  CHECK(after.payload_bytes - before.payload_bytes == (send_total - n) * sizeof(T));
  CHECK(after.ring_bytes_out - before.ring_bytes_out == to_others * sizeof(T));
  int wrong = 0;
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < rc[p]; ++i) wrong += static_cast<double>(recv[rd[p] + i]) != exchanged_value(p, r, i);
  CHECK(wrong == 0);
}

}  // namespace

#define FSDPP_ALL_TO_ALL_AT(NP)                                                                          \
  MPI_TEST_CASE("collectives: all_to_all_v on " #NP " rank(s), irregular counts with zeros", NP) {       \
    MpiCommunicator comm(test_comm);                                                                     \
    for (const auto& c : algorithm_cases()) {                                                            \
      CAPTURE(c.name);                                                                                   \
      comm.set_algorithms(c.algorithms);                                                                 \
      for (int trial = 0; trial < 4; ++trial) {                                                          \
        CAPTURE(trial);                                                                                  \
        check_all_to_all<float>(comm, trial, trial % 2 == 1);                                            \
        check_all_to_all<std::int64_t>(comm, trial, trial % 2 == 0);                                     \
      }                                                                                                  \
    }                                                                                                    \
  }
FSDPP_ALL_TO_ALL_AT(1)
FSDPP_ALL_TO_ALL_AT(2)
FSDPP_ALL_TO_ALL_AT(3)
FSDPP_ALL_TO_ALL_AT(4)

MPI_TEST_CASE("collectives: raw bytes gather and broadcast; reducing them is refused", 2) {
  MpiCommunicator comm(test_comm);
  std::string mine = test_rank == 0 ? "abc" : "xyz";
  std::string all(6, '?');
  comm.all_gather(mine.data(), all.data(), 3, DType::bytes);
  CHECK(all == "abcxyz");
  std::string text = test_rank == 1 ? "from rank 1" : "___________";
  comm.broadcast(text.data(), text.size(), DType::bytes, 1);
  CHECK(text == "from rank 1");
  CHECK_THROWS_WITH_AS(comm.all_reduce(all.data(), 6, DType::bytes, ReduceOp::sum),
                       doctest::Contains("cannot reduce dtype 'bytes'"), Error);
  CHECK_THROWS_WITH_AS(comm.broadcast(text.data(), 1, DType::bytes, 5), doctest::Contains("root 5 is not a rank"), Error);
  float x = 0;
  CHECK_THROWS_WITH_AS(comm.reduce_scatter(&x, &x, 1, DType::f32, {ReduceOp::max, 1, 1}),
                       doctest::Contains("sum and avg, not max"), Error);
}

MPI_TEST_CASE("collectives: bf16 sums accumulate in f32", 4) {
  // 256 + 1 + 1 + 1: summed in bf16 each +1 is lost (257 ties to 256), in f32 the total 259 rounds to 260.
  MpiCommunicator comm(test_comm);
  for (auto algorithm : {MpiAlgorithms::ReduceScatter::ring, MpiAlgorithms::ReduceScatter::native}) {
    MpiAlgorithms a;
    a.reduce_scatter = algorithm;
    a.ring_all_reduce_min_bytes = 0;
    comm.set_algorithms(a);
    std::vector<bf16> full(4, bf16::from_float(test_rank == 0 ? 256.0f : 1.0f));
    bf16 mine;
    comm.reduce_scatter(full.data(), &mine, 1);
    CHECK(mine.to_float() == 260.0f);
    std::vector<bf16> buf(8, bf16::from_float(test_rank == 0 ? 256.0f : 1.0f));
    comm.all_reduce(buf.data(), buf.size(), ReduceOp::sum);
    for (auto v : buf) CHECK(v.to_float() == 260.0f);
  }
}

MPI_TEST_CASE("collectives: two asynchronous collectives outstanding at once complete correctly", 2) {
  MpiCommunicator first(test_comm), second(test_comm);
  const std::size_t count = 1 << 16;
  std::vector<float> gather_in(count, float(test_rank + 1)), gather_out(2 * count, 0.f);
  std::vector<float> scatter_in(2 * count), scatter_out(count, 0.f), reduce(count, float(test_rank + 10));
  for (std::size_t i = 0; i < 2 * count; ++i) scatter_in[i] = float(i % 100);
  auto g = first.all_gather_async(gather_in.data(), gather_out.data(), count, DType::f32);
  auto s = first.reduce_scatter_async(scatter_in.data(), scatter_out.data(), count, DType::f32);
  auto a = second.all_reduce_async(reduce.data(), count, DType::f32, ReduceOp::max);
  // Waited in the reverse order of starting: each handle must still deliver its own result.
  a->wait();
  s->wait();
  g->wait();
  CHECK(g->is_completed());
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    wrong += gather_out[i] != 1.f || gather_out[count + i] != 2.f;
    wrong += scatter_out[i] != 2.f * float((test_rank * count + i) % 100);
    wrong += reduce[i] != 11.f;
  }
  CHECK(wrong == 0);
  if (first.asynchronous()) {
    // On a communication thread, start() returns before the collective completes: check that the caller is
    // free while a barrier waits for a rank that is still busy.
    // Rank 1 joins the asynchronous barrier only after rank 0 has looked at it, so it cannot have completed.
    if (test_rank == 0) {
      auto b = first.barrier_async();
      CHECK_FALSE(b->is_completed());
      MPI_Barrier(test_comm);
      b->wait();
      CHECK(b->is_completed());
    } else {
      MPI_Barrier(test_comm);
      auto b = first.barrier_async();
      b->wait();
      CHECK(b->is_completed());
    }
  }
}

MPI_TEST_CASE("collectives: a failed collective rethrows from wait(), and the communicator stays usable", 1) {
  MpiCommunicator comm(test_comm);
  CHECK_THROWS_WITH_AS(comm.all_gather_async(nullptr, nullptr, 4, DType::f32), doctest::Contains("send buffer is null"), Error);
  double x = 2;
  comm.all_reduce(&x, 1, ReduceOp::sum);
  CHECK(x == 2);
}

// Point to point (a pipeline's messages): around a ring of 3 ranks, receives posted before the sends, in pieces of
// at most 3 floats too, a zero-length message among them; messages to oneself are refused, and
// each message is one record in the flight recorder (send / recv, counted on this communicator).
MPI_TEST_CASE("collectives: send and receive around a ring, in pieces and empty, matched in posting order", 3) {
  MpiAlgorithms pieces;
  pieces.max_message_elements = 3;  // floats per MPI call for messages
  for (const MpiAlgorithms& algorithms : {MpiAlgorithms{}, pieces}) {
    MpiCommunicator comm(test_comm, algorithms);
    const int n = comm.size(), right = (test_rank + 1) % n, left = (test_rank + n - 1) % n;
    const std::uint64_t before = comm.issued();
    std::vector<std::vector<float>> in = {std::vector<float>(1001), {}, std::vector<float>(7)};
    std::vector<WorkHandle> receives, sends;
    for (std::size_t k = 0; k < in.size(); ++k)
      receives.push_back(comm.receive_async(in[k].data(), in[k].size(), DType::f32, left, static_cast<int>(k)));
    std::vector<std::vector<float>> out = {std::vector<float>(1001), {}, std::vector<float>(7)};
    for (std::size_t k = 0; k < out.size(); ++k) {
      for (std::size_t i = 0; i < out[k].size(); ++i) out[k][i] = float(test_rank * 10000 + k * 1000 + i);
      sends.push_back(comm.send_async(out[k].data(), out[k].size(), DType::f32, right, static_cast<int>(k)));
    }
    for (auto& r : receives) r->wait();
    for (auto& s : sends) s->wait();
    int wrong = 0;
    for (std::size_t k = 0; k < in.size(); ++k)
      for (std::size_t i = 0; i < in[k].size(); ++i) wrong += in[k][i] != float(left * 10000 + k * 1000 + i);
    CHECK(wrong == 0);
    CHECK(comm.issued() == before + 6);
    bool refused = false;
    try {
      (void)comm.send_async(out[0].data(), 1, DType::f32, test_rank, 0);
    } catch (const Error& e) {
      refused = std::string(e.what()).find("send on") != std::string::npos;
    }
    CHECK(refused);
  }
}
