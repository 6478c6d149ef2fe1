// fsdpp init [deck.yaml] [section.key=value ...] --out seed.h5: the initial weights of a deck's model, as a
// consolidated file (a seed checkpoint, torchtitan's create_seed_checkpoint). The same file on any number of
// ranks; start runs from it with checkpoint.init_from.
#include "commands.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/ckpt/seed_checkpoint.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/plan/memory_check.hpp"

namespace fsdpp::app {

Command add_init_command(CLI::App& app) {
  auto* cli = app.add_subcommand("init", "Write a deck's initial weights (a seed checkpoint) without training");
  auto words = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  cli->add_option("deck_and_overrides", *words, "deck.yaml, then section.key=value overrides");
  cli->add_option("--out", *out, "The seed file to write (HDF5, whole tensors at /model/<name>)")->required();
  return {cli, [words, out](Runtime& rt) {
            // The initial weights need no step: neither training's batch split nor its reshard group applies.
            const Deck deck = forward_only(deck_from_words(rt.world(), *words, hf_folder_reader(rt.world())));
            if (memory_check_enabled(rt.world())) check_memory_before_allocation(rt.world(), deck, MemoryUse::init);
            write_seed_checkpoint(rt.world(), deck, *out);
            Log::info("wrote the initial weights of {} (seed {}, {} parameters) to {}; train from them with "
                      "checkpoint.init_from={}", deck.run.name, deck.run.seed, make_model(deck.model)->parameter_count(),
                      *out, *out);
            return 0;
          }};
}

}  // namespace fsdpp::app
