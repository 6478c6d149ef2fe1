#include "fsdpp/train/checkpointer.hpp"

#include "fsdpp/ckpt/resume.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/train/nonfinite.hpp"
#include "fsdpp/train/reproducible.hpp"

#include <chrono>
#include <filesystem>

namespace fsdpp {

void ProgressState::state_dict(StateDict& out) const {
  out.set("tokens_seen", static_cast<std::int64_t>(tokens_per_step_) * step_);
  out.set("lr", lr_);
}

void ProgressState::load_state_dict(const StateDict& in) { lr_ = in.get<double>("lr"); }

void ModelState::state_dict(StateDict& out) const {
  out.params.insert(out.params.end(), params_.begin(), params_.end());
  if (optimizer_) out.optimizer = optimizer_;
}

Checkpointer::Checkpointer(MPI_Comm comm, const Deck& deck, const Parallelism& parallel, std::vector<Stateful*> parts,
                           ProgressState& progress, bool speaks)
    : comm_(comm), deck_(deck), parallel_(parallel), parts_(std::move(parts)), progress_(progress), speaks_(speaks),
      interval_(deck.checkpoint.interval) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &world_size_);
  stage_rank_ = rank_;
  meta_.mesh = parallel.describe();
  meta_.strategy = std::string(to_string(deck.fsdp.strategy));
  meta_.param_dtype = std::string(dtype_name(deck.fsdp.param_dtype));
  meta_.reduce_dtype = std::string(dtype_name(deck.fsdp.reduce_dtype));
  meta_.deck = resolved_deck_yaml(deck);
  if (deck.checkpoint.async && interval_ > 0)
    background_ = std::make_unique<AsyncCheckpointer>(comm, deck.checkpoint.on_error);
}

Checkpointer::~Checkpointer() = default;

void Checkpointer::set_pipeline_stage(MPI_Comm stage, int index, int stages) {
  stage_ = stage;
  stage_index_ = index;
  MPI_Comm_rank(stage, &stage_rank_);
  meta_.mesh = fmt::format("pp={} x {}", stages, parallel_.describe());
}

// Every part's state dict, merged: tensors by reference, scalars by value (their current values).
CheckpointContents Checkpointer::contents() const {
  StateDict all;
  for (const Stateful* part : parts_) part->state_dict(all);
  all.set("step", progress_.step());  // also the file's name; written from TrainProgress::step
  CheckpointContents c;
  c.params = all.params;
  c.optimizer = all.optimizer;
  c.writes_shards = parallel_.writes_checkpoint_shards();
  if (parallel_.layout().tp > 1) c.tensor_parallel = parallel_.mesh().mpi_comm("tp");
  c.stage = stage_;
  c.stage_index = stage_index_;
  for (const auto& entry : all.scalars)
    if (entry.first != "step") c.scalars.push_back(entry);
  return c;
}

std::int64_t Checkpointer::resume() {
  const CheckpointConfig& cfg = deck_.checkpoint;
  if (cfg.resume == ResumeMode::off) return 0;
  // `latest` is a hint: a damaged one makes the choice scan the folder; auto starts fresh only in an empty one.
  const ResumeChoice choice = choose_resume(comm_, cfg.dir, cfg.resume, cfg.resume_path);
  if (speaks_ && !choice.log.empty()) Log::info("{}", choice.log);
  const std::optional<std::string>& latest = choice.path;
  if (!latest) return 0;
  const LoadReport loaded = load_checkpoint(comm_, *latest, contents());
  check_reproducible_resume(deck_, loaded.saved_mesh, *latest);  // every rank read the same mesh
  StateDict scalars;
  scalars.scalars = loaded.progress.scalars;
  for (Stateful* part : parts_) part->load_state_dict(scalars);
  const std::int64_t first_step = loaded.progress.step;
  progress_.completed(first_step, static_cast<float>(scalars.get<double>("lr")));
  if (speaks_) {
    Log::info("resumed from {} at step {} (saved on {} ranks, {}; {:.1f} MiB read by rank 0 in {:.2f} s)", *latest,
              first_step, loaded.saved_world_size, loaded.saved_mesh, loaded.bytes / 1048576.0, loaded.seconds);
    const int G = deck_.train.global_batch;
    if (loaded.saved_world_size != world_size_)
      Log::info("data: the sample order is global, so resuming on {} ranks instead of {} continues it at global "
                "batch {}: each rank now takes its {} of the {} sequences of every batch, none repeated or skipped",
                world_size_, loaded.saved_world_size, first_step, G / world_size_, G);
    if (const std::string note = resume_past_end_note(*latest, first_step, deck_.train.steps); !note.empty())
      Log::warn("{}", note);
  }
  return first_step;
}

void Checkpointer::report_background(const std::optional<SaveResult>& done) {
  if (!done || background_reported_ || !speaks_) return;
  Log::info("checkpoint: step {} written in the background to {} ({:.1f} MiB: this rank's shards written in "
            "{:.2f} s, committed in {:.2f} s; {:.2f} s from staging to commit)", background_step_, done->path,
            done->bytes / 1048576.0, done->write_seconds, done->commit_seconds, done->seconds);
  background_reported_ = true;
}

void Checkpointer::save(std::int64_t done) {
  TrainProgress progress;
  progress.step = done;
  // The file holds each rank's shards, read from the parameters' values: whole ones would be saved as shard 0's rows.
  FSDPP_CHECK(parallel_.parameters_sharded(), "checkpoint: step {} would be saved while parameters are gathered "
              "whole; every unit must be resharded before a save", done);
  const CheckpointContents c = contents();
  progress.scalars = c.scalars;
  // Never a checkpoint of diverged weights: 'latest' keeps naming the last one saved from finite values.
  const auto bad = first_nonfinite(comm_, c.params, ParamTensor::value, stage_index_);
  FSDPP_REQUIRE(!bad, "checkpoint: refusing to save step {}: parameter '{}' holds NaN or Inf values; '{}' keeps "
                "its last checkpoint of finite weights", done, bad.value_or(""), deck_.checkpoint.dir);
  if (background_) {
    report_background(background_->wait());
    const auto t0 = std::chrono::steady_clock::now();
    CheckpointSnapshot snapshot = stage_checkpoint(c, progress, meta_, stage_rank_);
    merge_stage_snapshots(comm_, c, snapshot);  // under a pipeline: every stage's tensors, on every rank
    background_->start(std::move(snapshot), deck_.checkpoint.dir, deck_.checkpoint.keep_last);
    background_step_ = saved_step_ = done;
    background_reported_ = !background_->in_flight();  // a failed start was reported (on_error: continue)
    if (speaks_ && background_->in_flight())
      Log::info("checkpoint: step {} staged in {:.3f} s; writing in the background", done,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return;
  }
  saved_step_ = done;
  const SaveResult result = save_checkpoint(comm_, deck_.checkpoint.dir, c, progress, meta_, deck_.checkpoint.keep_last,
                                            deck_.checkpoint.on_error);
  if (speaks_ && result.error.empty())
    Log::info("checkpoint: saved step {} to {} ({:.1f} MiB in {:.2f} s, {:.2f} GB/s)", done, result.path,
              result.bytes / 1048576.0, result.seconds, result.bytes / std::max(result.seconds, 1e-9) / 1e9);
}

std::string Checkpointer::save_and_wait(std::int64_t done) {
  finish();
  const auto keep = std::move(background_);  // a synchronous save from here on
  if (done != saved_step_) save(done);       // an interval save of this very step is not written twice
  return (std::filesystem::path(deck_.checkpoint.dir) / checkpoint_file_name(done)).string();
}

void Checkpointer::poll() {
  // A background save is committed at the first step boundary after every rank has written its shards.
  if (background_ && background_->in_flight()) report_background(background_->poll());
}

void Checkpointer::finish() {
  if (background_) report_background(background_->wait());
}

}  // namespace fsdpp
