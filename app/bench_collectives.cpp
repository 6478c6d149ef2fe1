// fsdpp bench collectives: bus bandwidth of fsdpp's all_gather, reduce_scatter and all_reduce next to the raw
// MPI call moving the same bytes, after a self-check of every result. Launch it through
// `tests/bench/run collectives` (2 ranks). Algorithm bandwidth = full buffer bytes / time; bus bandwidth
// scales it by the fraction each rank must move ((n-1)/n, or 2(n-1)/n for all_reduce), as nccl-tests does.
#include "commands.hpp"

#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/runtime/error.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace fsdpp::app {
namespace {

struct Options {
  std::size_t min_bytes = 64u << 10;
  std::size_t max_bytes = 64u << 20;
  int repeats = 11;
  double target_seconds = 0.02;  // per timed repeat; short ops are looped to reach it
};

// Median over repeats of the slowest rank's time per call. The two sides of a comparison alternate repeat by
// repeat, so machine noise falls on both alike.
std::pair<double, double> time_pair(MPI_Comm world, const Options& o, const std::function<void()>& a,
                                    const std::function<void()>& b) {
  a();
  b();
  MPI_Barrier(world);
  double t0 = MPI_Wtime();
  a();
  double once = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, world);
  const int loops = std::max(1, static_cast<int>(o.target_seconds / std::max(once, 1e-7)));
  std::vector<double> ta, tb;
  for (int r = 0; r < o.repeats; ++r) {
    for (int side = 0; side < 2; ++side) {
      const auto& f = side == 0 ? a : b;
      MPI_Barrier(world);
      t0 = MPI_Wtime();
      for (int i = 0; i < loops; ++i) f();
      double t = (MPI_Wtime() - t0) / loops;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world);
      (side == 0 ? ta : tb).push_back(t);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(ta), median(tb)};
}

// Small integers keep every sum exact in f32, so the self-check can demand equality.
float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * 3 + static_cast<int>(i % 251)); }

struct CollectiveRow {
  std::size_t bytes;
  double fsdpp_s, mpi_s;
};

std::string human_bytes(std::size_t b) {
  if (b >= (1u << 20)) return fmt::format("{} MiB", b >> 20);
  return fmt::format("{} KiB", b >> 10);
}

void print_table(const std::string& title, const std::string& mpi_name, const std::vector<CollectiveRow>& rows, double bus_factor) {
  Log::info("\n{}", title);
  Log::info("{:>9} | {:>11} {:>11} | {:>11} {:>11} | {:>7}", "bytes", "fsdpp algbw", "busbw", mpi_name.substr(0, 11),
            "busbw", "ratio");
  Log::info("{:>9} | {:>11} {:>11} | {:>11} {:>11} | {:>7}", "", "GB/s", "GB/s", "algbw GB/s", "GB/s", "fsdpp/mpi");
  for (const auto& r : rows) {
    const double a = r.bytes / r.fsdpp_s / 1e9, m = r.bytes / r.mpi_s / 1e9;
    Log::info("{:>9} | {:>11.2f} {:>11.2f} | {:>11.2f} {:>11.2f} | {:>7.2f}", human_bytes(r.bytes), a, a * bus_factor, m,
              m * bus_factor, a / m);
  }
}

int run_collectives_bench(Runtime& rt, const Options& o) {
  const MPI_Comm world = rt.world();
  const int n = rt.size(), rank = rt.rank();
  MpiCommunicator comm(world);
  MPI_Comm raw;
  MPI_Comm_dup(world, &raw);
  Log::info("fsdpp bench collectives: {} ranks, f32, {} .. {}, median of {} repeats", n, human_bytes(o.min_bytes),
            human_bytes(o.max_bytes), o.repeats);
  Log::info("communicator: {}", comm.describe());

  std::vector<CollectiveRow> ag, rs, ar;
  int check_failures = 0, checks = 0;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const std::size_t total = bytes / sizeof(float);  // elements of the full buffer
    const std::size_t per_rank = total / static_cast<std::size_t>(n);
    std::vector<float> send(total), recv(total), check(total);
    for (std::size_t i = 0; i < total; ++i) send[i] = value(rank, i);

    // Self-check against a naive reference before timing.
    comm.all_gather(send.data(), recv.data(), per_rank);
    int bad = 0;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < per_rank; ++i) bad += recv[r * per_rank + i] != value(r, i);
    comm.reduce_scatter(send.data(), recv.data(), per_rank);
    for (std::size_t i = 0; i < per_rank; ++i) {
      float expect = 0;
      for (int r = 0; r < n; ++r) expect += value(r, rank * per_rank + i);
      bad += recv[i] != expect;
    }
    std::copy(send.begin(), send.end(), check.begin());
    comm.all_reduce(check.data(), total, ReduceOp::sum);
    for (std::size_t i = 0; i < total; ++i) {
      float expect = 0;
      for (int r = 0; r < n; ++r) expect += value(r, i);
      bad += check[i] != expect;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, world);
    checks += 3;
    if (bad) {
      ++check_failures;
      Log::error_all_ranks(fmt::format("self-check failed at {}: {} wrong elements", human_bytes(bytes), bad));
    }

    const int pr = static_cast<int>(per_rank);
    auto [ag_f, ag_m] = time_pair(
        world, o, [&] { comm.all_gather(send.data(), recv.data(), per_rank); },
        [&] { MPI_Allgather(send.data(), pr, MPI_FLOAT, recv.data(), pr, MPI_FLOAT, raw); });
    ag.push_back({bytes, ag_f, ag_m});
    auto [rs_f, rs_m] = time_pair(
        world, o, [&] { comm.reduce_scatter(send.data(), recv.data(), per_rank); },
        [&] { MPI_Reduce_scatter_block(send.data(), recv.data(), pr, MPI_FLOAT, MPI_SUM, raw); });
    rs.push_back({bytes, rs_f, rs_m});
    auto [ar_f, ar_m] = time_pair(
        world, o, [&] { comm.all_reduce(check.data(), total, ReduceOp::sum); },
        [&] { MPI_Allreduce(MPI_IN_PLACE, recv.data(), static_cast<int>(total), MPI_FLOAT, MPI_SUM, raw); });
    ar.push_back({bytes, ar_f, ar_m});
  }
  MPI_Comm_free(&raw);

  const double bus = n > 1 ? double(n - 1) / n : 1.0;
  print_table("all_gather  (bytes = gathered buffer)", "MPI_Allgather", ag, bus);
  print_table("reduce_scatter  (bytes = input buffer)", "MPI_Reduce_scatter_block", rs, bus);
  print_table("all_reduce  (bytes = buffer)", "MPI_Allreduce", ar, 2 * bus);

  double ag_min = INFINITY, rs_64 = NAN, ar_min = INFINITY;
  for (const auto& r : ag)
    if (r.bytes >= (1u << 20)) ag_min = std::min(ag_min, r.mpi_s / r.fsdpp_s);
  for (const auto& r : rs)
    if (r.bytes == (64u << 20)) rs_64 = r.mpi_s / r.fsdpp_s;
  for (const auto& r : ar)
    if (r.bytes >= (1u << 20)) ar_min = std::min(ar_min, r.mpi_s / r.fsdpp_s);
  Log::info("\nself-check: {} of {} collective results correct", checks - check_failures, checks);
  nlohmann::json summary = {{"bench", "collectives"},
                            {"ranks", n},
                            {"allgather_vs_mpi_min", std::isfinite(ag_min) ? nlohmann::json(std::round(ag_min * 1000) / 1000) : nlohmann::json()},
                            {"reduce_scatter_vs_mpi_64mib", std::isfinite(rs_64) ? nlohmann::json(std::round(rs_64 * 1000) / 1000) : nlohmann::json()},
                            {"allreduce_vs_mpi_min", std::isfinite(ar_min) ? nlohmann::json(std::round(ar_min * 1000) / 1000) : nlohmann::json()},
                            {"self_check_failures", check_failures}};
  Log::info("{}", summary.dump());
  return check_failures ? 1 : 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto* cli = app.add_subcommand("bench", "Benchmarks; run them through tests/bench/run <name>");
  cli->require_subcommand(1);
  auto* collectives = cli->add_subcommand("collectives", "Self-check and bandwidth of all_gather, reduce_scatter, all_reduce against raw MPI");
  auto options = std::make_shared<Options>();
  collectives->add_option("--min-bytes", options->min_bytes, "Smallest full-buffer size in bytes")->capture_default_str();
  collectives->add_option("--max-bytes", options->max_bytes, "Largest full-buffer size in bytes")->capture_default_str();
  collectives->add_option("--repeats", options->repeats, "Timed repeats per size; the median is reported")
      ->check(CLI::PositiveNumber)->capture_default_str();
  const Command train = add_bench_train_command(*cli);
  const Command fsdp = add_bench_fsdp_command(*cli);
  const Command checkpoint = add_bench_checkpoint_command(*cli);
  const Command gemm = add_bench_gemm_command(*cli);
  const Command kernels = add_bench_kernels_command(*cli);
  const Command calibrate = add_bench_calibrate_command(*cli);
  return {cli, [collectives, options, train, fsdp, checkpoint, gemm, kernels, calibrate](Runtime& rt) {
            if (*train.cli) return train.run(rt);
            if (*gemm.cli) return gemm.run(rt);
            if (*kernels.cli) return kernels.run(rt);
            if (*calibrate.cli) return calibrate.run(rt);
            if (*fsdp.cli) return fsdp.run(rt);
            if (*checkpoint.cli) return checkpoint.run(rt);
            FSDPP_REQUIRE(*collectives, "fsdpp bench: name a benchmark: collectives, train, fsdp_scaling, checkpoint, "
                          "gemm, kernels or calibrate");
            FSDPP_REQUIRE(options->min_bytes >= 4096 && options->min_bytes <= options->max_bytes,
                          "--min-bytes must be >= 4096 and <= --max-bytes");
            return run_collectives_bench(rt, *options);
          }};
}

}  // namespace fsdpp::app
