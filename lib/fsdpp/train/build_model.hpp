#pragma once
// The model a deck describes, built the one way every entry point shares (train, init, benchmarks): on meta,
// sharded with fully_shard per block and then the root as fsdp.strategy and mesh say, given storage for the
// local shards only, and filled from the counter-based init of run.seed.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/gpt.hpp"

#include <memory>

namespace fsdpp {

struct TrainModel {
  std::unique_ptr<Gpt> model;
  std::unique_ptr<DeviceMesh> mesh;  // null under no_shard (parameters replicated)
  FsdpGroup* root_group = nullptr;
  bool sharded() const { return mesh != nullptr; }
  // The whole tensor of `p` on every rank (gathered from the shards when sharded).
  std::vector<float> whole(const Parameter& p) const;
};

GptConfig model_config(const ModelConfig& m);
TrainModel build_model(MPI_Comm comm, const Deck& deck);  // collective

// `fsdpp init`: writes the initial weights as a consolidated file (whole tensors), the same for any number of
// ranks or mesh. Collective; rank 0 writes.
void write_seed_checkpoint(MPI_Comm comm, const Deck& deck, const std::string& out);

}  // namespace fsdpp
