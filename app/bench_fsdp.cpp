// fsdpp bench fsdp_scaling <deck>: weak scaling of full_shard training from 1 to 2 ranks at the same per-rank
// micro-batch, and bytes per rank by category at 1, 2 and 4 ranks. Launch with 4 ranks through
// `tests/bench/run fsdp_scaling`: every measurement runs on a sub-group of the launch while the other ranks
// sleep (not spin), so 4 processes on 2 cores do not disturb the 1- and 2-rank timings.
#include "commands.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/train/trainer.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

namespace fsdpp::app {
namespace {

// Rank-wide wait that sleeps between polls: MPI_Barrier would spin a core the measured ranks need.
void sleepy_barrier(MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Runs `deck` on the first `n` ranks of `world`; the result is broadcast from rank 0.
TrainSummary run_on(MPI_Comm world, int n, const Deck& deck) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm group;
  MPI_Comm_split(world, rank < n ? 0 : MPI_UNDEFINED, rank, &group);
  TrainSummary s;
  if (group != MPI_COMM_NULL) {
    TrainOptions o;
    o.quiet = true;
    o.measure_peak = false;
    s = train(group, deck, o);
    MPI_Comm_free(&group);
  }
  sleepy_barrier(world);
  double values[7] = {s.tokens_per_s, s.exposed_comm_ms, double(s.param_bytes), double(s.grad_bytes),
                      double(s.optimizer_bytes), double(s.peak_unsharded_bytes), double(s.activation_bytes)};
  MPI_Bcast(values, 7, MPI_DOUBLE, 0, world);
  s.tokens_per_s = values[0], s.exposed_comm_ms = values[1];
  s.param_bytes = std::int64_t(values[2]), s.grad_bytes = std::int64_t(values[3]);
  s.optimizer_bytes = std::int64_t(values[4]), s.peak_unsharded_bytes = std::int64_t(values[5]);
  s.activation_bytes = std::int64_t(values[6]);
  return s;
}

}  // namespace

Command add_bench_fsdp_command(CLI::App& bench) {
  auto* cli = bench.add_subcommand("fsdp_scaling", "Weak scaling 1 -> 2 ranks and bytes per rank at 1, 2, 4 ranks");
  auto deck_path = std::make_shared<std::string>();
  auto steps = std::make_shared<int>(20);
  cli->add_option("deck", *deck_path, "Input deck")->required();
  cli->add_option("--steps", *steps, "Timed optimizer steps per measurement")->check(CLI::PositiveNumber);
  return {cli, [deck_path, steps](Runtime& rt) {
            FSDPP_REQUIRE(rt.size() >= 4, "fsdpp bench fsdp_scaling needs 4 ranks (it measures on 1, 2 and 4); "
                          "launch it with tests/bench/run fsdp_scaling");
            const std::string text = read_deck_everywhere(rt.world(), *deck_path);
            auto deck_for = [&](int n, int steps_) {
              Deck d = parse_deck(text, *deck_path,
                                  {"train.steps=" + std::to_string(steps_), "train.eval_interval=0",
                                   "schedule.warmup_steps=0", "fsdp.strategy=full_shard"});
              d.train.global_batch = d.train.micro_batch * n;  // weak scaling: the per-rank work stays fixed
              d.run.output.clear();
              return d;
            };
            // Alternate 1- and 2-rank runs so that machine noise falls on both alike; report medians.
            std::vector<double> one, two, comm_two;
            run_on(rt.world(), 2, deck_for(2, 2));  // warm-up
            for (int rep = 0; rep < 3; ++rep) {
              one.push_back(run_on(rt.world(), 1, deck_for(1, *steps)).tokens_per_s);
              const TrainSummary s2 = run_on(rt.world(), 2, deck_for(2, *steps));
              two.push_back(s2.tokens_per_s);
              comm_two.push_back(s2.exposed_comm_ms);
            }
            auto median = [](std::vector<double> v) {
              std::sort(v.begin(), v.end());
              return v[v.size() / 2];
            };
            const double tok1 = median(one), tok2 = median(two), efficiency = tok2 / (2 * tok1);
            Log::info("\nweak scaling, full_shard, {} sequences per rank, median of 3", deck_for(1, 1).train.micro_batch);
            Log::info("{:>6} | {:>10} | {:>10} | {:>16}", "ranks", "tokens/s", "efficiency", "exposed comm ms");
            Log::info("{:>6} | {:>10.0f} | {:>10} | {:>16}", 1, tok1, "1.000", "-");
            Log::info("{:>6} | {:>10.0f} | {:>10.3f} | {:>16.2f}", 2, tok2, efficiency, median(comm_two));

            Log::info("\nbytes per rank (MiB), one short run each");
            Log::info("{:>6} | {:>10} | {:>10} | {:>10} | {:>16} | {:>11} | {:>12}", "ranks", "parameters", "gradients",
                      "optimizer", "peak unsharded", "activations", "sharded sum");
            double sharded[3] = {0, 0, 0};
            const int counts[3] = {1, 2, 4};
            for (int k = 0; k < 3; ++k) {
              const TrainSummary s = run_on(rt.world(), counts[k], deck_for(counts[k], 2));
              sharded[k] = double(s.param_bytes + s.grad_bytes + s.optimizer_bytes);
              const double mib = 1.0 / 1048576.0;
              Log::info("{:>6} | {:>10.2f} | {:>10.2f} | {:>10.2f} | {:>16.2f} | {:>11.2f} | {:>12.2f}", counts[k],
                        s.param_bytes * mib, s.grad_bytes * mib, s.optimizer_bytes * mib, s.peak_unsharded_bytes * mib,
                        s.activation_bytes * mib, sharded[k] * mib);
            }
            nlohmann::json j = {{"bench", "fsdp_scaling"},
                                {"deck", *deck_path},
                                {"tokens_per_s_1rank", std::round(tok1)},
                                {"tokens_per_s_2rank", std::round(tok2)},
                                {"scaling_efficiency", std::round(efficiency * 1000) / 1000},
                                {"exposed_comm_ms_2rank", std::round(median(comm_two) * 100) / 100},
                                {"sharded_bytes_ratio_4v1", std::round(sharded[2] / sharded[0] * 1000) / 1000}};
            Log::info("{}", j.dump());
            return 0;
          }};
}

}  // namespace fsdpp::app
