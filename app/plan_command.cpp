// fsdpp plan [deck.yaml] [key=value ...] --ranks N [--mem-per-rank 80GiB]: will this configuration fit? A dry
// run of the memory a training job of the deck needs on each of N ranks, from shapes alone: it starts no MPI
// job beyond itself and allocates no model (fsdpp/plan/memory_plan.hpp says how, and what is counted).
#include "commands.hpp"
#include "plan_time.hpp"

#include "fsdpp/infer/generator.hpp"
#include "fsdpp/plan/machine.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/plan/memory_plan.hpp"
#include "fsdpp/plan/pipeline_plan.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <optional>

namespace fsdpp::app {
namespace {

struct PlanArgs {
  std::vector<std::string> words;
  std::string ranks_text;  // "8", or "8,64,512" for the scaling table
  int ranks = 0;
  std::string machine;     // a preset or a YAML file: predict the step time too
  bool list_machines = false;
  bool search = false;
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
                                          {"activations", m.activations}, {"batch", m.batch},
                                          {"pipeline_messages", m.pipeline_messages}, {"weight_stash", m.weight_stash},
                                          {"total", m.total()}}},
                      {"per_sequence_bytes", plan.per_sequence_bytes}, {"peak", plan.peak_moment},
                      {"ring_bytes_per_step", plan.ring_bytes_per_step},
                      {"recomputing_blocks", plan.recomputing_blocks},
                      {"activations_without_checkpointing", plan.activations_without_checkpointing},
                      {"forward_prefetch", prefetch_json(plan.forward_prefetch)},
                      {"backward_prefetch", prefetch_json(plan.backward_prefetch)},
                      {"reduce_scatter_in_flight", plan.reduce_scatter_in_flight}};
  if (plan.pipeline_stage >= 0) {
    j["pipeline_stage"] = plan.pipeline_stage;
    j["pipeline_slots"] = plan.pipeline_slots;
    j["pipeline_stashes"] = plan.pipeline_stashes;
  }
  if (mem) {
    j["mem_per_rank"] = *mem;
    j["fits"] = m.total() <= *mem;
    j["largest_micro_batch"] = plan.largest_micro_batch(*mem);
  }
  return j;
}

// --list-machines: the presets, one line each.
int list_machines() {
  for (const std::string& name : machine_preset_names()) {
    const Machine m = *machine_preset(name);
    Log::info("{:<14} {} x {:.0f} GiB, {:.0f} TFLOP/s bf16 dense, intra-node busbw {:.0f} GB/s, inter-node {:.0f} GB/s "
              "({})", name, m.devices_per_node, m.memory_gib, m.bf16.peak_tflops, m.intra_node.ring.busbw_gbs,
              m.inter_node.ring.busbw_gbs, m.source);
  }
  Log::info("or --machine FILE.yaml: a description in the same form (docs/performance-model.md), e.g. from "
            "`fsdpp bench calibrate > machine.yaml`");
  return 0;
}

// The command line's deck with a layout's overrides added last: every rank reads it alike (collective).
DeckWith deck_with(MPI_Comm world, const std::vector<std::string>& words) {
  return [world, words](const std::vector<std::string>& overrides) {
    std::vector<std::string> all = words;
    all.insert(all.end(), overrides.begin(), overrides.end());
    return deck_from_words(world, all, hf_folder_reader(world));
  };
}

// --ranks 8,64,512: one row per rank count, the deck's layout (or with --search the best that fits).
int plan_scaling(MPI_Comm world, const PlanArgs& args, const std::vector<int>& counts, const Machine& machine) {
  nlohmann::json rows = nlohmann::json::array();
  std::string table = fmt::format("Scaling on {} ({}):\n  {:>6} {:>10} {:>12} {:>12} {:>7} {:>11} {:>9}  {}\n",
                                  machine.name, args.search ? "the best layout that fits at each size" : "the deck's layout",
                                  "ranks", "ms/step", "tok/s/dev", "tok/s", "MFU", "exposed ms", "mem GiB", "layout / critical");
  for (int n : counts) {
    std::string layout;
    StepPlan plan;
    if (args.search) {
      const std::vector<Candidate> best = search_layouts(deck_with(world, args.words), n, machine);
      if (best.empty()) {
        table += fmt::format("  {:>6} no layout fits in {:.0f} GiB\n", n, machine.memory_gib);
        rows.push_back({{"ranks", n}, {"fits", false}});
        continue;
      }
      plan = best.front().plan;
      layout = best.front().layout;
    } else {
      try {
        plan = plan_step(deck_from_words(world, args.words, hf_folder_reader(world)), n, machine);
      } catch (const UsageError& e) {  // this count only: say why in its row
        table += fmt::format("  {:>6} does not run: {}\n", n, e.what());
        rows.push_back({{"ranks", n}, {"error", e.what()}});
        continue;
      }
    }
    const StepTime& t = plan.time;
    double exposed = 0;
    for (const auto& [d, ms] : t.exposed_comm_ms) exposed += ms;
    table += fmt::format("  {:>6} {:>10.1f} {:>12.0f} {:>12.0f} {:>7.3f} {:>11.1f} {:>9.1f}  {}{}\n", n, t.ms_per_step,
                         t.tokens_per_s_per_device, t.tokens_per_s, t.mfu, exposed,
                         plan.memory.memory.total() / 1073741824.0, layout.empty() ? "" : layout + " / ",
                         t.critical_resource);
    nlohmann::json row = plan_json(plan.memory, std::nullopt);
    row["time"] = step_time_json(t);
    if (!layout.empty()) row["layout"] = layout;
    rows.push_back(row);
  }
  if (args.json) Log::info("{}", nlohmann::json({{"scaling", rows}}).dump());
  else Log::info("{}", table);
  return 0;
}

// mesh.pp > 1: the stages, the schedule and its bubble, and the memory of each stage's ranks (they differ: the
// embedding, the head, the micro-batches in flight); with --machine the step priced per stage and replayed.
int plan_pipeline_deck(const PlanArgs& args, const Deck& deck, int ranks, const std::optional<Machine>& machine,
                       std::optional<std::int64_t> mem) {
  const PipelinePlan plan = plan_pipeline(deck, ranks);
  std::vector<MemoryPlan> stages_memory;
  std::int64_t most = 0;
  for (int r = 0; r < plan.shape.ranks; ++r) {
    stages_memory.push_back(plan_stage_memory(deck, ranks, r));
    most = std::max(most, stages_memory.back().memory.total());
  }
  nlohmann::json memory = nlohmann::json::array();
  for (const MemoryPlan& s : stages_memory) memory.push_back(plan_json(s, mem));
  std::optional<PipelineStepPlan> step;
  if (machine) step = plan_pipeline_step(deck, ranks, *machine);
  if (args.json) {
    nlohmann::json stages = nlohmann::json::array();
    for (int s = 0; s < plan.shape.stages(); ++s)
      stages.push_back({{"stage", s}, {"rank", plan.shape.rank_of_stage(s)}, {"first_block", plan.split.first[s]},
                        {"blocks", plan.split.blocks(s)}, {"flops_per_token", plan.split.flops[s]}});
    nlohmann::json j({{"pipeline",
                                     {{"schedule", std::string(to_string(plan.kind))},
                                      {"pp", plan.shape.ranks},
                                      {"virtual_stages", plan.shape.virtual_stages},
                                      {"microbatches", plan.shape.microbatches},
                                      {"stages", stages},
                                      {"bubble", plan.timeline.bubble},
                                      {"equal_stages_bubble", plan.equal_stages_bubble},
                                      {"one_f_one_b_bubble", plan.one_f_one_b_bubble},
                                      {"peak_in_flight", plan.timeline.peak_in_flight}}},
                                    {"stages_memory", memory},
                                    {"total", most}});
    if (step) {
      j["time"] = step_time_json(step->time);
      j["time"]["pipeline"] = {{"makespan_ms", step->timeline.makespan}, {"bubble", step->timeline.bubble},
                               {"p2p_ms", step->p2p_ms}, {"message_bytes", step->message_bytes}};
    }
    Log::info("{}", j.dump());
    return mem && most > *mem ? 3 : 0;
  }
  std::string table = fmt::format(
      "Memory per rank of each pipeline stage ({} rank(s) per stage; MiB; the ranks of a stage need the same):\n"
      "  {:>5}  {:>12}  {:>12}  {:>12}  {:>20}  {:>9}  {:>9}\n",
      ranks / plan.shape.ranks, "stage", "model states", "unsharded", "activations", "(micro-batches kept)", "messages",
      "total");
  for (const MemoryPlan& s : stages_memory) {
    const PlannedMemory& m = s.memory;
    table += fmt::format("  {:>5}  {:>12.1f}  {:>12.1f}  {:>12.1f}  {:>20}  {:>9.1f}  {:>9.1f}{}\n", s.pipeline_stage,
                         (m.parameters + m.gradients + m.optimizer) / 1048576.0,
                         (m.unsharded_parameters + m.unsharded_gradients + m.comm_buffers + m.pool_cached) / 1048576.0,
                         (m.activations + m.batch + m.weight_stash) / 1048576.0,
                         fmt::format("({})", fmt::join(s.pipeline_slots, " + ")),
                         m.pipeline_messages / 1048576.0, m.total() / 1048576.0,
                         mem ? (m.total() <= *mem ? "  fits" : "  DOES NOT FIT") : "");
  }
  Log::info("fsdpp plan: {} on {} rank(s); nothing runs and no model is allocated\n{}{}{}",
            args.words.empty() ? "the embedded tiny deck" : args.words.front(), ranks, format_pipeline_plan(plan), table,
            step ? format_pipeline_step_time(*step)
                 : std::string("step time: add --machine h100-sxm-8x (or any of --list-machines, or a YAML file from "
                               "`fsdpp bench calibrate`) to price each stage and replay the schedule"));
  return mem && most > *mem ? 3 : 0;
}

int plan_training(MPI_Comm world, const PlanArgs& args, std::optional<std::int64_t> mem) {
  const std::vector<int> counts = parse_rank_list(args.ranks_text);
  std::optional<Machine> machine;
  if (!args.machine.empty()) machine = load_machine(args.machine);
  if (machine) {
    const int widest = *std::max_element(counts.begin(), counts.end());
    const std::string mismatch = blas_threads_mismatch(
        *machine, default_blas_threads(std::min(widest, machine->devices_per_node)), "--machine");
    if (!mismatch.empty()) Log::warn("{}", mismatch);
  }
  FSDPP_REQUIRE(machine || (!args.search && counts.size() == 1), "--search and --ranks with a list of counts predict "
                "step times: add --machine (a preset from --list-machines, or a YAML file)");
  if (counts.size() > 1) return plan_scaling(world, args, counts, *machine);
  const int ranks = counts.front();
  if (args.search) {
    const std::vector<Candidate> best = search_layouts(deck_with(world, args.words), ranks, *machine);
    if (args.json) Log::info("{}", search_json(best, 10).dump());
    else Log::info("{}", format_search(best, ranks, *machine, 10));
    return best.empty() ? 3 : 0;
  }
  const Deck deck = deck_from_words(world, args.words, hf_folder_reader(world));
  if (deck.mesh.pp > 1) return plan_pipeline_deck(args, deck, ranks, machine, mem);
  StepPlan step;
  if (machine) step = plan_step(deck, ranks, *machine);
  else step.memory = plan_memory(deck, ranks);
  const MemoryPlan& plan = step.memory;
  if (args.json) {
    nlohmann::json j = plan_json(plan, mem);
    if (machine) j["time"] = step_time_json(step.time);
    Log::info("{}", j.dump());
  } else {
    Log::info("fsdpp plan: {} on {} rank(s); nothing runs and no model is allocated\n{}{}",
              args.words.empty() ? "the embedded tiny deck" : args.words.front(), ranks,
              format_memory_plan(deck, plan, mem),
              machine ? "\n" + format_step_time(step.time)
                      : std::string("\nstep time: add --machine h100-sxm-8x (or any of --list-machines, or a YAML "
                                    "file from `fsdpp bench calibrate`) to predict ms/step, tokens/s and MFU"));
  }
  return mem && plan.memory.total() > *mem ? 3 : 0;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto* cli = app.add_subcommand("plan", "Per-rank memory of a deck on N ranks, by category, and the largest "
                                         "micro-batch that fits; runs nothing");
  auto args = std::make_shared<PlanArgs>();
  cli->add_option("deck_and_overrides", args->words, "deck.yaml, then section.key=value overrides");
  cli->add_option("--ranks,-n", args->ranks_text, "Ranks of the job to plan for; a list (8,64,512) prints a scaling "
                                                  "table (with --machine)");
  cli->add_option("--machine", args->machine, "Predict the step time on this machine: a preset (--list-machines) or "
                                              "a YAML description (fsdpp bench calibrate writes one)");
  cli->add_flag("--list-machines", args->list_machines, "List the machine presets and exit");
  cli->add_flag("--search", args->search, "With --machine: the ten fastest layouts (mesh, strategy, reshard, "
                                          "activation checkpointing, micro-batch, bf16/f32) that fit in its memory");
  cli->add_option("--mem-per-rank", args->mem_per_rank, "Memory each rank has (80GiB, 512MiB): says whether the "
                                                        "plan fits and the largest micro-batch that does");
  cli->add_flag("--json", args->json, "Print the plan as one JSON object instead of the table");
  cli->add_flag("--generate", args->generate, "Plan fsdpp generate instead of training: the model split over the "
                                               "ranks (mesh.tp), its KV cache and decode buffers");
  cli->add_option("--sequences", args->sequences, "--generate: prompts generated together (1)")->check(CLI::PositiveNumber);
  cli->add_option("--tokens", args->tokens, "--generate: prompt plus new tokens per sequence (model.context_length)")
      ->check(CLI::PositiveNumber);
  return {cli, [args](Runtime& rt) {
            if (args->list_machines) return list_machines();
            FSDPP_REQUIRE(!args->ranks_text.empty(), "fsdpp plan needs --ranks N (the job's rank count)");
            std::optional<std::int64_t> mem;
            if (!args->mem_per_rank.empty()) mem = parse_byte_size(args->mem_per_rank, "--mem-per-rank");
            if (args->generate) {
              const std::vector<int> counts = parse_rank_list(args->ranks_text);
              FSDPP_REQUIRE(counts.size() == 1, "--generate plans one rank count; --ranks is '{}'", args->ranks_text);
              args->ranks = counts.front();
              return plan_generate(deck_from_words(rt.world(), args->words, hf_folder_reader(rt.world())), *args, mem);
            }
            return plan_training(rt.world(), *args, mem);
          },
          [] { return false; }};  // shapes alone, on a planning mesh: no device, no Kokkos
}

}  // namespace fsdpp::app
