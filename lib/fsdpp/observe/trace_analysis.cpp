#include "fsdpp/observe/trace_analysis.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <tuple>

namespace fsdpp {
namespace {

using Json = nlohmann::json;

// The categories of trace.png, in drawing order: what holds other spans first, waits last (on top).
const std::vector<std::string> kSpanCategories = {"step", "forward", "backward", "recompute", "all_gather",
                                              "reduce_scatter", "all_reduce", "other collective", "wait", "blocking"};

int category_of(const Json& e) {
  std::string cat = e.value("cat", "");
  if (cat == "pipeline_receive") cat = "wait";  // waiting for another pipeline stage
  const auto at = std::find(kSpanCategories.begin(), kSpanCategories.end(), cat);
  if (at != kSpanCategories.end()) return static_cast<int>(at - kSpanCategories.begin());
  if (e.value("tid", 0) != 0) return 7;  // broadcast, barrier
  return 0;                              // data, grad_sync, optimizer, eval, sample, checkpoint
}

std::int64_t ns(double us) { return std::llround(us * 1000.0); }

struct RankTrace {
  int rank = 0;
  Json trace;
  std::int64_t sync_ns = 0;
};

std::vector<RankTrace> read_ranks(const std::filesystem::path& dir) {
  std::vector<RankTrace> out;
  const std::regex name(R"(rank([0-9]+)\.json)");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (!std::regex_match(file, m, name)) continue;
    std::ifstream in(entry.path());
    RankTrace r;
    try {
      r.trace = Json::parse(in);
      const Json& other = r.trace.at("otherData");
      if (other.value("format", "") != "fsdpp-trace 1") throw std::runtime_error("not an fsdpp trace (format)");
      r.rank = other.at("rank").get<int>();
      r.sync_ns = ns(other.at("sync_us").get<double>());
    } catch (const std::exception& e) {
      throw UsageError(fmt::format("{}: not a readable run.trace file: {}", entry.path().string(), e.what()));
    }
    out.push_back(std::move(r));
  }
  FSDPP_REQUIRE(!out.empty(), "no trace in {}: record one with run.trace: <first>-<last> (docs/trace.md)",
                dir.string());
  std::sort(out.begin(), out.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
  return out;
}

// Sums per unit, operation or mesh dimension; per rank after dividing by the ranks.
struct Totals {
  double collectives = 0, comm_ms = 0, in_flight_ms = 0, waited_ms = 0;
  void add(const Totals& o) {
    collectives += o.collectives, comm_ms += o.comm_ms, in_flight_ms += o.in_flight_ms, waited_ms += o.waited_ms;
  }
  // exposed: the share of the collectives' issue -> completion time the compute track spent waiting.
  Json json(const std::string& key, const std::string& name, int ranks) const {
    return {{key, name}, {"collectives", collectives / ranks}, {"comm_ms", comm_ms / ranks},
            {"in_flight_ms", in_flight_ms / ranks}, {"waited_ms", waited_ms / ranks},
            {"exposed_pct", in_flight_ms > 0 ? 100.0 * waited_ms / in_flight_ms : 0.0}};
  }
};

struct Collective {
  std::string unit, op, dim;
  double comm_ms = 0, in_flight_ms = 0;
};

// The unit a site belongs to: the longest unit name it starts with, followed by a space.
std::string unit_of(const std::string& site, const std::vector<std::string>& units) {
  std::string best;
  for (const std::string& u : units)
    if (u.size() > best.size() && site.compare(0, u.size(), u) == 0 && (site.size() == u.size() || site[u.size()] == ' '))
      best = u;
  return best.empty() ? "(other)" : best;
}

// Adds one rank's collectives and waits into the three tables.
void tally(const RankTrace& r, std::map<std::string, Totals>& by_unit, std::map<std::string, Totals>& by_op,
           std::map<std::string, Totals>& by_dim, std::vector<std::string>& unit_order) {
  const Json& other = r.trace.at("otherData");
  const auto units = other.at("units").get<std::vector<std::string>>();
  for (const std::string& u : units)
    if (std::find(unit_order.begin(), unit_order.end(), u) == unit_order.end()) unit_order.push_back(u);
  std::map<std::pair<std::uint32_t, std::uint64_t>, Collective> collectives;  // (comm id, seq)
  for (const Json& e : r.trace.at("traceEvents")) {
    if (e.value("ph", "") != "X" || e.value("tid", 0u) == 0) continue;
    const Json& a = e.at("args");
    const double dur_ms = e.at("dur").get<double>() / 1000.0;
    const double in_flight_ms = (e.at("ts").get<double>() - a.at("issued_us").get<double>()) / 1000.0 + dur_ms;
    Collective c{unit_of(a.value("site", ""), units), a.value("op", ""), a.value("comm", ""), dur_ms, in_flight_ms};
    for (Totals* t : {&by_unit[c.unit], &by_op[c.op], &by_dim[c.dim]})
      ++t->collectives, t->comm_ms += c.comm_ms, t->in_flight_ms += c.in_flight_ms;
    collectives[{e.at("tid").get<std::uint32_t>() - 1, a.at("seq").get<std::uint64_t>()}] = std::move(c);
  }
  for (const Json& e : r.trace.at("traceEvents")) {
    const std::string cat = e.value("cat", "");
    if (e.value("ph", "") != "X" || (cat != "wait" && cat != "blocking")) continue;
    const Json& a = e.at("args");
    const auto c = collectives.find({a.at("comm_id").get<std::uint32_t>(), a.at("seq").get<std::uint64_t>()});
    if (c == collectives.end()) continue;  // a collective that did not complete while recording
    const double waited = e.at("dur").get<double>() / 1000.0;
    for (Totals* t : {&by_unit[c->second.unit], &by_op[c->second.op], &by_dim[c->second.dim]}) t->waited_ms += waited;
  }
}

void add_rows(std::string& table, Json& json, const char* key, const std::map<std::string, Totals>& totals,
              const std::vector<std::string>& order, int ranks) {
  table += fmt::format("  {:<32} {:>11} {:>10} {:>12} {:>10} {:>8}\n", key, "collectives", "comm ms", "in flight ms",
                       "waited ms", "exposed");
  for (const std::string& name : order) {
    const auto t = totals.find(name);
    if (t == totals.end()) continue;
    const Json row = t->second.json(key, name, ranks);
    table += fmt::format("  {:<32} {:>11.1f} {:>10.3f} {:>12.3f} {:>10.3f} {:>7.1f}%\n", name,
                         row["collectives"].get<double>(), row["comm_ms"].get<double>(),
                         row["in_flight_ms"].get<double>(), row["waited_ms"].get<double>(),
                         row["exposed_pct"].get<double>());
    json.push_back(row);
  }
}

std::vector<std::string> keys_of(const std::map<std::string, Totals>& m) {
  std::vector<std::string> out;
  for (const auto& kv : m) out.push_back(kv.first);
  return out;
}

// A pipeline action's span starts a TracedAction; a receive inside it adds to its wait.
void note_pipeline_span(const std::string& name, int rank, double start_ms, double end_ms, TraceReport& report) {
  const std::string action_prefix = "fsdpp::pipeline ";
  const bool action = name.rfind(action_prefix, 0) == 0, receive = name == "fsdpp::pipeline_receive";
  if (!action && !receive) return;
  if (report.pipeline.size() <= static_cast<std::size_t>(rank)) report.pipeline.resize(static_cast<std::size_t>(rank) + 1);
  std::vector<TracedAction>& ran = report.pipeline[static_cast<std::size_t>(rank)];
  if (action) ran.push_back({name.substr(action_prefix.size()), start_ms, end_ms, 0.0});
  else if (!ran.empty() && start_ms >= ran.back().start_ms && end_ms <= ran.back().end_ms)
    ran.back().waited_ms += end_ms - start_ms;  // (an evaluation's receives are outside any action)
}

// One rank's events, shifted to the common time base, into `merged`; its rows and boxes into the report.
void merge_rank(const RankTrace& r, std::int64_t zero_ns, Json& merged, TraceReport& report) {
  std::map<std::uint32_t, int> row_of;  // track id -> row of trace.png, from the thread_name metadata
  for (const Json& e : r.trace.at("traceEvents"))
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") {
      row_of[e.value("tid", 0u)] = static_cast<int>(report.rows.size());
      report.rows.push_back(fmt::format("r{} {}", r.rank, e.at("args").value("name", "")));
    }
  std::vector<std::int64_t> open_ends;  // the compute track's enclosing spans (events are sorted by start)
  for (Json e : r.trace.at("traceEvents")) {
    e["pid"] = r.rank;
    if (e.value("ph", "") != "X") {
      merged.push_back(std::move(e));
      continue;
    }
    const auto tid = e.value("tid", 0u);
    const std::int64_t start = ns(e.at("ts").get<double>()) - r.sync_ns, end = start + ns(e.at("dur").get<double>());
    e["ts"] = static_cast<double>(start) / 1000.0;
    TraceBox box;
    box.row = row_of.count(tid) ? row_of[tid] : 0;
    box.category = category_of(e);
    box.start_ms = static_cast<double>(start - zero_ns) / 1e6;
    box.end_ms = static_cast<double>(end - zero_ns) / 1e6;
    if (tid == 0) {
      while (!open_ends.empty() && open_ends.back() <= start && open_ends.back() < end) open_ends.pop_back();
      box.depth = static_cast<int>(open_ends.size());
      open_ends.push_back(end);
      note_pipeline_span(e.value("name", ""), r.rank, box.start_ms, box.end_ms, report);
    }
    report.boxes.push_back(box);
    merged.push_back(std::move(e));
  }
}

}  // namespace

TraceReport analyze_trace(const std::string& run_dir) {
  const std::filesystem::path dir = std::filesystem::path(run_dir) / "trace";
  const std::vector<RankTrace> ranks = read_ranks(dir);
  TraceReport report;
  report.ranks = static_cast<int>(ranks.size());
  report.categories = kSpanCategories;
  const Json& first = ranks.front().trace.at("otherData");
  report.first_step = first.at("steps").at(0).get<std::int64_t>();
  report.last_step = first.at("steps").at(1).get<std::int64_t>();
  const int world = first.at("world").get<int>();

  std::int64_t zero_ns = INT64_MAX;  // the earliest event after alignment: trace.png's time 0
  for (const RankTrace& r : ranks)
    for (const Json& e : r.trace.at("traceEvents"))
      if (e.value("ph", "") == "X") zero_ns = std::min(zero_ns, ns(e.at("ts").get<double>()) - r.sync_ns);
  Json merged_events = Json::array();
  for (const RankTrace& r : ranks) merge_rank(r, zero_ns, merged_events, report);
  Json merged = {{"traceEvents", std::move(merged_events)},
                 {"displayTimeUnit", "ms"},
                 {"otherData", {{"format", "fsdpp-trace-merged 1"}, {"world", world}, {"ranks", report.ranks},
                                {"steps", {report.first_step, report.last_step}}}}};
  report.merged_path = (dir / "merged.json").string();
  {
    std::ofstream out(report.merged_path);
    out << merged.dump() << '\n';
    FSDPP_CHECK(out.good(), "cannot write {}", report.merged_path);
  }

  std::map<std::string, Totals> by_unit, by_op, by_dim;
  std::vector<std::string> unit_order;
  for (const RankTrace& r : ranks) tally(r, by_unit, by_op, by_dim, unit_order);
  unit_order.push_back("(other)");
  Totals all;
  for (const auto& kv : by_unit) all.add(kv.second);

  Json units = Json::array(), ops = Json::array(), dims = Json::array();
  std::string table = fmt::format("trace of steps {}-{} on {} of {} ranks (per rank, summed over the steps): {}\n",
                                  report.first_step, report.last_step, report.ranks, world, report.merged_path);
  add_rows(table, units, "unit", by_unit, unit_order, report.ranks);
  table += "\n";
  add_rows(table, ops, "operation", by_op, keys_of(by_op), report.ranks);
  table += "\n";
  add_rows(table, dims, "mesh dimension", by_dim, keys_of(by_dim), report.ranks);
  const Json total = all.json("total", "all", report.ranks);
  table += fmt::format("  total: {:.1f} collectives, {:.3f} ms communicating, {:.3f} ms waited ({:.1f}% exposed)\n",
                       total["collectives"].get<double>(), total["comm_ms"].get<double>(),
                       total["waited_ms"].get<double>(), total["exposed_pct"].get<double>());
  report.table = std::move(table);
  report.json = Json{{"trace", report.merged_path}, {"ranks", report.ranks}, {"world", world},
                     {"steps", {report.first_step, report.last_step}}, {"units", units}, {"by_op", ops},
                     {"by_dim", dims}, {"total", total}}.dump();
  return report;
}

}  // namespace fsdpp
