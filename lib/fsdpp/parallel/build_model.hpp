#pragma once
// The model a deck describes, built the one way every entry point shares (train, init, eval, generate,
// benchmarks): on meta (nn/make_model.hpp), parallelized as the deck says (parallelize.hpp: the mesh, the
// backend, fully_shard per block and then the root; under mesh.pp each rank's stage, parallelized over the
// stage's ranks), given storage for the local shards only, and filled from
// the counter-based init of run.seed.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/make_model.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/parallel/pipeline_parallel.hpp"

#include <memory>
#include <vector>

namespace fsdpp {

struct TrainModel {
  std::unique_ptr<LanguageModel> model;     // under mesh.pp > 1 this rank's stage of it
  std::unique_ptr<PipelineParallel> pipeline;  // mesh.pp > 1; else null. Before `parallel`, which runs on its stage
  std::unique_ptr<Parallelism> parallel;
  // The whole tensor of `p` on every rank (gathered from the shards). Collective over the shard group.
  std::vector<float> whole(const Parameter& p) const;
};

TrainModel build_model(MPI_Comm comm, const Deck& deck);  // collective

}  // namespace fsdpp
