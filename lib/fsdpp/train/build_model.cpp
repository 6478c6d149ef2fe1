#include "fsdpp/train/build_model.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/runtime/error.hpp"

namespace fsdpp {

GptConfig model_config(const ModelConfig& m) {
  GptConfig c;
  c.vocab_size = m.vocab_size;
  c.context_length = m.context_length;
  c.n_embd = m.n_embd;
  c.n_layer = m.n_layer;
  c.n_head = m.n_head;
  c.tie_embeddings = m.tie_embeddings;
  return c;
}

std::vector<float> TrainModel::whole(const Parameter& p) const {
  if (mesh) return gather_full_parameter(p, *mesh);
  std::vector<float> out(static_cast<std::size_t>(p.numel()));
  Kokkos::deep_copy(HostView1<float>(out.data(), out.size()), p.value);
  return out;
}

TrainModel build_model(MPI_Comm comm, const Deck& deck) {
  TrainModel t;
  t.model = std::make_unique<Gpt>(model_config(deck.model));
  Gpt& model = *t.model;
  if (deck.fsdp.strategy != ShardStrategy::no_shard) {
    const std::vector<MeshDim> dims = deck.mesh.dims();
    FSDPP_REQUIRE(deck.fsdp.strategy != ShardStrategy::hybrid_shard || dims.size() == 2,
                  "fsdp.strategy hybrid_shard needs a 2-D mesh: set mesh.dp_replicate (and mesh.dp_shard)");
    FSDPP_REQUIRE(deck.fsdp.strategy == ShardStrategy::hybrid_shard || dims.size() == 1,
                  "mesh.dp_replicate is set, which makes a 2-D mesh: use fsdp.strategy hybrid_shard, or remove "
                  "mesh.dp_replicate");
    t.mesh = std::make_unique<DeviceMesh>(comm, dims);
    FullyShardOptions block_options;
    block_options.mp_policy.param_dtype = deck.fsdp.param_dtype;
    block_options.mp_policy.reduce_dtype = deck.fsdp.reduce_dtype;
    block_options.mp_policy.output_dtype = deck.fsdp.output_dtype;
    block_options.offload_policy.cpu = deck.fsdp.offload == OffloadPolicy::cpu;
    const auto& raf = deck.fsdp.reshard_after_forward;
    if (deck.fsdp.strategy == ShardStrategy::shard_grad_op || raf.kind == ReshardAfterForward::Kind::no)
      block_options.reshard_after_forward = false;
    else if (raf.kind == ReshardAfterForward::Kind::yes)
      block_options.reshard_after_forward = true;
    else if (raf.kind == ReshardAfterForward::Kind::group)
      block_options.reshard_after_forward_ranks = raf.group_size;
    for (Block* block : model.blocks()) fully_shard(*block, *t.mesh, block_options);
    FullyShardOptions root_options;
    root_options.mp_policy = block_options.mp_policy;
    root_options.offload_policy = block_options.offload_policy;
    if (block_options.reshard_after_forward == false) root_options.reshard_after_forward = false;
    t.root_group = &fully_shard(model, *t.mesh, root_options);
  }
  model.to_empty();
  model.reset_parameters(deck.run.seed);
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
