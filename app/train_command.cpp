// fsdpp train [deck.yaml] [section.key=value ...]: train the model the deck describes (GPT-2, Llama, Qwen2). Without a deck, the
// embedded default (input/tiny.yaml, compiled in) runs. --help-deck lists every key; --dry-run stops after
// the deck, the model plan and the batch arithmetic have been checked.
#include "commands.hpp"

#include "embedded_decks.hpp"
#include "fsdpp/ckpt/save_faults.hpp"
#include "fsdpp/comm/collective_faults.hpp"
#include "fsdpp/comm/flight_service.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/preemption.hpp"
#include "fsdpp/train/build_model.hpp"
#include "fsdpp/train/memory_check.hpp"
#include "fsdpp/train/memory_plan.hpp"
#include "fsdpp/train/trainer.hpp"

#include <mpi.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fsdpp::app {
Deck deck_from_words(MPI_Comm world, std::vector<std::string> words) {
  std::string file_name = "tiny.yaml (embedded)", text = embedded_tiny_deck();
  if (!words.empty() && words.front().find('=') == std::string::npos) {
    file_name = words.front();
    text = read_deck_everywhere(world, file_name);
    words.erase(words.begin());
  }
  return parse_deck_everywhere(world, text, file_name, words);
}

namespace {

struct TrainArgs {
  std::vector<std::string> words;  // [deck.yaml] then key=value overrides
  bool help_deck = false;
  bool dry_run = false;
};

}  // namespace

// Rank 0 reads the deck; every rank gets its text (or the same error), so N ranks do not hammer the file
// system and every rank parses identical text.
std::string read_deck_everywhere(MPI_Comm world, const std::string& path) {
  std::string text;
  root_does(world, [&] {
    std::ifstream in(path);
    if (!in) throw UsageError(fmt::format("cannot read deck '{}': {}", path, std::strerror(errno)));
    std::ostringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  });
  return broadcast_string(world, std::move(text));
}

namespace {

int run_train(Runtime& rt, const TrainArgs& args) {
  if (args.help_deck) {
    Log::info("{}", deck_help());
    return 0;
  }
  const Deck deck = deck_from_words(rt.world(), args.words);
  if (rt.rank() == 0 && !deck.run.output.empty()) {
    std::filesystem::create_directories(deck.run.output);
    Log::tee_to(deck.run.output + "/log.txt");
  }
  if (args.dry_run) {
    const MemoryPlan plan = plan_memory(deck, rt.size());
    Log::info("---- resolved deck ----\n{}-----------------------", resolved_deck_yaml(deck));
    Log::info("{}", format_memory_plan(deck, plan, std::nullopt));
    Log::info("dry run: {} parameters, {} data-parallel rank(s) x {} micro-batch(es) of {} sequences; nothing was "
              "trained", make_model(deck.model)->parameter_count(), rt.size() / deck.mesh.tp, plan.accum_steps,
              deck.train.micro_batch);
    return 0;
  }
  // Tests only: a fault injected at a named point of a checkpoint save (fsdpp/ckpt/save_faults.hpp).
  if (const char* fault = std::getenv("FSDPP_TEST_SAVE_FAULT"); fault && *fault) arm_save_fault(parse_save_fault(fault));
  if (memory_check_enabled(rt.world())) check_memory_before_allocation(rt.world(), deck, MemoryUse::training);
  TrainOptions options;
  options.handle_preemption = true;
  // Test hook for the collective watchdog: FSDPP_TEST_STALL=<rank>:<step>:<seconds> makes that rank sleep
  // before that step while the others wait in its first collective.
  if (const char* stall = std::getenv("FSDPP_TEST_STALL")) {
    int rank = -1;
    long long at = 0;
    double seconds = 0;
    FSDPP_REQUIRE(std::sscanf(stall, "%d:%lld:%lf", &rank, &at, &seconds) == 3,
                  "FSDPP_TEST_STALL='{}': expected <rank>:<step>:<seconds>", stall);
    if (rank == rt.rank())
      options.before_step = [at, seconds](std::int64_t step) {
        if (step == at) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      };
  }
  // Test hook for the flight recorder: FSDPP_TEST_SKIP_COLLECTIVE=<rank>:<dimension>:<seq> makes that rank skip
  // that collective, so the ranks desynchronise.
  if (const char* skip = std::getenv("FSDPP_TEST_SKIP_COLLECTIVE"); skip && *skip) {
    const CollectiveSkip fault = parse_collective_skip(skip);
    if (fault.rank == rt.rank()) arm_collective_skip(fault);
  }
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
  auto* cli = app.add_subcommand("train", "Train a GPT-2, Llama or Qwen2 model (model.arch) from a YAML input deck "
                                          "(default: the embedded tiny deck)");
  auto args = std::make_shared<TrainArgs>();
  cli->add_option("deck_and_overrides", args->words, "deck.yaml, then section.key=value overrides (train.steps=50)");
  cli->add_flag("--help-deck", args->help_deck, "List every deck key with its type, default and meaning");
  cli->add_flag("--dry-run", args->dry_run, "Check the deck, model and batch plan on this launch; train nothing");
  return {cli, [args](Runtime& rt) { return run_train(rt, *args); },
          [args] { return !args->help_deck && !args->dry_run; }};  // --dry-run plans from shapes alone
}

}  // namespace fsdpp::app
