#include "fsdpp/runtime/rank_names.hpp"

#include <map>

namespace fsdpp {

std::string join_numbers(const std::vector<int>& numbers) {
  std::string text;
  for (std::size_t i = 0; i < numbers.size(); ++i) {
    if (i > 0) text += i + 1 == numbers.size() ? " and " : ", ";
    text += std::to_string(numbers[i]);
  }
  return text;
}

std::string ranks_on_hosts(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  // Grouped by host, hosts in order of their first rank.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> by_host;
  for (int r : ranks) {
    const std::string host = r >= 0 && static_cast<std::size_t>(r) < hosts.size() ? hosts[static_cast<std::size_t>(r)] : "";
    if (!by_host.count(host)) order.push_back(host);
    by_host[host].push_back(r);
  }
  std::string text;
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (i > 0) text += i + 1 == order.size() ? " and " : ", ";
    const std::vector<int>& group = by_host[order[i]];
    text += (group.size() == 1 ? "rank " : "ranks ") + join_numbers(group);
    if (!order[i].empty()) text += " on " + order[i];
  }
  return text;
}

}  // namespace fsdpp
