// fsdpp plan [deck.yaml] [key=value ...] --ranks N [--mem-per-rank 80GiB]: will this configuration fit? A dry
// run of the memory a training job of the deck needs on each of N ranks, from shapes alone: it starts no MPI
// job beyond itself and allocates no model (fsdpp/train/memory_plan.hpp says how, and what is counted).
#include "commands.hpp"

#include "fsdpp/infer/generator.hpp"
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
  bool generate = false;
  int sequences = 1, tokens = 0;
};

// fsdpp plan --generate: the model split over the ranks as fsdpp generate runs it, the KV cache of `sequences`
// of up to `tokens` tokens, and the decode buffers of their prefill.
int plan_generate(const Deck& deck, const PlanArgs& args, std::optional<std::int64_t> mem) {
  const int tokens = args.tokens > 0 ? args.tokens : deck.model.context_length;
  const GenerationMemory m = plan_generation(deck, args.ranks, args.sequences, tokens);
  const double mib = 1.0 / 1048576.0;
  if (args.json) {
    nlohmann::json j = {{"ranks", args.ranks}, {"sequences", args.sequences}, {"tokens", tokens},
                        {"bytes_per_rank", {{"parameters", m.parameters}, {"kv_cache", m.kv_cache},
                                            {"decode_buffers", m.decode_buffers}, {"total", m.total()}}}};
    if (mem) j["mem_per_rank"] = *mem, j["fits"] = m.total() <= *mem;
    Log::info("{}", j.dump());
  } else {
    Log::info("fsdpp plan --generate: {} sequence(s) of up to {} tokens on {} rank(s) (mesh.tp = {}); nothing runs\n"
              "Per-rank memory (MiB):\n"
              "  parameters (f32, this rank's tensor-parallel part)   {:>12.1f}\n"
              "  KV cache (k and v of every block)                    {:>12.1f}\n"
              "  decode buffers (a prefill forward of {:>5} rows)     {:>12.1f}\n"
              "                                                       ------------\n"
              "  total per rank                                       {:>12.1f}{}",
              args.sequences, tokens, args.ranks, args.ranks, m.parameters * mib, m.kv_cache * mib,
              std::min(args.sequences * tokens, GenerationOptions{}.prefill_rows), m.decode_buffers * mib, m.total() * mib,
              mem ? fmt::format("   of {:.2f} GiB per rank: {}", *mem / 1073741824.0,
                                m.total() <= *mem ? "fits" : "does NOT fit") : std::string());
  }
  return mem && m.total() > *mem ? 3 : 0;
}

// A depth as a number, per-unit lists as the deck writes them ("h.1:h.0").
nlohmann::json prefetch_json(const PrefetchSetting& p) {
  if (p.lists.empty()) return p.depth;
  return to_string(p);
}

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
                      {"activations_without_checkpointing", plan.activations_without_checkpointing},
                      {"forward_prefetch", prefetch_json(plan.forward_prefetch)},
                      {"backward_prefetch", prefetch_json(plan.backward_prefetch)},
                      {"reduce_scatter_in_flight", plan.reduce_scatter_in_flight}};
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
  cli->add_flag("--generate", args->generate, "Plan fsdpp generate instead of training: the model split over the "
                                               "ranks (mesh.tp), its KV cache and decode buffers");
  cli->add_option("--sequences", args->sequences, "--generate: prompts generated together (1)")->check(CLI::PositiveNumber);
  cli->add_option("--tokens", args->tokens, "--generate: prompt plus new tokens per sequence (model.context_length)")
      ->check(CLI::PositiveNumber);
  return {cli, [args](Runtime& rt) {
            const Deck deck = deck_from_words(rt.world(), args->words);
            std::optional<std::int64_t> mem;
            if (!args->mem_per_rank.empty()) mem = parse_byte_size(args->mem_per_rank, "--mem-per-rank");
            if (args->generate) return plan_generate(deck, *args, mem);
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
