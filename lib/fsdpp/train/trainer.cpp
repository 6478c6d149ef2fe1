#include "fsdpp/train/trainer.hpp"

#include "fsdpp/ckpt/async_save.hpp"
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/dir_lock.hpp"
#include "fsdpp/ckpt/resume.hpp"
#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/data/sampler.hpp"
#include "fsdpp/data/synthetic_corpus.hpp"
#include "fsdpp/data/token_file.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/optim/grad_norm.hpp"
#include "fsdpp/optim/lr_schedule.hpp"
#include "fsdpp/optim/sgd.hpp"
#include "fsdpp/runtime/build_info.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/runtime/memory_accounting.hpp"
#include "fsdpp/runtime/preemption.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/train/build_model.hpp"
#include "fsdpp/train/step_log.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

namespace fsdpp {
namespace {

enum Section { kData, kForward, kBackward, kGradSync, kOptimizer, kEval, kCheckpoint, kOther, kSections };


struct Dataset {
  std::vector<std::uint32_t> tokens;
  std::optional<double> entropy_floor;
  std::string description;
};

Dataset load_dataset(const Deck& deck) {
  Dataset d;
  const int V = deck.model.vocab_size;
  if (deck.data.source == "synthetic") {
    SyntheticCorpus corpus(deck.run.seed, V);
    // Windows are drawn with replacement from a stationary source, so a few million tokens give variety
    // enough; more only costs memory on every rank.
    const std::int64_t n = std::max<std::int64_t>(std::int64_t{1} << 21, 64LL * deck.model.context_length);
    d.tokens = corpus.generate(n);
    d.entropy_floor = corpus.entropy_rate_nats();
    d.description = fmt::format("synthetic Markov corpus (V {}, {} successors, seed {}), {} tokens, entropy rate "
                                "{:.4f} nats/token", V, corpus.successors(), deck.run.seed, n, *d.entropy_floor);
    return d;
  }
  const std::string& path = deck.data.source;
  switch (deck.data.format) {
    case DataFormat::automatic: d.tokens = load_tokens(path, V); break;
    case DataFormat::gpt2: d.tokens = load_tokens(path, TokenFormat::gpt2_bin, V); break;
    case DataFormat::uint16: d.tokens = load_tokens(path, TokenFormat::raw_u16, V); break;
    case DataFormat::uint32: d.tokens = load_tokens(path, TokenFormat::raw_u32, V); break;
  }
  d.description = fmt::format("{} ({} tokens)", path, d.tokens.size());
  return d;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& o, std::vector<Parameter*> params) {
  if (o.name == OptimizerKind::sgd) {
    SgdConfig c;
    c.lr = static_cast<float>(o.lr);
    c.momentum = static_cast<float>(o.momentum);
    c.weight_decay = static_cast<float>(o.weight_decay);
    c.decay_embeddings = o.decay_embeddings, c.decay_norms = o.decay_norms, c.decay_biases = o.decay_biases;
    return std::make_unique<Sgd>(std::move(params), c);
  }
  AdamWConfig c;
  c.lr = static_cast<float>(o.lr);
  c.beta1 = static_cast<float>(o.beta1), c.beta2 = static_cast<float>(o.beta2), c.eps = static_cast<float>(o.eps);
  c.weight_decay = static_cast<float>(o.weight_decay);
  c.decay_embeddings = o.decay_embeddings, c.decay_norms = o.decay_norms, c.decay_biases = o.decay_biases;
  return std::make_unique<AdamW>(std::move(params), c);
}

// A micro-batch on the device: tokens and next-token targets, (m, T) each.
struct Batch {
  std::vector<std::int32_t> host_inputs, host_targets;
  View1<std::int32_t> inputs, targets;
  Batch(int m, int T)
      : host_inputs(static_cast<std::size_t>(m) * T), host_targets(host_inputs.size()),
        inputs("batch.inputs", host_inputs.size()), targets("batch.targets", host_inputs.size()) {}
  void upload() {
    Kokkos::deep_copy(inputs, HostView1<std::int32_t>(host_inputs.data(), host_inputs.size()));
    Kokkos::deep_copy(targets, HostView1<std::int32_t>(host_targets.data(), host_targets.size()));
  }
};

// The banner's sharding plan: each unit with its parameters, and bytes per rank by category.
void log_sharding_plan(Gpt& model, const DeviceMesh& mesh, bool speaks) {
  std::int64_t local = 0, largest_unsharded = 0;
  std::string units;
  for (Module* m : model.modules()) {
    FsdpGroup* g = fsdp_group(*m);
    if (!g) continue;
    std::int64_t numel = 0;
    for (Parameter* p : g->parameters()) numel += p->numel();
    local += g->sharded_numel();
    largest_unsharded = std::max(largest_unsharded, g->unsharded_numel());
    units += fmt::format("{}{} ({} params)", units.empty() ? "" : ", ", m->display_name(), numel);
  }
  if (!speaks) return;
  const double mib = 1.0 / 1048576.0;
  Log::info("fully_shard over {}: {} units: {}", mesh.describe(), model.modules().size(), units);
  Log::info("shards live in {} memory", model.wte.placement ? model.wte.placement->memory : "?");
  Log::info("bytes per rank: parameters {:.2f} MiB, gradients {:.2f} MiB, AdamW state {:.2f} MiB (f32 shards, padded); "
            "largest unsharded group {:.2f} MiB", local * 4 * mib, local * 4 * mib, local * 8 * mib,
            largest_unsharded * 4 * mib);
}

double mean_over(MpiCommunicator& comm, double value) {
  comm.all_reduce(&value, 1, ReduceOp::avg);
  return value;
}

}  // namespace

TrainSummary train(MPI_Comm comm, const Deck& deck, TrainOptions options) {
  int R = 1, r = 0;
  MPI_Comm_size(comm, &R);
  MPI_Comm_rank(comm, &r);
  const bool speaks = r == 0 && !options.quiet;
  const int T = deck.model.context_length, m = deck.train.micro_batch, G = deck.train.global_batch;
  const int accum = grad_accum_steps(deck.train, R);
  MpiCommunicator world(comm);
  MemoryAccounting::install();  // already done by the Runtime; harmless again
  MemoryAccounting::reset_peak();

  // Output folder, resolved deck, metrics.
  std::string metrics_path;
  if (r == 0 && !deck.run.output.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(deck.run.output, ec);
    FSDPP_CHECK(!ec, "cannot create run.output '{}': {}", deck.run.output, ec.message());
    std::ofstream(deck.run.output + "/deck.resolved.yaml") << resolved_deck_yaml(deck);
    metrics_path = deck.run.output + "/metrics.jsonl";
  }

  // One run saves into a checkpoint folder at a time; a second one stops here, on every rank.
  const CheckpointDirLock checkpoint_lock(comm, deck.checkpoint.dir, deck.checkpoint.interval > 0);
  const Dataset data = load_dataset(deck);
  WindowSampler sampler(data.tokens, T, deck.data.val_fraction, deck.run.seed,
                        deck.data.order == DataOrder::sequential ? SampleOrder::sequential : SampleOrder::shuffled);
  FSDPP_REQUIRE(!(deck.train.eval_interval > 0 && !sampler.has_val()),
                "train.eval_interval is {} but the data has no validation split; set data.val_fraction > 0 or "
                "train.eval_interval: 0", deck.train.eval_interval);

  // Built on meta (shapes and init rules), sharded, then given storage and values: no rank ever holds the
  // whole model, and element i of every tensor gets the same value on any number of ranks.
  TrainModel built = build_model(comm, deck);
  Gpt& model = *built.model;
  const GptConfig config = model.config();
  const bool sharded = built.sharded();
  const std::unique_ptr<DeviceMesh>& mesh = built.mesh;
  FsdpGroup* root_group = built.root_group;
  if (deck.checkpoint.init_from != "none") {
    load_weights(comm, deck.checkpoint.init_from, model.parameters());
    if (speaks) Log::info("weights initialized from {}; training starts at step 0 with a fresh optimizer", deck.checkpoint.init_from);
  }
  auto optimizer = make_optimizer(deck.optim, model.parameters());
  LrSchedule schedule;
  schedule.kind = deck.schedule.kind == ScheduleKind::cosine ? LrSchedule::cosine : LrSchedule::constant;
  schedule.lr = static_cast<float>(deck.optim.lr);
  schedule.min_lr = static_cast<float>(deck.schedule.min_lr);
  schedule.warmup_steps = deck.schedule.warmup_steps;
  schedule.total_steps = deck.train.steps;
  schedule.validate();

  TrainSummary summary;
  summary.loss_floor = data.entropy_floor;
  summary.flops_per_token = config.flops_per_token(T);
  if (options.measure_peak) {
    summary.sgemm_gflops = measure_sgemm_gflops(1024, 3);
    summary.sgemm_gflops = mean_over(world, summary.sgemm_gflops);
  }
  const double tokens_per_step = static_cast<double>(G) * T;

  if (speaks) {
    Log::info("{}", format_build_info());
    Log::info("matmul: {}, BLAS threads per rank: {}", matmul_backend(), blas_threads());
    Log::info("---- resolved deck ----\n{}-----------------------", resolved_deck_yaml(deck));
    Log::info("model: GPT-2, V {} T {} C {} L {} NH {} ({} embeddings), {} parameters", config.vocab_size, T,
              config.n_embd, config.n_layer, config.n_head, config.tie_embeddings ? "tied" : "untied",
              config.parameter_count());
    Log::info("data: {}", data.description);
    Log::info("batch: {} sequences x {} tokens = {:.0f} tokens per step; {} rank(s) x {} micro-batch(es) of {}",
              G, T, tokens_per_step, R, accum, m);
    Log::info("flops per token: {:.4g} (6 x matmul parameters + 12 x L x T x C); sgemm peak {:.1f} GFLOP/s per rank",
              summary.flops_per_token, summary.sgemm_gflops);
    if (data.entropy_floor) Log::info("loss floor (entropy rate of the corpus): {:.4f}", *data.entropy_floor);
  }
  if (sharded) log_sharding_plan(model, *mesh, speaks);

  StepLog step_log(speaks, metrics_path, deck.log.header_every);
  SectionTimers timers({"Data", "Forward", "Backward", "GradSync", "Optimizer", "Eval", "Checkpoint", "Other"});
  Batch batch(m, T);
  const auto params = model.parameters();
  Flow flow;
  flow.B = m;
  flow.T = T;

  auto evaluate = [&]() {
    double total = 0;
    const int per_rank = std::max(1, deck.train.eval_batches);
    for (int e = 0; e < per_rank; ++e) {
      // Validation batch e: the same fixed windows every evaluation, split over ranks like training.
      sampler.fill_batch(Split::val, e, static_cast<std::int64_t>(m) * R, static_cast<std::int64_t>(r) * m, m,
                         batch.host_inputs.data(), batch.host_targets.data());
      batch.upload();
      flow.tokens = batch.inputs;
      flow.targets = batch.targets;
      flow.training = false;
      model(flow);
      total += flow.loss;
    }
    if (root_group) root_group->reshard();  // the root keeps its parameters after forward, for a backward
    return mean_over(world, total / per_rank);
  };

  // Communication the compute thread waited on, per rank: all-gathers not hidden by prefetch, reduce-scatters,
  // and the replicated path's all-reduces.
  double comm_seconds[3] = {0, 0, 0};
  double comm_since_log = 0;
  std::int64_t peak_unsharded = 0;
  // Checkpoints: what to save, and where to resume from.
  std::unique_ptr<AsyncCheckpointer> background;
  if (deck.checkpoint.async && deck.checkpoint.interval > 0)
    background = std::make_unique<AsyncCheckpointer>(comm, deck.checkpoint.on_error);
  std::int64_t background_step = 0;
  bool background_reported = true;
  auto report_background = [&](const std::optional<SaveResult>& done) {
    if (!done || background_reported || !speaks) return;
    Log::info("checkpoint: step {} written in the background to {} ({:.1f} MiB in {:.2f} s)", background_step,
              done->path, done->bytes / 1048576.0, done->seconds);
    background_reported = true;
  };
  CheckpointContents contents;
  contents.params = params;
  contents.optimizer = optimizer.get();
  contents.writes_shards = !mesh || mesh->ndim() == 1 || mesh->coordinate(0) == 0;  // HSDP: one replica writes
  CheckpointMeta ckpt_meta;
  ckpt_meta.mesh = mesh ? mesh->describe() : fmt::format("replicated on {} ranks", R);
  ckpt_meta.strategy = std::string(to_string(deck.fsdp.strategy));
  ckpt_meta.param_dtype = std::string(dtype_name(deck.fsdp.param_dtype));
  ckpt_meta.reduce_dtype = std::string(dtype_name(deck.fsdp.reduce_dtype));
  ckpt_meta.deck = resolved_deck_yaml(deck);
  std::int64_t first_step = 0;
  if (deck.checkpoint.resume != ResumeMode::off) {
    const ResumeChoice resume = choose_resume(comm, deck.checkpoint.dir, deck.checkpoint.resume, deck.checkpoint.resume_path);
    if (speaks && !resume.log.empty()) Log::info("{}", resume.log);
    const std::optional<std::string>& latest = resume.path;
    if (latest) {
      const LoadReport loaded = load_checkpoint(comm, *latest, contents);
      sampler.set_state(loaded.progress.sampler);
      first_step = loaded.progress.step;
      if (speaks) {
        Log::info("resumed from {} at step {} (saved on {} ranks, {}; {:.1f} MiB read by rank 0 in {:.2f} s)", *latest,
                  first_step, loaded.saved_world_size, loaded.saved_mesh, loaded.bytes / 1048576.0, loaded.seconds);
        if (loaded.saved_world_size != R)
          Log::info("data: the sample order is global, so resuming on {} ranks instead of {} continues it at global "
                    "batch {}: each rank now takes its {} of the {} sequences of every batch, none repeated or skipped",
                    R, loaded.saved_world_size, first_step, G / R, G);
        if (const std::string note = resume_past_end_note(*latest, first_step, deck.train.steps); !note.empty())
          Log::warn("{}", note);
      }
    }
  }
  auto save = [&](std::int64_t done, float lr) {
    TrainProgress progress;
    progress.step = done;
    progress.tokens_seen = static_cast<std::int64_t>(tokens_per_step) * done;
    progress.sampler = sampler.state();
    progress.lr = lr;
    if (background) {
      report_background(background->wait());
      const auto t0 = std::chrono::steady_clock::now();
      background->start(stage_checkpoint(contents, progress, ckpt_meta, r), deck.checkpoint.dir, deck.checkpoint.keep_last);
      background_step = done;
      background_reported = false;
      if (speaks)
        Log::info("checkpoint: step {} staged in {:.3f} s; writing in the background", done,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return;
    }
    const SaveResult result = save_checkpoint(comm, deck.checkpoint.dir, contents, progress, ckpt_meta,
                                              deck.checkpoint.keep_last, deck.checkpoint.on_error);
    if (speaks && result.error.empty())
      Log::info("checkpoint: saved step {} to {} ({:.1f} MiB in {:.2f} s, {:.2f} GB/s)", done, result.path,
                result.bytes / 1048576.0, result.seconds, result.bytes / std::max(result.seconds, 1e-9) / 1e9);
  };

  const auto loop_start = std::chrono::steady_clock::now();
  double eval_seconds = 0;
  auto last_log = loop_start;
  std::int64_t last_log_step = first_step;
  timers.restart();
  for (std::int64_t step = first_step; step < deck.train.steps; ++step) {
    const float lr = schedule.at(step);
    if (speaks && sampler.order() == SampleOrder::sequential && step > 0 &&
        sampler.epoch_of(step, G) != sampler.epoch_of(step - 1, G))
      Log::info("data: epoch {} begins at step {}: the {} training windows of {} tokens were all seen; wrapping to "
                "the start", sampler.epoch_of(step, G), step, sampler.sequential_windows(), T + 1);
    model.zero_grad();
    if (sharded) reset_fsdp_stats(model);
    double loss = 0;
    for (int a = 0; a < accum; ++a) {
      const std::int64_t first = micro_batch_first_sequence(G, m, R, r, a);
      sampler.fill_train_batch(G, first, m, batch.host_inputs.data(), batch.host_targets.data());
      batch.upload();
      flow.tokens = batch.inputs;
      flow.targets = batch.targets;
      flow.training = true;
      // The objective is the mean over the global batch: fully_shard averages gradients over the ranks, the
      // replicated path sums them.
      flow.loss_scale = 1.0f / static_cast<float>(sharded ? accum : accum * R);
      if (sharded && deck.fsdp.accumulate == GradAccumulation::unsharded)
        root_group->set_requires_gradient_sync(a == accum - 1);  // recursive: every block too
      timers.mark(kData);
      model(flow);
      Kokkos::fence();
      timers.mark(kForward);
      model(flow, Pass::backward);
      Kokkos::fence();
      timers.mark(kBackward);
      loss += flow.loss;
    }
    // Replicated: each rank's gradients carry 1/(accum x R); summing over ranks gives the global mean.
    if (!sharded && R > 1) {
      const auto t0 = std::chrono::steady_clock::now();
      for (Parameter* p : params) world.all_reduce(p->grad.data(), p->grad.extent(0), DType::f32, ReduceOp::sum);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      comm_seconds[2] += waited;
      comm_since_log += waited;
    }
    if (sharded) {
      const FsdpStats st = fsdp_stats(model);
      peak_unsharded = std::max(peak_unsharded, st.peak_unsharded_bytes);
      comm_seconds[0] += st.all_gather_wait_s;
      comm_seconds[1] += st.reduce_scatter_s;
      comm_seconds[2] += st.all_reduce_s;
      comm_since_log += st.exposed_comm_s();
    }
    loss = mean_over(world, loss / accum);
    timers.mark(kGradSync);
    // Sharded gradients: the squared norm is summed over the shard group (padding rows are zero).
    Communicator* norm_group = sharded ? &mesh->comm(mesh->ndim() - 1) : nullptr;  // shards; replicas are copies
    const double norm = deck.train.grad_clip > 0 ? clip_grad_norm(params, deck.train.grad_clip, norm_group)
                                                 : global_grad_norm(params, norm_group);
    optimizer->step(lr);
    sampler.advance();
    Kokkos::fence();
    timers.mark(kOptimizer);
    if (step == first_step) summary.first_loss = loss;
    summary.losses.push_back(loss);
    summary.final_loss = loss;

    const std::int64_t done = step + 1;
    const bool last = done == deck.train.steps || done == options.stop_after_step;
    std::optional<double> val;
    if (deck.train.eval_interval > 0 && (done % deck.train.eval_interval == 0 || last)) {
      const auto t0 = std::chrono::steady_clock::now();
      val = evaluate();
      eval_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      summary.final_val_loss = val;
      timers.mark(kEval);
    }
    if (deck.checkpoint.interval > 0 && (done % deck.checkpoint.interval == 0 || last)) {
      timers.mark(kOther);
      save(done, lr);
      timers.mark(kCheckpoint);
    }
    if (done % std::max<std::int64_t>(1, deck.log.interval) == 0 || last || done == first_step + 1) {
      const auto now = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(now - last_log).count();
      const double steps = static_cast<double>(done - last_log_step);
      StepRecord rec;
      rec.step = done;
      rec.loss = loss;
      rec.val_loss = val;
      rec.lr = lr;
      rec.grad_norm = norm;
      rec.ms_per_step = 1000.0 * seconds / steps;
      rec.tokens_per_s = tokens_per_step * steps / seconds;
      rec.mfu = summary.sgemm_gflops > 0 ? rec.tokens_per_s * summary.flops_per_token / (summary.sgemm_gflops * 1e9 * R) : 0;
      rec.peak_mem_bytes = peak_host_memory_bytes();
      rec.max_peak_mem_bytes = rec.peak_mem_bytes;
      MPI_Allreduce(MPI_IN_PLACE, &rec.max_peak_mem_bytes, 1, MPI_INT64_T, MPI_MAX, comm);
      rec.exposed_comm_ms = 1000.0 * mean_over(world, comm_since_log) / steps;
      comm_since_log = 0;
      step_log.write(rec);
      last_log = now;
      last_log_step = done;
      timers.mark(kOther);
    }
    // A background save is committed at the first step boundary after every rank has written its shards.
    if (background && background->in_flight()) report_background(background->poll());
    if (done == options.stop_after_step) break;
    if (options.handle_preemption && !last && preemption_requested(comm)) {
      // Finish cleanly: the save is synchronous and waits for any background one, so nothing is in flight.
      if (background) report_background(background->wait());
      std::string where = "no checkpoint (checkpoint.interval is 0)";
      if (deck.checkpoint.interval > 0) {
        const auto keep = std::move(background);  // a synchronous save from here on
        save(done, lr);
        where = (std::filesystem::path(deck.checkpoint.dir) / checkpoint_file_name(done)).string();
      }
      if (speaks)
        Log::info("preempted: signal {} received; stopped after step {} of {}, saved {}; resume with "
                  "checkpoint.resume: auto (exit code {})", preemption_signal(), done, deck.train.steps, where,
                  kPreemptedExitCode);
      summary.preempted = true;
      break;
    }
  }
  if (background) report_background(background->wait());  // the last save completes before the run reports
  summary.steps = static_cast<std::int64_t>(summary.losses.size());
  summary.loop_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
  const double train_seconds = summary.loop_seconds - eval_seconds;
  summary.tokens_per_s = train_seconds > 0 ? tokens_per_step * summary.steps / train_seconds : 0;
  summary.mfu = summary.sgemm_gflops > 0
                    ? summary.tokens_per_s * summary.flops_per_token / (summary.sgemm_gflops * 1e9 * R) : 0;

  summary.exposed_comm_ms = 1000.0 * mean_over(world, comm_seconds[0] + comm_seconds[1] + comm_seconds[2]) /
                            std::max<std::int64_t>(1, summary.steps);
  {
    std::int64_t bytes[5] = {0, 0, 0, 0, model.activation_bytes()};
    for (Parameter* p : params) bytes[0] += static_cast<std::int64_t>(p->value.extent(0)) * 4;
    bytes[1] = bytes[0];
    bytes[2] = deck.optim.name == OptimizerKind::adamw ? 2 * bytes[0] : (deck.optim.momentum > 0 ? bytes[0] : 0);
    bytes[3] = peak_unsharded;
    MPI_Allreduce(MPI_IN_PLACE, bytes, 5, MPI_INT64_T, MPI_MAX, comm);
    summary.param_bytes = bytes[0], summary.grad_bytes = bytes[1], summary.optimizer_bytes = bytes[2];
    summary.peak_unsharded_bytes = bytes[3], summary.activation_bytes = bytes[4];
  }
  const std::string breakdown = timers.report(comm, summary.loop_seconds);
  const std::string comm_breakdown = min_avg_max_table(
      comm, {"AllGather", "ReduceScat", "AllReduce"}, {comm_seconds[0], comm_seconds[1], comm_seconds[2]},
      summary.loop_seconds);
  // Per-rank memory: the peak of fsdpp's Views in the compute space (what `fsdpp plan` predicts) and the
  // process's peak resident set, each as min/avg/max over ranks and summed over the job.
  const SpaceUsage device = MemoryAccounting::device();
  const std::vector<std::string> memory_rows = {fmt::format("{} allocations", device.space), "Host RSS"};
  const std::vector<double> memory_mib = {device.peak_bytes / 1048576.0, peak_host_memory_bytes() / 1048576.0};
  const std::string memory_table = min_avg_max_sum_table(comm, memory_rows, memory_mib, "Peak MiB");
  summary.measured_peak_bytes = device.peak_bytes;
  MPI_Allreduce(MPI_IN_PLACE, &summary.measured_peak_bytes, 1, MPI_INT64_T, MPI_MAX, comm);
  if (speaks) {
    Log::info("Loop time of {:.3f} on {} procs for {} steps with {:.0f} tokens", summary.loop_seconds, R,
              summary.steps, tokens_per_step * summary.steps);
    Log::info("Performance: {:.0f} tokens/s, {:.2f} GFLOP/s{}", summary.tokens_per_s,
              summary.tokens_per_s * summary.flops_per_token / 1e9,
              summary.sgemm_gflops > 0 ? fmt::format(", MFU {:.3f} (of {:.1f} GFLOP/s sgemm peak per rank)", summary.mfu,
                                                     summary.sgemm_gflops)
                                       : std::string());
    Log::info("\nMPI task timing breakdown:\n{}", breakdown);
    Log::info("Communication the compute waited on (part of Forward, Backward and GradSync above):\n{}", comm_breakdown);
    Log::info("Per MPI rank peak memory: fsdpp's Views (what fsdpp plan predicts) and the resident set size:\n{}",
              memory_table);
    if (summary.final_val_loss)
      Log::info("final loss {:.4f}, validation loss {:.4f}{}", summary.final_loss, *summary.final_val_loss,
                data.entropy_floor ? fmt::format(" (floor {:.4f})", *data.entropy_floor) : std::string());
  }
  return summary;
}

}  // namespace fsdpp
