#pragma once
// The flight recorder (comm.flight_records): each rank keeps its last K collectives - the communicator's sequence
// number, the operation, the mesh dimension, element count and dtype, the FSDP unit or tensor-parallel site that
// issued it, the training step, and when it was issued, started and completed - so that a job that hangs or
// desynchronises can be explained afterwards, as PyTorch's Flight Recorder and its fr_trace analyzer do.
// Dumps: observe/flight_dump.hpp; who asks for them: observe/flight_service.hpp; the analysis: `fsdpp debug flight`.
//
// Every Communicator registers here at construction (an id, later its label and its members' world ranks) and
// reports every collective it issues; records are kept only while configure(K > 0) is in force (fsdpp train
// does it). Cost: a mutex taken when a collective is issued, starts and completes: tens of nanoseconds against
// collectives of tens of microseconds and more. Nothing here touches the data: numbers cannot change.
#include "fsdpp/tensor/dtype.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// send and receive: one message between two ranks (Communicator::send_async), recorded as the collectives are.
enum class CollectiveOp : std::uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier, all_to_all, send, receive };
const char* collective_op_name(CollectiveOp op);

enum class RecordState : std::uint8_t { issued, started, completed, failed };
const char* record_state_name(RecordState state);

// What a backend carries from issuing a collective to its completion.
struct CollectiveTicket {
  std::uint64_t record = 0;  // the record's number (1, 2, ...); 0: not recorded (recorder off)
  std::uint32_t comm = 0;    // the communicator's id in the registry
  std::uint64_t seq = 0;     // its sequence number on that communicator (1, 2, ...)
  CollectiveOp op = CollectiveOp::barrier;
};

struct FlightRecord {
  std::uint64_t number = 0;  // 0: an empty slot
  std::uint32_t comm = 0;
  std::uint64_t seq = 0;
  CollectiveOp op = CollectiveOp::barrier;
  DType dtype = DType::bytes;
  RecordState state = RecordState::issued;
  std::uint64_t count = 0;         // elements per rank (all_gather: sent; reduce_scatter: received; all_to_all: sent)
  std::int64_t step = 0;           // the optimizer step running when it was issued (0: none)
  const std::string* site = nullptr;  // interned: "h.1 forward all-gather", "h.1 backward (tensor parallel)"
  double issued_s = -1, started_s = -1, completed_s = -1;  // seconds since the recorder's epoch; -1: not yet
};

// A communicator as the registry knows it, with what it has carried so far.
struct CommEntry {
  std::uint32_t id = 0;
  std::string label;            // the mesh dimension ("dp_shard"), or what the group is
  std::string backend;          // "mpi" | "nccl"
  std::vector<int> world_ranks; // members in group order
  int rank_in_group = 0;
  std::uint64_t issued = 0;         // collectives issued (the last sequence number)
  std::uint64_t payload_bytes = 0;  // this rank's payload (count x dtype; all_gather: its input)
  std::uint64_t ring_bytes_out = 0; // what a flat ring sends from this rank to the next one (observe/traffic.hpp)
};

class FlightRecorder {
 public:
  // Keep the last `capacity` collectives (0: none). Clears the records; the registry stays.
  static void configure(std::size_t capacity);
  static std::size_t capacity();
  static void set_step(std::int64_t step);
  static std::int64_t step();
  static double now_s();  // seconds since the recorder's epoch (steady clock), the records' time base

  // The registry. Ids are never reused; entries outlive their communicators, so a dump can name them.
  static std::uint32_t register_comm(std::string backend);
  static void set_label(std::uint32_t comm, std::string label);
  static void set_members(std::uint32_t comm, std::vector<int> world_ranks, int rank_in_group);
  static std::string label(std::uint32_t comm);

  // A collective issued on `comm` (sequence number `seq`); counts its traffic and records it if recording.
  static CollectiveTicket issue(std::uint32_t comm, std::uint64_t seq, CollectiveOp op, std::size_t count,
                                DType dtype, std::uint64_t ring_bytes_out);
  static void started(const CollectiveTicket& ticket);
  static void completed(const CollectiveTicket& ticket);
  static void failed(const CollectiveTicket& ticket);
  static std::string site_of(const CollectiveTicket& ticket);  // "" when unknown or overwritten
  // A copy of the ticket's record; number 0 when it was never recorded or has been overwritten since.
  static FlightRecord record_of(const CollectiveTicket& ticket);

  // Tracing (run.trace, observe/timeline.hpp): while on, every record that reaches a final state (completed or
  // failed) is also copied aside, under the same mutex, so that a timeline keeps the collectives the ring
  // overwrites. take_traced() hands the copies over (in completion order) and clears them.
  static void set_tracing(bool on);
  static std::vector<FlightRecord> take_traced();

  // Copies for dumps and reports: the records oldest first, and the registry.
  static std::vector<FlightRecord> records();
  static std::vector<CommEntry> comms();
};

// Names the site of the collectives this thread issues while it lives, e.g. an FSDP unit's all-gather.
class FlightSite {
 public:
  explicit FlightSite(const std::string& site);
  ~FlightSite();
  FlightSite(const FlightSite&) = delete;
  FlightSite& operator=(const FlightSite&) = delete;

  // The unit whose forward or backward is running on this thread: collectives issued inside it without a
  // FlightSite of their own (tensor parallelism's) are attributed to "<unit> <pass> (tensor parallel)".
  static void enter_unit(const std::string& unit, bool backward);
  static void leave_unit(const std::string& unit, bool backward);

 private:
  const std::string* previous_;
};

}  // namespace fsdpp
