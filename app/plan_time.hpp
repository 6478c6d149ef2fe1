#pragma once
// fsdpp plan --machine: the predicted step time beside the memory plan, the layout search (--search) and the
// scaling table (--ranks 8,64,512). perf/step_cost.hpp does the pricing; this is the command's side.
#include "fsdpp/perf/step_cost.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace fsdpp::app {

// The "time" object of `fsdpp plan --json` (the names are a contract with tests/bench/model_accuracy).
nlohmann::json step_time_json(const StepTime& t);

// One layout of --search: the overrides that make it, its plan, and whether it fits in the device's memory.
struct Candidate {
  std::vector<std::string> overrides;  // "mesh.tp=2", ... added to the deck's words
  std::string layout;                  // one line: "dp_shard 8 x tp 1, full_shard, reshard true, ac none, mb 2, bf16"
  StepPlan plan;
};

// Every layout of the deck's model on `ranks` that the trainer's rules accept and that fits in the machine's
// device memory, fastest first. Words: the deck and its overrides as given on the command line.
std::vector<Candidate> search_layouts(MPI_Comm world, const std::vector<std::string>& words, int ranks,
                                      const Machine& machine);
// "8,64,512" -> {8, 64, 512}; UsageError naming --ranks otherwise.
std::vector<int> parse_rank_list(const std::string& text);

// The printed forms.
std::string format_search(const std::vector<Candidate>& best, int ranks, const Machine& machine, std::size_t shown);
nlohmann::json search_json(const std::vector<Candidate>& best, std::size_t shown);

}  // namespace fsdpp::app
