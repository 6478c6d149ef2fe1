#pragma once
// PipelineTopology: where a rank sits in the pipeline of mesh.pp (pipeline_parallel.hpp draws it), and the two
// groups that follow from it: its stage's ranks (the world of everything inside the stage) and the pp group (one
// rank per stage: the messages travel on it, and the scalars the stages share, from_last_stage).
#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/language_model.hpp"
#include "fsdpp/parallel/pipeline_schedule.hpp"
#include "fsdpp/parallel/pipeline_stages.hpp"

#include <mpi.h>

#include <memory>
#include <vector>

namespace fsdpp {

class PipelineTopology {
 public:
  // Collective over `world`. `whole`: the deck's whole model on meta (its per-block FLOPs balance the stages).
  // UsageError, on every rank alike, for a job size or a pipeline the deck cannot run.
  PipelineTopology(MPI_Comm world, const Deck& deck, const LanguageModel& whole);
  ~PipelineTopology();
  PipelineTopology(const PipelineTopology&) = delete;
  PipelineTopology& operator=(const PipelineTopology&) = delete;

  // This stage's ranks: the world of everything inside the stage (parallelize, the data feed, checkpoints).
  MPI_Comm stage_comm() const { return stage_comm_; }
  MPI_Comm pp_comm() const { return pp_comm_; }  // one rank per stage: this rank's place in each
  // This rank's place in the pipeline, 0 .. pp - 1 (the stage of its ranks; under interleaving it holds global
  // stages stage() + c pp for chunks c = 0 .. v - 1).
  int stage() const { return stage_; }
  int stages() const { return stages_; }  // pp
  int virtual_stages() const { return virtual_stages_; }  // v: chunks per rank
  int global_stage(int chunk) const { return chunk * stages_ + stage_; }
  int local_chunk_of(int global_stage) const { return global_stage / stages_; }  // inverse of global_stage
  bool first() const { return stage_ == 0; }  // holds the embedding (global stage 0)
  bool last() const { return stage_ == stages_ - 1; }  // holds the head (global stage pp v - 1)
  bool last_stage(int global) const { return global == stages_ * virtual_stages_ - 1; }
  const StageSplit& split() const { return split_; }  // over the pp x v global stages
  PipelineStagePart part() const;  // what this rank's model keeps: its chunks
  PipelineShape shape(int microbatches) const { return {stages_, virtual_stages_, microbatches}; }
  // The world rank of this place in pipeline rank `rank`'s stage (messages name it).
  int stage_world_rank(int rank) const { return stage_world_ranks_[static_cast<std::size_t>(rank)]; }
  // The MPI tag of a message (pp_comm), and the largest this MPI allows (MPI_TAG_UB).
  int message_tag(int from_stage, int microbatch, bool gradient) const {
    return (microbatch * stages_ * virtual_stages_ + from_stage) * 2 + (gradient ? 1 : 0);
  }
  int tag_limit() const { return tag_limit_; }

  // The pp group (one rank per stage) for scalars: the loss from the last stage, gradient norms.
  Communicator& stages_group() const { return *pp_group_; }
  double from_last_stage(double value) const;  // the last stage's value on every stage
  void from_last_stage(std::vector<double>& values) const;  // the same for a vector of the same size on every stage

 private:
  int stages_ = 1, stage_ = 0, virtual_stages_ = 1;
  StageSplit split_;
  MPI_Comm stage_comm_ = MPI_COMM_NULL;
  MPI_Comm pp_comm_ = MPI_COMM_NULL;
  std::unique_ptr<MpiCommunicator> pp_group_;  // on pp_comm_
  std::vector<int> stage_world_ranks_;
  int tag_limit_ = 32767;  // MPI_TAG_UB: the standard's least
};

}  // namespace fsdpp
