#pragma once
// fsdpp plan --search: every layout of a deck's model on N ranks of a machine (mesh with tp, cp and ep, strategy, reshard,
// activation checkpointing, micro-batch, parameter dtype) that the trainer's rules accept and that fits in the
// device's memory, priced by plan_step (step_cost.hpp), fastest first.
#include "fsdpp/plan/step_cost.hpp"

#include <functional>
#include <string>
#include <vector>

namespace fsdpp {

// One layout: the overrides that make it, its plan, and one line naming it.
struct Candidate {
  std::vector<std::string> overrides;  // "mesh.tp=2", ... added to the deck's words
  std::string layout;                  // one line: "dp_shard 8 x tp 1, full_shard, reshard true, ac none, mb 2, bf16"
  StepPlan plan;
};

// The deck as given, with `overrides` added last (later wins); throws UsageError for a layout the trainer
// refuses. The caller reads the deck (collectively, when it is a file).
using DeckWith = std::function<Deck(const std::vector<std::string>& overrides)>;

// Every layout of the deck's model on `ranks` that fits in the machine's device memory, fastest first.
std::vector<Candidate> search_layouts(const DeckWith& deck_with, int ranks, const Machine& machine);

// One sentence: what the best layout has over the runner-up.
std::string why_best(const std::vector<Candidate>& best);

// The table of the `shown` fastest.
std::string format_search(const std::vector<Candidate>& best, int ranks, const Machine& machine, std::size_t shown);

}  // namespace fsdpp
