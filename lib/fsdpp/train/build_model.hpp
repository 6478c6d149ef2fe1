#pragma once
// The model a deck describes, built the one way every entry point shares (train, init, benchmarks): on meta,
// parallelized as the deck says (parallel/parallelize.hpp: the mesh, the backend, fully_shard per block and
// then the root), given storage for the local shards only, and filled from the counter-based init of
// run.seed.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/nn/qwen2.hpp"
#include "fsdpp/parallel/parallelize.hpp"

#include <memory>

namespace fsdpp {

struct TrainModel {
  std::unique_ptr<LanguageModel> model;
  std::unique_ptr<Parallelism> parallel;
  // The whole tensor of `p` on every rank (gathered from the shards). Collective over the shard group.
  std::vector<float> whole(const Parameter& p) const;
};

// The model the deck's model.arch names, on meta: the one place that chooses the architecture.
std::unique_ptr<LanguageModel> make_model(const ModelConfig& m);
TrainModel build_model(MPI_Comm comm, const Deck& deck);  // collective

// `fsdpp init`: writes the initial weights as a consolidated file (whole tensors), the same for any number of
// ranks or mesh. Collective; rank 0 writes.
void write_seed_checkpoint(MPI_Comm comm, const Deck& deck, const std::string& out);

}  // namespace fsdpp
