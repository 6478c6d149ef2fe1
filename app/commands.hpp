#pragma once
// Subcommands of the fsdpp executable. Each registers its options on the CLI and returns how to run it once
// the Runtime (MPI, Kokkos, device) is up.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/runtime.hpp"

#include <CLI/CLI.hpp>

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace fsdpp::app {

// Rank 0 reads a deck file and every rank receives its text, or the same UsageError (collective).
std::string read_deck_everywhere(MPI_Comm world, const std::string& path);
// `[deck.yaml] [section.key=value ...]` -> the parsed deck; no file name: the embedded tiny deck. Collective.
Deck deck_from_words(MPI_Comm world, std::vector<std::string> words);
// parse_deck, with a model.from_hf folder's config.json read by rank 0 and mapped alike on every rank. Collective.
ModelSourceReader hf_folder_reader(MPI_Comm world);
Deck parse_deck_everywhere(MPI_Comm world, const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides = {});
// Whether `path` is a folder (a Hugging Face model folder), as rank 0 sees it. Collective.
bool is_model_folder_everywhere(MPI_Comm world, const std::string& path);
// The deck of a model named on the command line (generate, eval, ckpt): --deck's file when given, else a model
// folder's config.json (model.from_hf), else the deck an fsdpp checkpoint carries; then the overrides. Collective.
Deck model_deck(MPI_Comm world, const std::string& source, const std::string& deck_path,
                const std::vector<std::string>& overrides = {});


struct Command {
  CLI::App* cli;
  std::function<int(Runtime&)> run;
  // Whether this command (as parsed) computes with Kokkos, so that main starts the device before run. Unset:
  // it does. Commands that need no device must not touch Kokkos: on a GPU build they run where there is no
  // GPU or driver (a login node), and Kokkos is never initialized there.
  std::function<bool()> needs_device = {};
};

Command add_bench_command(CLI::App& app);  // fsdpp bench collectives | train
Command add_bench_train_command(CLI::App& bench);  // fsdpp bench train <deck>
Command add_bench_fsdp_command(CLI::App& bench);   // fsdpp bench fsdp_scaling <deck>
Command add_bench_checkpoint_command(CLI::App& bench);  // fsdpp bench checkpoint
Command add_bench_gemm_command(CLI::App& bench);        // fsdpp bench gemm
Command add_bench_kernels_command(CLI::App& bench);  // fsdpp bench kernels
Command add_bench_calibrate_command(CLI::App& bench);  // fsdpp bench calibrate [deck] > machine.yaml
Command add_mesh_command(CLI::App& app);   // fsdpp mesh dp_replicate=2 dp_shard=-1
Command add_train_command(CLI::App& app);  // fsdpp train [deck.yaml] [key=value ...]
Command add_tokenize_command(CLI::App& app);  // fsdpp tokenize <text> <out.bin>
Command add_ckpt_command(CLI::App& app);   // fsdpp ckpt inspect|verify|consolidate <ckpt>
Command add_init_command(CLI::App& app);   // fsdpp init [deck.yaml] --out seed.h5
Command add_report_command(CLI::App& app); // fsdpp report <run-folder>
Command add_plan_command(CLI::App& app);   // fsdpp plan <deck> --ranks N [--mem-per-rank 80GiB]
Command add_generate_command(CLI::App& app);  // fsdpp generate <ckpt> --prompt TEXT
Command add_eval_command(CLI::App& app);      // fsdpp eval <ckpt> <tokens.bin>
Command add_debug_command(CLI::App& app);  // fsdpp debug flight <dir>

}  // namespace fsdpp::app
