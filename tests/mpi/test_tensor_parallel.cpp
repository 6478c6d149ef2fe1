// Tensor parallelism composed with fully_shard (nn/tensor_parallel.hpp, parallel/parallelize.cpp): the same
// losses as one rank on every (dp_replicate, dp_shard, tp) mesh, with and without sequence parallelism, tied and
// untied, with accumulation and clipping; initial weights identical on every mesh; the gradient norm counted once; Megatron's all-reduce
// counts; checkpoints saved at dp_shard 2 x tp 2 loaded bitwise on other meshes and resumed; clear errors;
// comm.overlap bitwise the blocking collectives.
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "test_helpers.hpp"
#include "train_runs.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/optim/grad_norm.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/nn/qwen2.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/train/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <unistd.h>

using namespace fsdpp;

namespace {

// Twelve sequences a step, one per micro-batch: every data-parallel size here (1, 2, 3, 4) accumulates.
const std::vector<std::string> kCommon = {"train.eval_interval=0", "schedule.warmup_steps=2", "train.steps=6",
                                          "train.global_batch=12", "train.micro_batch=1", "train.grad_clip=0.5"};

using test::check_same_losses;
using test::losses_on;
using test::shared_temp_dir;
using test::usage_error_of;
using test::with;

Deck tiny(const std::vector<std::string>& extra) { return test::input_deck("tiny.yaml", with(kCommon, extra)); }

// Every parameter's whole tensor after `fill` on a model built for `deck` on the first n ranks, broadcast to all
// of test_comm (one flat vector, parameters in model order).
template <class Fill>
std::vector<float> whole_model_on(MPI_Comm test_comm, int test_rank, int n, const Deck& deck, Fill fill) {
  MPI_Comm group;
  MPI_Comm_split(test_comm, test_rank < n ? 0 : MPI_UNDEFINED, test_rank, &group);
  std::vector<float> all;
  if (group != MPI_COMM_NULL) {
    TrainModel t = build_model(group, deck);
    fill(group, t);
    for (Parameter* p : t.model->parameters())
      for (float x : t.whole(*p)) all.push_back(x);
    MPI_Comm_free(&group);
  }
  std::uint64_t size = all.size();
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, test_comm);
  all.resize(size);
  MPI_Bcast(all.data(), static_cast<int>(size), MPI_FLOAT, 0, test_comm);
  return all;
}

auto no_fill = [](MPI_Comm, TrainModel&) {};

CheckpointContents weights_of(const TrainModel& t) {
  CheckpointContents c;
  c.params = t.model->parameters();
  c.writes_shards = t.parallel->writes_checkpoint_shards();
  if (t.parallel->layout().tp > 1) c.tensor_parallel = t.parallel->mesh().mpi_comm("tp");
  return c;
}

// One forward and backward of a fixed batch on a model built for `deck`; what tests of a single pass read.
struct OnePass {
  double loss = 0, grad_norm = 0, grad_max = 0;
  TensorParallelStats tp;
  FsdpStats fsdp;
};

OnePass one_pass(MPI_Comm comm, const Deck& deck, int B, int T) {
  TrainModel t = build_model(comm, deck);
  const int N = B * T, V = deck.model.vocab_size;
  View1<std::int32_t> tokens("tokens", N), targets("targets", N);
  auto ht = Kokkos::create_mirror_view(tokens), hg = Kokkos::create_mirror_view(targets);
  for (int i = 0; i < N; ++i) ht(i) = (7 * i + 3) % V, hg(i) = (5 * i + 1) % V;
  hg(0) = -1;  // an ignored position, as a padded batch has
  Kokkos::deep_copy(tokens, ht);
  Kokkos::deep_copy(targets, hg);
  Flow flow;
  flow.B = B, flow.T = T, flow.tokens = tokens, flow.targets = targets;
  t.parallel->before_micro_batch(0, 1);
  t.model->tensor_parallel().reset_stats();
  (*t.model)(flow);
  (*t.model)(flow, Pass::backward);
  Kokkos::fence();
  OnePass r;
  r.loss = flow.loss;
  r.tp = t.model->tensor_parallel().stats();
  r.fsdp = fsdp_stats(*t.model);
  const auto params = t.model->parameters();
  r.grad_norm = global_grad_norm(params, t.parallel->grad_norm_group(), NormType::l2, t.parallel->tensor_parallel_group());
  r.grad_max = global_grad_norm(params, t.parallel->grad_norm_group(), NormType::inf, t.parallel->tensor_parallel_group());
  return r;
}

}  // namespace

MPI_TEST_CASE("tensor parallel: the same losses as one rank on tp 2, tp 4, dp_shard 2 x tp 2 and HSDP 2 x 1 x tp 2", 4) {
  for (const char* tie : {"model.tie_embeddings=true", "model.tie_embeddings=false"})
    for (const char* sp : {"mesh.tp_sequence_parallel=false", "mesh.tp_sequence_parallel=true"}) {
      CAPTURE(tie);
      CAPTURE(sp);
      const auto one = losses_on(test_comm, test_rank, 1, tiny({tie}));
      check_same_losses(losses_on(test_comm, test_rank, 2, tiny({tie, sp, "mesh.tp=2"})), one);
      check_same_losses(losses_on(test_comm, test_rank, 4, tiny({tie, sp, "mesh.tp=4"})), one);
      check_same_losses(losses_on(test_comm, test_rank, 4, tiny({tie, sp, "mesh.tp=2", "mesh.dp_shard=2"})), one);
      check_same_losses(losses_on(test_comm, test_rank, 4, tiny({tie, sp, "mesh.tp=2", "fsdp.strategy=hybrid_shard",
                                                                 "mesh.dp_replicate=2", "mesh.dp_shard=1"})), one);
    }
  // shard_grad_op, unsharded accumulation and activation checkpointing compose with tp (and sp) too.
  const auto one = losses_on(test_comm, test_rank, 1, tiny({}));
  check_same_losses(losses_on(test_comm, test_rank, 4, tiny({"mesh.tp=2", "fsdp.strategy=shard_grad_op"})), one);
  check_same_losses(losses_on(test_comm, test_rank, 4, tiny({"mesh.tp=2", "fsdp.accumulate=unsharded",
                                                             "mesh.tp_sequence_parallel=true"})), one);
  for (const char* sp : {"mesh.tp_sequence_parallel=false", "mesh.tp_sequence_parallel=true"})
    check_same_losses(losses_on(test_comm, test_rank, 4, tiny({"mesh.tp=2", sp, "train.activation_checkpointing=full"})), one);
  check_same_losses(losses_on(test_comm, test_rank, 4, tiny({"mesh.tp=2", "fsdp.offload=cpu"})), one);
  // Mixed precision: bf16 parameters and GEMMs on both sides; the sums split over tp round differently.
  check_same_losses(losses_on(test_comm, test_rank, 4, tiny({"mesh.tp=2", "fsdp.param_dtype=bf16",
                                                             "mesh.tp_sequence_parallel=true"})),
                    losses_on(test_comm, test_rank, 1, tiny({"fsdp.param_dtype=bf16"})), 1e-3);
}

MPI_TEST_CASE("tensor parallel: the same losses as one rank on dp_shard 3 x tp 2 (6 ranks)", 6) {
  const auto one = losses_on(test_comm, test_rank, 1, tiny({}));
  check_same_losses(losses_on(test_comm, test_rank, 6, tiny({"mesh.tp=2"})), one);
  check_same_losses(losses_on(test_comm, test_rank, 6, tiny({"mesh.tp=2", "mesh.tp_sequence_parallel=true"})), one);
  check_same_losses(losses_on(test_comm, test_rank, 6, tiny({"mesh.tp=2", "model.tie_embeddings=false"})),
                    losses_on(test_comm, test_rank, 1, tiny({"model.tie_embeddings=false"})));
}

MPI_TEST_CASE("tensor parallel: initial weights are those of one rank, bitwise, on every mesh", 4) {
  for (const char* tie : {"model.tie_embeddings=true", "model.tie_embeddings=false"}) {
    CAPTURE(tie);
    const auto one = whole_model_on(test_comm, test_rank, 1, tiny({tie}), no_fill);
    CHECK(whole_model_on(test_comm, test_rank, 2, tiny({tie, "mesh.tp=2"}), no_fill) == one);
    CHECK(whole_model_on(test_comm, test_rank, 4, tiny({tie, "mesh.tp=4"}), no_fill) == one);
    CHECK(whole_model_on(test_comm, test_rank, 4, tiny({tie, "mesh.tp=2", "mesh.dp_shard=2"}), no_fill) == one);
  }
}

MPI_TEST_CASE("tensor parallel: Megatron's all-reduce counts and bytes, FSDP's collectives unchanged, one norm", 4) {
  const int B = 2, T = 16, N = B * T;
  MPI_Comm one_comm;
  MPI_Comm_split(test_comm, test_rank == 0 ? 0 : MPI_UNDEFINED, 0, &one_comm);
  OnePass one;
  if (one_comm != MPI_COMM_NULL) {
    one = one_pass(one_comm, tiny({}), B, T);
    MPI_Comm_free(&one_comm);
  }
  MPI_Bcast(&one.loss, 1, MPI_DOUBLE, 0, test_comm);
  MPI_Bcast(&one.grad_norm, 1, MPI_DOUBLE, 0, test_comm);
  MPI_Bcast(&one.grad_max, 1, MPI_DOUBLE, 0, test_comm);
  for (const char* ac : {"train.activation_checkpointing=none", "train.activation_checkpointing=full"}) {
    CAPTURE(ac);
    const Deck deck = tiny({"mesh.tp=2", "mesh.dp_shard=2", ac});
    const OnePass two = one_pass(test_comm, deck, B, T);
    const std::int64_t L = deck.model.n_layer, C = deck.model.n_embd;
    const std::int64_t R = std::string(ac).find("full") != std::string::npos ? L : 0;  // blocks that recompute
    // Forward: the embedding, two row-parallel outputs per block, the loss's max and sums. Backward: the two
    // column-parallel input gradients per block and the LM head's; recomputing blocks redo their attention
    // projection's all-reduce (the recomputation stops before the MLP's).
    CHECK(two.tp.all_reduces == 4 * L + 4 + R);
    CHECK(two.tp.all_gathers == 0);
    CHECK(two.tp.reduce_scatters == 0);
    CHECK(two.tp.bytes == 4 * ((4 * L + 2 + R) * N * C + 3 * N));
    // fully_shard over dp_shard 2 does what it does without tp: per block and the root, one all-gather before
    // forward, one again before backward (reshard_after_forward), one reduce-scatter.
    CHECK(two.fsdp.forward_all_gathers == L + 1);
    CHECK(two.fsdp.backward_all_gathers == L);
    CHECK(two.fsdp.reduce_scatters == L + 1);
    CHECK(two.loss == doctest::Approx(one.loss).epsilon(1e-6));
    CHECK(two.grad_norm == doctest::Approx(one.grad_norm).epsilon(1e-5));
    CHECK(two.grad_max == doctest::Approx(one.grad_max).epsilon(1e-5));

    // Sequence parallelism: each all-reduce of a block's or the embedding's (N,C) becomes a reduce-scatter
    // (forward) or the pair all-gather + reduce-scatter around each region; the final norm's output and the
    // embedding's gradient are gathered; the norms' partial gradients are all-reduced once per block and for
    // ln_f. Recomputing blocks redo both of their gathers and the attention projection's reduce-scatter.
    const Deck sp_deck = tiny({"mesh.tp=2", "mesh.dp_shard=2", "mesh.tp_sequence_parallel=true", ac});
    const OnePass sp = one_pass(test_comm, sp_deck, B, T);
    CHECK(sp.tp.all_gathers == 4 * L + 2 + 2 * R);
    CHECK(sp.tp.reduce_scatters == 4 * L + 2 + R);
    CHECK(sp.tp.all_reduces == L + 3);
    CHECK(sp.tp.bytes == 4 * ((8 * L + 4 + 3 * R) * N * C + 3 * N + 2 * C + 4 * C * L));
    CHECK(sp.fsdp.reduce_scatters == L + 1);
    CHECK(sp.loss == doctest::Approx(one.loss).epsilon(1e-6));
    CHECK(sp.grad_norm == doctest::Approx(one.grad_norm).epsilon(1e-5));
  }
}

MPI_TEST_CASE("tensor parallel: a checkpoint saved at dp_shard 2 x tp 2 loads bitwise at tp 4, dp 4 and 1 rank, and resumes; tp 1 -> 4", 4) {
  const std::string dir = shared_temp_dir(test_comm, test_rank, "fsdpp-tp-ckpt");
  const auto straight = losses_on(test_comm, test_rank, 1, tiny({}));
  losses_on(test_comm, test_rank, 4, tiny({"mesh.tp=2", "mesh.dp_shard=2", "checkpoint.interval=3", "checkpoint.dir=" + dir}), 3);
  const std::string path = dir + "/" + checkpoint_file_name(3);
  {  // every tensor records its DTensor-style placements
    h5::Handle file = h5::open_file(path, test_comm);
    const auto placements = [&](const std::string& name) {
      return h5::get_string(h5::open_group(file, "/model/" + name, path), "placements", path);
    };
    CHECK(placements("h.0.attn.c_attn.weight") == "tp: StridedShard(0, blocks=3), dp_shard: Shard(0)");
    CHECK(placements("h.0.attn.c_proj.weight") == "tp: Shard(1), dp_shard: Shard(0)");
    CHECK(placements("h.0.mlp.c_fc.bias") == "tp: Shard(0), dp_shard: Shard(0)");
    CHECK(placements("wte.weight") == "tp: Shard(0), dp_shard: Shard(0)");
    CHECK(placements("h.0.ln_1.weight") == "dp_shard: Shard(0)");  // replicated over tp
  }
  auto load = [&](MPI_Comm group, TrainModel& t) { load_checkpoint(group, path, weights_of(t)); };
  const auto saved = whole_model_on(test_comm, test_rank, 4, tiny({"mesh.tp=2", "mesh.dp_shard=2"}), load);
  CHECK(whole_model_on(test_comm, test_rank, 4, tiny({"mesh.tp=4"}), load) == saved);
  CHECK(whole_model_on(test_comm, test_rank, 4, tiny({}), load) == saved);
  CHECK(whole_model_on(test_comm, test_rank, 1, tiny({}), load) == saved);
  CHECK(whole_model_on(test_comm, test_rank, 2, tiny({"mesh.tp=2"}), load) == saved);
  // And the other way: a checkpoint written without tensor parallelism (1 rank) loads at tp 4.
  losses_on(test_comm, test_rank, 1, tiny({"checkpoint.interval=3", "checkpoint.dir=" + dir + "/plain"}), 3);
  const std::string plain = dir + "/plain/" + checkpoint_file_name(3);
  auto load_plain = [&](MPI_Comm group, TrainModel& t) { load_checkpoint(group, plain, weights_of(t)); };
  CHECK(whole_model_on(test_comm, test_rank, 4, tiny({"mesh.tp=4"}), load_plain) ==
        whole_model_on(test_comm, test_rank, 1, tiny({}), load_plain));
  // The file is an ordinary one: /full and consolidate assemble the same whole tensors.
  if (test_rank == 0) consolidate_checkpoint(path, dir + "/whole.h5");
  MPI_Barrier(test_comm);
  auto consolidated = [&](MPI_Comm group, TrainModel& t) { load_consolidated(group, dir + "/whole.h5", t.model->parameters()); };
  CHECK(whole_model_on(test_comm, test_rank, 2, tiny({"mesh.tp=2"}), consolidated) == saved);
  // Resume on other meshes: steps 4-6 as the uninterrupted run has them, within fp32 tolerance.
  const std::vector<double> rest(straight.begin() + 3, straight.end());
  for (const std::vector<std::string>& mesh : {std::vector<std::string>{"mesh.tp=4"}, std::vector<std::string>{},
                                               std::vector<std::string>{"mesh.tp=2", "mesh.dp_shard=2"},
                                               std::vector<std::string>{"mesh.tp=2", "mesh.tp_sequence_parallel=true"}}) {
    auto resumed = losses_on(test_comm, test_rank, 4, tiny(with(mesh, {"checkpoint.resume=" + path,
                                                                       "checkpoint.dir=" + dir + "/again"})));
    resumed.resize(3);
    check_same_losses(resumed, rest);
  }
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

MPI_TEST_CASE("tensor parallel: a checkpoint saved at dp_shard 2 x tp 2 loads bitwise at dp_shard 3 x tp 2 (6 ranks)", 6) {
  const std::string dir = shared_temp_dir(test_comm, test_rank, "fsdpp-tp-ckpt6");
  losses_on(test_comm, test_rank, 4, tiny({"mesh.tp=2", "mesh.dp_shard=2", "checkpoint.interval=3", "checkpoint.dir=" + dir}), 3);
  const std::string path = dir + "/" + checkpoint_file_name(3);
  auto load = [&](MPI_Comm group, TrainModel& t) { load_checkpoint(group, path, weights_of(t)); };
  const auto saved = whole_model_on(test_comm, test_rank, 4, tiny({"mesh.tp=2", "mesh.dp_shard=2"}), load);
  CHECK(whole_model_on(test_comm, test_rank, 6, tiny({"mesh.tp=2"}), load) == saved);
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

MPI_TEST_CASE("tensor parallel: impossible meshes are one clear error", 1) {
  CHECK(usage_error_of([] { tiny({"mesh.tp=3"}); }).find("mesh.tp (3) must divide model.n_head (4)") != std::string::npos);
  CHECK(usage_error_of([] { parallel_layout(tiny({"mesh.tp=2"}), 3); }).find("does not divide the 3 ranks") != std::string::npos);
  CHECK(usage_error_of([] { test::input_deck("llama-tiny.yaml", {"mesh.tp=4"}); })
            .find("mesh.tp (4) must divide model.n_head (4) and model.n_kv_head (2)") != std::string::npos);
  CHECK(usage_error_of([] { test::input_deck("llama-tiny.yaml", {"mesh.tp=2", "model.ffn_hidden=175"}); })
            .find("must divide the MLP width model.ffn_hidden (175)") != std::string::npos);
  CHECK(usage_error_of([] { tiny({"mesh.tp=2", "fsdp.strategy=no_shard"}); }).find("no_shard") != std::string::npos);
  CHECK(usage_error_of([] { tiny({"mesh.tp_sequence_parallel=true"}); }).find("but mesh.tp is 1") != std::string::npos);
  CHECK(usage_error_of([] { tiny({"mesh.tp=4", "mesh.tp_sequence_parallel=true", "model.context_length=6",
                                  "train.micro_batch=1"}); })
            .find("1 x 6 = 6 tokens over mesh.tp = 4 ranks") != std::string::npos);
}

MPI_TEST_CASE("tensor parallel: Llama and Qwen2 (GQA, SwiGLU, RoPE, q/k/v biases) give the losses and initial weights of one rank", 4) {
  const std::vector<std::string> common = with(kCommon, {});
  for (const char* name : {"llama-tiny.yaml", "qwen2-tiny.yaml"}) {
    auto model = [&](const std::vector<std::string>& extra) { return test::input_deck(name, with(common, extra)); };
    for (const char* tie : {"model.tie_embeddings=false", "model.tie_embeddings=true"}) {
      CAPTURE(name);
      CAPTURE(tie);
      const auto one = losses_on(test_comm, test_rank, 1, model({tie}));
      check_same_losses(losses_on(test_comm, test_rank, 2, model({tie, "mesh.tp=2"})), one);
      check_same_losses(losses_on(test_comm, test_rank, 4, model({tie, "mesh.tp=2", "mesh.tp_sequence_parallel=true"})), one);
      check_same_losses(losses_on(test_comm, test_rank, 4, model({tie, "mesh.tp=2", "train.activation_checkpointing=full"})), one);
      CHECK(whole_model_on(test_comm, test_rank, 4, model({tie, "mesh.tp=2"}), no_fill) ==
            whole_model_on(test_comm, test_rank, 1, model({tie}), no_fill));
    }
  }
  auto llama = [&](const std::vector<std::string>& extra) { return test::input_deck("llama-tiny.yaml", with(common, extra)); };
  // Megatron's counts hold for Llama too (no biases change nothing): 4L + 4 all-reduces per micro-batch.
  const Deck deck = llama({"mesh.tp=2", "mesh.dp_shard=2"});
  const OnePass two = one_pass(test_comm, deck, 2, 16);
  CHECK(two.tp.all_reduces == 4 * deck.model.n_layer + 4);
  const OnePass sp = one_pass(test_comm, llama({"mesh.tp=2", "mesh.dp_shard=2", "mesh.tp_sequence_parallel=true"}), 2, 16);
  CHECK(sp.tp.all_gathers == 4 * deck.model.n_layer + 2);
  CHECK(sp.tp.reduce_scatters == 4 * deck.model.n_layer + 2);
  CHECK(sp.tp.all_reduces == deck.model.n_layer + 3);
  CHECK(sp.loss == doctest::Approx(two.loss).epsilon(1e-6));
  CHECK(sp.grad_norm == doctest::Approx(two.grad_norm).epsilon(1e-5));
}

// On 2 ranks, so that the sanitized CI run (ci-extras: unit and mpi at 2 ranks) goes through the tensor-parallel
// paths: training with sequence parallelism, the checkpoint save (columns gathered over tp) and the load.
MPI_TEST_CASE("tensor parallel: tp 2 on 2 ranks with sequence parallelism trains as one rank and reloads its checkpoint bitwise", 2) {
  const std::string dir = shared_temp_dir(test_comm, test_rank, "fsdpp-tp-2ranks");
  const std::vector<std::string> short_run = {"train.steps=3", "train.global_batch=4"};
  check_same_losses(losses_on(test_comm, test_rank, 2, tiny(with(short_run, {"mesh.tp=2", "mesh.tp_sequence_parallel=true",
                                                                              "model.tie_embeddings=false",
                                                                              "checkpoint.interval=3",
                                                                              "checkpoint.dir=" + dir}))),
                    losses_on(test_comm, test_rank, 1, tiny(with(short_run, {"model.tie_embeddings=false"}))));
  const std::string path = dir + "/" + checkpoint_file_name(3);
  auto load = [&](MPI_Comm group, TrainModel& t) { load_checkpoint(group, path, weights_of(t)); };
  const auto untied = [&](std::vector<std::string> extra) {
    extra.push_back("model.tie_embeddings=false");
    return tiny(with(short_run, extra));
  };
  CHECK(whole_model_on(test_comm, test_rank, 2, untied({"mesh.tp=2"}), load) ==
        whole_model_on(test_comm, test_rank, 1, untied({}), load));
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

// comm.overlap (nn/tensor_parallel.hpp): backward starts each column-parallel region's input-gradient reduction
// (and, under sequence parallelism, the all-gather of Wo's output gradient) before the weight-gradient products
// and waits after them. The same products and collectives in the same order into every buffer: the losses and
// the trained weights are those of the blocking backward bit for bit, and so are the collectives' counts and bytes.
MPI_TEST_CASE("tensor parallel: comm.overlap trains bitwise as blocking collectives, with the same collectives", 4) {
  const std::string dir = shared_temp_dir(test_comm, test_rank, "fsdpp-tp-overlap");
  const std::vector<std::pair<const char*, std::vector<std::string>>> cases = {
      {"tiny.yaml", {"mesh.tp_sequence_parallel=false"}},
      {"tiny.yaml", {"mesh.tp_sequence_parallel=true"}},
      {"tiny.yaml", {"mesh.tp_sequence_parallel=true", "train.activation_checkpointing=full"}},
      {"llama-tiny.yaml", {"mesh.tp_sequence_parallel=false"}},
      {"llama-tiny.yaml", {"mesh.tp_sequence_parallel=true"}}};
  int run = 0;
  for (const auto& one_case : cases) {
    // Named copies, not structured bindings: doctest's CAPTURE and the lambda below capture them, which nvcc
    // (C++17) warns about for structured bindings (#3357-D).
    const char* const name = one_case.first;
    const std::vector<std::string>& extra = one_case.second;
    CAPTURE(name);
    CAPTURE(extra.front());
    CAPTURE(extra.back());
    auto deck = [&](const char* overlap, const std::vector<std::string>& more) {
      return test::input_deck(name, with(with(kCommon, {"mesh.tp=2", "mesh.dp_shard=2", overlap}), with(extra, more)));
    };
    std::vector<double> losses[2];
    std::vector<float> weights[2];
    OnePass pass[2];
    for (int on = 0; on < 2; ++on) {
      const char* overlap = on ? "comm.overlap=true" : "comm.overlap=false";
      const std::string out = dir + "/" + std::to_string(run++);
      losses[on] = losses_on(test_comm, test_rank, 4, deck(overlap, {"checkpoint.interval=6", "checkpoint.dir=" + out}));
      const std::string path = out + "/" + checkpoint_file_name(6);
      auto load = [&](MPI_Comm group, TrainModel& t) { load_checkpoint(group, path, weights_of(t)); };
      weights[on] = whole_model_on(test_comm, test_rank, 4, deck(overlap, {}), load);
      pass[on] = one_pass(test_comm, deck(overlap, {}), 2, 16);
    }
    CHECK(losses[1] == losses[0]);
    CHECK(!weights[1].empty());
    CHECK(weights[1] == weights[0]);
    CHECK(pass[1].loss == pass[0].loss);
    CHECK(pass[1].grad_norm == pass[0].grad_norm);
    CHECK(pass[1].tp.all_reduces == pass[0].tp.all_reduces);
    CHECK(pass[1].tp.all_gathers == pass[0].tp.all_gathers);
    CHECK(pass[1].tp.reduce_scatters == pass[0].tp.reduce_scatters);
    CHECK(pass[1].tp.bytes == pass[0].tp.bytes);
    CHECK(pass[1].fsdp.reduce_scatters == pass[0].fsdp.reduce_scatters);
  }
  if (test_rank == 0) std::filesystem::remove_all(dir);
}

// Document masks (data.document_mask, reset positions; kernels/document.hpp) through the trainer's deck path: they
// change the training (the options reach the model), and tp 2 with sequence parallelism (attention sees whole
// rows after the gather) gives one rank's losses; activation checkpointing's replay sees the same document starts
// (bitwise); reproducible mode is bitwise on 1 and 2 ranks. Token 22, one of the synthetic corpus's frequent ones
// (10 of the first step's 128 tokens), stands for the end-of-text.
MPI_TEST_CASE("document masks: tp 2 with sequence parallelism, activation checkpointing and reproducible mode", 2) {
  const std::vector<std::string> masks = {"data.document_mask=true", "data.eot_id=22", "data.reset_positions=true"};
  const std::vector<std::string> short_run = {"train.eval_interval=0", "schedule.warmup_steps=1", "train.steps=3",
                                              "train.global_batch=4", "train.micro_batch=2"};
  auto llama = [&](const std::vector<std::string>& extra) {
    return test::input_deck("llama-tiny.yaml", with(with(short_run, masks), extra));
  };
  const auto one = losses_on(test_comm, test_rank, 1, llama({}));
  const auto unmasked = losses_on(test_comm, test_rank, 1, test::input_deck("llama-tiny.yaml", short_run));
  CHECK(std::fabs(one.front() - unmasked.front()) > 1e-4);
  check_same_losses(losses_on(test_comm, test_rank, 2, llama({"mesh.tp=2", "mesh.tp_sequence_parallel=true"})), one);
  test::check_bitwise(losses_on(test_comm, test_rank, 1, llama({"train.activation_checkpointing=full"})), one,
                      "loss with activation checkpointing");
  const std::vector<std::string> reproducible = {"train.reproducible=true", "train.micro_batch=4"};
  test::check_bitwise(losses_on(test_comm, test_rank, 2, llama(with(reproducible, {"train.micro_batch=2"}))),
                      losses_on(test_comm, test_rank, 1, llama(reproducible)), "reproducible loss");
}
