#include "fsdpp/train/trainer.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/dir_lock.hpp"
#include "fsdpp/comm/flight_service.hpp"
#include "fsdpp/comm/timeline.hpp"
#include "fsdpp/comm/traffic.hpp"
#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/optim/lr_schedule.hpp"
#include "fsdpp/optim/sgd.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/runtime/memory_accounting.hpp"
#include "fsdpp/runtime/preemption.hpp"
#include "fsdpp/runtime/watchdog.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/train/build_model.hpp"
#include "fsdpp/train/checkpointer.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/train/evaluator.hpp"
#include "fsdpp/train/reproducible.hpp"
#include "fsdpp/train/training_samples.hpp"
#include "fsdpp/train/step_metrics.hpp"
#include "fsdpp/train/train_step.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>

namespace fsdpp {

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

LrSchedule make_schedule(const Deck& deck) {
  LrSchedule schedule;
  schedule.kind = deck.schedule.kind == ScheduleKind::cosine ? LrSchedule::cosine : LrSchedule::constant;
  schedule.lr = static_cast<float>(deck.optim.lr);
  schedule.min_lr = static_cast<float>(deck.schedule.min_lr);
  schedule.warmup_steps = deck.schedule.warmup_steps;
  schedule.total_steps = deck.train.steps;
  schedule.validate();
  return schedule;
}

namespace {

// Rank 0 makes run.output and writes the resolved deck there.
void prepare_output(int rank, const Deck& deck) {
  if (rank != 0 || deck.run.output.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(deck.run.output, ec);
  FSDPP_CHECK(!ec, "cannot create run.output '{}': {}", deck.run.output, ec.message());
  std::ofstream(deck.run.output + "/deck.resolved.yaml") << resolved_deck_yaml(deck);
}

// Every rank's host for the traffic table; empty (no table) when the run is not over MPI_COMM_WORLD, whose
// ranks the communicators name their members by.
std::vector<std::string> hosts_for_traffic(MPI_Comm comm) {
  int same = MPI_UNEQUAL;
  MPI_Comm_compare(comm, MPI_COMM_WORLD, &same);
  return same == MPI_IDENT || same == MPI_CONGRUENT ? FlightService::hosts() : std::vector<std::string>{};
}

// The step's FSDP and tensor-parallel collective counts, summed into the timeline's otherData while it records:
// tests/cli/trace_check.py checks the collectives on the communicator tracks against them.
void add_timeline_counters(const TrainStep& step, LanguageModel& model) {
  if (!Timeline::recording()) return;
  const TensorParallelStats& tp = model.tensor_parallel().stats();
  const FsdpStats& fsdp = step.fsdp_stats_of_last_step();  // its all_reduces include tensor parallelism's
  Timeline::add_counter("fsdp_all_gathers", fsdp.forward_all_gathers + fsdp.backward_all_gathers);
  Timeline::add_counter("fsdp_reduce_scatters", fsdp.reduce_scatters);
  Timeline::add_counter("fsdp_all_reduces", fsdp.all_reduces - tp.all_reduces);
  Timeline::add_counter("tp_all_reduces", tp.all_reduces);
  Timeline::add_counter("tp_all_gathers", tp.all_gathers);
  Timeline::add_counter("tp_reduce_scatters", tp.reduce_scatters);
}

}  // namespace

TrainSummary train(MPI_Comm comm, const Deck& deck, TrainOptions options) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const bool speaks = rank == 0 && !options.quiet;
  MemoryAccounting::install();  // already done by the Runtime; harmless again
  MemoryAccounting::reset_peak();
  prepare_output(rank, deck);
  // Every float GEMM of this run (training and evaluation) follows the deck; the previous setting returns
  // afterwards, so runs in one process do not leak precision into each other.
  const ScopedGemmPrecision gemm_precision(resolved_gemm_precision(deck));
  // Reproducible mode: one BLAS thread per rank for the run, so that every environment gives the same bits.
  const ScopedBlasThreads blas_threads(reproducible_blas_threads(deck.train));
  // One run saves into a checkpoint folder at a time; a second one stops here, on every rank.
  const CheckpointDirLock checkpoint_lock(comm, deck.checkpoint.dir, deck.checkpoint.interval > 0);
  // The last collectives of every rank, dumped to <run.output>/flight by the watchdog, an abort or SIGUSR2.
  const FlightService::Run flight(comm, static_cast<std::size_t>(deck.comm.flight_records),
                                  (deck.run.output.empty() ? std::string(".") : deck.run.output) + "/flight",
                                  deck.comm.timeout_s);
  // run.trace: a timeline of the chosen steps in <run.output>/trace (comm/timeline.hpp).
  const Timeline::Run timeline(deck.run.trace_first, deck.run.trace_last,
                               (deck.run.output.empty() ? std::string(".") : deck.run.output) + "/trace", comm);

  // Built on meta, parallelized, then given storage and values: no rank ever holds the whole model, and
  // element i of every tensor gets the same value on any number of ranks.
  TrainModel built = build_model(comm, deck);
  LanguageModel& model = *built.model;
  Parallelism& parallel = *built.parallel;
  // Training's batch split, on every rank alike before any step (train_command's memory check, when on, has
  // refused such a launch before anything was allocated).
  grad_accum_steps(deck.train, parallel.data_parallel_size());
  DataFeed data(deck, parallel.data_parallel_size(), parallel.data_parallel_rank());
  if (deck.checkpoint.init_from != "none") {
    load_weights(comm, deck.checkpoint.init_from, model.parameters(), &deck.model);
    if (speaks) Log::info("weights initialized from {}; training starts at step 0 with a fresh optimizer", deck.checkpoint.init_from);
  }
  const auto optimizer = make_optimizer(deck.optim, model.parameters());
  const LrSchedule schedule = make_schedule(deck);

  StepMetrics metrics(comm, deck, parallel, speaks, options.measure_peak);
  metrics.banner(model, data, *optimizer);
  SectionTimers& timers = metrics.timers();
  TrainStep train_step(comm, model, parallel, *optimizer, data, deck.train, timers);
  Evaluator evaluator(model, parallel, data, deck.train);
  TrainingSamples samples(comm, model, parallel, deck);
  ProgressState progress(static_cast<double>(deck.train.global_batch) * deck.model.context_length);
  ModelState model_state(model.parameters(), optimizer.get());
  Checkpointer checkpointer(comm, deck, parallel, {&model_state, &data, &progress}, progress, speaks);
  const std::int64_t first_step = checkpointer.resume();

  bool preempted = false;
  const CollectiveWatchdog::Running watchdog(deck.comm.timeout_s);  // until train() returns or throws
  metrics.start_loop(first_step);
  for (std::int64_t step = first_step; step < deck.train.steps; ++step) {
    if (const auto note = data.epoch_note(step); note && speaks) Log::info("{}", *note);
    const float lr = schedule.at(step);
    const std::int64_t done = step + 1;
    FlightRecorder::set_step(done);
    if (options.before_step) options.before_step(done);
    Timeline::begin_step(done);
    const StepResult result = train_step.run(done, lr);
    add_timeline_counters(train_step, model);
    if (result.skipped && speaks) Log::warn("{}", result.nonfinite);
    progress.completed(done, lr);
    const bool last = done == deck.train.steps || done == options.stop_after_step;
    std::optional<double> val;
    if (evaluator.due(done, last)) {
      const auto t0 = std::chrono::steady_clock::now();
      const TimelineScope span(timeline_names::eval);
      val = evaluator.run();
      metrics.add_eval_seconds(seconds_since(t0));
      timers.mark(kEval);
    }
    if (samples.due(done)) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string text = [&] {
        const TimelineScope span(timeline_names::sample);
        return samples.run();
      }();
      if (speaks) Log::info("{}\n{}\n---- end of sample ----", samples.heading(done), text);
      metrics.add_eval_seconds(seconds_since(t0));  // forwards without a backward, as evaluation's
      timers.mark(kEval);
    }
    if (checkpointer.due(done, last)) {
      timers.mark(kOther);
      // A save is collective (parallel HDF5): a rank lost in it must not hang the others either.
      const CollectiveWatchdog::Region watched(fmt::format("checkpoint save of step {}", done));
      const TimelineScope span(timeline_names::checkpoint);
      checkpointer.save(done);
      timers.mark(kCheckpoint);
    }
    metrics.after_step(done, result, train_step.fsdp_stats_of_last_step(), lr, val, last);
    checkpointer.poll();
    Timeline::end_step(done);
    if (done == options.stop_after_step) break;
    // The signal any rank received (the largest number when ranks got different ones), the same on every rank.
    const int signal = options.handle_preemption && !last
                           ? static_cast<int>(parallel.max_over_ranks(preemption_signal())) : 0;
    if (signal != 0) {
      // Finish cleanly: the save is synchronous and waits for any background one, so nothing is in flight.
      const CollectiveWatchdog::Region watched(fmt::format("checkpoint save of step {} (preemption)", done));
      checkpointer.finish();
      const std::string where = checkpointer.enabled() ? checkpointer.save_and_wait(done)
                                                       : "no checkpoint (checkpoint.interval is 0)";
      if (speaks)
        Log::info("preempted: signal {} received; stopped after step {} of {}, saved {}; resume with "
                  "checkpoint.resume: auto (exit code {})", signal, done, deck.train.steps, where,
                  kPreemptedExitCode);
      preempted = true;
      break;
    }
  }
  {
    const CollectiveWatchdog::Region watched("the last checkpoint save");
    checkpointer.finish();  // the last save completes before the run reports
  }
  Timeline::finish();  // a run stopped before run.trace's last step writes what it recorded
  TrainSummary summary = metrics.finish(model, data.entropy_floor());
  summary.preempted = preempted;
  // What crossed between hosts, from fsdpp's own counters (comm/traffic.hpp): tests/cluster/ checks it against
  // the links' byte counters.
  if (const std::vector<std::string> hosts = hosts_for_traffic(comm); !hosts.empty()) {
    const std::vector<DimensionTraffic> traffic = traffic_by_dimension(comm, hosts);
    if (speaks) Log::info("{}", format_traffic(traffic, hosts));
  }
  return summary;
}

}  // namespace fsdpp
