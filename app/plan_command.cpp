// fsdpp plan [deck.yaml] [key=value ...] --ranks N [--mem-per-rank 80GiB]: will this configuration fit? A dry
// run of the memory a training job of the deck needs on each of N ranks, from shapes alone: it starts no MPI
// job beyond itself and allocates no model (fsdpp/train/memory_plan.hpp says how, and what is counted).
#include "commands.hpp"

#include "fsdpp/train/memory_plan.hpp"

#include <nlohmann/json.hpp>

#include <optional>

namespace fsdpp::app {
namespace {

struct PlanArgs {
  std::vector<std::string> words;
  int ranks = 0;
  std::string mem_per_rank;
  bool json = false;
};

nlohmann::json plan_json(const MemoryPlan& plan, std::optional<std::int64_t> mem) {
  const PlannedMemory& m = plan.memory;
  nlohmann::json units = nlohmann::json::array();
  for (const PlannedUnit& u : plan.units)
    units.push_back({{"name", u.name}, {"parameters", u.parameters}, {"sharded_bytes", u.sharded_bytes},
                     {"unsharded_bytes", u.unsharded_bytes}});
  nlohmann::json mesh = nlohmann::json::object();
  for (const MeshDim& d : plan.mesh) mesh[d.name] = d.size;
  nlohmann::json j = {{"ranks", plan.ranks}, {"mesh", mesh}, {"strategy", plan.strategy}, {"micro_batch", plan.micro_batch},
                      {"accum_steps", plan.accum_steps}, {"units", units},
                      {"bytes_per_rank", {{"parameters", m.parameters}, {"gradients", m.gradients},
                                          {"optimizer", m.optimizer}, {"unsharded_parameters", m.unsharded_parameters},
                                          {"unsharded_gradients", m.unsharded_gradients},
                                          {"comm_buffers", m.comm_buffers}, {"pool_cached", m.pool_cached},
                                          {"activations", m.activations}, {"batch", m.batch}, {"total", m.total()}}},
                      {"per_sequence_bytes", plan.per_sequence_bytes}, {"peak", plan.peak_moment},
                      {"recomputing_blocks", plan.recomputing_blocks},
                      {"activations_without_checkpointing", plan.activations_without_checkpointing}};
  if (mem) {
    j["mem_per_rank"] = *mem;
    j["fits"] = m.total() <= *mem;
    j["largest_micro_batch"] = plan.largest_micro_batch(*mem);
  }
  return j;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto* cli = app.add_subcommand("plan", "Per-rank memory of a deck on N ranks, by category, and the largest "
                                         "micro-batch that fits; runs nothing");
  auto args = std::make_shared<PlanArgs>();
  cli->add_option("deck_and_overrides", args->words, "deck.yaml, then section.key=value overrides");
  cli->add_option("--ranks,-n", args->ranks, "Ranks of the job to plan for")->required()->check(CLI::PositiveNumber);
  cli->add_option("--mem-per-rank", args->mem_per_rank, "Memory each rank has (80GiB, 512MiB): says whether the "
                                                        "plan fits and the largest micro-batch that does");
  cli->add_flag("--json", args->json, "Print the plan as one JSON object instead of the table");
  return {cli, [args](Runtime& rt) {
            const Deck deck = deck_from_words(rt.world(), args->words);
            std::optional<std::int64_t> mem;
            if (!args->mem_per_rank.empty()) mem = parse_byte_size(args->mem_per_rank, "--mem-per-rank");
            const MemoryPlan plan = plan_memory(deck, args->ranks);
            if (args->json) Log::info("{}", plan_json(plan, mem).dump());
            else Log::info("fsdpp plan: {} on {} rank(s); nothing runs and no model is allocated\n{}",
                           args->words.empty() ? "the embedded tiny deck" : args->words.front(), args->ranks,
                           format_memory_plan(deck, plan, mem));
            return mem && plan.memory.total() > *mem ? 3 : 0;
          },
          [] { return false; }};  // shapes alone, on a planning mesh: no device, no Kokkos
}

}  // namespace fsdpp::app
