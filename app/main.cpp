// fsdpp: the executable. Parse the command line, start the Runtime (MPI -> device -> Kokkos), run one
// subcommand, shut down in reverse order. Errors become the right exit: see fsdpp/runtime/error.hpp.
#include "commands.hpp"

#include "fsdpp/runtime/build_info.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/version.hpp"

#include <exception>
#include <sstream>

int main(int argc, char** argv) {
  using namespace fsdpp;
  CLI::App cli{"fsdpp: fully sharded data-parallel training of transformer models on MPI + Kokkos"};
  cli.set_help_all_flag("--help-all", "Print help for every subcommand");
  cli.footer("Exit codes: 0 success; 1 an error on one rank (job aborted); 2 bad input (printed once); 85 "
             "preempted: fsdpp train received SIGUSR1, SIGTERM or SIGINT, saved a checkpoint and stopped; requeue the job "
             "with checkpoint.resume: auto to continue; 3 fsdpp plan: the plan does not fit in --mem-per-rank.");
  bool show_version = false;
  RuntimeOptions options = RuntimeOptions::from_environment();
  options.start_device = false;  // started below for the commands that compute (see Command::needs_device)
  std::string device = "auto";
  cli.add_flag("--version", show_version, "Print the versions of fsdpp and its stack, then exit");
  cli.add_flag("--log-all-ranks", options.log.all_ranks, "Every rank prints its log lines, not only rank 0");
  cli.add_flag("--log-rank-prefix", options.log.rank_prefix, "Prefix every log line with [rank r]");
  cli.add_option("--device", device, "auto | host | cuda")->check(CLI::IsMember({"auto", "host", "cuda"}));
  cli.add_flag("--allow-gpu-sharing", options.allow_gpu_sharing, "Allow several ranks on one GPU");
  const std::vector<app::Command> commands = {app::add_train_command(cli), app::add_tokenize_command(cli),
                                             app::add_init_command(cli), app::add_ckpt_command(cli), app::add_report_command(cli),
                                             app::add_plan_command(cli), app::add_generate_command(cli), app::add_eval_command(cli),
                                             app::add_bench_command(cli),
                                             app::add_mesh_command(cli), app::add_debug_command(cli)};

  // Parse before MPI starts (so --device can steer device selection), but report after, from rank 0 only.
  std::exception_ptr parse_error;
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError&) {
    parse_error = std::current_exception();
  }
  if (!parse_error && device != "auto") options.device = parse_device_policy(device);

  Runtime runtime(argc, argv, options);
  if (parse_error) {
    std::ostringstream out, err;
    int code = 2;
    try {
      std::rethrow_exception(parse_error);
    } catch (const CLI::ParseError& e) {
      code = cli.exit(e, out, err);
    }
    if (runtime.rank() == 0) std::fputs((out.str() + err.str()).c_str(), code ? stderr : stdout);
    runtime.exit_all(code);
  }
  try {
    if (show_version) {
      // A host build chooses its device as a run would (so --device cuda without a GPU is refused here too). A
      // GPU build starts nothing: --version must work on a login node without a GPU or driver, so it lists
      // the GPUs the CUDA runtime reports, or why there are none.
      const std::string gpu_build = gpu_build_target();
      if (gpu_build.empty()) runtime.start_device();
      Log::info("fsdpp {}\n{}", FSDPP_VERSION, format_build_info(matmul_build_info()));
      Log::info("  {:<10} {} rank(s), {} on this node ({}), MPI threads '{}', device {}", "runtime", runtime.size(),
                runtime.local_size(), runtime.hostname(), thread_level_name(runtime.thread_level()),
                gpu_build.empty() ? runtime.device().name
                                  : fmt::format("not started ({}); {}", gpu_build, describe_visible_gpus()));
      return 0;
    }
    for (const auto& command : commands)
      if (*command.cli) {
        if (!command.needs_device || command.needs_device()) {
          runtime.start_device();
          configure_blas_threads(runtime.local_size());
        }
        return command.run(runtime);
      }
    Log::info("{}", cli.help());
    return 0;
  } catch (const std::exception& e) {
    runtime.fail(e);
  }
}
