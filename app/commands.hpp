#pragma once
// Subcommands of the fsdpp executable. Each registers its options on the CLI and returns how to run it once
// the Runtime (MPI, Kokkos, device) is up.
#include "fsdpp/ckpt/model_decks.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/config/deck_loading.hpp"
#include "fsdpp/runtime/runtime.hpp"

#include <CLI/CLI.hpp>

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace fsdpp::app {

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
