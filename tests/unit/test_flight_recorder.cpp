// The flight recorder's ring and sites, and `fsdpp debug flight`'s reading of dumps written by the real writer:
// two "ranks" are played one after the other in this process (the recorder is cleared in between).
#include "test_helpers.hpp"
#include "fsdpp/observe/flight_analysis.hpp"
#include "fsdpp/observe/flight_dump.hpp"
#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/runtime/error.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

using namespace fsdpp;

namespace {

using fsdpp::test::fresh_temp_dir;

struct RecorderReset {
  ~RecorderReset() {
    FlightRecorder::configure(0);
    FlightRecorder::set_step(0);
  }
};

// Issues `seq` on `comm` and marks it completed (or leaves it started when `finish` is false).
void collective(std::uint32_t comm, std::uint64_t seq, CollectiveOp op, std::size_t count, bool finish = true) {
  const CollectiveTicket t = FlightRecorder::issue(comm, seq, op, count, DType::f32, 0);
  FlightRecorder::started(t);
  if (finish) FlightRecorder::completed(t);
}

void dump_as(const std::string& dir, int rank, int world, std::string reason, std::vector<int> silent = {}) {
  FlightDumpContext c;
  c.rank = rank;
  c.world_size = world;
  c.hosts = {"nodeA", "nodeA", "nodeB"};
  c.hosts.resize(static_cast<std::size_t>(world), "nodeB");
  c.reason = std::move(reason);
  c.not_answering = std::move(silent);
  write_flight_dump(dir, c);
}

}  // namespace

TEST_CASE("the flight recorder keeps the last K collectives, oldest first, and ignores updates of overwritten ones") {
  RecorderReset reset;
  const std::uint32_t comm = FlightRecorder::register_comm("mpi");
  FlightRecorder::set_label(comm, "dp_shard");
  FlightRecorder::configure(4);
  std::vector<CollectiveTicket> tickets;
  for (std::uint64_t seq = 1; seq <= 10; ++seq)
    tickets.push_back(FlightRecorder::issue(comm, seq, CollectiveOp::all_gather, 100 * seq, DType::f32, 0));
  FlightRecorder::completed(tickets[2]);  // #3 was overwritten long ago
  FlightRecorder::started(tickets[9]);
  const std::vector<FlightRecord> records = FlightRecorder::records();
  REQUIRE(records.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(records[i].seq == 7 + i);
    CHECK(records[i].count == 100 * (7 + i));
  }
  CHECK(records[3].state == RecordState::started);
  CHECK(records[2].state == RecordState::issued);
  // A final state stays: a late "started" does not undo "completed".
  FlightRecorder::completed(tickets[9]);
  FlightRecorder::started(tickets[9]);
  CHECK(FlightRecorder::records().back().state == RecordState::completed);
  FlightRecorder::configure(0);
  CHECK(FlightRecorder::issue(comm, 11, CollectiveOp::all_gather, 1, DType::f32, 0).record == 0);
}

TEST_CASE("collectives are named after the FSDP unit or the tensor-parallel site that issued them") {
  RecorderReset reset;
  const std::uint32_t comm = FlightRecorder::register_comm("mpi");
  FlightRecorder::configure(8);
  FlightSite::enter_unit("h.1", false);
  CollectiveTicket tp = FlightRecorder::issue(comm, 1, CollectiveOp::all_reduce, 8, DType::f32, 0);
  CollectiveTicket own;
  {
    const FlightSite site("h.2 forward all-gather");
    own = FlightRecorder::issue(comm, 2, CollectiveOp::all_gather, 8, DType::f32, 0);
  }
  FlightSite::leave_unit("h.1", false);
  const CollectiveTicket outside = FlightRecorder::issue(comm, 3, CollectiveOp::barrier, 0, DType::bytes, 0);
  CHECK(FlightRecorder::site_of(tp) == "h.1 forward (tensor parallel)");
  CHECK(FlightRecorder::site_of(own) == "h.2 forward all-gather");
  CHECK(FlightRecorder::site_of(outside).empty());
}

TEST_CASE("fsdpp debug flight: the first sequence number where the ranks differ, though their windows differ") {
  RecorderReset reset;
  const std::string dir = fresh_temp_dir("flight-desync");
  const std::uint32_t comm = FlightRecorder::register_comm("mpi");
  FlightRecorder::set_label(comm, "dp_shard");
  FlightRecorder::set_members(comm, {0, 1}, 0);
  FlightRecorder::configure(6);  // rank 0 keeps #5..#10 of 10
  for (std::uint64_t seq = 1; seq <= 10; ++seq) collective(comm, seq, CollectiveOp::all_gather, 64);
  dump_as(dir, 0, 2, "aborting: collective watchdog: all_gather over dp_shard (#10) did not finish");
  FlightRecorder::configure(7);  // rank 1 keeps #3..#9 of 9, and its #8 is a reduce-scatter
  FlightRecorder::set_members(comm, {0, 1}, 1);
  for (std::uint64_t seq = 1; seq <= 9; ++seq)
    collective(comm, seq, seq == 8 ? CollectiveOp::reduce_scatter : CollectiveOp::all_gather, seq == 8 ? 32 : 64);
  dump_as(dir, 1, 2, "asked by rank 0: ...");
  const std::string report = explain_flight_dumps(dir);
  INFO(report);
  CHECK(report.find("every rank dumped") != std::string::npos);
  CHECK(report.find("collective #8 is not the same collective everywhere: rank 0 on nodeA issued all_gather of 64 f32; "
                    "rank 1 on nodeA issued reduce_scatter of 32 f32") != std::string::npos);
}

TEST_CASE("fsdpp debug flight: a hang names who waits, who never entered (with its last collective), who is missing") {
  RecorderReset reset;
  const std::string dir = fresh_temp_dir("flight-hang");
  const std::uint32_t comm = FlightRecorder::register_comm("mpi");
  FlightRecorder::set_label(comm, "dp_shard");
  FlightRecorder::configure(16);
  FlightRecorder::set_members(comm, {0, 1, 2}, 0);
  FlightRecorder::set_step(3);
  for (std::uint64_t seq = 1; seq <= 4; ++seq) collective(comm, seq, CollectiveOp::all_gather, 64, seq < 4);
  dump_as(dir, 0, 3, "aborting: collective watchdog: all_gather over dp_shard (#4) did not finish", {2});
  FlightRecorder::configure(16);
  FlightRecorder::set_members(comm, {0, 1, 2}, 1);
  for (std::uint64_t seq = 1; seq <= 3; ++seq) collective(comm, seq, CollectiveOp::all_gather, 64);
  dump_as(dir, 1, 3, "asked by rank 0: ...");
  // Rank 2 never dumps: it is named as missing, not guessed at.
  const std::string report = explain_flight_dumps(dir);
  INFO(report);
  CHECK(report.find("ranks 0 and 1 on nodeA dumped; no dump from rank 2 on nodeB") != std::string::npos);
  CHECK(report.find("found rank 2 on nodeB not answering") != std::string::npos);
  CHECK(report.find("The job hangs in dp_shard (ranks 0, 1 and 2) collective #4, all_gather of 64 f32 (step 3): "
                    "rank 0 on nodeA entered it and waits") != std::string::npos);
  CHECK(report.find("rank 1 on nodeA never entered it (its last collective on dp_shard is #3, all_gather of 64 f32 "
                    "(step 3), completed)") != std::string::npos);
  CHECK(report.find("rank 2 on nodeB left no dump") != std::string::npos);
}

TEST_CASE("fsdpp debug flight: a folder without dumps is a usage error that says where dumps come from") {
  const std::string dir = fresh_temp_dir("flight-empty");
  std::filesystem::create_directories(dir);
  CHECK_THROWS_WITH_AS(explain_flight_dumps(dir), doctest::Contains("no flight-recorder dump (rank<r>.json)"), UsageError);
}

TEST_CASE("fsdpp debug flight: a rank found silent that dumped after the abort (resumed by the kill) is read as missing") {
  RecorderReset reset;
  const std::string dir = fresh_temp_dir("flight-late");
  const std::uint32_t comm = FlightRecorder::register_comm("mpi");
  FlightRecorder::set_label(comm, "dp_shard");
  FlightRecorder::configure(16);
  FlightRecorder::set_members(comm, {0, 1, 2}, 0);
  for (std::uint64_t seq = 1; seq <= 4; ++seq) collective(comm, seq, CollectiveOp::all_gather, 64, seq < 4);
  dump_as(dir, 0, 3, "aborting: collective watchdog: all_gather over dp_shard (#4) did not finish", {2});
  FlightRecorder::configure(16);
  FlightRecorder::set_members(comm, {0, 1, 2}, 1);
  for (std::uint64_t seq = 1; seq <= 4; ++seq) collective(comm, seq, CollectiveOp::all_gather, 64, seq < 4);
  dump_as(dir, 1, 3, "aborting: collective watchdog: all_gather over dp_shard (#4) did not finish", {2});
  // Rank 2, stopped in #4, is continued by the launcher's kill: it finishes #4, waits in #5 and dumps last.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  FlightRecorder::configure(16);
  FlightRecorder::set_members(comm, {0, 1, 2}, 2);
  for (std::uint64_t seq = 1; seq <= 5; ++seq) collective(comm, seq, CollectiveOp::all_gather, 64, seq < 5);
  dump_as(dir, 2, 3, "aborting: collective watchdog: all_gather over dp_shard (#5) did not finish");
  const std::string report = explain_flight_dumps(dir);
  INFO(report);
  CHECK(report.find("found rank 2 on nodeB not answering") != std::string::npos);
  CHECK(report.find("Rank 2 on nodeB dumped only after the job was aborted, having been found not answering") !=
        std::string::npos);
  CHECK(report.find("The job hangs in dp_shard (ranks 0, 1 and 2) collective #4, all_gather of 64 f32") !=
        std::string::npos);
  CHECK(report.find("ranks 0 and 1 on nodeA entered it and wait") != std::string::npos);
  CHECK(report.find("rank 2 on nodeB left no dump") != std::string::npos);
}
