#pragma once
// Ranks named with their hosts, as messages about a job's ranks put them: "rank 1 on vm", "ranks 2 and 3 on
// node2", "rank 0 on node1 and rank 3 on node2". One place, for the flight recorder's abort message and
// `fsdpp debug flight`.
#include <string>
#include <vector>

namespace fsdpp {

// `hosts[r]` is world rank r's host; ranks past its end are named without one.
std::string ranks_on_hosts(const std::vector<int>& ranks, const std::vector<std::string>& hosts);
std::string join_numbers(const std::vector<int>& numbers);  // "2", "2 and 3", "0, 2 and 3"

}  // namespace fsdpp
