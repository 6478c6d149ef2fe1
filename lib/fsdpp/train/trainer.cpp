#include "fsdpp/train/trainer.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/dir_lock.hpp"
#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/observe/flight_service.hpp"
#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/observe/traffic.hpp"
#include "fsdpp/optim/deck_optimizer.hpp"
#include "fsdpp/optim/lr_schedule.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/runtime/memory_accounting.hpp"
#include "fsdpp/observe/watchdog.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/train/checkpointer.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/train/evaluator.hpp"
#include "fsdpp/train/periodic_parts.hpp"
#include "fsdpp/train/reproducible.hpp"
#include "fsdpp/train/training_samples.hpp"
#include "fsdpp/train/step_metrics.hpp"
#include "fsdpp/train/train_step.hpp"

#include <filesystem>
#include <fstream>
#include <memory>

namespace fsdpp {

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

// What lives around the whole run, in this order.
struct RunServices {
  RunServices(MPI_Comm comm, const Deck& deck)
      : gemm_precision(resolved_gemm_precision(deck)),
        blas_threads(reproducible_blas_threads(deck.train)),
        checkpoint_lock(comm, deck.checkpoint.dir, deck.checkpoint.interval > 0),
        flight(comm, static_cast<std::size_t>(deck.comm.flight_records), output_dir(deck) + "/flight",
               deck.comm.timeout_s),
        timeline(deck.run.trace_first, deck.run.trace_last, output_dir(deck) + "/trace", comm) {}
  static std::string output_dir(const Deck& deck) { return deck.run.output.empty() ? "." : deck.run.output; }

  // Every float GEMM of this run (training and evaluation) follows the deck; the previous setting returns
  // afterwards, so runs in one process do not leak precision into each other.
  const ScopedGemmPrecision gemm_precision;
  // Reproducible mode: one BLAS thread per rank for the run, so that every environment gives the same bits.
  const ScopedBlasThreads blas_threads;
  // One run saves into a checkpoint folder at a time; a second one stops here, on every rank.
  const CheckpointDirLock checkpoint_lock;
  // The last collectives of every rank, dumped to <run.output>/flight by the watchdog, an abort or SIGUSR2.
  const FlightService::Run flight;
  // run.trace: a timeline of the chosen steps in <run.output>/trace (observe/timeline.hpp).
  const Timeline::Run timeline;
};

// checkpoint.init_from: the weights of a checkpoint (or Hugging Face folder); the optimizer starts fresh.
// Under a pipeline each stage reads its own tensors over its own ranks; a failure on any stage stops every rank.
void initialize_weights(MPI_Comm comm, const Deck& deck, LanguageModel& model, const PipelineParallel* pipeline,
                        bool speaks) {
  if (deck.checkpoint.init_from == "none") return;
  if (!pipeline) {
    load_weights(comm, deck.checkpoint.init_from, model.parameters(), &deck.model);
  } else {
    std::string error;
    try {
      load_weights(pipeline->topology().stage_comm(), deck.checkpoint.init_from, model.parameters(), &deck.model, true);
    } catch (const std::exception& e) {
      error = fmt::format("pipeline stage {}: {}", pipeline->topology().stage(), e.what());
    }
    agree_on_error(comm, error);
  }
  if (speaks) Log::info("weights initialized from {}; training starts at step 0 with a fresh optimizer", deck.checkpoint.init_from);
}

// What crossed between hosts, from fsdpp's own counters (observe/traffic.hpp): tests/cluster/ checks it against
// the links' byte counters.
void report_traffic(MPI_Comm comm, bool speaks) {
  const std::vector<std::string> hosts = hosts_for_traffic(comm);
  if (hosts.empty()) return;
  const std::vector<DimensionTraffic> traffic = traffic_by_dimension(comm, hosts);
  if (speaks) Log::info("{}", format_traffic(traffic, hosts));
}

// The parts the step loop walks, built by train() in the order they depend on each other.
struct RunParts {
  DataFeed& data;
  const LrSchedule& schedule;
  TrainStep& step;
  LanguageModel& model;
  ProgressState& progress;
  StepMetrics& metrics;
  Evaluator& evaluator;
  EvaluationPart& evaluation;
  std::vector<PeriodicPart*> after_step;  // after each step, in this order
  Checkpointer& checkpointer;
  PreemptionPart& preemption;  // then, at the step boundary
};

// Steps first_step+1 .. train.steps (or options.stop_after_step), each followed by its periodic parts; a
// preemption agreed at a step boundary saves and ends the loop.
void run_steps(const Deck& deck, const TrainOptions& options, const RunParts& run, std::int64_t first_step,
               bool speaks) {
  run.metrics.start_loop(first_step);
  for (std::int64_t step = first_step; step < deck.train.steps; ++step) {
    if (const auto note = run.data.epoch_note(step); note && speaks) Log::info("{}", *note);
    const float lr = run.schedule.at(step);
    const std::int64_t done = step + 1;
    FlightRecorder::set_step(done);
    if (options.before_step) options.before_step(done);
    Timeline::begin_step(done);
    const StepResult result = run.step.run(done, lr);
    add_timeline_counters(run.step, run.model);
    if (result.skipped && speaks) Log::warn("{}", result.nonfinite);
    run.progress.completed(done, lr);
    const StepEnd end{done, done == deck.train.steps || done == options.stop_after_step};
    for (PeriodicPart* part : run.after_step)
      if (part->due(end)) run_part(*part, end, run.metrics);
    run.metrics.after_step(done, result, run.step.fsdp_stats_of_last_step(), lr, run.evaluation.loss_after(done),
                           end.last);
    // A mixture's share of the tokens by source, with each evaluation (and once at the end, in finish_run).
    if (speaks && !end.last && run.evaluator.due(done, end.last))
      if (const auto note = run.data.mixture_note()) Log::info("{}", *note);
    run.checkpointer.poll();
    Timeline::end_step(done);
    if (done == options.stop_after_step) break;
    if (run.preemption.due(end)) {
      run_part(run.preemption, end, run.metrics);
      break;
    }
  }
}

// After the loop: the last save completes, then the run reports (the end-of-run tables, the pipeline's bubble,
// the traffic between hosts).
TrainSummary finish_run(MPI_Comm comm, const RunParts& run, bool speaks) {
  {
    const CollectiveWatchdog::Region watched("the last checkpoint save");
    run.checkpointer.finish();
  }
  Timeline::finish();  // a run stopped before run.trace's last step writes what it recorded
  if (speaks)
    if (const auto note = run.data.mixture_note()) Log::info("{}", *note);
  TrainSummary summary = run.metrics.finish(run.model, run.data.entropy_floor());
  if (const PipelineStep* pipeline = run.step.pipeline_step()) {
    const std::string line = pipeline->summary(comm, run.data.accumulation_steps());
    if (speaks) Log::info("{}", line);
    summary.pipeline_bubble = pipeline->train_s() > 0 ? pipeline->train_waited_s() / pipeline->train_s() : 0.0;
  }
  summary.preempted = run.preemption.preempted();
  report_traffic(comm, speaks);
  return summary;
}

}  // namespace

TrainSummary train(MPI_Comm comm, const Deck& deck, TrainOptions options) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const bool speaks = rank == 0 && !options.quiet;
  MemoryAccounting::install();  // already done by the Runtime; harmless again
  MemoryAccounting::reset_peak();
  prepare_output(rank, deck);
  const RunServices services(comm, deck);

  // Built on meta, parallelized, then given storage and values: no rank ever holds the whole model, and
  // element i of every tensor gets the same value on any number of ranks.
  TrainModel built = build_model(comm, deck);
  LanguageModel& model = *built.model;
  Parallelism& parallel = *built.parallel;
  // Training's batch split, on every rank alike before any step (train_command's memory check, when on, has
  // refused such a launch before anything was allocated).
  grad_accum_steps(deck.train, parallel.data_parallel_size());
  DataFeed data(deck, parallel.data_parallel_size(), parallel.data_parallel_rank());
  initialize_weights(comm, deck, model, built.pipeline.get(), speaks);
  const auto optimizer = make_optimizer(deck.optim, model.parameters());
  const LrSchedule schedule = make_schedule(deck);

  StepMetrics metrics(comm, deck, parallel, speaks, options.measure_peak, options.prediction);
  const std::unique_ptr<LanguageModel> whole = built.pipeline ? make_model(deck) : nullptr;  // on meta
  metrics.banner(model, data, *optimizer, whole.get());
  TrainStep train_step(comm, model, parallel, *optimizer, data, deck.train, metrics.timers());
  train_step.set_pipeline(built.pipeline.get());
  Evaluator evaluator(model, parallel, data, deck.train);
  evaluator.set_pipeline(train_step.pipeline_step());
  TrainingSamples samples(comm, model, parallel, deck);
  samples.set_pipeline(built.pipeline.get());
  ProgressState progress(static_cast<double>(deck.train.global_batch) * deck.model.context_length);
  ModelState model_state(model.parameters(), optimizer.get());
  Checkpointer checkpointer(comm, deck, parallel, {&model_state, &data, &progress}, progress, speaks);
  if (built.pipeline)
    checkpointer.set_pipeline_stage(built.pipeline->topology().stage_comm(), built.pipeline->topology().stage(),
                                    built.pipeline->topology().stages());
  const std::int64_t first_step = checkpointer.resume();
  // After each step, in this order; then, at the step boundary, the preemption check.
  EvaluationPart evaluation(evaluator);
  SamplesPart sampling(samples, speaks);
  CheckpointPart saving(checkpointer);
  // Under a pipeline the Parallelism's host scalars cover one stage: a stop must be agreed by the whole job.
  MpiCommunicator job(comm);
  job.set_label("the job's ranks (the preemption check)");
  PreemptionPart preemption(options.handle_preemption, job, checkpointer, deck.train.steps, speaks);

  const CollectiveWatchdog::Running watchdog(deck.comm.timeout_s);  // until train() returns or throws
  const RunParts parts{data, schedule, train_step, model, progress, metrics, evaluator, evaluation,
                       {&evaluation, &sampling, &saving}, checkpointer, preemption};
  run_steps(deck, options, parts, first_step, speaks);
  return finish_run(comm, parts, speaks);
}

}  // namespace fsdpp
