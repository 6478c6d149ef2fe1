#include "fsdpp/train/build_model.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/runtime/error.hpp"

namespace fsdpp {

std::unique_ptr<LanguageModel> make_model(const ModelConfig& m) {
  switch (m.arch) {
    case ModelArch::gpt2: return std::make_unique<Gpt>(m);
    case ModelArch::llama: return std::make_unique<Llama>(m);
    case ModelArch::qwen2: return std::make_unique<Qwen2>(m);
  }
  throw UsageError(fmt::format("model.arch {} is not a model fsdpp builds", static_cast<int>(m.arch)));
}

std::vector<float> TrainModel::whole(const Parameter& p) const {
  return gather_full_parameter(p, parallel->data_parallel_mesh(), parallel->tensor_parallel_group());
}

TrainModel build_model(MPI_Comm comm, const Deck& deck) {
  TrainModel t;
  t.model = make_model(deck.model);
  t.parallel = parallelize(*t.model, deck, comm);
  t.model->to_empty();
  t.model->reset_parameters(deck.run.seed);
  return t;
}

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
