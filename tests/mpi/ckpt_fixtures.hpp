#pragma once
// Shared by the checkpoint tests: a small sharded GPT with AdamW state, a folder every rank sees, progress.
#include "mpi_test.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/optim/adamw.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <unistd.h>

namespace fsdpp::test {

inline ModelConfig ckpt_config(bool tied = true, int n_embd = 10) {
  ModelConfig c;
  c.vocab_size = 13, c.context_length = 5, c.n_embd = n_embd, c.n_layer = 2, c.n_head = 2, c.tie_embeddings = tied;
  return c;
}

// A sharded model with AdamW state after `steps` steps, on `comm` with `mesh`.
struct Trained {
  std::unique_ptr<DeviceMesh> mesh;
  std::unique_ptr<Gpt> model;
  std::unique_ptr<AdamW> optimizer;
  CheckpointContents contents() {
    CheckpointContents c;
    c.params = model->parameters();
    c.optimizer = optimizer.get();
    c.writes_shards = mesh->ndim() == 1 || mesh->coordinate(0) == 0;
    return c;
  }
  // Every parameter and optimizer state, whole.
  std::vector<std::vector<float>> gathered() {
    std::vector<std::vector<float>> out;
    for (Parameter* p : model->parameters()) {
      out.push_back(gather_full_parameter(*p, *mesh));
      for (auto& [name, view] : optimizer->state_tensors(*p)) {
        Parameter shadow = *p;  // the state, gathered with the parameter's placement
        shadow.show_shard(view, View1<float>());
        out.push_back(gather_full_parameter(shadow, *mesh));
      }
    }
    return out;
  }
};

inline Trained build(MPI_Comm comm, const std::vector<MeshDim>& shape, int steps, const ModelConfig& config = ckpt_config()) {
  Trained t;
  t.mesh = std::make_unique<DeviceMesh>(comm, shape);
  t.model = std::make_unique<Gpt>(config);
  for (Block* b : t.model->blocks()) fully_shard(*b, *t.mesh);
  fully_shard(*t.model, *t.mesh);
  t.model->to_empty();
  t.model->reset_parameters(7);
  t.optimizer = std::make_unique<AdamW>(t.model->parameters(), AdamWConfig{});
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  for (int s = 0; s < steps; ++s) {
    std::vector<std::int32_t> in(10), tg(10);
    for (int i = 0; i < 10; ++i) in[i] = (i * 3 + s + rank) % 13, tg[i] = (i * 5 + s + rank) % 13;
    View1<std::int32_t> tokens("tokens", 10), targets("targets", 10);
    Kokkos::deep_copy(tokens, HostView1<std::int32_t>(in.data(), 10));
    Kokkos::deep_copy(targets, HostView1<std::int32_t>(tg.data(), 10));
    Flow flow;
    flow.B = 2, flow.T = 5, flow.tokens = tokens, flow.targets = targets;
    t.model->zero_grad();
    (*t.model)(flow);
    (*t.model)(flow, Pass::backward);
    t.optimizer->step(1e-2f);
  }
  return t;
}

inline std::string shared_temp_dir(MPI_Comm comm, const std::string& tag) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  char name[256] = {0};
  if (rank == 0) {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("fsdpp-ckpt-{}-{}", tag, ::getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::snprintf(name, sizeof name, "%s", dir.c_str());
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
  return name;
}

inline TrainProgress progress_at(std::int64_t step) {
  TrainProgress p;
  p.step = step;
  p.scalars = {{"tokens_seen", std::int64_t{step * 10}}, {"sampler_seed", std::uint64_t{5}},
               {"sampler_next_step", std::int64_t{step}}, {"lr", 1e-2}};
  return p;
}

// Runs `f` on the first n ranks of `comm` only.
template <class F> inline void on_first(MPI_Comm comm, int n, F&& f) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm group;
  MPI_Comm_split(comm, rank < n ? 0 : MPI_UNDEFINED, rank, &group);
  if (group != MPI_COMM_NULL) {
    f(group);
    MPI_Comm_free(&group);
  }
  MPI_Barrier(comm);
}

}  // namespace fsdpp::test
