// The models as a whole, for every architecture (GPT-2, Llama, Qwen2): their parameter names, shapes and counts,
// the counter-based init (split-invariant, with each model's scales), the hook door fully_shard uses, the
// planner's activation bytes against what a forward and backward allocate, and a gradient check through the
// whole model against central differences. What differs between architectures is data in these tests (names,
// shapes, scales); the checks are one each.
#include "model_shapes.hpp"
#include "mpi_test.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/nn/qwen2.hpp"
#include "fsdpp/parallel/build_model.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

using namespace fsdpp;
using namespace fsdpp::test;

namespace {

std::map<std::string, Parameter*> by_name(LanguageModel& model) {
  std::map<std::string, Parameter*> out;
  for (Parameter* p : model.parameters()) out[p->name()] = p;
  return out;
}

double stddev(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += double(x) * x;
  const double mean = s / v.size();
  return std::sqrt(s2 / v.size() - mean * mean);
}

using ParamShape = std::vector<std::int64_t>;

}  // namespace

TEST_CASE("models: GPT-2 has GPT-2's names and small.yaml's 4.27M parameters, on meta") {
  const ModelConfig c = model_config(ModelArch::gpt2, 4096, 256, 256, 4, 4, true);
  Gpt model(c);
  auto params = by_name(model);
  std::int64_t total = 0;
  for (const auto& [name, p] : params) {
    total += p->numel();
    CHECK(p->is_meta());  // no storage until to_empty
  }
  CHECK(total == 4'273'664);
  CHECK(model.parameter_count() == total);
  const std::map<std::string, ParamShape> expected = {
      {"wte.weight", {4096, 256}},        {"wpe.weight", {256, 256}},           {"ln_f.weight", {256}},
      {"ln_f.bias", {256}},               {"h.0.ln_1.weight", {256}},           {"h.0.attn.c_attn.weight", {768, 256}},
      {"h.0.attn.c_attn.bias", {768}},    {"h.0.attn.c_proj.weight", {256, 256}}, {"h.2.ln_2.bias", {256}},
      {"h.3.mlp.c_fc.weight", {1024, 256}}, {"h.3.mlp.c_proj.weight", {256, 1024}}, {"h.3.mlp.c_proj.bias", {256}}};
  for (const auto& [name, shape] : expected) {
    const std::string shown_name = name;  // a copy: CAPTURE cannot capture a structured binding before C++20
    CAPTURE(shown_name);
    REQUIRE(params.count(name) == 1);
    CHECK(params[name]->shape() == shape);
  }
  CHECK(params.count("lm_head.weight") == 0);  // tied
  CHECK(params.size() == 4 + 4 * 12);
  CHECK(model.parameters().front()->name() == "wte.weight");  // registration order: the embeddings first
  CHECK(model.blocks().size() == 4);
  CHECK(model.blocks()[1]->path() == "h.1");
  CHECK(model.describe() == "GPT-2, V 4096 T 256 C 256 L 4 NH 4 (tied embeddings)");
  // FLOPs: 6 x every parameter but the position table (wte is the head), + 12 L T C.
  CHECK(model.flops_per_token(256) == 6.0 * (total - 256 * 256) + 12.0 * 4 * 256 * 256);

  ModelConfig untied = c;
  untied.tie_embeddings = false;
  Gpt with_head(untied);
  REQUIRE(with_head.lm_head != nullptr);
  CHECK(with_head.lm_head->name() == "lm_head.weight");
  CHECK(with_head.parameter_count() == total + 4096 * 256);
  CHECK(with_head.flops_per_token(256) == model.flops_per_token(256));  // wte is then a lookup, lm_head multiplies
}

TEST_CASE("models: Llama and Qwen2 have Hugging Face's names, shapes and counts, on meta") {
  const std::int64_t V = 1000, C = 64, L = 3, KC = 16, F = 176;  // NH 8, NKV 2: hs 8, KC = 2 x 8
  for (ModelArch arch : {ModelArch::llama, ModelArch::qwen2}) {
    CAPTURE(to_string(arch));
    const bool qwen = arch == ModelArch::qwen2;
    ModelConfig c = model_config(arch, V, 32, C, L, 8, false, F);
    c.n_kv_head = 2;
    const auto model = make_model(c);
    auto params = by_name(*model);
    std::int64_t total = 0;
    for (const auto& [name, p] : params) {
      total += p->numel();
      CHECK(p->is_meta());
    }
    const std::int64_t biases = qwen ? L * (C + 2 * KC) : 0;
    CHECK(total == V * C * 2 + C + L * (2 * C + 2 * C * C + 2 * KC * C + 3 * F * C) + biases);
    CHECK(model->parameter_count() == total);
    std::map<std::string, ParamShape> expected = {
        {"embed_tokens.weight", {V, C}},       {"norm.weight", {C}},
        {"lm_head.weight", {V, C}},            {"layers.0.input_layernorm.weight", {C}},
        {"layers.0.self_attn.q_proj.weight", {C, C}}, {"layers.1.self_attn.k_proj.weight", {KC, C}},
        {"layers.2.self_attn.v_proj.weight", {KC, C}}, {"layers.2.self_attn.o_proj.weight", {C, C}},
        {"layers.1.post_attention_layernorm.weight", {C}}, {"layers.0.mlp.gate_proj.weight", {F, C}},
        {"layers.0.mlp.up_proj.weight", {F, C}},      {"layers.2.mlp.down_proj.weight", {C, F}}};
    if (qwen)
      expected.insert({{"layers.0.self_attn.q_proj.bias", {C}}, {"layers.1.self_attn.k_proj.bias", {KC}},
                       {"layers.2.self_attn.v_proj.bias", {KC}}});
    for (const auto& [name, shape] : expected) {
      const std::string shown_name = name;  // a copy: CAPTURE cannot capture a structured binding before C++20
      CAPTURE(shown_name);
      REQUIRE(params.count(name) == 1);
      CHECK(params[name]->shape() == shape);
    }
    std::size_t bias_count = 0;
    for (const auto& [name, p] : params) bias_count += name.find("bias") != std::string::npos;
    CHECK(bias_count == (qwen ? 3 * L : 0));  // Llama has none; Qwen2 only q, k and v's
    CHECK(params.size() == 3 + L * (qwen ? 12 : 9));
    CHECK(model->block_modules().size() == L);
    CHECK(model->block_modules()[1]->path() == "layers.1");
    CHECK(model->describe().rfind(qwen ? "Qwen2, V 1000 T 32 C 64 L 3 NH 8 NKV 2 F 176" :
                                         "Llama, V 1000 T 32 C 64 L 3 NH 8 NKV 2 F 176", 0) == 0);
    // FLOPs: 6 x every parameter but the embedding (a lookup, lm_head multiplies), + 12 L T C.
    CHECK(model->flops_per_token(32) == 6.0 * (total - V * C) + 12.0 * L * 32 * C);
    c.tie_embeddings = true;
    const auto tied = make_model(c);
    CHECK(by_name(*tied).count("lm_head.weight") == 0);
    CHECK(tied->parameter_count() == total - V * C);
  }
}

TEST_CASE("models: a model refuses a config of another architecture or an impossible shape, naming the key") {
  const ModelConfig llama = model_config(ModelArch::llama, 50, 8, 16, 1, 4, false);
  CHECK_THROWS_WITH_AS(Gpt{llama}, "a gpt2 model built from a model.arch llama deck", UsageError);
  ModelConfig odd = llama;
  odd.n_embd = 12, odd.n_head = 4;  // head size 3: RoPE rotates pairs
  CHECK_THROWS_WITH_AS(Llama{odd}, doctest::Contains("model.n_embd / model.n_head (12 / 4 = 3) must be even"),
                       DeckRuleError);  // the deck's own rule, from config/deck_rules.cpp
  ModelConfig gqa = llama;
  gqa.arch = ModelArch::qwen2, gqa.n_kv_head = 3;
  CHECK_THROWS_WITH_AS(Qwen2{gqa}, doctest::Contains("model.n_kv_head (3) must divide model.n_head (4)"), DeckRuleError);
}

TEST_CASE("models: initial values depend only on (seed, name, index): a split tensor gets the same values") {
  const InitRule rule = InitRule::normal(0.02f);
  View1<float> whole("whole", 1000), head("head", 300), tail("tail", 700);
  fill_initial_values(whole, rule, 42, "h.0.attn.c_attn.weight", 0);
  fill_initial_values(head, rule, 42, "h.0.attn.c_attn.weight", 0);
  fill_initial_values(tail, rule, 42, "h.0.attn.c_attn.weight", 300);
  const auto w = to_host(whole), h = to_host(head), t = to_host(tail);
  int mismatches = 0;
  for (int i = 0; i < 300; ++i) mismatches += w[i] != h[i];
  for (int i = 0; i < 700; ++i) mismatches += w[300 + i] != t[i];
  CHECK(mismatches == 0);
  View1<float> other("other", 1000);
  fill_initial_values(other, rule, 42, "h.0.attn.c_proj.weight", 0);
  CHECK(to_host(other)[0] != w[0]);
  fill_initial_values(other, rule, 43, "h.0.attn.c_attn.weight", 0);
  CHECK(to_host(other)[0] != w[0]);
}

TEST_CASE("models: init scales: 0.02, the residual projections 0.02/sqrt(2L), biases 0, norm weights 1") {
  // name -> expected standard deviation (0: every element 0; -1: every element 1)
  const std::map<ModelArch, std::map<std::string, double>> scales = {
      {ModelArch::gpt2, {{"wte.weight", 0.02}, {"h.0.attn.c_attn.weight", 0.02}, {"h.0.mlp.c_fc.weight", 0.02},
                         {"h.0.attn.c_proj.weight", 0.02 / std::sqrt(8.0)}, {"h.0.mlp.c_proj.weight", 0.02 / std::sqrt(8.0)},
                         {"h.0.mlp.c_fc.bias", 0}, {"ln_f.weight", -1}, {"ln_f.bias", 0}}},
      {ModelArch::llama, {{"embed_tokens.weight", 0.02}, {"layers.0.self_attn.q_proj.weight", 0.02},
                          {"layers.0.mlp.gate_proj.weight", 0.02}, {"layers.0.self_attn.o_proj.weight", 0.02 / std::sqrt(8.0)},
                          {"layers.0.mlp.down_proj.weight", 0.02 / std::sqrt(8.0)}, {"norm.weight", -1},
                          {"layers.0.input_layernorm.weight", -1}}},
      {ModelArch::qwen2, {{"layers.0.self_attn.k_proj.weight", 0.02}, {"layers.0.self_attn.q_proj.bias", 0},
                          {"layers.3.self_attn.v_proj.bias", 0}, {"layers.3.mlp.down_proj.weight", 0.02 / std::sqrt(8.0)}}}};
  for (const auto& [arch, expected] : scales) {
    const std::string shown_arch(to_string(arch));  // a copy: CAPTURE cannot capture a structured binding before C++20
    CAPTURE(shown_arch);
    const auto model = make_model(model_config(arch, 512, 16, 128, 4, 4, false, 352));
    model->to_empty();
    model->reset_parameters(1337);
    auto params = by_name(*model);
    for (const auto& [name, sd] : expected) {
      const std::string shown_name = name;  // a copy: CAPTURE cannot capture a structured binding before C++20
      CAPTURE(shown_name);
      REQUIRE(params.count(name) == 1);
      const auto v = to_host(params[name]->value());
      if (sd > 0) {
        CHECK(stddev(v) == doctest::Approx(sd).epsilon(0.03));
      } else {
        const float value = sd == 0 ? 0.0f : 1.0f;
        CHECK(std::all_of(v.begin(), v.end(), [&](float x) { return x == value; }));
      }
    }
  }
}

TEST_CASE("models: hooks run around every pass, through each module's one door, nested like scopes") {
  struct Recorder : ModuleHooks {
    std::vector<std::string>* log;
    void before(Module& m, Pass p, Flow&) override { log->push_back((p == Pass::forward ? "F>" : "B>") + m.display_name()); }
    void after(Module& m, Pass p, Flow&) override { log->push_back((p == Pass::forward ? "F<" : "B<") + m.display_name()); }
  };
  for (ModelArch arch : kArchs) {
    CAPTURE(to_string(arch));
    const auto model = make_model(model_config(arch, 11, 4, 8, 2, 2, true));
    model->to_empty();
    model->reset_parameters(1);
    std::vector<std::string> log;
    for (Module* m : model->modules()) {
      auto r = std::make_shared<Recorder>();
      r->log = &log;
      m->add_hooks(r);
    }
    Flow flow;
    flow.B = 1, flow.T = 4;
    const auto tokens = tokens_view({1, 2, 3, 4}), targets = tokens_view({2, 3, 4, 5});
    flow.tokens = tokens, flow.targets = targets;
    (*model)(flow);
    (*model)(flow, Pass::backward);
    const std::string root = model->display_name(), b0 = model->block_modules()[0]->path(),
                      b1 = model->block_modules()[1]->path();
    const std::vector<std::string> expected = {"F>" + root, "F>" + b0, "F<" + b0, "F>" + b1, "F<" + b1, "F<" + root,
                                               "B>" + root, "B>" + b1, "B<" + b1, "B>" + b0, "B<" + b0, "B<" + root};
    CHECK(log == expected);
  }
}

TEST_CASE("models: activation_bytes_for equals what a forward and backward allocate, with and without recomputation") {
  const Deck deck = parse_deck("model: {arch: llama, vocab_size: 50, context_length: 12, n_embd: 24, n_layer: 2, "
                               "n_head: 6, n_kv_head: 2, ffn_multiplier: 1.5, ffn_multiple_of: 16}\ntrain: {steps: 1}\n",
                               "llama.yaml");
  CHECK(deck.model.ffn_hidden == 96);  // 8C/3 = 64, x 1.5 = 96, a multiple of 16
  CHECK(llama_ffn_hidden(4096, 1.3, 1024) == 14336);  // Llama 3 8B
  CHECK(llama_ffn_hidden(2048, 1.5, 256) == 8192);    // Llama 3.2 1B
  for (ModelArch arch : kArchs) {
    for (bool tied : {true, false}) {
      CAPTURE(to_string(arch));
      CAPTURE(tied);
      ModelConfig c = deck.model;
      c.arch = arch, c.tie_embeddings = tied;
      if (arch == ModelArch::gpt2) c.n_kv_head = 0, c.ffn_hidden = 0;
      Flow flow;
      flow.B = 3, flow.T = 10;
      std::vector<std::int32_t> t(30);
      for (int i = 0; i < 30; ++i) t[i] = (7 * i) % 50;
      const auto tokens = tokens_view(t);
      flow.tokens = tokens, flow.targets = tokens;
      double loss = 0;
      std::int64_t plain_bytes = 0;
      for (int recomputing : {0, 1, 2}) {
        CAPTURE(recomputing);
        const auto model = make_model(c);
        for (int b = 0; b < recomputing; ++b) model->block_modules()[b]->set_recompute_in_backward(true);
        model->to_empty();
        model->reset_parameters(3);
        (*model)(flow);
        (*model)(flow, Pass::backward);
        CHECK(model->recomputing_blocks() == recomputing);
        CHECK(model->activation_bytes() == model->activation_bytes_for(3, 10, recomputing));
        CHECK(model->activation_bytes_for(6, 10, recomputing) > model->activation_bytes_for(3, 10, recomputing));
        if (recomputing == 0) {
          loss = flow.loss, plain_bytes = model->activation_bytes();
          // Near-uniform at init (a tied head scores each token against its own embedding: lower).
          if (!tied) CHECK(flow.loss == doctest::Approx(std::log(50.0)).epsilon(0.05));
        } else {
          CHECK(flow.loss == loss);  // a replay of the same kernels: bitwise the same
        }
        if (recomputing == 2) CHECK(model->activation_bytes() < plain_bytes);  // one shared set instead of two
      }
    }
  }
}

TEST_CASE("models: gradients through the whole model match central differences (f32, tied and untied)") {
  for (ModelArch arch : kArchs) {
    for (bool tied : {true, false}) {
      CAPTURE(to_string(arch));
      CAPTURE(tied);
      ModelConfig c = model_config(arch, 13, 8, 16, 2, 4, tied, 24);
      if (arch == ModelArch::gpt2) c.n_head = 2;
      const auto model = make_model(c);
      model->to_empty();
      model->reset_parameters(7);
      // Larger weights than the init's, so every gradient is well above f32 round-off.
      for (Parameter* p : model->parameters()) {
        auto v = to_host(p->value());
        std::mt19937 rng(static_cast<unsigned>(name_hash(p->name())));
        std::normal_distribution<float> noise(0.0f, 0.3f);
        for (auto& x : v) x += noise(rng);
        to_device(p->value(), v);
      }
      Flow flow;
      flow.B = 2, flow.T = 6;
      const auto tokens = tokens_view({1, 5, 2, 12, 0, 7, 3, 3, 9, 4, 11, 6});
      const auto targets = tokens_view({5, 2, 12, 0, 7, 8, 3, 9, 4, 11, 6, 1});
      flow.tokens = tokens, flow.targets = targets;
      model->zero_grad();
      flow.training = true;
      (*model)(flow);
      (*model)(flow, Pass::backward);

      for (Parameter* p : model->parameters()) {
        CAPTURE(p->name());
        const auto grad = to_host(p->grad());
        auto value = to_host(p->value());
        // The three largest gradients of each tensor, where f32 differences resolve best.
        std::vector<std::size_t> order(grad.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        const std::size_t n = std::min<std::size_t>(3, order.size());
        std::partial_sort(order.begin(), order.begin() + n, order.end(),
                          [&](std::size_t a, std::size_t b) { return std::fabs(grad[a]) > std::fabs(grad[b]); });
        for (std::size_t k = 0; k < n; ++k) {
          const std::size_t i = order[k];
          const float h = 1e-2f, saved = value[i];
          value[i] = saved + h;
          to_device(p->value(), value);
          const double up = loss_of(*model, flow);
          value[i] = saved - h;
          to_device(p->value(), value);
          const double down = loss_of(*model, flow);
          value[i] = saved;
          to_device(p->value(), value);
          const double numeric = (up - down) / (2.0 * h);
          CAPTURE(i);
          CHECK(std::fabs(numeric - grad[i]) <= 2e-3 + 3e-2 * std::fabs(grad[i]));
        }
      }
    }
  }
}
