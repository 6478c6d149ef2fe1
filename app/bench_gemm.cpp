// fsdpp bench gemm: GFLOP/s of the GEMM entry point in each precision (f32, tf32, bf16) at GPT-2 124M's linear
// shapes (C 768, one rank, a batch of --tokens rows), through `tests/bench/run gemm` (1 BLAS thread). The
// rounded precisions include packing (rounding) the inputs: what training pays for them. On host builds tf32
// and bf16 are emulated on sgemm (tensor/matmul.hpp), so they measure the cost of the rounding, not a speed-up.
#include "commands.hpp"

#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/tensor/matmul.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace fsdpp::app {
namespace {

struct LinearShape {
  std::string name;
  int out, in;  // weight (out, in): out = inp (tokens, in) . weight^T
};

// GPT-2 124M (C 768, 4C MLP, V 50257): every linear layer of a block and the LM head.
const std::vector<LinearShape> kGpt2Small = {
    {"attn.qkv 768->2304", 2304, 768}, {"attn.proj 768->768", 768, 768},      {"mlp.fc 768->3072", 3072, 768},
    {"mlp.proj 3072->768", 768, 3072}, {"lm_head 768->50257", 50257, 768}};

}  // namespace

Command add_bench_gemm_command(CLI::App& bench) {
  auto* cli = bench.add_subcommand("gemm", "GEMM GFLOP/s in f32, tf32 and bf16 at GPT-2 124M's linear shapes");
  auto tokens = std::make_shared<int>(1024);
  auto repeats = std::make_shared<int>(3);
  cli->add_option("--tokens", *tokens, "Rows of the activations (B x T)")->check(CLI::PositiveNumber)->capture_default_str();
  cli->add_option("--repeats", *repeats, "Timed runs per shape; the median is reported")
      ->check(CLI::PositiveNumber)->capture_default_str();
  return {cli, [tokens, repeats](Runtime&) {
            const GemmPrecision precisions[] = {GemmPrecision::f32, GemmPrecision::tf32, GemmPrecision::bf16};
            double total_flop = 0, seconds[3] = {0, 0, 0};
            Log::info("GEMM {}, {} rows, BLAS threads {}", matmul_backend(), *tokens, blas_threads());
            Log::info("{:<22} {:>10} {:>10} {:>10} {:>10}", "shape (GFLOP/s)", "f32", "tf32", "bf16", "bf16/f32");
            for (const LinearShape& s : kGpt2Small) {
              const double flop = 2.0 * *tokens * s.out * s.in;
              double rate[3];
              for (int p = 0; p < 3; ++p) {
                rate[p] = measure_gemm_gflops(*tokens, s.out, s.in, precisions[p], *repeats);
                seconds[p] += flop / (rate[p] * 1e9);
              }
              total_flop += flop;
              Log::info("{:<22} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.2f}", s.name, rate[0], rate[1], rate[2],
                        rate[2] / rate[0]);
            }
            double overall[3];
            for (int p = 0; p < 3; ++p) overall[p] = total_flop / seconds[p] / 1e9;
            Log::info("{:<22} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.2f}", "all (FLOP-weighted)", overall[0],
                      overall[1], overall[2], overall[2] / overall[0]);
            for (int p = 0; p < 3; ++p) Log::info("{:<5} {}", gemm_precision_name(precisions[p]),
                                                   gemm_precision_description(precisions[p]));
            auto round1 = [](double x) { return std::round(x * 10) / 10; };
            nlohmann::json j = {{"bench", "gemm"},
                                {"backend", matmul_backend()},
                                {"tokens", *tokens},
                                {"f32_gflops", round1(overall[0])},
                                {"tf32_gflops", round1(overall[1])},
                                {"bf16_gflops", round1(overall[2])}};
            Log::info("{}", j.dump());
            return 0;
          }};
}

}  // namespace fsdpp::app
