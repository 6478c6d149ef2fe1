#include "fsdpp/parallel/pipeline_topology.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/observe/flight_recorder.hpp"

#include <string>

namespace fsdpp {

PipelineTopology::PipelineTopology(MPI_Comm world, const Deck& deck, const LanguageModel& whole)
    : stages_(deck.mesh.pp), virtual_stages_(deck.pipeline.virtual_stages) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  check_job_size(deck.mesh, size);
  check_pipeline(deck.model, deck.mesh, deck.pipeline);
  const int per_stage = size / stages_;
  stage_ = rank / per_stage;
  const int place = rank % per_stage;
  split_ = split_stages(whole.flops_per_token_by_piece(deck.model.context_length), stages_ * virtual_stages_,
                        deck.pipeline.split);
  MPI_Comm_split(world, stage_, place, &stage_comm_);
  MPI_Comm_split(world, place, stage_, &pp_comm_);
  pp_group_ = std::make_unique<MpiCommunicator>(pp_comm_);
  pp_group_->set_label("pp");  // the flight recorder's and the traffic table's name for it
  int* tag_ub = nullptr;
  int has_tag_ub = 0;
  MPI_Comm_get_attr(pp_comm_, MPI_TAG_UB, &tag_ub, &has_tag_ub);
  if (has_tag_ub && tag_ub) tag_limit_ = *tag_ub;
  stage_world_ranks_.resize(static_cast<std::size_t>(stages_));
  MPI_Allgather(&rank, 1, MPI_INT, stage_world_ranks_.data(), 1, MPI_INT, pp_comm_);
}

PipelineTopology::~PipelineTopology() {
  pp_group_.reset();
  if (pp_comm_ != MPI_COMM_NULL) MPI_Comm_free(&pp_comm_);
  if (stage_comm_ != MPI_COMM_NULL) MPI_Comm_free(&stage_comm_);
}

PipelineStagePart PipelineTopology::part() const { return pipeline_stage_part(split_, stages_, stage_); }

double PipelineTopology::from_last_stage(double value) const {
  static const std::string name = "pipeline loss from the last stage";  // FlightSite keeps a pointer to it
  const FlightSite site(name);
  pp_group_->broadcast(&value, 1, stages_ - 1);
  return value;
}

void PipelineTopology::from_last_stage(std::vector<double>& values) const {
  static const std::string name = "pipeline statistics from the last stage";  // FlightSite keeps a pointer to it
  const FlightSite site(name);
  pp_group_->broadcast(values.data(), values.size(), stages_ - 1);
}

}  // namespace fsdpp
