// fsdpp bench train <deck>: tokens/s and MFU of training, against the single-rank sgemm peak measured in the
// same run (OpenBLAS at 1024^3). Launch it through `tests/bench/run train_1rank` (small.yaml, 1 rank,
// 1 BLAS thread). MFU = achieved FLOP/s / sgemm peak, with FLOPs per token = 6 x matmul parameters +
// 12 x L x T x C (attention scores and values, forward and backward).
#include "commands.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/train/trainer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace fsdpp::app {

Command add_bench_train_command(CLI::App& bench) {
  auto* cli = bench.add_subcommand("train", "Training throughput and MFU against the measured sgemm peak");
  auto deck_path = std::make_shared<std::string>();
  auto steps = std::make_shared<int>(30);
  cli->add_option("deck", *deck_path, "Input deck")->required();
  cli->add_option("--steps", *steps, "Timed optimizer steps (after 2 warm-up steps)")->check(CLI::PositiveNumber);
  return {cli, [deck_path, steps](Runtime& rt) {
            const std::string text = read_deck_everywhere(rt.world(), *deck_path);
            // No evaluation, no files: only the training step is timed.
            Deck deck = parse_deck(text, *deck_path,
                                   {"train.steps=" + std::to_string(*steps + 2), "train.eval_interval=0",
                                    "schedule.warmup_steps=0", "log.interval=10"});
            deck.run.output.clear();
            const double peak_before = measure_sgemm_gflops(1024, 10);
            TrainOptions options;
            options.measure_peak = false;
            // The first two steps fault in buffers and BLAS workspaces; time the rest.
            Deck warmup = deck;
            warmup.train.steps = 2;
            TrainOptions quiet = options;
            quiet.quiet = true;
            train(rt.world(), warmup, quiet);
            deck.train.steps = *steps;
            TrainSummary s = train(rt.world(), deck, options);
            const double peak_after = measure_sgemm_gflops(1024, 10);
            const double peak = std::max(peak_before, peak_after);  // a busy neighbour only lowers a sample
            const double gflops = s.tokens_per_s * s.flops_per_token / 1e9;
            const double mfu = gflops / (peak * rt.size());
            Log::info("\n{:<28} {:>12}", "metric", "value");
            Log::info("{:<28} {:>12.0f}", "tokens/s", s.tokens_per_s);
            Log::info("{:<28} {:>12.4g}", "model FLOPs per token", s.flops_per_token);
            Log::info("{:<28} {:>12.2f}", "achieved GFLOP/s", gflops);
            Log::info("{:<28} {:>12.2f}", "sgemm peak GFLOP/s (1024^3)", peak);
            Log::info("{:<28} {:>12.3f}", "MFU", mfu);
            Log::info("{:<28} {:>12d}", "BLAS threads", blas_threads());
            nlohmann::json j = {{"bench", "train"},
                                {"deck", *deck_path},
                                {"ranks", rt.size()},
                                {"tokens_per_s", std::round(s.tokens_per_s)},
                                {"mfu", std::round(mfu * 1000) / 1000},
                                {"sgemm_gflops", std::round(peak * 10) / 10}};
            Log::info("{}", j.dump());
            return 0;
          }};
}

}  // namespace fsdpp::app
