#pragma once
// Checkpointer: saves and restores the Stateful parts of training (the model, the optimizer, the data
// sampler's position, the schedule and progress) through their state dicts, at checkpoint.interval, at the
// last step and on preemption; synchronously, or in the background with checkpoint.async. It resumes as
// checkpoint.resume says. The checkpoint format itself is ckpt/checkpoint.hpp's.
#include "fsdpp/ckpt/async_save.hpp"
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/parallel/parallelize.hpp"

#include <mpi.h>

#include <memory>
#include <vector>

namespace fsdpp {

// Steps done, tokens seen and the last learning rate: the scalars of progress a checkpoint records.
class ProgressState final : public Stateful {
 public:
  explicit ProgressState(double tokens_per_step) : tokens_per_step_(tokens_per_step) {}
  void completed(std::int64_t step, float lr) {
    step_ = step;
    lr_ = lr;
  }
  std::int64_t step() const { return step_; }
  void state_dict(StateDict& out) const override;
  void load_state_dict(const StateDict& in) override;

 private:
  double tokens_per_step_;
  std::int64_t step_ = 0;
  double lr_ = 0;
};

// The parameters (sharded or whole) and the optimizer's state, by reference.
class ModelState final : public Stateful {
 public:
  ModelState(std::vector<Parameter*> params, Optimizer* optimizer) : params_(std::move(params)), optimizer_(optimizer) {}
  void state_dict(StateDict& out) const override;
  void load_state_dict(const StateDict&) override {}  // filled in place by the load

 private:
  std::vector<Parameter*> params_;
  Optimizer* optimizer_;
};

class Checkpointer {
 public:
  Checkpointer(MPI_Comm comm, const Deck& deck, const Parallelism& parallel, std::vector<Stateful*> parts,
               ProgressState& progress, bool speaks);
  ~Checkpointer();

  // Collective. Restores every part from the checkpoint checkpoint.resume names, if any, and returns the
  // step to continue from (0 when starting fresh).
  std::int64_t resume();
  bool due(std::int64_t done, bool last) const {
    return interval_ > 0 && (done % interval_ == 0 || last);
  }
  bool enabled() const { return interval_ > 0; }
  // Collective: saves the state after `done` steps (in the background with checkpoint.async). UsageError, and
  // nothing written, when a parameter holds a NaN or Inf on any rank.
  void save(std::int64_t done);
  // Collective: waits for a background save, then saves synchronously (unless step `done` was just saved);
  // returns the file's path.
  std::string save_and_wait(std::int64_t done);
  // mesh.pp > 1: the stage this rank's parameters are (before resume and the first save).
  void set_pipeline_stage(MPI_Comm stage, int index, int stages);
  void poll();    // collective: commits a background save whose shards are written
  void finish();  // collective: the save in flight completes

 private:
  CheckpointContents contents() const;
  void report_background(const std::optional<SaveResult>& done);

  MPI_Comm comm_;
  const Deck& deck_;
  const Parallelism& parallel_;
  std::vector<Stateful*> parts_;
  ProgressState& progress_;
  bool speaks_;
  std::int64_t interval_;
  int rank_ = 0, world_size_ = 1;
  MPI_Comm stage_ = MPI_COMM_NULL;  // pipeline parallelism: this rank's stage (CheckpointContents::stage)
  int stage_index_ = 0, stage_rank_ = 0;
  CheckpointMeta meta_;
  std::unique_ptr<AsyncCheckpointer> background_;
  std::int64_t background_step_ = 0;
  std::int64_t saved_step_ = -1;  // the step of the last save started
  bool background_reported_ = true;
};

}  // namespace fsdpp
