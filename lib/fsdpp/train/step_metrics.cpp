#include "fsdpp/train/step_metrics.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/nn/context_parallel.hpp"
#include "fsdpp/optim/deck_optimizer.hpp"
#include "fsdpp/runtime/median.hpp"
#include "fsdpp/runtime/build_info.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/runtime/memory_accounting.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/train/reproducible.hpp"

#include <algorithm>

namespace fsdpp {
namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The optimizer's per-parameter state, as the banner names it, and how many f32 copies of a shard it is.
std::pair<std::string, int> optimizer_state(const Optimizer& optimizer) {
  const Parameter& any = *optimizer.parameters().front();
  const int copies = static_cast<int>(optimizer.state_tensors(any).size());
  if (copies == 0) return {fmt::format("{} state (none)", optimizer.kind()), 0};
  std::string names;
  for (const auto& [name, view] : optimizer.state_tensors(any)) names += (names.empty() ? "" : ", ") + name;
  return {fmt::format("{} state ({})", optimizer.kind(), names), copies};
}

// "activation checkpointing: every_2 (h.1, h.3 of 4 blocks recompute in backward): activations 198.1 MiB per
// micro-batch of 8 instead of 236.1 MiB (38.0 MiB saved)", or empty when no block recomputes.
std::string activation_checkpointing_line(const LanguageModel& model, const Deck& deck) {
  const int recomputing = model.recomputing_blocks();
  if (recomputing == 0) return {};
  std::string names;
  const std::vector<Module*> blocks = model.block_modules();
  for (const Module* b : blocks)
    if (b->recomputes_in_backward()) names += (names.empty() ? "" : ", ") + b->path();
  const int B = training_forward_batch(deck.train), T = deck.model.context_length;
  const double with = model.activation_bytes_for(B, T, recomputing) / 1048576.0;
  const double without = model.activation_bytes_for(B, T, 0) / 1048576.0;
  return fmt::format("activation checkpointing: {} ({} of {} blocks recompute in backward): activations {:.1f} MiB "
                     "per micro-batch of {} instead of {:.1f} MiB ({:.1f} MiB saved)",
                     to_string(deck.train.activation_checkpointing), names, blocks.size(), with, B, without,
                     without - with);
}

// How the model is laid over the ranks: the units fully_shard made, tensor parallelism, and the bytes per rank.
std::vector<std::string> parallelism_lines(const Parallelism& parallel, const std::string& optimizer_state,
                                           int optimizer_state_copies) {
  std::int64_t local = 0, largest_unsharded = 0;
  std::string names;
  const std::vector<UnitSummary> all = parallel.units();
  for (const UnitSummary& u : all) {
    local += u.sharded_numel;
    largest_unsharded = std::max(largest_unsharded, u.unsharded_numel);
    names += fmt::format("{}{} ({} params)", names.empty() ? "" : ", ", u.name, u.parameters);
  }
  const double mib = 4.0 / 1048576.0;  // f32
  const ParallelLayout& layout = parallel.layout();
  const char* how = layout.strategy == ShardStrategy::no_shard ? "replicated (no_shard: DDP) over" : "fully_shard over";
  std::vector<std::string> lines;
  lines.push_back(fmt::format("{} {}: {} units: {}", how, parallel.describe(), all.size(), names));
  if (layout.tp > 1)
    lines.push_back(fmt::format("tensor parallel over tp={} (Megatron: attention split by heads, the MLP column- then "
                                "row-parallel, vocabulary-parallel embedding and loss{}); fully_shard over {}",
                                layout.tp, layout.sequence_parallel ? "; sequence parallel: norms and residuals "
                                "hold 1/tp of the tokens" : "", parallel.fsdp_mesh().describe()));
  if (layout.ep > 1) lines.push_back(parallel.describe_expert_groups());
  if (layout.cp > 1)
    lines.push_back(fmt::format("context parallel over cp={} (each sequence in {} equal chunks, rank r holding chunks "
                                "r and {} - r; ring attention passes key/value blocks round cp); fully_shard over {}",
                                layout.cp, 2 * layout.cp, 2 * layout.cp - 1, parallel.fsdp_mesh().describe()));
  lines.push_back(fmt::format("shards live in {} memory", parallel.root().parameters().front()->placement()->memory));
  const bool overlap = layout.block_options.overlap_reduction;
  int thread_level = MPI_THREAD_MULTIPLE;
  MPI_Query_thread(&thread_level);
  lines.push_back(schedule_text(layout.forward_prefetch, layout.backward_prefetch, overlap) +
                  (thread_level < MPI_THREAD_MULTIPLE && layout.backend == CommBackend::mpi
                       ? "; but MPI lacks THREAD_MULTIPLE: each collective runs when it is issued, nothing overlaps"
                       : ""));
  lines.push_back(fmt::format("bytes per rank: parameters {:.2f} MiB, gradients {:.2f} MiB, {} {:.2f} MiB (f32 "
                              "shards, padded); largest unsharded group {:.2f} MiB", local * mib, local * mib,
                              optimizer_state, optimizer_state_copies * local * mib, largest_unsharded * mib));
  return lines;
}

}  // namespace

StepMetrics::StepMetrics(MPI_Comm comm, const Deck& deck, const Parallelism& parallel, bool speaks, bool measure_peak,
                         std::optional<StepTimePrediction> prediction)
    : comm_(comm), deck_(deck), parallel_(parallel), speaks_(speaks),
      log_(speaks, speaks && !deck.run.output.empty() ? deck.run.output + "/metrics.jsonl" : std::string(),
           deck.log.header_every),
      timers_(step_section_names()), prediction_(std::move(prediction)) {
  MPI_Comm_size(comm, &ranks_);
  tokens_per_step_ = static_cast<double>(deck.train.global_batch) * deck.model.context_length;
  if (measure_peak) summary_.sgemm_gflops = parallel_.mean_over_ranks(measure_sgemm_gflops(1024, 3));
}

namespace {

// The median of the steps after the first (the first allocates the buffer pool and warms up); the only step
// when there is one.
double median_ms_after_first(std::vector<double> seconds) {
  if (seconds.size() > 1) seconds.erase(seconds.begin());
  return 1000.0 * median(std::move(seconds));
}

}  // namespace

std::string StepMetrics::prediction_line(const TrainSummary& s) const {
  if (!s.predicted_ms_per_step || !prediction_)
    return "Predicted step time: none; set run.machine=<preset|file> (fsdpp plan --list-machines, or a file from "
           "`fsdpp bench calibrate > machine.yaml`) to print the model's prediction beside the measured ms/step";
  const double predicted = *s.predicted_ms_per_step, measured = s.median_ms_per_step;
  return fmt::format("predicted {:.1f} ms/step (machine {}) vs measured {:.1f} ms/step (median of steps after the "
                     "first): error {:+.1f}%", predicted, prediction_->machine, measured,
                     measured > 0 ? 100.0 * (predicted - measured) / measured : 0.0);
}

void StepMetrics::banner(const LanguageModel& model, const DataFeed& data, const Optimizer& optimizer,
                         const LanguageModel* whole) {
  const int T = deck_.model.context_length;
  summary_.loss_floor = data.entropy_floor();
  const LanguageModel& job = whole ? *whole : model;  // every token goes through every stage
  summary_.flops_per_token = job.flops_per_token(T);
  if (!speaks_) return;
  Log::info("{}", format_build_info(matmul_build_info()));
  const bool one_blas_thread = deck_.train.reproducible && blas_threads() > 0;  // OpenBLAS; cuBLAS has no threads
  Log::info("matmul: {}, GEMM precision {}, BLAS threads per rank: {}{}", matmul_backend(),
            gemm_precision_description(gemm_precision()), blas_threads(),
            one_blas_thread ? " (train.reproducible)" : "");
  if (const std::string overridden = blas_threads_override(deck_.train); one_blas_thread && !overridden.empty())
    Log::warn("{}", overridden);
  Log::info("---- resolved deck ----\n{}-----------------------", resolved_deck_yaml(deck_));
  Log::info("model: {}, {} parameters", job.describe(), job.parameter_count());
  Log::info("data: {}", data.description());
  Log::info("batch: {} sequences x {} tokens = {:.0f} tokens per step; {} data-parallel rank(s) x {} {} of {}",
            deck_.train.global_batch, T, tokens_per_step_, data.data_parallel_size(), data.accumulation_steps(),
            deck_.train.reproducible ? "computation unit(s)" : "micro-batch(es)", training_forward_batch(deck_.train));
  if (deck_.train.reproducible)
    Log::info("reproducible: micro-batches of {} run as units of {} sequences; gradients, losses and the gradient "
              "norm are summed exactly in fixed point: the same bits on every data-parallel layout at mesh.tp {} "
              "(docs/reproducible.md)", deck_.train.micro_batch, deck_.train.reproducible_unit, deck_.mesh.tp);
  Log::info("flops per token: {:.4g} (6 x matmul parameters + 12 x L x T x C); sgemm peak {:.1f} GFLOP/s per rank",
            summary_.flops_per_token, summary_.sgemm_gflops);
  if (summary_.loss_floor) Log::info("loss floor (entropy rate of the corpus): {:.4f}", *summary_.loss_floor);
  const auto [state, copies] = optimizer_state(optimizer);
  for (const std::string& line : parallelism_lines(parallel_, state, copies)) Log::info("{}", line);
  if (const std::string ac = activation_checkpointing_line(model, deck_); !ac.empty()) Log::info("{}", ac);
}

void StepMetrics::start_loop(std::int64_t first_step) {
  first_step_ = last_log_step_ = first_step;
  loop_start_ = last_log_ = last_step_end_ = std::chrono::steady_clock::now();
  timers_.restart();
}

void StepMetrics::after_step(std::int64_t done, const StepResult& r, const FsdpStats& stats, float lr,
                             std::optional<double> val, bool last) {
  peak_unsharded_ = std::max(peak_unsharded_, stats.peak_unsharded_bytes);
  comm_seconds_[0] += stats.all_gather_wait_s;
  comm_seconds_[1] += stats.reduce_scatter_s;
  comm_seconds_[2] += stats.all_reduce_s;
  comm_since_log_ += stats.exposed_comm_s();
  const auto step_end = std::chrono::steady_clock::now();
  step_seconds_.push_back(seconds_between(last_step_end_, step_end));
  last_step_end_ = step_end;
  if (done == first_step_ + 1) summary_.first_loss = r.loss;
  summary_.losses.push_back(r.loss);
  summary_.final_loss = r.loss;
  if (val) summary_.final_val_loss = val;
  if (!(done % std::max<std::int64_t>(1, deck_.log.interval) == 0 || last || done == first_step_ + 1)) return;

  const auto now = std::chrono::steady_clock::now();
  const double seconds = seconds_between(last_log_, now);
  const double steps = static_cast<double>(done - last_log_step_);
  StepRecord rec;
  rec.step = done;
  rec.loss = r.loss;
  rec.val_loss = val;
  rec.lr = lr;
  rec.grad_norm = r.grad_norm;
  rec.aux_loss = r.aux_loss;
  rec.expert_load = r.expert_load;
  rec.expert_load_per_layer = r.expert_load_per_layer;
  rec.dropped = r.dropped;
  rec.pipeline_bubble = r.pipeline_bubble;
  rec.ms_per_step = 1000.0 * seconds / steps;
  rec.tokens_per_s = tokens_per_step_ * steps / seconds;
  rec.mfu = mfu(rec.tokens_per_s * summary_.flops_per_token / ranks_, summary_.sgemm_gflops * 1e9);
  rec.peak_mem_bytes = peak_host_memory_bytes();
  // Exact in a double below 2^53 bytes.
  rec.max_peak_mem_bytes = static_cast<std::int64_t>(parallel_.max_over_ranks(static_cast<double>(rec.peak_mem_bytes)));
  rec.exposed_comm_ms = 1000.0 * parallel_.mean_over_ranks(comm_since_log_) / steps;
  if (prediction_) rec.predicted_ms_per_step = prediction_->ms_per_step;
  comm_since_log_ = 0;
  log_.write(rec);
  last_log_ = now;
  last_log_step_ = done;
  timers_.mark(kOther);
}

TrainSummary StepMetrics::finish(LanguageModel& model, std::optional<double> loss_floor) {
  TrainSummary& s = summary_;
  s.loss_floor = loss_floor;
  s.steps = static_cast<std::int64_t>(s.losses.size());
  s.loop_seconds = seconds_between(loop_start_, std::chrono::steady_clock::now());
  const double train_seconds = s.loop_seconds - eval_seconds_;
  s.tokens_per_s = train_seconds > 0 ? tokens_per_step_ * s.steps / train_seconds : 0;
  s.mfu = mfu(s.tokens_per_s * s.flops_per_token / ranks_, s.sgemm_gflops * 1e9);
  s.exposed_comm_ms = 1000.0 * parallel_.mean_over_ranks(comm_seconds_[0] + comm_seconds_[1] + comm_seconds_[2]) /
                      std::max<std::int64_t>(1, s.steps);
  {
    std::int64_t bytes[5] = {0, 0, 0, peak_unsharded_, model.activation_bytes()};
    for (Parameter* p : model.parameters()) bytes[0] += static_cast<std::int64_t>(p->value().extent(0)) * 4;
    bytes[1] = bytes[0];
    bytes[2] = optimizer_state_copies(deck_.optim) * bytes[0];
    MPI_Allreduce(MPI_IN_PLACE, bytes, 5, MPI_INT64_T, MPI_MAX, comm_);
    s.param_bytes = bytes[0], s.grad_bytes = bytes[1], s.optimizer_bytes = bytes[2];
    s.peak_unsharded_bytes = bytes[3], s.activation_bytes = bytes[4];
  }
  const std::string breakdown = timers_.report(comm_, s.loop_seconds);
  const std::string comm_breakdown = min_avg_max_table(
      comm_, {"AllGather", "ReduceScat", "AllReduce"}, {comm_seconds_[0], comm_seconds_[1], comm_seconds_[2]},
      s.loop_seconds);
  // Per-rank memory: the peak of fsdpp's Views in the compute space (what `fsdpp plan` predicts) and the
  // process's peak resident set, each as min/avg/max over ranks and summed over the job.
  const SpaceUsage device = MemoryAccounting::device();
  const std::vector<std::string> memory_rows = {fmt::format("{} allocations", device.space), "Host RSS"};
  const std::vector<double> memory_mib = {device.peak_bytes / 1048576.0, peak_host_memory_bytes() / 1048576.0};
  const std::string memory_table = min_avg_max_sum_table(comm_, memory_rows, memory_mib, "Peak MiB");
  // Context parallelism: the ring's attention compute per rank (its balance over the cp ranks) and the waits for
  // its hops that the compute did not hide.
  std::string ring_table;
  if (const ContextParallelStats* cp = model.context_parallel_stats())
    ring_table = min_avg_max_sum_table(comm_, {"Ring compute", "Ring waits"},
                                       {cp->compute_seconds, cp->wait_seconds}, "Seconds");
  // What this run added: buffers an earlier run or test in the same process left (Kokkos' own team scratch,
  // grow-only kernel scratch) were live before it started and are not the run's to plan.
  s.measured_peak_bytes = device.peak_bytes - device.live_at_reset;
  if (prediction_) s.predicted_ms_per_step = prediction_->ms_per_step;
  // Rank 0's steps: every rank's step ends at the same collectives, so the ranks agree to within a few ms.
  s.median_ms_per_step = median_ms_after_first(step_seconds_);
  MPI_Allreduce(MPI_IN_PLACE, &s.measured_peak_bytes, 1, MPI_INT64_T, MPI_MAX, comm_);
  if (!speaks_) return s;
  Log::info("Loop time of {:.3f} on {} procs for {} steps with {:.0f} tokens", s.loop_seconds, ranks_, s.steps,
            tokens_per_step_ * s.steps);
  Log::info("Performance: {:.0f} tokens/s, {:.2f} GFLOP/s{}", s.tokens_per_s, s.tokens_per_s * s.flops_per_token / 1e9,
            s.sgemm_gflops > 0 ? fmt::format(", MFU {:.3f} (of {:.1f} GFLOP/s sgemm peak per rank)", s.mfu, s.sgemm_gflops)
                               : std::string());
  Log::info("{}", prediction_line(s));
  Log::info("\nMPI task timing breakdown:\n{}", breakdown);
  Log::info("Communication the compute waited on (part of Forward, Backward and GradSync above):\n{}", comm_breakdown);
  Log::info("Per MPI rank peak memory: fsdpp's Views (what fsdpp plan predicts) and the resident set size:\n{}",
            memory_table);
  if (!ring_table.empty())
    Log::info("Context parallelism: the ring's attention kernels (Ring compute) and the hops they waited for (Ring "
              "waits, the exposed part), per rank:\n{}", ring_table);
  if (s.final_val_loss)
    Log::info("final loss {:.4f}, validation loss {:.4f}{}", s.final_loss, *s.final_val_loss,
              s.loss_floor ? fmt::format(" (floor {:.4f})", *s.loss_floor) : std::string());
  return s;
}

}  // namespace fsdpp
