// fsdpp train [deck.yaml] [section.key=value ...]: train the model the deck describes (GPT-2, Llama, Qwen2). Without a deck, the
// embedded default (input/tiny.yaml, compiled in) runs. --help-deck lists every key; --dry-run stops after
// the deck, the model plan and the batch arithmetic have been checked.
#include "commands.hpp"

#include "fsdpp/observe/flight_service.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/preemption.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/plan/memory_check.hpp"
#include "fsdpp/plan/memory_plan.hpp"
#include "fsdpp/plan/machine.hpp"
#include "fsdpp/plan/pipeline_plan.hpp"
#include "fsdpp/plan/step_cost.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/train/reproducible.hpp"
#include "fsdpp/train/test_faults.hpp"
#include "fsdpp/train/trainer.hpp"

#include <mpi.h>

#include <cstdlib>
#include <filesystem>

namespace fsdpp::app {
namespace {

struct TrainArgs {
  std::vector<std::string> words;  // [deck.yaml] then key=value overrides
  bool help_deck = false;
  bool dry_run = false;
};

// run.machine: what `fsdpp plan --machine` predicts for this deck on `ranks` ranks. Every rank reads the
// description (or fails alike, before training starts); the plan runs dry, without collectives.
std::optional<StepTimePrediction> predict_step_time(const Deck& deck, int ranks) {
  if (deck.run.machine.empty()) return std::nullopt;
  const Machine machine = load_machine(deck.run.machine, "run.machine");
  const int forced = reproducible_blas_threads(deck.train);  // what train() will run with
  if (const std::string mismatch = blas_threads_mismatch(machine, forced > 0 ? forced : blas_threads(), "run.machine");
      !mismatch.empty())
    Log::warn("{}", mismatch);
  const double ms = deck.mesh.pp > 1 ? plan_pipeline_step(deck, ranks, machine).time.ms_per_step
                                     : plan_step(deck, ranks, machine).time.ms_per_step;
  return StepTimePrediction{machine.name, ms};
}

int run_train(Runtime& rt, const TrainArgs& args) {
  if (args.help_deck) {
    Log::info("{}", deck_help());
    return 0;
  }
  const Deck deck = deck_from_words(rt.world(), args.words, hf_folder_reader(rt.world()));
  if (rt.rank() == 0 && !deck.run.output.empty()) {
    std::filesystem::create_directories(deck.run.output);
    Log::tee_to(deck.run.output + "/log.txt");
  }
  if (args.dry_run) {
    // A pipeline's stages differ: each one's plan (its ranks need the same).
    std::vector<MemoryPlan> plans;
    if (deck.mesh.pp == 1) plans.push_back(plan_memory(deck, rt.size()));
    for (int s = 0; s < deck.mesh.pp && deck.mesh.pp > 1; ++s) plans.push_back(plan_stage_memory(deck, rt.size(), s));
    const MemoryPlan& plan = plans.front();
    Log::info("---- resolved deck ----\n{}-----------------------", resolved_deck_yaml(deck));
    for (const MemoryPlan& p : plans)
      Log::info("{}{}", p.pipeline_stage >= 0 ? fmt::format("pipeline stage {} ({} of the job's {} ranks):\n",
                                                            p.pipeline_stage, p.ranks, rt.size())
                                              : std::string(),
                format_memory_plan(deck, p, std::nullopt));
    Log::info("dry run: {} parameters, {} data-parallel rank(s) x {} micro-batch(es) of {} sequences; nothing was "
              "trained", make_model(deck.model)->parameter_count(), rt.size() / (deck.mesh.tp * deck.mesh.pp), plan.accum_steps,
              deck.train.micro_batch);
    return 0;
  }
  if (memory_check_enabled(rt.world())) check_memory_before_allocation(rt.world(), deck, MemoryUse::training);
  TrainOptions options;
  options.handle_preemption = true;
  options.prediction = predict_step_time(deck, rt.size());
  // Tests only: FSDPP_TEST_SAVE_FAULT, FSDPP_TEST_SKIP_COLLECTIVE, FSDPP_TEST_STALL (train/test_faults.hpp).
  options.before_step = arm_test_faults_from_environment(rt.rank());
  // Where each rank runs: the first thing to check on a new cluster (--log-all-ranks prints every rank's line).
  const char* gpus = std::getenv("CUDA_VISIBLE_DEVICES");
  Log::info("placement: rank {} on {}: node-local rank {} of {}, device {}{}", rt.rank(), rt.hostname(),
            rt.local_rank(), rt.local_size(), rt.device().name,
            gpus ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", gpus) : std::string());
  install_preemption_handlers();
  FlightService::install_signal_handler();
  const TrainSummary summary = train(rt.world(), deck, options);
  Log::tee_to("");
  return summary.preempted ? kPreemptedExitCode : 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto* cli = app.add_subcommand("train", "Train a GPT-2, Llama, Qwen2, Qwen3, Qwen3-MoE or Mixtral model (model.arch) from a YAML input deck "
                                          "(default: the embedded tiny deck)");
  auto args = std::make_shared<TrainArgs>();
  cli->add_option("deck_and_overrides", args->words, "deck.yaml, then section.key=value overrides (train.steps=50)");
  cli->add_flag("--help-deck", args->help_deck, "List every deck key with its type, default and meaning");
  cli->add_flag("--dry-run", args->dry_run, "Check the deck, model and batch plan on this launch; train nothing");
  return {cli, [args](Runtime& rt) { return run_train(rt, *args); },
          [args] { return !args->help_deck && !args->dry_run; }};  // --dry-run plans from shapes alone
}

}  // namespace fsdpp::app
