// fully_shard: N ranks, each with its share of the global batch, must train exactly the model one rank
// trains on the whole batch; plus init invariance, collective counts, memory and misuse errors.
#include "mpi_test.hpp"

#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/optim/grad_norm.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"

#include <cmath>
#include <string>

using namespace fsdpp;

namespace {

// Dimensions chosen so that no rank count divides them evenly: V 13 rows, wpe 5 rows (2,2,1,0 on 4 ranks).
ModelConfig parity_config(bool tied) {
  ModelConfig c;
  c.vocab_size = 13, c.context_length = 5, c.n_embd = 10, c.n_layer = 2, c.n_head = 2, c.tie_embeddings = tied;
  return c;
}

std::vector<float> host_copy(const View1<float>& v) {
  std::vector<float> out(v.extent(0));
  Kokkos::deep_copy(HostView1<float>(out.data(), out.size()), v);
  return out;
}

constexpr int kGlobalBatch = 48, kT = 5;  // 48: whole micro-batches on 1, 2, 3 and 4 ranks, also in quarters

// Sequence s of the global batch, deterministic: tokens and next-token targets.
std::int32_t token(int s, int t, int step) { return static_cast<std::int32_t>((s * 7 + t * 3 + step * 5 + s * t) % 13); }

struct Options {
  bool tied = true;
  std::vector<MeshDim> mesh{{"dp_shard", -1}};
  std::optional<bool> reshard_after_forward;
  int reshard_ranks = 0;
  MixedPrecisionPolicy mp;
  double tolerance = 1e-5;  // relative, on losses; rtol and atol on the final parameters
  bool clip_inf = false;    // clip by the inf-norm (0.05) instead of the 2-norm (1.0)
  bool offload = false;     // CPU offload
  bool divide_by_ranks = false;  // set_gradient_divide_factor(N): the same mean, as a sum times 1/N
  bool explicit_prefetch = false;  // root prefetches both blocks in forward; h.1 prefetches h.0 in backward
  int micro_batches = 1;          // per rank per step
  bool unsharded_accumulation = false;
  bool replica_all_reduce_last = false;  // HSDP: set_requires_all_reduce only on the last micro-batch
  int forward_prefetch = 1, backward_prefetch = 1;  // units ahead (FullyShardOptions)
};

struct ShardedRun {
  std::vector<double> losses;               // global mean loss per step
  std::vector<std::vector<float>> params;   // gathered whole parameters after the last step
  std::vector<std::string> names;
  FsdpStats first_step_counts;
  std::int64_t block_unsharded_bytes = 0;   // one block's whole parameters (f32), padded
  std::int64_t shard_bytes = 0;             // every group's padded shard on this rank (f32)
  double norm_l2 = 0, norm_inf = 0;         // of the first step's gradients, before clipping
};

// `steps` AdamW steps of the parity model sharded over `comm`; every rank takes its share of each batch.
ShardedRun train_sharded(MPI_Comm comm, const Options& o, int steps) {
  int N = 1, r = 0;
  MPI_Comm_size(comm, &N);
  MPI_Comm_rank(comm, &r);
  DeviceMesh mesh(comm, o.mesh);
  Gpt model(parity_config(o.tied));
  FullyShardOptions fo;
  fo.reshard_after_forward = o.reshard_after_forward;
  fo.reshard_after_forward_ranks = o.reshard_ranks;
  fo.mp_policy = o.mp;
  fo.offload_policy.cpu = o.offload;
  fo.forward_prefetch = o.forward_prefetch;
  fo.backward_prefetch = o.backward_prefetch;
  for (Block* b : model.blocks()) fully_shard(*b, mesh, fo);
  FullyShardOptions root = fo;
  root.reshard_after_forward_ranks = 0;
  if (!o.reshard_after_forward) root.reshard_after_forward.reset();
  fully_shard(model, mesh, root);
  if (o.explicit_prefetch) {
    fsdp_group(model)->set_modules_to_forward_prefetch({model.blocks()[0], model.blocks()[1]});
    fsdp_group(*model.blocks()[1])->set_modules_to_backward_prefetch({model.blocks()[0]});
  }
  if (o.divide_by_ranks)
    for (Module* m : model.modules())
      if (FsdpGroup* g = fsdp_group(*m)) g->set_gradient_divide_factor(N);
  model.to_empty();
  model.reset_parameters(2024);
  AdamWConfig ac;
  ac.lr = 1e-2f;
  AdamW opt(model.parameters(), ac);

  const int per_rank = kGlobalBatch / N, m = per_rank / o.micro_batches;
  ShardedRun run;
  run.block_unsharded_bytes = fsdp_group(*model.blocks()[0])->unsharded_numel() * 4;
  for (Module* g : model.modules())
    if (fsdp_group(*g)) run.shard_bytes += fsdp_group(*g)->sharded_numel() * 4;
  for (int step = 0; step < steps; ++step) {
    model.zero_grad();
    double loss = 0;
    for (int a = 0; a < o.micro_batches; ++a) {
      std::vector<std::int32_t> in(static_cast<std::size_t>(m) * kT), tg(in.size());
      for (int i = 0; i < m; ++i)
        for (int t = 0; t < kT; ++t) {
          const int s = r * per_rank + a * m + i;
          in[i * kT + t] = token(s, t, step);
          tg[i * kT + t] = token(s, t + 1, step);
        }
      View1<std::int32_t> tokens("tokens", in.size()), targets("targets", tg.size());
      Kokkos::deep_copy(tokens, HostView1<std::int32_t>(in.data(), in.size()));
      Kokkos::deep_copy(targets, HostView1<std::int32_t>(tg.data(), tg.size()));
      if (o.unsharded_accumulation) fsdp_group(model)->set_requires_gradient_sync(a == o.micro_batches - 1);
      if (o.replica_all_reduce_last) fsdp_group(model)->set_requires_all_reduce(a == o.micro_batches - 1);
      Flow flow;
      flow.B = m, flow.T = kT, flow.tokens = tokens, flow.targets = targets;
      flow.loss_scale = 1.0f / static_cast<float>(o.micro_batches);
      model(flow);
      model(flow, Pass::backward);
      loss += flow.loss / o.micro_batches;
    }
    Communicator& shards = mesh.comm(mesh.ndim() - 1);  // norms over shards only: HSDP replicas are copies
    if (step == 0) {
      run.first_step_counts = fsdp_stats(model);
      run.norm_l2 = global_grad_norm(model.parameters(), &shards, NormType::l2);
      run.norm_inf = global_grad_norm(model.parameters(), &shards, NormType::inf);
    }
    clip_grad_norm(model.parameters(), o.clip_inf ? 0.05 : 1.0, &shards, o.clip_inf ? NormType::inf : NormType::l2);
    opt.step(ac.lr);
    MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, comm);
    run.losses.push_back(loss / N);
  }
  for (Parameter* p : model.parameters()) {
    run.params.push_back(gather_full_parameter(*p, mesh));
    run.names.push_back(p->name());
  }
  return run;
}

// The reference: the same steps on a single rank (rank 0 of test_comm) with the whole batch, broadcast.
ShardedRun reference(MPI_Comm test_comm, int test_rank, const Options& o, int steps) {
  MPI_Comm solo;
  MPI_Comm_split(test_comm, test_rank == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  Options single = o;
  single.micro_batches = 1;
  single.unsharded_accumulation = false;
  single.replica_all_reduce_last = false;
  single.mesh = {{"dp_shard", -1}};
  single.reshard_ranks = 0;
  single.mp = MixedPrecisionPolicy{};  // the reference is always the f32 run, not offloaded
  single.offload = false;
  single.divide_by_ranks = false;
  single.explicit_prefetch = false;
  ShardedRun run;
  if (solo != MPI_COMM_NULL) {
    run = train_sharded(solo, single, steps);
    MPI_Comm_free(&solo);
  }
  run.losses.resize(static_cast<std::size_t>(steps));
  MPI_Bcast(run.losses.data(), steps, MPI_DOUBLE, 0, test_comm);
  MPI_Bcast(&run.norm_l2, 1, MPI_DOUBLE, 0, test_comm);
  MPI_Bcast(&run.norm_inf, 1, MPI_DOUBLE, 0, test_comm);
  int count = static_cast<int>(run.params.size());
  MPI_Bcast(&count, 1, MPI_INT, 0, test_comm);
  run.params.resize(static_cast<std::size_t>(count));
  for (auto& p : run.params) {
    long long n = static_cast<long long>(p.size());
    MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, test_comm);
    p.resize(static_cast<std::size_t>(n));
    MPI_Bcast(p.data(), static_cast<int>(n), MPI_FLOAT, 0, test_comm);
  }
  return run;
}

void check_parity(MPI_Comm test_comm, int test_rank, const Options& o) {
  const int steps = 10;
  const ShardedRun want = reference(test_comm, test_rank, o, steps);
  const ShardedRun got = train_sharded(test_comm, o, steps);
  for (int s = 0; s < steps; ++s) CHECK(got.losses[s] == doctest::Approx(want.losses[s]).epsilon(o.tolerance));
  // The norm over shards is the unsharded model's: nothing counted twice, nothing missed.
  CHECK(got.norm_l2 == doctest::Approx(want.norm_l2).epsilon(o.tolerance));
  CHECK(got.norm_inf == doctest::Approx(want.norm_inf).epsilon(o.tolerance));
  REQUIRE(got.params.size() == want.params.size());
  if (o.mp.param_dtype == DType::bf16 || o.mp.reduce_dtype == DType::bf16) {
    // bf16 rounding changes AdamW's step direction on small gradients, element by element; what stays within
    // bf16 tolerance is the model as a whole: the relative L2 distance of all parameters.
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < got.params.size(); ++i)
      for (std::size_t k = 0; k < got.params[i].size(); ++k) {
        diff += std::pow(double(got.params[i][k]) - want.params[i][k], 2);
        norm += std::pow(double(want.params[i][k]), 2);
      }
    CHECK(std::sqrt(diff / norm) <= o.tolerance);
    return;
  }
  // allclose(rtol = atol = tolerance), except the attention key bias: its gradient is zero in exact arithmetic
  // (a per-key constant cancels in the softmax), so AdamW turns rounding noise into updates that no two
  // summation orders agree on; its values are compared against that noise's scale only.
  const std::size_t C = static_cast<std::size_t>(parity_config(o.tied).n_embd);
  int mismatches = 0;
  for (std::size_t i = 0; i < got.params.size(); ++i)
    for (std::size_t k = 0; k < got.params[i].size(); ++k) {
      const bool key_bias = got.names[i].find("attn.c_attn.bias") != std::string::npos && k >= C && k < 2 * C;
      const double allowed = key_bias ? 1e-3 : o.tolerance * (std::fabs(want.params[i][k]) + 1.0);
      if (std::fabs(got.params[i][k] - want.params[i][k]) > allowed) {
        ++mismatches;
        MESSAGE(got.names[i] << "[" << k << "]: " << got.params[i][k] << " vs " << want.params[i][k]);
      }
    }
  CHECK(mismatches == 0);
}

}  // namespace

#define FSDPP_PARITY_AT(NP)                                                                                  \
  MPI_TEST_CASE("fsdp parity on " #NP " ranks: losses and final parameters match one rank", NP) {            \
    Options o;                                                                                               \
    SUBCASE("default resharding, tied") {}                                                                   \
    SUBCASE("reshard_after_forward true") { o.reshard_after_forward = true; }                                \
    SUBCASE("reshard_after_forward false (shard_grad_op)") { o.reshard_after_forward = false; }              \
    SUBCASE("untied embeddings") { o.tied = false; }                                                         \
    SUBCASE("clipping by the inf-norm") { o.clip_inf = true; }                                                \
    SUBCASE("CPU offload") { o.offload = true; }                                                             \
    SUBCASE("gradient divide factor = ranks (sum, then 1/N)") { o.divide_by_ranks = true; }                   \
    SUBCASE("explicit forward and backward prefetch") { o.explicit_prefetch = true; }                        \
    SUBCASE("4 micro-batches, sharded accumulation") { o.micro_batches = 4; }                                \
    SUBCASE("4 micro-batches, unsharded accumulation (no sync)") {                                           \
      o.micro_batches = 4;                                                                                   \
      o.unsharded_accumulation = true;                                                                       \
    }                                                                                                        \
    SUBCASE("bf16 parameters and reductions, within bf16 tolerance of f32") {                                \
      o.mp.param_dtype = o.mp.reduce_dtype = DType::bf16;                                                    \
      o.tolerance = 2e-2;                                                                                    \
    }                                                                                                        \
    check_parity(test_comm, test_rank, o);                                                                   \
  }
FSDPP_PARITY_AT(2)
FSDPP_PARITY_AT(3)
FSDPP_PARITY_AT(4)

MPI_TEST_CASE("fsdp parity on 4 ranks: HSDP 2x2 and reshard_after_forward = 2", 4) {
  Options o;
  SUBCASE("HSDP: replicate 2 x shard 2") { o.mesh = {{"dp_replicate", 2}, {"dp_shard", 2}}; }
  SUBCASE("HSDP with 2 micro-batches") {
    o.mesh = {{"dp_replicate", 2}, {"dp_shard", 2}};
    o.micro_batches = 2;
  }
  SUBCASE("HSDP with 3 micro-batches, the replica all-reduce on the last only") {
    o.mesh = {{"dp_replicate", 2}, {"dp_shard", 2}};
    o.micro_batches = 3;
    o.replica_all_reduce_last = true;
  }
  SUBCASE("reshard_after_forward = 2 (post-forward groups of 2 ranks)") { o.reshard_ranks = 2; }
  check_parity(test_comm, test_rank, o);
}

MPI_TEST_CASE("fsdp: HSDP with the replica all-reduce on the last micro-batch only all-reduces once per step", 4) {
  Options every;
  every.mesh = {{"dp_replicate", 2}, {"dp_shard", 2}};
  every.micro_batches = 3;
  Options last = every;
  last.replica_all_reduce_last = true;
  const ShardedRun e = train_sharded(test_comm, every, 1), l = train_sharded(test_comm, last, 1);
  // Three groups (two blocks, the root), each reduce-scattered every micro-batch either way.
  CHECK(e.first_step_counts.reduce_scatters == 9);
  CHECK(l.first_step_counts.reduce_scatters == 9);
  CHECK(l.first_step_counts.reduce_scatter_bytes == e.first_step_counts.reduce_scatter_bytes);
  CHECK(e.first_step_counts.all_reduces == 9);
  CHECK(l.first_step_counts.all_reduces == 3);
  // Each all-reduce moves one group's reduced f32 shard: once per group per step, 1/3 of the bytes, exactly.
  CHECK(l.shard_bytes > 0);
  CHECK(l.first_step_counts.all_reduce_bytes == l.shard_bytes);
  CHECK(e.first_step_counts.all_reduce_bytes == 3 * l.shard_bytes);
}

MPI_TEST_CASE("fsdp: bf16 all-gathers move half the bytes; HSDP all-reduces once per group", 4) {
  Options f32;
  const ShardedRun a = train_sharded(test_comm, f32, 1);
  Options half;
  half.mp.param_dtype = DType::bf16;
  const ShardedRun b = train_sharded(test_comm, half, 1);
  CHECK(a.first_step_counts.all_gather_bytes > 0);
  CHECK(b.first_step_counts.all_gather_bytes * 2 == a.first_step_counts.all_gather_bytes);
  Options hsdp;
  hsdp.mesh = {{"dp_replicate", 2}, {"dp_shard", 2}};
  const ShardedRun c = train_sharded(test_comm, hsdp, 1);
  CHECK(c.first_step_counts.reduce_scatters == 3);
  CHECK(c.first_step_counts.all_reduces == 3);
  CHECK(a.first_step_counts.all_reduces == 0);
}

MPI_TEST_CASE("fsdp: initial whole parameters are bitwise those of one rank, on 1-4 ranks, 1x4 and 2x2", 4) {
  const std::vector<std::vector<MeshDim>> meshes = {{{"dp_shard", 1}}, {{"dp_shard", 2}}, {{"dp_shard", 3}},
                                                     {{"dp_replicate", 1}, {"dp_shard", 4}},
                                                     {{"dp_replicate", 2}, {"dp_shard", 2}}};
  for (const auto& shape : meshes) {
    int n = 1;
    for (const auto& d : shape) n *= d.size;
    CAPTURE(format_mesh_shape(shape));
    MPI_Comm group;
    MPI_Comm_split(test_comm, test_rank < n ? 0 : MPI_UNDEFINED, test_rank, &group);
    std::vector<float> all;
    if (group != MPI_COMM_NULL) {
      DeviceMesh mesh(group, shape);
      Gpt model(parity_config(true));
      for (Block* b : model.blocks()) fully_shard(*b, mesh);
      fully_shard(model, mesh);
      model.to_empty();
      model.reset_parameters(99);
      for (Parameter* p : model.parameters())
        for (float x : gather_full_parameter(*p, mesh)) all.push_back(x);
      MPI_Comm_free(&group);
    }
    // Compare with rank 0's unsharded model, built without fully_shard.
    if (test_rank == 0) {
      Gpt plain(parity_config(true));
      plain.to_empty();
      plain.reset_parameters(99);
      std::vector<float> expected;
      for (Parameter* p : plain.parameters()) {
        std::vector<float> v(static_cast<std::size_t>(p->numel()));
        Kokkos::deep_copy(HostView1<float>(v.data(), v.size()), p->value());
        expected.insert(expected.end(), v.begin(), v.end());
      }
      CHECK(all == expected);
    }
  }
}

MPI_TEST_CASE("fsdp: collectives per step follow FSDP2's counts, and shards hold ceil(rows/N) rows", 3) {
  Options o;
  const ShardedRun run = train_sharded(test_comm, o, 1);
  const int groups = 3, blocks = 2;
  CHECK(run.first_step_counts.forward_all_gathers == groups);
  // Unsharded parameters at any time: the root (kept from forward to backward), the current block and the
  // prefetched one, plus the current block's all-gather buffer during its copy-out.
  std::int64_t root_bytes = 0, block_bytes = 0;
  {
    const ModelConfig c = parity_config(true);
    auto rows_bytes = [](std::int64_t rows, std::int64_t row_size) { return (rows + 2) / 3 * 3 * row_size * 4; };
    root_bytes = rows_bytes(c.vocab_size, c.n_embd) + rows_bytes(c.context_length, c.n_embd) + 2 * rows_bytes(c.n_embd, 1);
    const std::int64_t C = c.n_embd;
    block_bytes = 4 * rows_bytes(C, 1) + rows_bytes(3 * C, C) + rows_bytes(3 * C, 1) + rows_bytes(C, C) + rows_bytes(C, 1) +
                  rows_bytes(4 * C, C) + rows_bytes(4 * C, 1) + rows_bytes(C, 4 * C) + rows_bytes(C, 1);
  }
  CHECK(run.first_step_counts.peak_unsharded_param_bytes > 0);
  CHECK(run.first_step_counts.peak_unsharded_param_bytes <= root_bytes + 3 * block_bytes);
  CHECK(run.first_step_counts.backward_all_gathers == blocks);  // the root keeps its parameters for backward
  CHECK(run.first_step_counts.reduce_scatters == groups);

  DeviceMesh mesh(test_comm, {{"dp_shard", -1}});
  Gpt model(parity_config(true));
  for (Block* b : model.blocks()) fully_shard(*b, mesh);
  fully_shard(model, mesh);
  model.to_empty();
  std::int64_t expected = 0, local = 0;
  for (Parameter* p : model.parameters()) {
    expected += (p->rows() + 2) / 3 * p->row_size();
    local += static_cast<std::int64_t>(p->value().extent(0));
    CHECK(p->placement()->chunk_rows == (p->rows() + 2) / 3);
  }
  CHECK(local == expected);
  // wpe has 5 rows: 2, 2, 1 on three ranks.
  const std::int64_t wpe_rows[3] = {2, 2, 1};
  CHECK(model.wpe.placement()->local_rows == wpe_rows[test_rank]);
}

MPI_TEST_CASE("fsdp: prefetch depth 0, 1, 2 and explicit lists: bitwise the same run and all-gathers; depth 2 "
              "holds one unit more", 2) {
  auto run_with = [&](int forward, int backward, bool lists) {
    Options o;
    o.forward_prefetch = forward;
    o.backward_prefetch = backward;
    o.explicit_prefetch = lists;
    return train_sharded(test_comm, o, 3);
  };
  const ShardedRun one = run_with(1, 1, false);
  struct Case { int forward, backward; bool lists; };
  for (const Case c : {Case{0, 0, false}, Case{2, 2, false}, Case{0, 2, false}, Case{1, 1, true}, Case{0, 0, true}}) {
    CAPTURE(c.forward);
    CAPTURE(c.backward);
    CAPTURE(c.lists);
    const ShardedRun got = run_with(c.forward, c.backward, c.lists);
    REQUIRE(got.losses.size() == one.losses.size());
    for (std::size_t s = 0; s < got.losses.size(); ++s) CHECK(got.losses[s] == one.losses[s]);  // bitwise
    REQUIRE(got.params.size() == one.params.size());
    for (std::size_t i = 0; i < got.params.size(); ++i) CHECK(got.params[i] == one.params[i]);
    CHECK(got.first_step_counts.forward_all_gathers == one.first_step_counts.forward_all_gathers);
    CHECK(got.first_step_counts.backward_all_gathers == one.first_step_counts.backward_all_gathers);
    CHECK(got.first_step_counts.all_gather_bytes == one.first_step_counts.all_gather_bytes);
    CHECK(got.first_step_counts.reduce_scatters == one.first_step_counts.reduce_scatters);
  }
  // Two units ahead: one more unit's all-gathered parameters are held at the peak.
  const ShardedRun two = run_with(2, 2, false);
  CHECK(two.first_step_counts.peak_unsharded_param_bytes - one.first_step_counts.peak_unsharded_param_bytes ==
        one.block_unsharded_bytes);
  // None ahead: never more than depth 1.
  CHECK(run_with(0, 0, false).first_step_counts.peak_unsharded_param_bytes <=
        one.first_step_counts.peak_unsharded_param_bytes);
}

MPI_TEST_CASE("fsdp: CPU offload keeps shards in host memory and stages each collective through the device", 2) {
  DeviceMesh mesh(test_comm, {{"dp_shard", -1}});
  Gpt model(parity_config(true));
  FullyShardOptions fo;
  fo.offload_policy.cpu = true;
  for (Block* b : model.blocks()) fully_shard(*b, mesh, fo);
  fully_shard(model, mesh, fo);
  model.to_empty();
  model.reset_parameters(3);
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, OffloadSpace>::accessible,
                "offloaded shards must be host memory: the optimizer steps them on the host");
  for (Parameter* p : model.parameters()) {
    CHECK(p->placement()->offloaded);
    CHECK(p->placement()->memory == "host (pinned)");
    CHECK(p->host_resident());
  }
  AdamW optimizer(model.parameters(), AdamWConfig{});
  for (Parameter* p : model.parameters()) {
    // The optimizer state sits beside the shard: a host allocation of its own, the shard's extent.
    CHECK(optimizer.exp_avg(*p).extent(0) == p->value().extent(0));
    CHECK(optimizer.exp_avg(*p).data() != p->value().data());
  }
  std::vector<std::int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  View1<std::int32_t> tokens("tokens", t.size());
  Kokkos::deep_copy(tokens, HostView1<std::int32_t>(t.data(), t.size()));
  Flow flow;
  flow.B = 2, flow.T = kT, flow.tokens = tokens, flow.targets = tokens;
  model(flow);
  model(flow, Pass::backward);
  // Every all-gather stages one slot (this rank's shards) to the device: forward gathers every group, backward
  // the blocks again (the root keeps its parameters). Every reduce-scatter copies one slot back.
  std::int64_t h2d = 0, d2h = 0;
  for (Module* m : model.modules())
    if (FsdpGroup* g = fsdp_group(*m)) {
      h2d += g->sharded_numel() * 4 * (g->is_root() ? 1 : 2);
      d2h += g->sharded_numel() * 4;
    }
  const FsdpStats st = fsdp_stats(model);
  CHECK(st.host_to_device_bytes == h2d);
  CHECK(st.device_to_host_bytes == d2h);
  for (Parameter* p : model.parameters()) CHECK(!p->unsharded());  // back on the host shards after backward
  // The step runs on the host over the shards: each shard moves, none becomes non-finite.
  std::vector<std::vector<float>> before;
  for (Parameter* p : model.parameters()) before.push_back(host_copy(p->value()));
  optimizer.step(1e-2f);
  std::size_t moved = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    const std::vector<float> after = host_copy(model.parameters()[i]->value());
    for (float x : after) REQUIRE(std::isfinite(x));
    moved += after != before[i];
  }
  CHECK(moved == before.size());
}

MPI_TEST_CASE("fsdp: misuse gets a clear error naming the module or parameter", 2) {
  DeviceMesh mesh(test_comm, {{"dp_shard", -1}});
  {
    Gpt model(parity_config(true));
    fully_shard(model, mesh);
    CHECK_THROWS_WITH_AS(fully_shard(*model.blocks()[0], mesh),
                         doctest::Contains("fully_shard(h.0) after fully_shard(GPT (root))"), UsageError);
    model.to_empty();
    model.reset_parameters(1);
    // Root-only sharding leaves the blocks' parameters in the root's group: running a block on its own
    // would compute on shards.
    View1<std::int32_t> tokens("tokens", kT);
    Flow flow;
    flow.B = 1, flow.T = kT, flow.tokens = tokens, flow.targets = tokens;
    View1<float> x("x", kT * 10);
    flow.x = x;
    CHECK_THROWS_WITH_AS((*model.blocks()[0])(flow), doctest::Contains("parameter 'h.0.ln_1.weight' still sharded"),
                         UsageError);
    // Through the root it runs, with a warning that one group means no overlap and whole-model memory.
    flow.x = View1<float>();
    model(flow);
    CHECK(Log::last_warning().find("fully_shard was applied only to the root GPT (root)") != std::string::npos);
    CHECK(Log::last_warning().find("Apply fully_shard to each block first") != std::string::npos);
  }
  {
    Gpt model(parity_config(true));
    model.to_empty();
    model.reset_parameters(1);
    AdamW early(model.parameters(), AdamWConfig{});
    for (Block* b : model.blocks()) fully_shard(*b, mesh);
    fully_shard(model, mesh);
    CHECK_THROWS_WITH_AS(early.step(1e-3f), doctest::Contains("optimizer holds stale parameter 'wte.weight'"),
                         UsageError);
  }
  {
    Gpt model(parity_config(true));
    for (Block* b : model.blocks()) fully_shard(*b, mesh);
    fully_shard(model, mesh);
    View1<std::int32_t> tokens("tokens", kT);
    Flow flow;
    flow.B = 1, flow.T = kT, flow.tokens = tokens, flow.targets = tokens;
    CHECK_THROWS_WITH_AS(model(flow), doctest::Contains("has no storage: call to_empty()"), UsageError);
  }
}
