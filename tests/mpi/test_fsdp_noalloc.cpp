// fully_shard allocates nothing after the first step: its transient buffers come from a caching pool
// (fsdp/buffer_pool.hpp), so steps 2..n of a real training loop (forward, backward, clipping, AdamW) make no
// Kokkos allocation in the compute memory space, under every layout; and the pool's rule on sizes alone (what
// `fsdpp plan`'s dry groups run) reserves what the pool allocated.
#include "mpi_test.hpp"

#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/optim/grad_norm.hpp"
#include "fsdpp/runtime/memory_accounting.hpp"

#include <map>
#include <string>
#include <vector>

using namespace fsdpp;

namespace {

struct Layout {
  std::string name;
  std::vector<MeshDim> mesh{{"dp_shard", -1}};
  bool reshard_after_forward = true;  // false: shard_grad_op
  int reshard_ranks = 0;              // reshard_after_forward = k
  DType param_dtype = DType::f32, reduce_dtype = DType::f32;
  int micro_batches = 1;
};

// Kokkos allocations in the compute space made by each of `steps` training steps of a small GPT.
std::vector<std::int64_t> allocations_per_step(MPI_Comm comm, const Layout& o, int steps, FsdpStats& last,
                                               std::int64_t& pool_bytes_allocated, std::int64_t& emptied) {
  MemoryAccounting::install();
  DeviceMesh mesh(comm, o.mesh);
  ModelConfig c;
  c.vocab_size = 13, c.context_length = 5, c.n_embd = 10, c.n_layer = 2, c.n_head = 2;
  Gpt model(c);
  FullyShardOptions fo;
  fo.reshard_after_forward = o.reshard_after_forward;
  fo.reshard_after_forward_ranks = o.reshard_ranks;
  fo.mp_policy.param_dtype = o.param_dtype;
  fo.mp_policy.reduce_dtype = o.reduce_dtype;
  for (Block* b : model.blocks()) fully_shard(*b, mesh, fo);
  FullyShardOptions root = fo;
  root.reshard_after_forward.reset();
  root.reshard_after_forward_ranks = 0;
  fully_shard(model, mesh, root);
  model.to_empty();
  model.reset_parameters(7);
  AdamWConfig ac;
  ac.lr = 1e-2f;
  AdamW opt(model.parameters(), ac);
  const int B = 2, T = c.context_length;
  std::vector<std::int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) in[i] = i % 13, tg[i] = (i * 5 + 1) % 13;
  View1<std::int32_t> tokens("tokens", in.size()), targets("targets", tg.size());
  Kokkos::deep_copy(tokens, HostView1<std::int32_t>(in.data(), in.size()));
  Kokkos::deep_copy(targets, HostView1<std::int32_t>(tg.data(), tg.size()));
  Communicator& shards = mesh.comm(mesh.ndim() - 1);
  FsdpGroup* top = fsdp_group(model);
  std::vector<std::int64_t> made;
  const std::int64_t bytes_before = MemoryAccounting::device().live_bytes;
  for (int step = 0; step < steps; ++step) {
    const std::int64_t before = MemoryAccounting::device().allocations;
    model.zero_grad();
    for (int a = 0; a < o.micro_batches; ++a) {
      top->set_requires_gradient_sync(a == o.micro_batches - 1);
      Flow flow;
      flow.B = B, flow.T = T, flow.tokens = tokens, flow.targets = targets;
      flow.loss_scale = 1.0f / static_cast<float>(o.micro_batches);
      model(flow);
      model(flow, Pass::backward);
    }
    clip_grad_norm(model.parameters(), 1.0, &shards);
    opt.step(ac.lr);
    Kokkos::fence();
    made.push_back(MemoryAccounting::device().allocations - before);
    if (step == 0) pool_bytes_allocated = MemoryAccounting::device().live_bytes - bytes_before;
  }
  last = fsdp_stats(model);
  // empty_fsdp_cache hands every free block back to Kokkos: all of them, between steps.
  const std::int64_t held = MemoryAccounting::device().live_bytes;
  empty_fsdp_cache(model);
  emptied = held - MemoryAccounting::device().live_bytes;
  CHECK(fsdp_stats(model).pool_reserved_bytes == 0);
  return made;
}

void check_no_allocation_after_first_step(MPI_Comm comm, const Layout& o) {
  CAPTURE(o.name);
  FsdpStats stats;
  std::int64_t first_step_bytes = 0, emptied = 0;
  const std::vector<std::int64_t> made = allocations_per_step(comm, o, 4, stats, first_step_bytes, emptied);
  CHECK(made[0] > 0);  // the first step fills the pool (and the optimizer state, activations)
  for (std::size_t s = 1; s < made.size(); ++s) {
    CAPTURE(s);
    CHECK(made[s] == 0);
  }
  CHECK(stats.pool_live_bytes == 0);  // nothing is handed out between steps
  CHECK(stats.pool_reserved_bytes >= stats.pool_peak_live_bytes);
  CHECK(stats.pool_peak_live_bytes > 0);
  // What the first step allocated and kept: the pool's blocks, and the optimizer state (2 x the shards).
  CHECK(first_step_bytes >= stats.pool_reserved_bytes);
  CHECK(emptied == stats.pool_reserved_bytes);  // what Kokkos held for the pool is what the pool reports
}

}  // namespace

MPI_TEST_CASE("fsdp pool: steps after the first allocate nothing, on 1 rank", 1) {
  check_no_allocation_after_first_step(test_comm, {"full_shard"});
  check_no_allocation_after_first_step(test_comm, {"bf16", {{"dp_shard", -1}}, true, 0, DType::bf16, DType::bf16});
}

MPI_TEST_CASE("fsdp pool: steps after the first allocate nothing, on 2 ranks", 2) {
  check_no_allocation_after_first_step(test_comm, {"full_shard"});
  check_no_allocation_after_first_step(test_comm, {"shard_grad_op", {{"dp_shard", -1}}, false});
  check_no_allocation_after_first_step(test_comm, {"bf16", {{"dp_shard", -1}}, true, 0, DType::bf16, DType::bf16});
  check_no_allocation_after_first_step(test_comm, {"no_shard (2x1)", {{"dp_replicate", 2}, {"dp_shard", 1}}});
  check_no_allocation_after_first_step(test_comm, {"unsharded accumulation", {{"dp_shard", -1}}, true, 0,
                                                   DType::f32, DType::f32, 2});
}

MPI_TEST_CASE("fsdp pool: steps after the first allocate nothing, HSDP 2x2 and reshard_after_forward = 2", 4) {
  check_no_allocation_after_first_step(test_comm, {"hsdp 2x2", {{"dp_replicate", 2}, {"dp_shard", 2}}});
  check_no_allocation_after_first_step(test_comm, {"reshard_after_forward 2", {{"dp_shard", -1}}, true, 2});
  check_no_allocation_after_first_step(test_comm, {"hsdp bf16", {{"dp_replicate", 2}, {"dp_shard", 2}}, true, 0,
                                                   DType::bf16, DType::bf16});
}

MPI_TEST_CASE("fsdp pool: exact size first, else the smallest free block up to twice the request", 1) {
  PoolRule rule;
  bool reused = true;
  CHECK(rule.take(96, reused) == 96);
  CHECK(!reused);
  CHECK(rule.take(96, reused) == 96);
  CHECK(rule.take(304, reused) == 304);
  rule.give_back(96, 96);
  rule.give_back(304, 304);
  CHECK(rule.take(60, reused) == 96);  // 60 is 64 in whole words; the 96 block is at most twice that
  CHECK(reused);
  CHECK(rule.take(96, reused) == 96);  // no free 96 left; the 304 is more than twice 96
  CHECK(!reused);
  CHECK(rule.take(200, reused) == 304);
  CHECK(reused);
  CHECK(rule.live_bytes() == 96 + 60 + 96 + 200);  // live counts what was asked for
  CHECK(rule.reserved_bytes() == 96 + 96 + 304 + 96);
  CHECK(rule.allocations() == 4);
  rule.give_back(96, 60);
  rule.clear();  // the free 96 goes
  CHECK(rule.reserved_bytes() == 96 + 304 + 96);
  CHECK(rule.live_bytes() == 96 + 96 + 200);
  BufferPool pool;
  PoolBlock a = pool.take(64, "test.a");
  const void* at = a.storage.data();
  pool.give_back(std::move(a));
  PoolBlock b = pool.take(64, "test.b");
  CHECK(b.storage.data() == at);
  CHECK(pool.rule().allocations() == 1);
  pool.give_back(std::move(b));
  pool.clear();
  CHECK(pool.rule().reserved_bytes() == 0);
}

namespace {

// Kernel launches by label, through the Kokkos Tools begin_parallel_for callback (restored after).
std::map<std::string, int>& launches() {
  static std::map<std::string, int> counts;
  return counts;
}
void count_launch(const char* name, std::uint32_t, std::uint64_t*) { ++launches()[name]; }

// The piece kernels (tensor/piece_batch.hpp) launched by the second step of a 2-block GPT on `comm`.
std::map<std::string, int> piece_launches_per_step(MPI_Comm comm, bool tied) {
  DeviceMesh mesh(comm, {{"dp_shard", -1}});
  ModelConfig c;
  c.vocab_size = 13, c.context_length = 5, c.n_embd = 10, c.n_layer = 2, c.n_head = 2, c.tie_embeddings = tied;
  Gpt model(c);
  for (Block* b : model.blocks()) fully_shard(*b, mesh);
  fully_shard(model, mesh);
  model.to_empty();
  model.reset_parameters(7);
  const int B = 2, T = c.context_length;
  std::vector<std::int32_t> in(B * T, 3);
  View1<std::int32_t> tokens("tokens", in.size());
  Kokkos::deep_copy(tokens, HostView1<std::int32_t>(in.data(), in.size()));
  std::map<std::string, int> counted;
  for (int step = 0; step < 2; ++step) {
    const auto previous = Kokkos::Tools::Experimental::get_callbacks().begin_parallel_for;
    launches().clear();
    if (step == 1) Kokkos::Tools::Experimental::set_begin_parallel_for_callback(count_launch);
    model.zero_grad();
    Flow flow;
    flow.B = B, flow.T = T, flow.tokens = tokens, flow.targets = tokens;
    model(flow);
    model(flow, Pass::backward);
    Kokkos::fence();
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(previous);
  }
  for (const auto& [name, n] : launches())
    if (name.find("_pieces") != std::string::npos) counted[name] = n;
  return counted;
}

}  // namespace

MPI_TEST_CASE("fsdp: copy-in, copy-out, accumulation and zeroing are one kernel per group, whatever its parameters", 2) {
  const std::map<std::string, int> tied = piece_launches_per_step(test_comm, true);
  const std::map<std::string, int> untied = piece_launches_per_step(test_comm, false);  // the root has one more
  CHECK(tied == untied);
  const int groups = 3, blocks = 2;
  // Forward: every group packs its slot and unpacks the gathered buffer; backward re-gathers the blocks (the
  // root keeps its parameters) and packs each group's reduce-scatter input.
  CHECK(tied.at("fsdpp::copy_pieces") == 2 * groups + 2 * blocks + groups);
  CHECK(tied.at("fsdpp::accumulate_pieces") == groups);  // reduced shards into the shard gradients
  CHECK(tied.at("fsdpp::zero_pieces") == groups + 1);    // whole gradients per group, and Module::zero_grad
}
