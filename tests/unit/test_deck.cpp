// The YAML input deck: defaults, overrides, the resolved-deck round trip, --help-deck, and malformed decks,
// each checked for its exact message (what a user sees is the contract: file:line:col, key path, expected, got).
#include "input_decks.hpp"
#include "mpi_test.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <string>
#include <vector>

using fsdpp::Deck;
using fsdpp::parse_deck;

namespace {

const char* const kMinimal = "train:\n  steps: 10\n";

using fsdpp::test::deck_error;

}  // namespace

TEST_CASE("deck: a minimal deck gets every default") {
  const Deck d = parse_deck(kMinimal, "input/tiny.yaml", {});
  CHECK(d.run.name == "tiny");  // named after the deck file
  CHECK(d.run.seed == 1337);
  CHECK(d.run.output == "runs/tiny");
  CHECK(d.model.vocab_size == 50257);
  CHECK(d.model.context_length == 1024);
  CHECK(d.model.n_embd == 768);
  CHECK(d.model.n_layer == 12);
  CHECK(d.model.n_head == 12);
  CHECK(d.model.tie_embeddings);
  CHECK(d.data.source == "synthetic");
  CHECK(d.data.format == fsdpp::DataFormat::automatic);
  CHECK(d.optim.name == fsdpp::OptimizerKind::adamw);
  CHECK(d.optim.lr == 3e-4);
  CHECK(!d.optim.decay_embeddings);
  CHECK(d.schedule.kind == fsdpp::ScheduleKind::constant);
  CHECK(d.train.steps == 10);
  CHECK(d.train.global_batch == 8);
  CHECK(d.train.micro_batch == 8);  // defaults to global_batch: no accumulation on one rank
  CHECK(d.train.grad_clip == 1.0);
  CHECK(d.log.interval == 10);
  CHECK(d.fsdp.strategy == fsdpp::ShardStrategy::full_shard);
  CHECK(d.fsdp.reshard_after_forward.kind == fsdpp::ReshardAfterForward::Kind::automatic);
  CHECK(d.fsdp.param_dtype == fsdpp::DType::f32);
  CHECK(d.fsdp.accumulate == fsdpp::GradAccumulation::sharded);
  CHECK(d.mesh.dp_replicate == 0);  // absent
  CHECK(d.mesh.dp_shard == -1);
  CHECK(d.mesh.tp == 1);
  CHECK(d.checkpoint.dir == "runs/tiny/checkpoints");
  CHECK(d.checkpoint.interval == 0);
  CHECK(d.checkpoint.resume == fsdpp::ResumeMode::off);
  CHECK(!d.checkpoint.async);
}

TEST_CASE("deck: values, comments, empty sections and YAML's boolean spellings") {
  const Deck d = parse_deck(
      "# a tiny model\n"
      "run: {name: t1, seed: 7}\n"
      "model:\n  vocab_size: 256\n  context_length: 64\n  n_embd: 64\n  n_layer: 2\n  n_head: 4\n"
      "  tie_embeddings: no\n"
      "log:\n"
      "optim:\n  name: sgd\n  lr: +1e-2\n  decay_norms: Yes\n"
      "train: {steps: 100, global_batch: 16, micro_batch: 4}\n"
      "fsdp: {strategy: hybrid_shard, reshard_after_forward: 2, param_dtype: bf16}\n"
      "mesh: {dp_replicate: 2}\n"
      "checkpoint: {interval: 50, resume: auto, async: on}\n",
      "deck.yaml", {});
  CHECK(d.run.name == "t1");
  CHECK(d.run.seed == 7);
  CHECK(d.run.output == "runs/t1");
  CHECK(d.model.vocab_size == 256);
  CHECK(!d.model.tie_embeddings);
  CHECK(d.optim.name == fsdpp::OptimizerKind::sgd);
  CHECK(d.optim.lr == 1e-2);
  CHECK(d.optim.decay_norms);
  CHECK(d.train.micro_batch == 4);
  CHECK(d.fsdp.reshard_after_forward.kind == fsdpp::ReshardAfterForward::Kind::group);
  CHECK(d.fsdp.reshard_after_forward.group_size == 2);
  CHECK(d.fsdp.param_dtype == fsdpp::DType::bf16);
  // Mesh keys merge into the default {dp_shard: -1} (parallel_layout orders them, test_parallelize.cpp).
  CHECK(d.mesh.dp_replicate == 2);
  CHECK(d.mesh.dp_shard == -1);
  CHECK(d.checkpoint.resume == fsdpp::ResumeMode::automatic);
  CHECK(d.checkpoint.async);
}

TEST_CASE("deck: overrides apply after the file, in order, and derived defaults follow them") {
  const Deck d = parse_deck("train:\n  steps: 10\noptim:\n  lr: 1e-3\n", "deck.yaml",
                            {"train.steps=50", "optim.lr=3e-4", "run.name=exp1", "mesh.dp_replicate=2", "fsdp.strategy=hybrid_shard",
                             "fsdp.reshard_after_forward=false", "checkpoint.resume=true", "train.steps=60",
                             "train.global_batch=32", "data.source=data/my corpus.bin"});
  CHECK(d.train.steps == 60);  // the last override of a key wins
  CHECK(d.optim.lr == 3e-4);
  CHECK(d.run.name == "exp1");
  CHECK(d.run.output == "runs/exp1");
  CHECK(d.checkpoint.dir == "runs/exp1/checkpoints");
  CHECK(d.train.micro_batch == 32);
  CHECK(d.mesh.dp_replicate == 2);
  CHECK(d.fsdp.reshard_after_forward.kind == fsdpp::ReshardAfterForward::Kind::no);
  CHECK(d.checkpoint.resume == fsdpp::ResumeMode::on);
  CHECK(d.data.source == "data/my corpus.bin");
  // An override may supply the one required key.
  CHECK(parse_deck("", "deck.yaml", {"train.steps=5"}).train.steps == 5);
}

TEST_CASE("deck: the resolved deck parses back to the same deck") {
  const Deck d = parse_deck(
      "run: {name: 'odd: name #1', output: \"out dir/x\"}\n"
      "model: {vocab_size: 4096, n_embd: 256, n_layer: 4, n_head: 4, context_length: 256}\n"
      "data: {source: 'null', val_fraction: 0.125}\n"
      "optim: {lr: 0.1, beta2: 0.999, eps: 1e-10, weight_decay: 0}\n"
      "schedule: {kind: cosine, warmup_steps: 7, min_lr: 1e-5}\n"
      "train: {steps: 300, global_batch: 64, micro_batch: 8, grad_clip: 0.5}\n"
      "fsdp: {strategy: hybrid_shard, reshard_after_forward: 8, reduce_dtype: bf16, offload: cpu,\n"
      "       accumulate: unsharded}\n"
      "mesh: {dp_replicate: -1, dp_shard: 4}\n"
      "checkpoint: {dir: /scratch/ckpt, interval: 100, resume: auto, keep_last: 3}\n",
      "deck.yaml", {});
  const std::string yaml = fsdpp::resolved_deck_yaml(d);
  const Deck again = parse_deck(yaml, "resolved.yaml", {});
  CHECK(fsdpp::resolved_deck_yaml(again) == yaml);
  CHECK(again.run.name == "odd: name #1");
  CHECK(again.run.output == "out dir/x");
  CHECK(again.data.source == "null");
  CHECK(yaml.find("  source: \"null\"\n") != std::string::npos);  // quoted: a string, not YAML's null
  CHECK(again.optim.eps == 1e-10);
  CHECK(again.schedule.min_lr == 1e-5);
  CHECK(again.fsdp.reshard_after_forward.group_size == 8);
  CHECK(again.mesh.dp_replicate == -1);
  CHECK(again.mesh.dp_shard == 4);
  CHECK(again.checkpoint.dir == "/scratch/ckpt");
  // Every key is written out, in table order, but the Llama-only keys of this gpt2 deck, model.from_hf (the
  // resolved deck holds the values a model folder gives), train.sample_tokenizer (unset: one token per byte) and
  // data.sources (unset: data.source).
  const std::vector<std::string> llama_only = {"model.n_kv_head",       "model.ffn_hidden", "model.ffn_multiplier",
                                               "model.ffn_multiple_of", "model.rope_theta", "model.norm_eps",
                                               "model.rope_scaling_factor", "model.rope_low_freq_factor",
                                               "model.rope_high_freq_factor", "model.rope_original_context",
                                               "model.from_hf", "train.sample_tokenizer", "run.machine",
                                               "data.sources"};
  for (const auto& key : fsdpp::deck_keys()) {
    CAPTURE(key);
    const bool written = yaml.find("  " + key.substr(key.find('.') + 1) + ": ") != std::string::npos;
    const bool family = key == "model.head_dim" || key.rfind("model.moe.", 0) == 0;  // Llama's, the experts'
    CHECK(written == (std::find(llama_only.begin(), llama_only.end(), key) == llama_only.end() && !family));
  }
  CHECK(yaml.find("run:\n  name: \"odd: name #1\"\n  seed: 1337\n") != std::string::npos);
  // Numbers keep a '.' so that YAML 1.1 readers (PyYAML) read floats as floats.
  CHECK(yaml.find("  eps: 1.0e-10\n") != std::string::npos);
  CHECK(yaml.find("  weight_decay: 0.0\n") != std::string::npos);

  const Deck defaults = parse_deck(kMinimal, "deck.yaml", {});
  CHECK(fsdpp::resolved_deck_yaml(parse_deck(fsdpp::resolved_deck_yaml(defaults), "x.yaml", {})) ==
        fsdpp::resolved_deck_yaml(defaults));
}

TEST_CASE("deck: --help-deck lists every key with its type and default") {
  const std::string help = fsdpp::deck_help();
  // The fixed names that documentation, job templates and scripts rely on.
  for (const char* key : {"run.name", "run.seed", "run.output", "train.steps", "train.global_batch",
                          "train.micro_batch", "train.grad_clip", "optim.lr", "log.interval", "data.source",
                          "checkpoint.dir", "checkpoint.interval", "checkpoint.resume", "checkpoint.keep_last",
                          "checkpoint.async"}) {
    CAPTURE(key);
    CHECK(help.find(std::string("  ") + key + " ") != std::string::npos);
  }
  for (const auto& key : fsdpp::deck_keys()) {
    CAPTURE(key);
    CHECK(help.find("  " + key + " ") != std::string::npos);
  }
  CHECK(help.find("train.steps                 integer >= 1                   default: (required)") != std::string::npos);
  CHECK(help.find("optim.name                  adamw|sgd                      default: adamw") != std::string::npos);
  CHECK(help.find("run.output                  string                         default: runs/<run.name>") !=
        std::string::npos);
}

TEST_CASE("deck: accumulation steps come from the global batch, the micro-batch and the data-parallel size") {
  fsdpp::TrainConfig t;
  t.global_batch = 32;
  t.micro_batch = 4;
  CHECK(fsdpp::grad_accum_steps(t, 1) == 8);
  CHECK(fsdpp::grad_accum_steps(t, 4) == 2);
  CHECK(fsdpp::grad_accum_steps(t, 8) == 1);
  std::string message;
  try {
    fsdpp::grad_accum_steps(t, 3);
  } catch (const fsdpp::UsageError& e) {
    message = e.what();
  }
  CHECK(message ==
        "train.global_batch (32) must be a multiple of train.micro_batch (4) x 3 data-parallel ranks = 12; change "
        "train.global_batch or train.micro_batch, or the number of ranks");
}

TEST_CASE("deck: unknown and duplicate keys and sections are rejected with a suggestion") {
  CHECK(deck_error("train:\n  steps: 10\n  global_bach: 8\n") ==
        "deck.yaml:3:3: unknown key 'global_bach' in 'train' (did you mean 'global_batch'?)");
  // Names from other frameworks point at ours; a near miss of an ambiguous one, at every key it may mean.
  CHECK(deck_error("train:\n  steps: 10\n  batch_sizee: 8\n") ==
        "deck.yaml:3:3: unknown key 'batch_sizee' in 'train' (did you mean 'global_batch' or 'micro_batch'?)");
  CHECK(deck_error("train:\n  steps: 10\n  max_stepz: 8\n") ==
        "deck.yaml:3:3: unknown key 'max_stepz' in 'train' (did you mean 'steps'?)");
  CHECK(deck_error("model:\n  block_size: 256\n") ==
        "deck.yaml:2:3: unknown key 'block_size' in 'model' (did you mean 'context_length'?)");
  CHECK(deck_error("train:\n  steps: 10\n  frobnicate: 1\n") == "deck.yaml:3:3: unknown key 'frobnicate' in 'train'");
  CHECK(deck_error("optim:\n  lr: 1e-3\n  beta1: 0.9\n  lr: 2e-3\n") ==
        "deck.yaml:4:3: duplicate key 'lr' in 'optim' (first at line 2)");
  CHECK(deck_error("trian:\n  steps: 5\n") == "deck.yaml:1:1: unknown section 'trian' (did you mean 'train'?)");
  CHECK(deck_error("train: {steps: 5}\nlog: {interval: 1}\ntrain: {steps: 6}\n") ==
        "deck.yaml:3:1: duplicate section 'train' (first at line 1)");
  CHECK(deck_error("train: {steps: 5}\nmesh:\n  dp_shrd: 4\n") ==
        "deck.yaml:3:3: unknown key 'dp_shrd' in 'mesh' (did you mean 'dp_shard'?)");
}

TEST_CASE("deck: wrong types say where, which key, what was expected and what was found") {
  CHECK(deck_error("model:\n  n_head: twelve\n") == "deck.yaml:2:11: model.n_head: expected an integer, got 'twelve'");
  CHECK(deck_error("train:\n  steps: 1.5\n") == "deck.yaml:2:10: train.steps: expected an integer, got '1.5'");
  CHECK(deck_error("train:\n  steps:\n") == "deck.yaml:2:3: train.steps: expected an integer, got nothing");
  CHECK(deck_error("model:\n  n_layer: [1, 2]\n") == "deck.yaml:2:12: model.n_layer: expected an integer, got a sequence");
  CHECK(deck_error("train: {steps: 5}\noptim: {lr: fast}\n") == "deck.yaml:2:13: optim.lr: expected a number, got 'fast'");
  CHECK(deck_error("train: {steps: 5}\nmodel: {tie_embeddings: maybe}\n") ==
        "deck.yaml:2:25: model.tie_embeddings: expected true or false, got 'maybe'");
  CHECK(deck_error("train: {steps: 5}\nrun: {name: a/b}\n") == "deck.yaml:2:13: run.name: expected a name without '/', got 'a/b'");
  CHECK(deck_error("train: 5\n") == "deck.yaml:1:8: section 'train': expected a map of keys, got '5'");
  CHECK(deck_error("- train\n- model\n") == "deck.yaml:1:1: expected a map of sections (run, model, data, ...), got a sequence");
}

TEST_CASE("deck: out-of-range and unknown enumerated values name what is allowed") {
  CHECK(deck_error("train:\n  steps: 0\n") == "deck.yaml:2:10: train.steps: expected an integer >= 1, got 0");
  CHECK(deck_error("train: {steps: 5}\noptim:\n  beta1: 1.5\n") ==
        "deck.yaml:3:10: optim.beta1: expected a number in [0, 1), got 1.5");
  CHECK(deck_error("train: {steps: 5}\noptim:\n  lr: 0\n") == "deck.yaml:3:7: optim.lr: expected a number > 0, got 0");
  CHECK(deck_error("train: {steps: 5}\nmodel:\n  n_embd: 99999999999999999999\n") ==
        "deck.yaml:3:11: model.n_embd: expected an integer in [1, 2147483647], got 99999999999999999999");
  CHECK(deck_error("train: {steps: 5}\nrun:\n  seed: -1\n") == "deck.yaml:3:9: run.seed: expected an integer >= 0, got -1");
  CHECK(deck_error("train: {steps: 5}\noptim:\n  name: adam\n") ==
        "deck.yaml:3:9: optim.name: expected adamw|sgd, got 'adam' (did you mean 'adamw'?)");
  CHECK(deck_error("train: {steps: 5}\nfsdp:\n  strategy: zero3\n") ==
        "deck.yaml:3:13: fsdp.strategy: expected full_shard|hybrid_shard|shard_grad_op|no_shard, got 'zero3'");
  CHECK(deck_error("train: {steps: 5}\nfsdp:\n  param_dtype: fp16\n") ==
        "deck.yaml:3:16: fsdp.param_dtype: expected f32|bf16, got 'fp16' (did you mean 'bf16'?)");
  CHECK(deck_error("train: {steps: 5}\nfsdp:\n  reshard_after_forward: maybe\n") ==
        "deck.yaml:3:26: fsdp.reshard_after_forward: expected auto, true, false or an integer >= 2, got 'maybe'");
  CHECK(deck_error("train: {steps: 5}\nfsdp:\n  reshard_after_forward: 1\n") ==
        "deck.yaml:3:26: fsdp.reshard_after_forward: expected auto, true, false or an integer >= 2, got '1'");
  CHECK(deck_error("train: {steps: 5}\nmesh:\n  dp_shard: 0\n") ==
        "deck.yaml:3:13: mesh.dp_shard: expected -1 (infer from the job size) or an integer >= 1, got 0");
  CHECK(deck_error("train: {steps: 5}\ncheckpoint:\n  resume: later\n") ==
        "deck.yaml:3:11: checkpoint.resume: expected true, false, auto, none or a checkpoint path (.h5), got 'later'");
}

TEST_CASE("deck: YAML syntax errors and missing required keys") {
  CHECK(deck_error("train:\n  steps: [1,\n") == "deck.yaml:3:1: YAML syntax error: end of sequence flow not found");
  CHECK(deck_error("train:\n  steps: 5\n global_batch: 8\n") == "deck.yaml:3:2: YAML syntax error: end of map not found");
  CHECK(deck_error("train: {steps: 5}\n---\nmodel: {n_head: 4}\n") ==
        "deck.yaml:3:1: a deck is one YAML document, but a second one starts here");
  CHECK(deck_error("train:\n  global_batch: 8\n") == "deck.yaml:1:1: missing required key 'steps' in 'train'");
  CHECK(deck_error("model: {n_head: 4}\n") ==
        "deck.yaml: missing required key 'steps' in 'train' (the deck has no 'train' section)");
}

// yaml-cpp 0.7's LoadAll loops, allocating, on a document that starts with ','; found by fuzzing
// (tests/fuzz/regressions/deck/). Each case here ran out of memory before the fix.
TEST_CASE("deck: a stray ',' where the deck starts is a syntax error, not a hang") {
  const std::string unexpected = "YAML syntax error: unexpected ',' where a document should start";
  CHECK(deck_error(",train: {steps: 5}\n") == "deck.yaml:1:1: " + unexpected);
  CHECK(deck_error("# comment\n,\n") == "deck.yaml:2:1: " + unexpected);
  CHECK(deck_error("---\n, train: {steps: 5}\n") == "deck.yaml:2:1: " + unexpected);
  CHECK(deck_error("train: {steps: 5}\n---\n,\n") == "deck.yaml:3:1: " + unexpected);
}

TEST_CASE("deck: bad overrides") {
  CHECK(deck_error(kMinimal, {"train.steps"}) == "override 'train.steps': expected key=value");
  CHECK(deck_error(kMinimal, {"train.stepz=5"}) == "override 'train.stepz=5': unknown key 'stepz' in 'train' (did you mean 'steps'?)");
  CHECK(deck_error(kMinimal, {"trian.steps=5"}) == "override 'trian.steps=5': unknown section 'trian' (did you mean 'train'?)");
  CHECK(deck_error(kMinimal, {"steps=5"}) == "override 'steps=5': expected section.key=value (did you mean 'train.steps'?)");
  CHECK(deck_error(kMinimal, {"optim.lr=fast"}) == "override 'optim.lr=fast': expected a number, got 'fast'");
  CHECK(deck_error(kMinimal, {"train.steps="}) == "override 'train.steps=': expected an integer, got ''");
  CHECK(deck_error(kMinimal, {"train.steps=-3"}) == "override 'train.steps=-3': expected an integer >= 1, got -3");
  CHECK(deck_error(kMinimal, {"fsdp.reshard_after_forward=sometimes"}) ==
        "override 'fsdp.reshard_after_forward=sometimes': expected auto, true, false or an integer >= 2, got 'sometimes'");
}

TEST_CASE("deck: checks across keys point at the key most recently set") {
  CHECK(deck_error("train: {steps: 5}\nmodel:\n  n_embd: 100\n  n_head: 12\n") ==
        "deck.yaml:4:11: model.n_embd (100) must be a multiple of model.n_head (12)");
  CHECK(deck_error("train: {steps: 5, global_batch: 4, micro_batch: 8}\n") ==
        "deck.yaml:1:49: train.micro_batch (8) must be <= train.global_batch (4)");
  CHECK(deck_error("train: {steps: 5, global_batch: 12, micro_batch: 8}\n") ==
        "deck.yaml:1:50: train.global_batch (12) must be a multiple of train.micro_batch (8)");
  CHECK(deck_error("train: {steps: 5}\noptim: {lr: 1e-3}\n", {"schedule.min_lr=0.01"}) ==
        "override 'schedule.min_lr=0.01': schedule.min_lr (0.01) must be <= optim.lr (0.001)");
  CHECK(deck_error("schedule: {warmup_steps: 200}\ntrain: {steps: 100}\n") ==
        "deck.yaml:2:16: schedule.warmup_steps (200) must be <= train.steps (100)");
  CHECK(deck_error("train: {steps: 5}\ndata: {val_fraction: 0}\n") ==
        "deck.yaml:2:22: train.eval_interval (100) needs held-out data: set data.val_fraction > 0, or "
        "train.eval_interval: 0");
  CHECK(deck_error("train: {steps: 5}\nmesh: {dp_replicate: -1}\n") ==
        "deck.yaml:2:22: mesh.dp_replicate and mesh.dp_shard are both -1, but only one size can be inferred from "
        "the job size (mesh.dp_shard is -1 unless set)");
  CHECK(deck_error("train: {steps: 5}\nfsdp: {strategy: hybrid_shard}\n") ==
        "deck.yaml:2:18: fsdp.strategy hybrid_shard needs a mesh.dp_replicate dimension, e.g. mesh: {dp_replicate: "
        "2, dp_shard: -1}");
  CHECK(deck_error("train: {steps: 5}\nfsdp: {strategy: shard_grad_op, reshard_after_forward: true}\n") ==
        "deck.yaml:2:56: fsdp.reshard_after_forward (true) contradicts fsdp.strategy shard_grad_op, which keeps "
        "parameters unsharded after forward; leave it auto or set false");
  // An override is the newest edit, so it is named even when the other key came from the file.
  CHECK(deck_error("", {"train.steps=5", "data.val_fraction=0"}) ==
        "override 'data.val_fraction=0': train.eval_interval (100) needs held-out data: set data.val_fraction > 0, "
        "or train.eval_interval: 0");
}

TEST_CASE("deck: checkpoint.resume takes a checkpoint path, and none") {
  const Deck d = parse_deck("train: {steps: 5}\ncheckpoint:\n  resume: runs/a/checkpoints/step_00000004.h5\n", "deck.yaml");
  CHECK(d.checkpoint.resume == fsdpp::ResumeMode::path);
  CHECK(d.checkpoint.resume_path == "runs/a/checkpoints/step_00000004.h5");
  const Deck again = parse_deck(resolved_deck_yaml(d), "deck.yaml");
  CHECK(again.checkpoint.resume_path == d.checkpoint.resume_path);
  CHECK(parse_deck("train: {steps: 5}\ncheckpoint: {resume: none}\n", "deck.yaml").checkpoint.resume == fsdpp::ResumeMode::off);
}

TEST_CASE("deck: fsdp.replica_all_reduce defers HSDP's replica all-reduce, and only where there is one to defer") {
  CHECK(parse_deck("train: {steps: 5}\n", "deck.yaml").fsdp.replica_all_reduce ==
        fsdpp::ReplicaAllReduce::every_micro_batch);
  const std::string hsdp = "train: {steps: 5}\nmesh: {dp_replicate: 2}\nfsdp: {strategy: hybrid_shard, ";
  const Deck d = parse_deck(hsdp + "replica_all_reduce: last_micro_batch}\n", "deck.yaml");
  CHECK(d.fsdp.replica_all_reduce == fsdpp::ReplicaAllReduce::last_micro_batch);
  CHECK(parse_deck(resolved_deck_yaml(d), "deck.yaml").fsdp.replica_all_reduce ==
        fsdpp::ReplicaAllReduce::last_micro_batch);
  CHECK(deck_error("train: {steps: 5}\nfsdp: {replica_all_reduce: last_micro_batch}\n") ==
        "deck.yaml:2:28: fsdp.replica_all_reduce last_micro_batch defers hybrid_shard's all-reduce over the "
        "replicas, but fsdp.strategy full_shard has none to defer: set fsdp.strategy hybrid_shard, or remove "
        "fsdp.replica_all_reduce");
  CHECK(deck_error(hsdp + "replica_all_reduce: last_micro_batch, accumulate: unsharded}\n")
            .find("fsdp.accumulate unsharded already reduces once per step") != std::string::npos);
  CHECK(deck_error(hsdp + "replica_all_reduce: last_micro_batch}\n", {"train.reproducible=true"})
            .find("train.reproducible already all-reduces") != std::string::npos);
  CHECK(deck_error(hsdp + "replica_all_reduce: last}\n").find("every_micro_batch|last_micro_batch") !=
        std::string::npos);
}

TEST_CASE("deck: checkpoint.on_error is abort or continue, abort by default") {
  CHECK(parse_deck("train: {steps: 5}\n", "deck.yaml").checkpoint.on_error == fsdpp::CheckpointOnError::abort);
  const Deck d = parse_deck("train: {steps: 5}\ncheckpoint: {on_error: continue}\n", "deck.yaml");
  CHECK(d.checkpoint.on_error == fsdpp::CheckpointOnError::keep_going);
  CHECK(parse_deck(resolved_deck_yaml(d), "deck.yaml").checkpoint.on_error == fsdpp::CheckpointOnError::keep_going);
  CHECK(deck_error("train: {steps: 5}\ncheckpoint: {on_error: retry}\n").find("checkpoint.on_error") != std::string::npos);
  CHECK(fsdpp::deck_help().find("  checkpoint.on_error ") != std::string::npos);
}

TEST_CASE("deck: model.attention is auto, fused, batched or reference, auto by default, echoed and in --help-deck") {
  CHECK(parse_deck("train: {steps: 5}\n", "deck.yaml").model.attention == fsdpp::AttentionKind::automatic);
  const Deck d = parse_deck("train: {steps: 5}\nmodel: {attention: fused}\n", "deck.yaml");
  CHECK(d.model.attention == fsdpp::AttentionKind::fused);
  CHECK(parse_deck(resolved_deck_yaml(d), "deck.yaml").model.attention == fsdpp::AttentionKind::fused);
  const std::string e = deck_error("train: {steps: 5}\nmodel: {attention: flash}\n");
  CAPTURE(e);
  CHECK(e.rfind("deck.yaml:2:20: model.attention", 0) == 0);
  for (const char* choice : {"auto", "fused", "batched", "reference"}) CHECK(e.find(choice) != std::string::npos);
  CHECK(fsdpp::deck_help().find("  model.attention ") != std::string::npos);
}

TEST_CASE("deck: model.arch llama fills its derived keys, echoes them, and parses back to the same deck") {
  const Deck d = parse_deck("model: {arch: llama, n_embd: 4096, n_head: 32, n_kv_head: 8, n_layer: 2, "
                            "ffn_multiplier: 1.3, ffn_multiple_of: 1024, rope_theta: 500000}\ntrain: {steps: 1}\n",
                            "deck.yaml", {});
  CHECK(d.model.arch == fsdpp::ModelArch::llama);
  CHECK(d.model.ffn_hidden == 14336);       // Llama 3 8B's width from Meta's rule
  CHECK(d.model.tie_embeddings == false);   // llama's default
  CHECK(d.model.norm_eps == 1e-5);
  const std::string yaml = fsdpp::resolved_deck_yaml(d);
  for (const char* line : {"  arch: llama\n", "  n_kv_head: 8\n", "  ffn_hidden: 14336\n", "  rope_theta: 500000.0\n",
                           "  tie_embeddings: false\n"})
    CHECK_MESSAGE(yaml.find(line) != std::string::npos, line);
  CHECK(fsdpp::resolved_deck_yaml(parse_deck(yaml, "resolved.yaml", {})) == yaml);

  const Deck plain = parse_deck("model: {arch: llama, n_head: 12}\ntrain: {steps: 1}\n", "deck.yaml", {});
  CHECK(plain.model.n_kv_head == 12);  // multi-head attention unless n_kv_head is given
  CHECK(parse_deck("model: {arch: llama, tie_embeddings: true, ffn_hidden: 100}\ntrain: {steps: 1}\n", "d.yaml", {})
            .model.ffn_hidden == 100);  // given: no rule
  CHECK(parse_deck(kMinimal, "deck.yaml", {}).model.arch == fsdpp::ModelArch::gpt2);
}

TEST_CASE("deck: Llama keys are refused for gpt2, and Llama shapes are checked") {
  CHECK(deck_error("train: {steps: 5}\nmodel:\n  n_kv_head: 4\n") ==
        "deck.yaml:3:14: model.n_kv_head applies to Llama models only, but model.arch is gpt2: remove "
        "model.n_kv_head or set model.arch: llama (or qwen2, qwen3, qwen3_moe, mixtral)");
  CHECK(deck_error("train: {steps: 5}\nmodel: {arch: gpt2}\n", {"model.rope_theta=5e5"}) ==
        "override 'model.rope_theta=5e5': model.rope_theta applies to Llama models only, but model.arch is gpt2: "
        "remove model.rope_theta or set model.arch: llama (or qwen2, qwen3, qwen3_moe, mixtral)");
  CHECK(deck_error("train: {steps: 5}\nmodel:\n  arch: llama\n  n_head: 12\n  n_kv_head: 5\n") ==
        "deck.yaml:5:14: model.n_kv_head (5) must divide model.n_head (12): each key/value head serves n_head / "
        "n_kv_head query heads");
  CHECK(deck_error("train: {steps: 5}\nmodel:\n  arch: llama\n  n_embd: 100\n  n_head: 12\n") ==
        "deck.yaml:5:11: model.n_embd (100) must be a multiple of model.n_head (12)");
  CHECK(deck_error("train: {steps: 5}\nmodel:\n  arch: llama\n  n_embd: 36\n  n_head: 12\n") ==
        "deck.yaml:5:11: the head size model.n_embd / model.n_head (36 / 12 = 3) must be even: RoPE rotates "
        "channel pairs");
  CHECK(deck_error("train: {steps: 5}\nmodel: {arch: mamba}\n").find("model.arch") != std::string::npos);
  CHECK(deck_error("train: {steps: 5}\nmodel: {arch: llama, norm_eps: 0}\n").find("model.norm_eps") !=
        std::string::npos);
  CHECK(deck_error("train: {steps: 5}\nmodel: {arch: llama, rope_scaling_factor: 0.5}\n") ==
        "deck.yaml:2:43: model.rope_scaling_factor (0.5) must be at least 1 (1: plain RoPE; Llama 3.1: 8, Llama "
        "3.2: 32)");
  CHECK(deck_error("train: {steps: 5}\nmodel: {arch: llama, rope_scaling_factor: 8, rope_high_freq_factor: 1}\n") ==
        "deck.yaml:2:69: model.rope_high_freq_factor (1) must exceed model.rope_low_freq_factor (1) (Llama 3.1: 4 "
        "and 1)");
  CHECK(deck_error("train: {steps: 5}\nmodel: {arch: gpt2, rope_scaling_factor: 8}\n").find(
            "model.rope_scaling_factor applies to Llama models only") != std::string::npos);
}

TEST_CASE("deck: matmul.precision and matmul.tf32 choose the GEMM precision") {
  using fsdpp::GemmPrecision;
  using fsdpp::resolved_gemm_precision;
  const Deck defaults = parse_deck(kMinimal, "deck.yaml");
  CHECK(defaults.matmul.precision == fsdpp::MatmulPrecisionChoice::automatic);
  CHECK(defaults.matmul.tf32 == fsdpp::tf32_is_native());  // on by default only where tensor cores do it
  const GemmPrecision f32_default = fsdpp::tf32_is_native() ? GemmPrecision::tf32 : GemmPrecision::f32;
  CHECK(resolved_gemm_precision(defaults) == f32_default);
  // auto follows fsdp.param_dtype: bf16 parameters compute bf16 GEMMs, as FSDP2's mixed precision does.
  CHECK(resolved_gemm_precision(parse_deck(kMinimal, "deck.yaml", {"fsdp.param_dtype=bf16"})) ==
        GemmPrecision::bf16);
  CHECK(resolved_gemm_precision(parse_deck(kMinimal, "deck.yaml", {"fsdp.param_dtype=bf16", "matmul.precision=f32",
                                                                   "matmul.tf32=false"})) == GemmPrecision::f32);
  CHECK(resolved_gemm_precision(parse_deck(kMinimal, "deck.yaml", {"matmul.precision=bf16"})) == GemmPrecision::bf16);
  CHECK(resolved_gemm_precision(parse_deck(kMinimal, "deck.yaml", {"matmul.tf32=true"})) == GemmPrecision::tf32);
  CHECK(resolved_gemm_precision(parse_deck("train: {steps: 5}\nmatmul: {precision: bf16, tf32: true}\n",
                                           "deck.yaml")) == GemmPrecision::bf16);  // bf16 wins over tf32

  const Deck d = parse_deck("train: {steps: 5}\nmatmul: {precision: bf16, tf32: true}\n", "deck.yaml");
  const Deck again = parse_deck(fsdpp::resolved_deck_yaml(d), "resolved.yaml");
  CHECK(again.matmul.precision == fsdpp::MatmulPrecisionChoice::bf16);
  CHECK(again.matmul.tf32);
  CHECK(fsdpp::resolved_deck_yaml(d).find("matmul:\n  precision: bf16\n  tf32: true\n") != std::string::npos);

  CHECK(deck_error("train: {steps: 5}\nmatmul: {precision: fp8}\n") ==
        "deck.yaml:2:21: matmul.precision: expected auto|f32|bf16, got 'fp8'");
  CHECK(deck_error("train: {steps: 5}\nmatmul: {tf32: maybe}\n").find("matmul.tf32") != std::string::npos);
  CHECK(deck_error(kMinimal, {"matmul.precison=bf16"}).find("did you mean 'precision'") != std::string::npos);
  const std::string help = fsdpp::deck_help();
  CHECK(help.find("matmul.precision            auto|f32|bf16                  default: auto") != std::string::npos);
  CHECK(help.find("default: true on GPU builds, false on CPU builds") != std::string::npos);
}

TEST_CASE("deck: run.trace is none, a step or <first>-<last>, echoed, and checked against train.steps") {
  CHECK(parse_deck(kMinimal, "deck.yaml").run.trace_first == 0);
  const Deck range = parse_deck("train: {steps: 10}\nrun: {trace: 2-4}\n", "deck.yaml");
  CHECK(range.run.trace_first == 2);
  CHECK(range.run.trace_last == 4);
  CHECK(resolved_deck_yaml(range).find("trace: 2-4") != std::string::npos);
  const Deck again = parse_deck(resolved_deck_yaml(range), "deck.yaml");
  CHECK((again.run.trace_first == 2 && again.run.trace_last == 4));
  const Deck one = parse_deck(kMinimal, "deck.yaml", {"run.trace=7"});
  CHECK((one.run.trace_first == 7 && one.run.trace_last == 7));
  CHECK(parse_deck(resolved_deck_yaml(one), "deck.yaml").run.trace_last == 7);
  CHECK(parse_deck(resolved_deck_yaml(parse_deck(kMinimal, "deck.yaml")), "deck.yaml").run.trace_first == 0);
  CHECK(deck_error(kMinimal, {"run.trace=4-2"}) ==
        "override 'run.trace=4-2': run.trace 4-2 ends before it starts: write <first>-<last> with first <= last, e.g. 2-4");
  CHECK(deck_error(kMinimal, {"run.trace=9-11"}) ==
        "override 'run.trace=9-11': run.trace 9-11 goes past the last step (train.steps 10): trace steps 1-10 at most");
  CHECK(deck_error(kMinimal, {"run.trace=2-3", "comm.flight_records=0"}) ==
        "override 'comm.flight_records=0': run.trace 2-3 takes its collectives from the flight recorder, but "
        "comm.flight_records is 0: set comm.flight_records >= 64 (the default is 4096)");
  CHECK(deck_error(kMinimal, {"run.trace=0-3"}).find("expected steps >= 1") != std::string::npos);
  CHECK(deck_error(kMinimal, {"run.trace=-3"}).find("expected steps >= 1") != std::string::npos);
  CHECK(deck_error(kMinimal, {"run.trace=all"}) ==
        "override 'run.trace=all': expected none, a step (3) or a range of steps (2-4), got 'all'");
  CHECK(deck_error(kMinimal, {"run.trace=2-"}).find("expected none, a step") != std::string::npos);
  CHECK(fsdpp::deck_help().find("  run.trace ") != std::string::npos);
}

TEST_CASE("deck: fsdp.forward_prefetch and backward_prefetch take 0, 1, 2 or per-unit lists, and echo back") {
  const Deck defaults = parse_deck(kMinimal, "deck.yaml");
  CHECK(defaults.fsdp.forward_prefetch.depth == 1);
  CHECK(defaults.fsdp.backward_prefetch.depth == 1);
  CHECK(defaults.fsdp.forward_prefetch.lists.empty());
  CHECK(defaults.comm.overlap);

  const Deck d = parse_deck(kMinimal, "deck.yaml",
                            {"fsdp.forward_prefetch=2", "fsdp.backward_prefetch=h.3:h.4,h.5;h.4:h.6", "comm.overlap=false"});
  CHECK(d.fsdp.forward_prefetch.depth == 2);
  REQUIRE(d.fsdp.backward_prefetch.lists.size() == 2);
  CHECK(d.fsdp.backward_prefetch.lists[0].first == "h.3");
  CHECK(d.fsdp.backward_prefetch.lists[0].second == std::vector<std::string>{"h.4", "h.5"});
  CHECK(d.fsdp.backward_prefetch.lists[1].first == "h.4");
  CHECK(d.fsdp.backward_prefetch.lists[1].second == std::vector<std::string>{"h.6"});
  CHECK_FALSE(d.comm.overlap);
  const std::string yaml = fsdpp::resolved_deck_yaml(d);
  CHECK(yaml.find("  forward_prefetch: 2\n") != std::string::npos);
  CHECK(yaml.find("  backward_prefetch: \"h.3:h.4,h.5;h.4:h.6\"\n") != std::string::npos);
  CHECK(yaml.find("  overlap: false\n") != std::string::npos);
  const Deck again = parse_deck(yaml, "resolved.yaml");
  CHECK(fsdpp::resolved_deck_yaml(again) == yaml);
  CHECK(again.fsdp.backward_prefetch.lists == d.fsdp.backward_prefetch.lists);

  // In files, also a map of unit -> list (or one unit).
  const Deck map = parse_deck("train: {steps: 5}\nfsdp:\n  forward_prefetch: {root: [h.0, h.1], h.0: h.2}\n"
                              "  backward_prefetch: 0\n", "deck.yaml");
  CHECK(fsdpp::to_string(map.fsdp.forward_prefetch) == "root:h.0,h.1;h.0:h.2");
  CHECK(map.fsdp.backward_prefetch.depth == 0);
  CHECK(parse_deck(fsdpp::resolved_deck_yaml(map), "resolved.yaml").fsdp.forward_prefetch.lists ==
        map.fsdp.forward_prefetch.lists);
}

TEST_CASE("deck: bad prefetch settings say what is allowed") {
  CHECK(deck_error(kMinimal, {"fsdp.forward_prefetch=3"}) ==
        "override 'fsdp.forward_prefetch=3': expected 0, 1 or 2 units ahead, or per-unit lists (h.3:h.4,h.5;h.4:h.6), "
        "got '3'");
  CHECK(deck_error(kMinimal, {"fsdp.backward_prefetch=-1"}) ==
        "override 'fsdp.backward_prefetch=-1': expected 0, 1 or 2 units ahead, or per-unit lists (h.3:h.4,h.5;h.4:h.6), "
        "got '-1'");
  CHECK(deck_error(kMinimal, {"fsdp.forward_prefetch=often"}) ==
        "override 'fsdp.forward_prefetch=often': expected 0, 1, 2 or <unit>:<unit>[,<unit>];... (h.3:h.4,h.5;h.4:h.6), "
        "got 'often'");
  CHECK(deck_error(kMinimal, {"fsdp.forward_prefetch=h.0:"}) ==
        "override 'fsdp.forward_prefetch=h.0:': expected a unit name (h.<i> or root) in 'h.0:', got ''");
  CHECK(deck_error(kMinimal, {"fsdp.forward_prefetch=h.0:h.1;h.0:h.2"}) ==
        "override 'fsdp.forward_prefetch=h.0:h.1;h.0:h.2': unit h.0 has two prefetch lists; give it one: h.0:h.1,h.2");
  CHECK(deck_error("train: {steps: 5}\nfsdp: {forward_prefetch: [1, 2]}\n").find("fsdp.forward_prefetch: expected") !=
        std::string::npos);
}
