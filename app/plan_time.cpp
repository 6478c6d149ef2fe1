#include "plan_time.hpp"

#include "commands.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

namespace fsdpp::app {

nlohmann::json step_time_json(const StepTime& t) {
  nlohmann::json exposed = nlohmann::json::object(), busy = nlohmann::json::object(), bytes = nlohmann::json::object();
  for (const auto& [dim, ms] : t.exposed_comm_ms) exposed[dim] = ms;
  for (const auto& [dim, ms] : t.busy_comm_ms) busy[dim] = ms;
  for (const auto& [dim, b] : t.comm_bytes) bytes[dim] = b;
  nlohmann::json links = nlohmann::json::object();
  for (const auto& [dim, link] : t.link_of) links[dim] = link;
  return {{"machine", t.machine}, {"precision", t.precision}, {"peak_tflops", t.peak_tflops},
          {"ms_per_step", t.ms_per_step}, {"tokens_per_s_per_device", t.tokens_per_s_per_device},
          {"tokens_per_s", t.tokens_per_s}, {"mfu", t.mfu}, {"critical_resource", t.critical_resource},
          {"exposed_comm_ms", exposed}, {"comm_ms_by_dim", busy}, {"compute_ms", t.compute_ms},
          {"comm_ms", t.comm_ms}, {"comm_bytes_by_dim", bytes}, {"link_by_dim", links}};
}

std::vector<int> parse_rank_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FSDPP_REQUIRE(used == item.size() && n >= 1, "--ranks '{}': '{}' is not a rank count; write a positive number or "
                  "a list such as 8,64,512", text, item);
    out.push_back(n);
  }
  FSDPP_REQUIRE(!out.empty(), "--ranks is empty; write a rank count or a list such as 8,64,512");
  return out;
}

nlohmann::json search_json(const std::vector<Candidate>& best, std::size_t shown) {
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < std::min(shown, best.size()); ++i)
    rows.push_back({{"layout", best[i].layout}, {"overrides", best[i].overrides},
                    {"bytes_per_rank", best[i].plan.memory.memory.total()},
                    {"time", step_time_json(best[i].plan.time)}});
  return {{"fitting_layouts", best.size()}, {"best", rows}, {"why", why_best(best)}};
}

}  // namespace fsdpp::app
