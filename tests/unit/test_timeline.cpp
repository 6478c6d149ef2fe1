// The timeline of run.trace (observe/timeline.hpp) on one rank: spans nest, collectives land on their
// communicator's track with waits no longer than issue -> completion, nothing is kept outside the traced steps,
// and the cost of a scope with tracing off (a timing case: run it alone with -tc="*timing*").
#include "test_helpers.hpp"
#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/observe/timeline.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace fsdpp;

namespace {

using fsdpp::test::fresh_temp_dir;

struct TimelineReset {
  ~TimelineReset() {
    Timeline::reset();
    FlightRecorder::configure(0);
  }
};

const std::string kOuter = "fsdpp::forward outer", kInner = "fsdpp::forward inner", kLater = "fsdpp::optimizer";

}  // namespace

TEST_CASE("timeline: the traced steps' spans nest, collectives get a track, waits end at completion") {
  const TimelineReset reset;
  FlightRecorder::configure(64);
  const std::string dir = fresh_temp_dir("timeline-spans");
  MpiCommunicator comm(MPI_COMM_SELF);
  comm.set_label("dp_shard");
  Timeline::configure(2, 3, dir, MPI_COMM_SELF);
  std::vector<float> buf(1024, 1.0f), out(1024);
  for (std::int64_t step = 1; step <= 3; ++step) {
    Timeline::begin_step(step);
    CHECK(Timeline::recording() == (step >= 2));
    Timeline::enter(kOuter);
    {
      const TimelineScope inner(kInner);
      comm.all_gather_async(buf.data(), out.data(), buf.size(), DType::f32)->wait();
      comm.all_reduce(buf.data(), buf.size(), ReduceOp::sum);
    }
    {
      const Timeline::Leave leave(kOuter);
    }
    const TimelineScope later(kLater);
    Timeline::add_counter("things", 2);
    Timeline::end_step(step);
  }
  CHECK_FALSE(Timeline::recording());
  std::ifstream in(dir + "/rank0.json");
  REQUIRE(in.good());
  const nlohmann::json t = nlohmann::json::parse(in);
  const nlohmann::json& other = t.at("otherData");
  CHECK(other.at("steps") == nlohmann::json({2, 3}));
  CHECK(other.at("counters").at("things") == 4);  // steps 2 and 3 only
  CHECK(other.at("units") == nlohmann::json({"inner", "outer"}));
  std::map<std::string, int> spans;
  std::vector<std::pair<double, double>> compute;
  for (const auto& e : t.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++spans[e.at("name").get<std::string>()];
    if (e.at("tid") == 0) compute.emplace_back(e.at("ts").get<double>(), e.at("dur").get<double>());
    if (e.at("cat") == "wait" || e.at("cat") == "blocking") CHECK(e.at("dur").get<double>() >= 0);
  }
  // Two traced steps: the scopes twice each, the collectives on the dp_shard track (tid 1 + its id).
  CHECK(spans[kOuter] == 2);
  CHECK(spans[kInner] == 2);
  // Left after end_step: step 2's is written, step 3's was open when recording stopped and is not.
  CHECK(spans[kLater] == 1);
  CHECK(spans["wait all_gather"] == 2);
  CHECK(spans["blocking all_reduce"] == 2);
  CHECK(spans["all_gather"] == 2);
  CHECK(spans["all_reduce"] == 2);
  const auto& comms = other.at("comms");
  REQUIRE(comms.size() == 1);
  CHECK(comms[0].at("label") == "dp_shard");
  CHECK(comms[0].at("events") == 4);
  CHECK(comms[0].at("issued_end").get<int>() - comms[0].at("issued_begin").get<int>() == 4);
  // Sorted by start on the compute track, outer before inner at equal starts.
  for (std::size_t i = 1; i < compute.size(); ++i) CHECK(compute[i - 1].first <= compute[i].first);
}

TEST_CASE("timeline: TimelineScope timing with tracing off") {
  Timeline::reset();
  REQUIRE_FALSE(Timeline::recording());
  constexpr int kScopes = 2'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kScopes; ++i) {
    const TimelineScope span(kOuter);
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kScopes;
  std::printf("TimelineScope with tracing off: %.1f ns per scope (Kokkos region push + pop, one atomic load)\n", ns);
  CHECK(ns < 1000.0);  // a scope per unit and pass: even 1 us would be noise against a unit's milliseconds
}
