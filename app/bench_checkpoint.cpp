// fsdpp bench checkpoint: save and load bandwidth of sharded checkpoints against the raw disk write bandwidth
// measured in the same run, the resharded load (2 ranks -> 1), and the step-time overhead of an async save.
// Launch through `tests/bench/run checkpoint` (2 ranks). The model carries ~120 MB of f32 state (parameters
// and AdamW's two moments).
#include "commands.hpp"

#include "fsdpp/ckpt/async_save.hpp"
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/runtime/median.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>

namespace fsdpp::app {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Bytes/s of writing `bytes` to a fresh file in `dir` and fsyncing it: what the disk gives one writer.
double raw_write_bandwidth(const std::string& dir, std::int64_t bytes) {
  const std::string path = dir + "/raw-write.bin";
  std::vector<char> block(8 << 20, 'x');
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  FSDPP_CHECK(fd >= 0, "cannot write {}", path);
  for (std::int64_t done = 0; done < bytes;) {
    const auto n = static_cast<std::size_t>(std::min<std::int64_t>(static_cast<std::int64_t>(block.size()), bytes - done));
    FSDPP_CHECK(::write(fd, block.data(), n) == static_cast<ssize_t>(n), "short write to {}", path);
    done += static_cast<std::int64_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  const double seconds = since(t0);
  std::filesystem::remove(path);
  return bytes / seconds;
}

struct Setup {
  std::unique_ptr<DeviceMesh> mesh;
  std::unique_ptr<Gpt> model;
  std::unique_ptr<AdamW> optimizer;
  CheckpointContents contents() {
    CheckpointContents c;
    c.params = model->parameters();
    c.optimizer = optimizer.get();
    return c;
  }
};

Setup build(MPI_Comm comm) {
  ModelConfig c;
  c.vocab_size = 8192, c.context_length = 64, c.n_embd = 320, c.n_layer = 6, c.n_head = 5;
  Setup s;
  s.mesh = std::make_unique<DeviceMesh>(comm, std::vector<MeshDim>{{"dp_shard", -1}});
  s.model = std::make_unique<Gpt>(c);
  for (Block* b : s.model->blocks()) fully_shard(*b, *s.mesh);
  fully_shard(*s.model, *s.mesh);
  s.model->to_empty();
  s.model->reset_parameters(1);
  s.optimizer = std::make_unique<AdamW>(s.model->parameters(), AdamWConfig{});
  return s;
}

// One training step on a small batch; returns its seconds.
double train_step(Setup& s, int rank) {
  std::vector<std::int32_t> in(2 * 64);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::int32_t>((i * 31 + static_cast<std::size_t>(rank)) % 8192);
  View1<std::int32_t> tokens("tokens", in.size());
  Kokkos::deep_copy(tokens, HostView1<std::int32_t>(in.data(), in.size()));
  const auto t0 = Clock::now();
  Flow flow;
  flow.B = 2, flow.T = 64, flow.tokens = tokens, flow.targets = tokens;
  s.model->zero_grad();
  (*s.model)(flow);
  (*s.model)(flow, Pass::backward);
  s.optimizer->step(1e-4f);
  Kokkos::fence();
  double seconds = since(t0);
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, s.mesh->mpi_comm(0));
  return seconds;
}

}  // namespace

Command add_bench_checkpoint_command(CLI::App& bench) {
  auto* cli = bench.add_subcommand("checkpoint", "Checkpoint save/load bandwidth vs the raw disk, async-save overhead");
  auto dir = std::make_shared<std::string>("bench-checkpoint");
  cli->add_option("--dir", *dir, "Folder to write checkpoints in (removed afterwards)");
  return {cli, [dir](Runtime& rt) {
            const MPI_Comm world = rt.world();
            const int rank = rt.rank();
            if (rank == 0) std::filesystem::create_directories(*dir);
            MPI_Barrier(world);
            Setup s = build(world);
            TrainProgress progress;
            progress.step = 1;
            // Warm-up save, then three timed saves and loads; medians.
            SaveResult first = save_checkpoint(world, *dir, s.contents(), progress, {});
            const std::int64_t bytes = first.bytes;
            std::vector<double> save_s, load_s;
            for (int rep = 0; rep < 3; ++rep) {
              progress.step = 2 + rep;
              MPI_Barrier(world);
              save_s.push_back(save_checkpoint(world, *dir, s.contents(), progress, {}).seconds);
              MPI_Barrier(world);
              const auto t0 = Clock::now();
              load_checkpoint(world, *latest_checkpoint(*dir), s.contents());
              double seconds = since(t0);
              MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, world);
              load_s.push_back(seconds);
            }
            // Resharded: rank 0 alone loads what 2 ranks wrote.
            double reshard_s = 0;
            {
              MPI_Comm solo;
              MPI_Comm_split(world, rank == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
              if (solo != MPI_COMM_NULL) {
                Setup one = build(solo);
                const auto t0 = Clock::now();
                load_checkpoint(solo, *latest_checkpoint(*dir), one.contents());
                reshard_s = since(t0);
                MPI_Comm_free(&solo);
              }
              MPI_Bcast(&reshard_s, 1, MPI_DOUBLE, 0, world);
            }
            double disk = rank == 0 ? raw_write_bandwidth(*dir, bytes) : 0;
            MPI_Bcast(&disk, 1, MPI_DOUBLE, 0, world);

            // Async save: step time while a save is being written, against step time without one.
            std::vector<double> plain, during;
            for (int i = 0; i < 5; ++i) plain.push_back(train_step(s, rank));
            AsyncCheckpointer background(world);
            int saves = 0;
            for (int i = 0; i < 200 && saves < 3; ++i) {
              if (!background.in_flight()) {
                progress.step = 10 + saves++;
                background.start(stage_checkpoint(s.contents(), progress, {}, rank), *dir, 0);
              }
              during.push_back(train_step(s, rank));
              background.poll();  // commits once every rank has written (collective, as in training)
            }
            background.wait();
            for (int i = 0; i < 5; ++i) plain.push_back(train_step(s, rank));
            const double save_bw = bytes / median(save_s), load_bw = bytes / median(load_s), reshard_bw = bytes / reshard_s;
            const double mean_plain = std::accumulate(plain.begin(), plain.end(), 0.0) / plain.size();
            const double mean_during = std::accumulate(during.begin(), during.end(), 0.0) / during.size();
            const double overhead = mean_during / mean_plain;
            Log::info("\ncheckpoint of {:.1f} MB ({} parameters + AdamW state) on {} ranks, medians of 3", bytes / 1e6,
                      s.model->parameter_count(), rt.size());
            Log::info("{:<28} {:>10} {:>12}", "operation", "GB/s", "vs disk");
            Log::info("{:<28} {:>10.3f} {:>12}", "raw disk write (fsync)", disk / 1e9, "1.00");
            Log::info("{:<28} {:>10.3f} {:>12.2f}", "save", save_bw / 1e9, save_bw / disk);
            Log::info("{:<28} {:>10.3f} {:>12.2f}", "load (same ranks)", load_bw / 1e9, load_bw / disk);
            Log::info("{:<28} {:>10.3f} {:>12.2f}", "load resharded 2 -> 1", reshard_bw / 1e9, reshard_bw / disk);
            Log::info("async save: mean step {:.1f} ms during {} saves over {} steps (median {:.1f}, max {:.1f}), {:.1f} ms "
                      "without (median {:.1f}): x{:.3f}", 1000 * mean_during, saves, during.size(), 1000 * median(during),
                      1000 * *std::max_element(during.begin(), during.end()), 1000 * mean_plain, 1000 * median(plain), overhead);
            if (rank == 0) std::filesystem::remove_all(*dir);
            nlohmann::json j = {{"bench", "checkpoint"},
                                {"bytes", bytes},
                                {"disk_write_gbps", std::round(disk / 1e7) / 100},
                                {"save_vs_disk", std::round(save_bw / disk * 1000) / 1000},
                                {"load_vs_disk", std::round(load_bw / disk * 1000) / 1000},
                                {"resharded_load_vs_disk", std::round(reshard_bw / disk * 1000) / 1000},
                                {"async_step_overhead", std::round(overhead * 1000) / 1000}};
            Log::info("{}", j.dump());
            return 0;
          }};
}

}  // namespace fsdpp::app
