#include "fsdpp/observe/traffic.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>

namespace fsdpp {

std::vector<DimensionTraffic> traffic_by_dimension(MPI_Comm world, const std::vector<std::string>& host_of_rank) {
  // The communicators of the mesh: those with members (a planning mesh's have none), in registration order.
  std::vector<CommEntry> comms = FlightRecorder::comms();
  comms.erase(std::remove_if(comms.begin(), comms.end(), [](const CommEntry& c) { return c.world_ranks.empty(); }),
              comms.end());
  // Every rank must list the same dimensions in the same order before their numbers are added up.
  std::size_t signature = comms.size();
  for (const CommEntry& c : comms) signature = signature * 31 + std::hash<std::string>{}(c.label);
  long long check[2] = {static_cast<long long>(signature % (1ull << 62)), -static_cast<long long>(signature % (1ull << 62))};
  MPI_Allreduce(MPI_IN_PLACE, check, 2, MPI_LONG_LONG, MPI_MIN, world);
  if (check[0] != -check[1]) return {};

  auto host = [&](int r) -> const std::string& { return host_of_rank.at(static_cast<std::size_t>(r)); };
  std::vector<double> sums(comms.size() * 2);
  std::vector<unsigned long long> issued(comms.size());
  for (std::size_t i = 0; i < comms.size(); ++i) {
    const CommEntry& c = comms[i];
    const std::size_t n = c.world_ranks.size(), me = static_cast<std::size_t>(c.rank_in_group);
    const bool crosses = n > 1 && host(c.world_ranks[me]) != host(c.world_ranks[(me + 1) % n]);
    sums[2 * i] = static_cast<double>(c.payload_bytes);
    sums[2 * i + 1] = crosses ? static_cast<double>(c.ring_bytes_out) : 0.0;
    issued[i] = c.issued;
  }
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_DOUBLE, MPI_SUM, world);
  MPI_Allreduce(MPI_IN_PLACE, issued.data(), static_cast<int>(issued.size()), MPI_UNSIGNED_LONG_LONG, MPI_MAX, world);

  std::vector<DimensionTraffic> table;
  for (std::size_t i = 0; i < comms.size(); ++i) {
    auto row = std::find_if(table.begin(), table.end(), [&](const DimensionTraffic& t) { return t.label == comms[i].label; });
    if (row == table.end()) row = table.insert(table.end(), DimensionTraffic{comms[i].label});
    row->collectives = std::max<std::uint64_t>(row->collectives, issued[i]);
    row->payload_bytes += sums[2 * i];
    row->crossing_bytes += sums[2 * i + 1];
  }
  return table;
}

std::string format_traffic(const std::vector<DimensionTraffic>& traffic, const std::vector<std::string>& host_of_rank) {
  if (traffic.empty()) return "traffic by mesh dimension: not available (the ranks' communicators differ)";
  const std::size_t hosts = std::set<std::string>(host_of_rank.begin(), host_of_rank.end()).size();
  std::string text = fmt::format("Traffic by mesh dimension ({} host(s); ring bytes between hosts, all ranks):\n", hosts);
  text += fmt::format("  {:<34} {:>11} {:>14} {:>18}\n", "dimension", "collectives", "payload MiB", "between hosts B");
  double total = 0;
  for (const DimensionTraffic& t : traffic) {
    text += fmt::format("  {:<34} {:>11} {:>14.2f} {:>18.0f}\n", t.label, t.collectives, t.payload_bytes / (1 << 20),
                        t.crossing_bytes);
    total += t.crossing_bytes;
  }
  text += fmt::format("bytes between hosts (predicted, flat rings): {:.0f}", total);
  return text;
}

}  // namespace fsdpp
