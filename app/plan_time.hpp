#pragma once
// fsdpp plan --machine: the predicted step time beside the memory plan, the layout search (--search) and the
// scaling table (--ranks 8,64,512) as JSON. lib/fsdpp/plan/ does the pricing and the search.
#include "fsdpp/plan/layout_search.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace fsdpp::app {

// The "time" object of `fsdpp plan --json` (the names are a contract with tests/bench/model_accuracy).
nlohmann::json step_time_json(const StepTime& t);

// "8,64,512" -> {8, 64, 512}; UsageError naming --ranks otherwise.
std::vector<int> parse_rank_list(const std::string& text);

// --json's form of --search.
nlohmann::json search_json(const std::vector<Candidate>& best, std::size_t shown);

}  // namespace fsdpp::app
