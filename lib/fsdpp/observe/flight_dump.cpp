#include "fsdpp/observe/flight_dump.hpp"

#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/runtime/error.hpp"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>

namespace fsdpp {
namespace {

nlohmann::json time_or_null(double seconds) { return seconds < 0 ? nlohmann::json(nullptr) : nlohmann::json(seconds); }

std::string wall_time_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace

std::string write_flight_dump(const std::string& dir, const FlightDumpContext& context) {
  const std::vector<FlightRecord> records = FlightRecorder::records();
  const std::vector<CommEntry> comms = FlightRecorder::comms();
  std::set<std::uint32_t> used;
  for (const FlightRecord& r : records) used.insert(r.comm);

  nlohmann::json out;
  out["format"] = "fsdpp-flight 1";
  out["rank"] = context.rank;
  out["world_size"] = context.world_size;
  out["host"] = context.hosts.empty() ? std::string() : context.hosts.at(static_cast<std::size_t>(context.rank));
  out["pid"] = static_cast<long>(getpid());
  out["reason"] = context.reason;
  out["step"] = FlightRecorder::step();
  out["timeout_s"] = context.timeout_s;
  out["dumped_at_s"] = FlightRecorder::now_s();
  out["wall_time"] = wall_time_now();
  out["capacity"] = FlightRecorder::capacity();
  out["hosts"] = context.hosts;
  out["not_answering"] = context.not_answering;
  out["comms"] = nlohmann::json::array();
  for (const CommEntry& c : comms) {
    if (c.world_ranks.empty() || (c.issued == 0 && !used.count(c.id))) continue;
    out["comms"].push_back({{"id", c.id}, {"label", c.label}, {"backend", c.backend}, {"ranks", c.world_ranks},
                            {"issued", c.issued}});
  }
  out["records"] = nlohmann::json::array();
  for (const FlightRecord& r : records)
    out["records"].push_back({{"comm", r.comm}, {"seq", r.seq}, {"op", collective_op_name(r.op)}, {"count", r.count},
                              {"dtype", std::string(dtype_name(r.dtype))}, {"site", r.site ? *r.site : std::string()},
                              {"step", r.step}, {"state", record_state_name(r.state)},
                              {"issued_s", time_or_null(r.issued_s)}, {"started_s", time_or_null(r.started_s)},
                              {"completed_s", time_or_null(r.completed_s)}});

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  FSDPP_CHECK(!ec, "flight recorder: cannot create '{}': {}", dir, ec.message());
  const std::string path = dir + "/rank" + std::to_string(context.rank) + ".json";
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::trunc);
    file << out.dump(1) << '\n';
    FSDPP_CHECK(file.good(), "flight recorder: cannot write '{}'", temporary);
  }
  std::filesystem::rename(temporary, path, ec);
  FSDPP_CHECK(!ec, "flight recorder: cannot rename '{}' to '{}': {}", temporary, path, ec.message());
  return path;
}

}  // namespace fsdpp
