// The rules that tie deck keys together (config/deck_rules.hpp): each one is a function that names its keys,
// parse_deck reports it at the key set last, and the code that depends on a rule gets the same words from the
// same function; launch-time rules apply only where they are used. Also the key table's other single sources:
// which architectures read which keys, and the names of other frameworks, ambiguous ones refused.
#include "input_decks.hpp"
#include "mpi_test.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/config/deck_schema.hpp"
#include "fsdpp/nn/tensor_parallel.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/nn/qwen2.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/train/data_feed.hpp"

#include <string>
#include <vector>

using fsdpp::Deck;
using fsdpp::DeckRuleError;
using fsdpp::parse_deck;

namespace {

const char* const kFiveSteps = "train: {steps: 5}\n";

using fsdpp::test::deck_error;

// The DeckRuleError a rule throws: its keys, then its message.
template <class Rule> std::pair<std::vector<std::string>, std::string> broken(Rule&& rule) {
  try {
    rule();
  } catch (const DeckRuleError& e) {
    return {e.keys(), e.what()};
  }
  return {{}, "(no error)"};
}

fsdpp::ModelConfig llama(int n_head, int n_kv_head, int ffn_hidden) {
  fsdpp::ModelConfig m;
  m.arch = fsdpp::ModelArch::llama;
  m.vocab_size = 256;
  m.n_embd = 64;
  m.n_head = n_head;
  m.n_kv_head = n_kv_head;
  m.ffn_hidden = ffn_hidden;
  return m;
}

}  // namespace

TEST_CASE("deck rules: each rule names its keys, and parse_deck points at the one set last") {
  fsdpp::ModelConfig gpt;
  gpt.n_embd = 100;
  const auto [keys, message] = broken([&] { fsdpp::check_model_shape(gpt); });
  CHECK(keys == std::vector<std::string>{"model.n_embd", "model.n_head"});
  CHECK(message == "model.n_embd (100) must be a multiple of model.n_head (12)");
  // The same rule through a deck: at the line of n_embd when it comes last, at the override of n_head when that does.
  CHECK(deck_error("train: {steps: 5}\nmodel:\n  n_head: 12\n  n_embd: 100\n") == "deck.yaml:4:11: " + message);
  CHECK(deck_error("train: {steps: 5}\nmodel:\n  n_embd: 100\n", {"model.n_head=12"}) ==
        "override 'model.n_head=12': " + message);
  // A derived key (ffn_hidden from Meta's rule) has no place in the deck: the rule points at a key the user set.
  CHECK(deck_error("train: {steps: 5}\nmodel: {arch: llama}\n", {"mesh.tp=3"}) ==
        "override 'mesh.tp=3': mesh.tp (3) must divide the MLP width model.ffn_hidden (2048); set model.ffn_hidden (or "
        "model.ffn_multiple_of) to a multiple of 3");
}

TEST_CASE("deck rules: the model's shape, for every architecture and for the Llama family") {
  fsdpp::ModelConfig m;
  m.vocab_size = 1;
  CHECK(broken([&] { fsdpp::check_model_shape(m); }).second ==
        "model.vocab_size (1) must be at least 2: the model predicts one of its tokens");
  CHECK(deck_error(kFiveSteps, {"model.vocab_size=1"}) ==
        "override 'model.vocab_size=1': model.vocab_size (1) must be at least 2: the model predicts one of its tokens");
  for (const fsdpp::ModelArch arch : {fsdpp::ModelArch::llama, fsdpp::ModelArch::qwen2}) {
    fsdpp::ModelConfig l = llama(4, 3, 176);
    l.arch = arch;
    CHECK(broken([&] { fsdpp::check_model_shape(l); }).first ==
          std::vector<std::string>{"model.n_kv_head", "model.n_head"});
    l = llama(4, 2, 176);
    l.arch = arch;
    fsdpp::check_model_shape(l);  // sound
    l.rope_scaling_factor = 8;
    l.rope_high_freq_factor = 1;
    CHECK(broken([&] { fsdpp::check_model_shape(l); }).second ==
          "model.rope_high_freq_factor (1) must exceed model.rope_low_freq_factor (1) (Llama 3.1: 4 and 1)");
  }
  // GPT-2 has no RoPE: an odd head size is fine there.
  fsdpp::ModelConfig odd;
  odd.n_embd = 36;
  odd.n_head = 12;
  fsdpp::check_model_shape(odd);
}

TEST_CASE("deck rules: tensor parallelism splits whole heads, the MLP width and the vocabulary") {
  CHECK(broken([] { fsdpp::check_tensor_parallel(llama(4, 2, 176), 4); }) ==
        std::pair<std::vector<std::string>, std::string>{
            {"mesh.tp", "model.n_head", "model.n_kv_head"},
            "mesh.tp (4) must divide model.n_head (4) and model.n_kv_head (2): each tensor-parallel rank computes whole "
            "query and key/value heads"});
  fsdpp::ModelConfig qwen2 = llama(4, 2, 175);
  qwen2.arch = fsdpp::ModelArch::qwen2;  // the Llama family's rules
  CHECK(broken([&] { fsdpp::check_tensor_parallel(qwen2, 2); }).second ==
        "mesh.tp (2) must divide the MLP width model.ffn_hidden (175); set model.ffn_hidden (or model.ffn_multiple_of) "
        "to a multiple of 2");
  fsdpp::check_tensor_parallel(llama(4, 2, 176), 2);  // sound
  // Mixtral: attention splits, the experts do not (every layer sparse, so no dense MLP width to divide); not with
  // sequence parallelism.
  fsdpp::ModelConfig mixtral = llama(4, 2, 175);
  mixtral.arch = fsdpp::ModelArch::mixtral;
  fsdpp::check_tensor_parallel(mixtral, 2);
  CHECK(broken([&] { fsdpp::check_tensor_parallel(mixtral, 2, /*sequence_parallel=*/true); }).first ==
        std::vector<std::string>{"mesh.tp_sequence_parallel", "model.arch"});
  mixtral.arch = fsdpp::ModelArch::qwen3_moe;  // q/k norms: replicated, their gradients summed over tp
  fsdpp::check_tensor_parallel(mixtral, 2);
  fsdpp::check_tensor_parallel(llama(3, 3, 175), 1);  // no tensor parallelism: nothing to split
  CHECK(broken([] { fsdpp::check_vocabulary_split(5, 4); }).second ==
        "mesh.tp (4) splits model.vocab_size (5) like torch.chunk, which leaves the last tensor-parallel rank no "
        "vocabulary rows; use a smaller mesh.tp");
  fsdpp::check_vocabulary_split(7, 4);  // 2, 2, 2, 1 rows
  // A model split over tensor-parallel ranks asks the same rule.
  fsdpp::ModelConfig five_tokens = llama(4, 4, 176);
  five_tokens.vocab_size = 5;
  const auto model = fsdpp::make_model(five_tokens);
  const fsdpp::DeviceMesh planning = fsdpp::DeviceMesh::planning({{"tp", 4}}, 4, 0);
  CHECK_THROWS_WITH_AS(model->apply_tensor_parallel(std::make_shared<fsdpp::TensorParallelGroup>(4, 0, &planning.comm(0))),
                       doctest::Contains("leaves the last tensor-parallel rank no vocabulary rows"), DeckRuleError);
  CHECK(broken([] { fsdpp::check_sequence_parallel_tokens(1, 6, 4); }) ==
        std::pair<std::vector<std::string>, std::string>{
            {"mesh.tp_sequence_parallel", "mesh.tp", "train.micro_batch", "model.context_length"},
            "mesh.tp_sequence_parallel splits a micro-batch's train.micro_batch x model.context_length = 1 x 6 = 6 "
            "tokens over mesh.tp = 4 ranks: make it a multiple of 4"});
  // In a deck, at the key set last: here the micro-batch.
  CHECK(deck_error("train: {steps: 5}\nmodel: {context_length: 6}\nmesh: {tp: 4, tp_sequence_parallel: true}\n",
                 {"train.micro_batch=1"})
            .rfind("override 'train.micro_batch=1': mesh.tp_sequence_parallel splits", 0) == 0);
}

TEST_CASE("deck rules: expert parallelism needs experts to split, and divides them and the shard group") {
  fsdpp::ModelConfig moe = llama(4, 2, 176);
  moe.arch = fsdpp::ModelArch::qwen3_moe;
  moe.moe.num_experts = 8;
  fsdpp::MeshConfig mesh;
  mesh.ep = 4;
  fsdpp::check_expert_parallel(moe, mesh, 8);   // sound: 8 experts, 2 per rank; dp_shard 8 = 2 x 4
  fsdpp::check_expert_parallel(moe, mesh, -1);  // dp_shard inferred: checked at launch
  CHECK(broken([&] { fsdpp::check_expert_parallel(moe, mesh, 6); }) ==
        std::pair<std::vector<std::string>, std::string>{
            {"mesh.ep", "mesh.dp_shard"},
            "mesh.ep (4) must divide mesh.dp_shard (6): expert parallelism splits the shard group into dp_shard / ep "
            "groups of ep consecutive ranks"});
  moe.moe.num_experts = 6;
  CHECK(broken([&] { fsdpp::check_expert_parallel(moe, mesh, 8); }) ==
        std::pair<std::vector<std::string>, std::string>{
            {"mesh.ep", "model.moe.num_experts"},
            "mesh.ep (4) must divide model.moe.num_experts (6): each expert-parallel rank holds the same number of "
            "whole experts"});
  CHECK(broken([&] { fsdpp::check_expert_parallel(llama(4, 2, 176), mesh, 8); }).first ==
        std::vector<std::string>{"mesh.ep", "model.arch"});
  CHECK(broken([&] { fsdpp::check_expert_parallel(llama(4, 2, 176), mesh, 8); }).second ==
        "mesh.ep (4) splits the experts of a mixture-of-experts model, but model.arch llama has none: use qwen3_moe "
        "or mixtral, or remove mesh.ep");
  mesh.ep = 0;
  CHECK(broken([&] { fsdpp::check_expert_parallel(moe, mesh, 8); }).second ==
        "mesh.ep (0) must be at least 1 (1: no expert parallelism)");
  mesh.ep = 1;
  fsdpp::check_expert_parallel(llama(4, 2, 176), mesh, 3);  // no expert parallelism: nothing to check
  // In a deck, at file:line:col of the key set last.
  CHECK(deck_error("train: {steps: 5}\nmesh: {dp_shard: 4, ep: 2}\n") ==
        "deck.yaml:2:25: mesh.ep (2) splits the experts of a mixture-of-experts model, but model.arch gpt2 has none: "
        "use qwen3_moe or mixtral, or remove mesh.ep");
  CHECK(deck_error("train: {steps: 5}\nmodel: {arch: mixtral, moe: {expert_ffn_hidden: 8}}\nmesh: {dp_shard: 6, ep: 4}\n")
            .rfind("deck.yaml:3:25: mesh.ep (4) must divide mesh.dp_shard (6)", 0) == 0);
  // The launch: dp_shard -1 resolved from the job size, by parallel_layout with the same words.
  Deck d = parse_deck("train: {steps: 5}\nmodel: {arch: mixtral, moe: {expert_ffn_hidden: 8}}\nmesh: {ep: 4}\n", "deck.yaml");
  CHECK_THROWS_WITH_AS(fsdpp::parallel_layout(d, 6), doctest::Contains("mesh.ep (4) must divide mesh.dp_shard (6)"),
                       DeckRuleError);
  const fsdpp::ParallelLayout layout = fsdpp::parallel_layout(d, 8);
  CHECK(layout.ep == 4);
  // Parallelism builds the expert groups over the layout's mesh (here a planning one, seen from world rank 5).
  fsdpp::Parallelism par(layout, std::make_unique<fsdpp::DeviceMesh>(fsdpp::DeviceMesh::planning(layout.mesh, 8, 5)),
                         MPI_COMM_NULL);
  REQUIRE(par.expert_parallel_group() != nullptr);
  CHECK(par.expert_parallel_group()->size() == 4);
  CHECK(par.expert_parallel_group()->rank() == 1);
  CHECK(par.expert_fsdp_mesh()->size() == 2);
  CHECK(par.describe_expert_groups() ==
        "expert parallel over ep=4 (world ranks 4,5,6,7: consecutive ranks of dp_shard, outside tp); experts' data "
        "parallel dp_shard_mod_ep=2 (world ranks 1,5: the ranks holding the same experts; the experts' fully_shard "
        "mesh: dp_shard_mod_ep=2 (2 ranks, mpi))");
  CHECK(par.describe() == "dp_shard=8 (8 ranks, mpi); experts over dp_shard_mod_ep=2 x ep=4");
}

TEST_CASE("deck rules: strategy and mesh combinations are refused in the deck and by parallel_layout alike") {
  fsdpp::FsdpConfig fsdp;
  fsdpp::MeshConfig mesh;
  mesh.dp_replicate = 2;
  const std::string full_with_replicas =
      "mesh.dp_replicate (2) makes a 2-D mesh, which fsdp.strategy full_shard does not use: set fsdp.strategy "
      "hybrid_shard, or remove mesh.dp_replicate";
  CHECK(broken([&] { fsdpp::check_parallel_strategy(fsdp, mesh); }).second == full_with_replicas);
  CHECK(deck_error("train: {steps: 5}\nmesh: {dp_replicate: 2}\n") == "deck.yaml:2:22: " + full_with_replicas);
  fsdp.strategy = fsdpp::ShardStrategy::hybrid_shard;
  fsdpp::check_parallel_strategy(fsdp, mesh);  // sound
  // A Deck built in code meets the same rule at layout time, before any mesh exists.
  Deck d = parse_deck(kFiveSteps, "deck.yaml");
  d.mesh.dp_replicate = 2;
  CHECK_THROWS_WITH_AS(fsdpp::parallel_layout(d, 4), full_with_replicas.c_str(), DeckRuleError);
  d.mesh.dp_replicate = 0;
  d.mesh.tp = 2;
  d.fsdp.strategy = fsdpp::ShardStrategy::no_shard;
  CHECK_THROWS_WITH_AS(fsdpp::parallel_layout(d, 4), doctest::Contains("fsdp.strategy no_shard lays its own mesh"),
                       DeckRuleError);
  // Launch time: the job size, and the reshard group against the shard group.
  CHECK(broken([] { fsdpp::check_job_size(fsdpp::MeshConfig{0, -1, 2, false}, 3); }).second ==
        "mesh.tp is 2, which does not divide the 3 ranks of the job: launch a multiple of 2 ranks, or change mesh.tp");
  CHECK(broken([] { fsdpp::check_reshard_after_forward_group(3, 4); }) ==
        std::pair<std::vector<std::string>, std::string>{
            {"fsdp.reshard_after_forward", "mesh.dp_shard"},
            "fsdp.reshard_after_forward = 3 must divide the 4 ranks of the shard group"});
  fsdpp::check_reshard_after_forward_group(2, 4);
  fsdpp::check_reshard_after_forward_group(0, 3);  // unused
}

TEST_CASE("deck rules: the batch split over data-parallel ranks is training's, a DeckRuleError with its keys") {
  fsdpp::TrainConfig t;
  t.global_batch = 16;
  t.micro_batch = 8;
  CHECK(fsdpp::grad_accum_steps(t, 2) == 1);
  const auto [keys, message] = broken([&] { fsdpp::grad_accum_steps(t, 3); });
  CHECK(keys == std::vector<std::string>{"train.global_batch", "train.micro_batch"});
  CHECK(message == "train.global_batch (16) must be a multiple of train.micro_batch (8) x 3 data-parallel ranks = 24; "
                   "change train.global_batch or train.micro_batch, or the number of ranks");
  // parse_deck does not know the job size: the deck itself is sound.
  CHECK(parse_deck("train: {steps: 5, global_batch: 16, micro_batch: 8}\n", "deck.yaml").train.micro_batch == 8);
}

TEST_CASE("deck rules: the keys only the Llama family reads come from one table, refused elsewhere") {
  using fsdpp::deck_detail::deck_fields;
  const Deck llama_deck = parse_deck("train: {steps: 5}\nmodel: {arch: llama}\n", "deck.yaml");
  int family_keys = 0;
  for (const auto& f : deck_fields()) {
    if (f.family != "Llama") continue;
    ++family_keys;
    CAPTURE(f.path());
    const std::string set = f.path() + "=" + f.get(llama_deck);  // a value the key accepts
    CHECK(f.reads(fsdpp::ModelArch::llama));
    CHECK(f.reads(fsdpp::ModelArch::qwen2));
    CHECK_FALSE(f.reads(fsdpp::ModelArch::gpt2));
    CHECK(deck_error(kFiveSteps, {"model.arch=qwen2", set}) == "(no error)");
    CHECK(deck_error(kFiveSteps, {"model.arch=llama", set}) == "(no error)");
    CHECK(deck_error(kFiveSteps, {set}) == "override '" + set + "': " + f.path() + " applies to Llama models only, "
                                           "but model.arch is gpt2: remove " + f.path() +
                                           " or set model.arch: llama (or qwen2, qwen3, qwen3_moe, mixtral)");
  }
  CHECK(family_keys == 11);
}

TEST_CASE("deck rules: the model.moe keys are read by the mixture-of-experts architectures only") {
  using fsdpp::deck_detail::deck_fields;
  const Deck moe_deck = parse_deck("train: {steps: 5}\nmodel: {arch: mixtral, moe: {expert_ffn_hidden: 32}}\n",
                                   "deck.yaml");
  int moe_keys = 0;
  for (const auto& f : deck_fields()) {
    if (f.family != "mixture-of-experts") continue;
    ++moe_keys;
    CAPTURE(f.path());
    CHECK(f.path().rfind("model.moe.", 0) == 0);
    const std::string set = f.path() + "=" + f.get(moe_deck);  // a value the key accepts
    CHECK(f.reads(fsdpp::ModelArch::qwen3_moe));
    CHECK(f.reads(fsdpp::ModelArch::mixtral));
    CHECK_FALSE(f.reads(fsdpp::ModelArch::llama));
    CHECK_FALSE(f.reads(fsdpp::ModelArch::qwen3));
    CHECK(deck_error(kFiveSteps, {"model.arch=qwen3_moe", "model.moe.expert_ffn_hidden=8", set}) == "(no error)");
    CHECK(deck_error(kFiveSteps, {"model.arch=llama", set}) ==
          "override '" + set + "': " + f.path() + " applies to mixture-of-experts models only, but model.arch is "
          "llama: remove " + f.path() + " or set model.arch: qwen3_moe (or mixtral)");
  }
  CHECK(moe_keys == 11);
  // The map form and the dotted form are one key; the rules point at the line that broke them.
  const Deck nested = parse_deck("train: {steps: 5}\nmodel:\n  arch: qwen3_moe\n  moe:\n    num_experts: 4\n"
                                 "    top_k: 3\n    expert_ffn_hidden: 8\n    dense_layers: [0, 5]\n  n_layer: 6\n",
                                 "deck.yaml");
  CHECK(nested.model.moe.num_experts == 4);
  CHECK(nested.model.moe.top_k == 3);
  CHECK(nested.model.moe.dense_layers == std::vector<int>{0, 5});
  CHECK(!fsdpp::is_moe_layer(nested.model, 0));
  CHECK(fsdpp::is_moe_layer(nested.model, 1));
  CHECK(!fsdpp::is_moe_layer(nested.model, 5));
  CHECK(deck_error("train: {steps: 5}\nmodel:\n  arch: qwen3_moe\n  moe:\n    num_experts: 4\n    top_k: 5\n"
                   "    expert_ffn_hidden: 8\n") ==
        "deck.yaml:6:12: model.moe.top_k (5) must be at most model.moe.num_experts (4): a token goes to top_k "
        "different experts");
  CHECK(deck_error("train: {steps: 5}\nmodel: {arch: mixtral}\n") ==
        "deck.yaml:2:15: model.moe.expert_ffn_hidden is required for model.arch mixtral: each expert's SwiGLU width "
        "(HF moe_intermediate_size; Mixtral's intermediate_size)");
  CHECK(deck_error(kFiveSteps, {"model.arch=qwen3_moe", "model.moe.expert_ffn_hidden=8", "model.n_layer=2",
                                "model.moe.dense_layers=[0, 2]"}) ==
        "override 'model.moe.dense_layers=[0, 2]': model.moe.dense_layers names layer 2, but the model has layers 0 "
        "to 1 (model.n_layer 2)");
  CHECK(deck_error(kFiveSteps, {"model.arch=mixtral", "model.moe.expert_ffn_hidden=8", "mesh.tp=2"}) == "(no error)");
  CHECK(deck_error(kFiveSteps, {"model.arch=mixtral", "model.moe.expert_ffn_hidden=8", "mesh.tp=2",
                                "mesh.tp_sequence_parallel=true"})
            .rfind("override 'mesh.tp_sequence_parallel=true': mesh.tp_sequence_parallel with model.arch mixtral: the "
                   "mixture-of-experts layers run on every row", 0) == 0);
}

TEST_CASE("deck rules: other frameworks' names point at ours, and ambiguous ones are refused") {
  using fsdpp::deck_detail::deck_aliases;
  using fsdpp::deck_detail::deck_fields;
  using fsdpp::deck_detail::deck_sections;
  // Every alias points at keys (or sections) that exist.
  for (const auto& a : deck_aliases()) {
    CAPTURE(a.alias);
    REQUIRE_FALSE(a.targets.empty());
    for (const std::string_view target : a.targets) {
      bool found = false;
      if (a.section.empty())
        for (const auto& s : deck_sections()) found = found || s.name == target;
      else
        for (const auto& f : deck_fields()) found = found || (f.section == a.section && f.key == target);
      CHECK_MESSAGE(found, target);
    }
    CHECK(a.ambiguous() == (a.targets.size() > 1));  // one meaning, one target
  }
  const std::string batch_size = "train.batch_size is ambiguous (per process in nanoGPT and llm.c): use "
                                 "train.global_batch (sequences per optimizer step, all ranks) or train.micro_batch "
                                 "(per rank per forward)";
  CHECK(deck_error("train: {steps: 5, batch_size: 8}\n") == "deck.yaml:1:19: " + batch_size);
  CHECK(deck_error(kFiveSteps, {"train.batch_size=8"}) == "override 'train.batch_size=8': " + batch_size);
  CHECK(deck_error("train: {steps: 5}\ncheckpoint:\n  path: runs/x\n") ==
        "deck.yaml:3:3: checkpoint.path is ambiguous (a folder to save in, or a file to continue or start from, "
        "depending on the framework): use checkpoint.dir (the folder saves go to), checkpoint.resume (a checkpoint "
        "file to continue a run from) or checkpoint.init_from (weights to start a new run from)");
  // Plain synonyms are still only pointed at, never taken.
  CHECK(deck_error("train: {steps: 5, micro_batch_size: 8}\n") ==
        "deck.yaml:1:19: unknown key 'micro_batch_size' in 'train' (did you mean 'micro_batch'?)");
  CHECK(deck_error("train: {steps: 5, global_batch_size: 8}\n") ==
        "deck.yaml:1:19: unknown key 'global_batch_size' in 'train' (did you mean 'global_batch'?)");
}

TEST_CASE("deck rules: validation batches (fsdpp eval) need no batch split; training batches do") {
  // tiny.yaml: 16 sequences in micro-batches of 8, which 3 data-parallel ranks cannot split.
  const Deck deck = fsdpp::test::input_deck("tiny.yaml", {});
  fsdpp::DataFeed data(deck, 3, 2);
  fsdpp::Flow flow;
  data.load_val(0, flow);  // micro_batch windows of this rank's share of the validation batch
  CHECK(flow.B == deck.train.micro_batch);
  CHECK(flow.T == deck.model.context_length);
  CHECK_THROWS_WITH_AS(data.accumulation_steps(), doctest::Contains("x 3 data-parallel ranks = 24"), DeckRuleError);
  CHECK_THROWS_AS(data.load_train(0, flow), DeckRuleError);
  CHECK(fsdpp::DataFeed(deck, 2, 1).accumulation_steps() == 1);
}

TEST_CASE("deck rules: a model that runs no backward is laid out without training's reshard group") {
  const Deck trained = fsdpp::test::input_deck("tiny.yaml", {"fsdp.reshard_after_forward=2"});
  CHECK_THROWS_WITH_AS(fsdpp::parallel_layout(trained, 1), "fsdp.reshard_after_forward = 2 must divide the 1 ranks "
                       "of the shard group", DeckRuleError);
  const Deck forward = fsdpp::forward_only(trained);
  CHECK(forward.fsdp.reshard_after_forward.kind == fsdpp::ReshardAfterForward::Kind::automatic);
  CHECK(fsdpp::parallel_layout(forward, 1).block_options.reshard_after_forward_ranks == 0);
  CHECK(fsdpp::parallel_layout(forward, 3).mesh.back().size == 3);
  CHECK(forward.train.global_batch == trained.train.global_batch);  // nothing else changes
}

TEST_CASE("deck rules: document masks need an end-of-text id in the vocabulary; reset positions need masks and RoPE") {
  fsdpp::DataConfig data;
  fsdpp::ModelConfig gpt;  // GPT-2's defaults: vocab_size 50257
  CHECK(fsdpp::document_masks(data).eot_id == -1);  // off by default: no masks
  data.document_mask = true;
  CHECK(broken([&] { fsdpp::check_document_masks(data, gpt); }).first ==
        std::vector<std::string>{"data.document_mask", "data.eot_id"});
  CHECK(deck_error(kFiveSteps, {"data.document_mask=true"}) ==
        "override 'data.document_mask=true': data.document_mask needs the end-of-text id that ends each document: "
        "set data.eot_id (GPT-2's tokenizer: 50256)");
  data.eot_id = 50257;
  CHECK(broken([&] { fsdpp::check_document_masks(data, gpt); }).second ==
        "data.eot_id (50257) must be below model.vocab_size (50257)");
  data.eot_id = 50256;
  fsdpp::check_document_masks(data, gpt);  // sound
  CHECK(fsdpp::document_masks(data).eot_id == 50256);
  data.reset_positions = true;
  CHECK(broken([&] { fsdpp::check_document_masks(data, gpt); }).first ==
        std::vector<std::string>{"data.reset_positions", "model.arch"});
  fsdpp::ModelConfig rope = llama(4, 2, 176);
  rope.vocab_size = 50257;
  fsdpp::check_document_masks(data, rope);  // RoPE: sound
  CHECK(fsdpp::document_masks(data).reset_positions);
  data.document_mask = false;
  CHECK(broken([&] { fsdpp::check_document_masks(data, rope); }).first ==
        std::vector<std::string>{"data.reset_positions", "data.document_mask"});
  CHECK(fsdpp::document_masks(data).eot_id == -1);  // eot_id alone turns nothing on
  // In a deck: at the key set last, with its line and column.
  CHECK(deck_error("train: {steps: 5}\ndata:\n  document_mask: true\n  eot_id: 50256\n  reset_positions: true\n")
            .rfind("deck.yaml:5:20: data.reset_positions is for rotary positions", 0) == 0);
}
