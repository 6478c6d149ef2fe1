#include "fsdpp/ckpt/seed_checkpoint.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/parallel/build_model.hpp"

#include <memory>

namespace fsdpp {

void write_seed_checkpoint(MPI_Comm comm, const Deck& deck, const std::string& out) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const TrainModel t = build_model(comm, deck);
  std::unique_ptr<ConsolidatedWriter> writer;
  if (rank == 0) writer = std::make_unique<ConsolidatedWriter>(out, "fsdpp init (seed " + std::to_string(deck.run.seed) + ")", 0);
  for (Parameter* p : t.model->parameters()) {
    const std::vector<float> whole = t.whole(*p);  // collective when sharded
    if (writer) writer->add(p->name(), p->shape(), whole.data());
  }
}

}  // namespace fsdpp
