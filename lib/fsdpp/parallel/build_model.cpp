#include "fsdpp/parallel/build_model.hpp"

namespace fsdpp {

std::vector<float> TrainModel::whole(const Parameter& p) const {
  if (p.tensor_parallel() && p.tensor_parallel()->expert)  // sharded on the experts' mesh, split over ep
    return gather_full_parameter(p, *parallel->expert_fsdp_mesh(), parallel->expert_parallel_group());
  return gather_full_parameter(p, parallel->fsdp_mesh(), parallel->tensor_parallel_group());
}

TrainModel build_model(MPI_Comm comm, const Deck& deck) {
  TrainModel t;
  t.model = make_model(deck);
  if (deck.mesh.pp > 1) {
    t.pipeline = std::make_unique<PipelineParallel>(comm, deck, *t.model);
    t.model->keep_pipeline_stage(t.pipeline->topology().part());
    t.parallel = parallelize(*t.model, pipeline_stage_deck(deck), t.pipeline->topology().stage_comm());
    t.pipeline->tied_embedding().tie_gradients(*t.model);
  } else {
    t.parallel = parallelize(*t.model, deck, comm);
  }
  t.model->to_empty();
  t.model->reset_parameters(deck.run.seed);
  return t;
}

}  // namespace fsdpp
