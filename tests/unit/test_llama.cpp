// The Llama model as a whole: Hugging Face-style parameter names and count, init scales, the deck factory
// (model.arch), the planner's activation bytes against what a forward and backward allocate, and a gradient
// check through the whole model (GQA, RoPE, RMSNorm, SwiGLU, tied and untied heads).
#include "mpi_test.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/train/build_model.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

using namespace fsdpp;

namespace {

std::vector<float> to_host(const View1<float>& v) {
  std::vector<float> out(v.extent(0));
  Kokkos::deep_copy(HostView1<float>(out.data(), out.size()), v);
  return out;
}

View1<std::int32_t> tokens_view(const std::vector<std::int32_t>& t) {
  View1<std::int32_t> v("tokens", t.size());
  Kokkos::deep_copy(v, HostView1<const std::int32_t>(t.data(), t.size()));
  return v;
}

double loss_of(LanguageModel& model, Flow flow) {
  flow.training = false;
  model(flow);
  return flow.loss;
}

LlamaConfig tiny_config(bool tied) {
  LlamaConfig c;
  c.vocab_size = 13, c.context_length = 8, c.n_embd = 16, c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2;
  c.ffn_hidden = 24, c.rope_theta = 100.0, c.norm_eps = 1e-5, c.tie_embeddings = tied;
  return c;
}

}  // namespace

TEST_CASE("llama: Hugging Face parameter names, shapes and count, on meta") {
  LlamaConfig c;
  c.vocab_size = 1000, c.context_length = 32, c.n_embd = 64, c.n_layer = 3, c.n_head = 8, c.n_kv_head = 2;
  c.ffn_hidden = 176;
  Llama model(c);
  std::int64_t total = 0;
  std::set<std::string> names;
  for (Parameter* p : model.parameters()) {
    total += p->numel();
    names.insert(p->name());
    CHECK(p->is_meta());
  }
  CHECK(model.parameter_count() == total);
  CHECK(total == 1000 * 64 * 2 + 64 + 3 * (2 * 64 + 2 * 64 * 64 + 2 * 16 * 64 + 3 * 176 * 64));
  for (const char* n : {"embed_tokens.weight", "norm.weight", "lm_head.weight", "layers.0.input_layernorm.weight",
                        "layers.0.self_attn.q_proj.weight", "layers.1.self_attn.k_proj.weight",
                        "layers.2.self_attn.v_proj.weight", "layers.2.self_attn.o_proj.weight",
                        "layers.1.post_attention_layernorm.weight", "layers.0.mlp.gate_proj.weight",
                        "layers.0.mlp.up_proj.weight", "layers.2.mlp.down_proj.weight"})
    CHECK_MESSAGE(names.count(n) == 1, n);
  for (const std::string& n : names) CHECK_MESSAGE(n.find("bias") == std::string::npos, n);  // no biases
  CHECK(names.size() == 3 + 3 * 9);
  CHECK(model.blocks()[1]->k_proj.shape() == std::vector<std::int64_t>{16, 64});
  CHECK(model.blocks()[2]->down_proj.shape() == std::vector<std::int64_t>{64, 176});
  CHECK(model.block_modules().size() == 3);
  CHECK(model.block_modules()[1]->path() == "layers.1");
  c.tie_embeddings = true;
  CHECK(Llama(c).lm_head == nullptr);
  CHECK(c.parameter_count() == total - 1000 * 64);
  // FLOPs: 6 x matmul parameters (projections + head) + 12 L T C.
  CHECK(model.flops_per_token(32) ==
        6.0 * (3 * (2 * 64 * 64 + 2 * 16 * 64 + 3 * 176 * 64) + 1000 * 64) + 12.0 * 3 * 32 * 64);
}

TEST_CASE("llama: init scales: 0.02, o_proj and down_proj 0.02/sqrt(2L), norm weights 1") {
  LlamaConfig c;
  c.vocab_size = 512, c.context_length = 16, c.n_embd = 128, c.n_layer = 4, c.n_head = 4, c.n_kv_head = 4;
  c.ffn_hidden = 352;
  Llama model(c);
  model.to_empty();
  model.reset_parameters(1337);
  auto stddev = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    const double mean = s / v.size();
    return std::sqrt(s2 / v.size() - mean * mean);
  };
  LlamaBlock& b = *model.blocks()[0];
  CHECK(stddev(to_host(b.q_proj.value())) == doctest::Approx(0.02).epsilon(0.03));
  CHECK(stddev(to_host(b.gate_proj.value())) == doctest::Approx(0.02).epsilon(0.03));
  CHECK(stddev(to_host(model.embed_tokens.value())) == doctest::Approx(0.02).epsilon(0.03));
  CHECK(stddev(to_host(b.down_proj.value())) == doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.03));
  CHECK(stddev(to_host(b.o_proj.value())) == doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.03));
  for (float x : to_host(b.input_layernorm.value())) REQUIRE(x == 1.0f);
  for (float x : to_host(model.norm.value())) REQUIRE(x == 1.0f);
}

TEST_CASE("llama: model.arch chooses the model; activation_bytes_for matches a real forward and backward") {
  const Deck deck = parse_deck("model: {arch: llama, vocab_size: 50, context_length: 12, n_embd: 24, n_layer: 2, "
                               "n_head: 6, n_kv_head: 2, ffn_multiplier: 1.5, ffn_multiple_of: 16}\ntrain: {steps: 1}\n",
                               "llama.yaml");
  CHECK(deck.model.ffn_hidden == 96);  // 8C/3 = 64, x 1.5 = 96, a multiple of 16
  CHECK(llama_ffn_hidden(4096, 1.3, 1024) == 14336);  // Llama 3 8B
  CHECK(llama_ffn_hidden(2048, 1.5, 256) == 8192);    // Llama 3.2 1B
  const auto model = make_model(deck.model);
  REQUIRE(dynamic_cast<Llama*>(model.get()) != nullptr);
  CHECK(model->describe().rfind("Llama, V 50 T 12 C 24 L 2 NH 6 NKV 2", 0) == 0);
  CHECK(dynamic_cast<Llama&>(*model).lm_head != nullptr);  // untied unless the deck says so
  model->to_empty();
  model->reset_parameters(3);
  Flow flow;
  flow.B = 3, flow.T = 10;
  std::vector<std::int32_t> t(30);
  for (int i = 0; i < 30; ++i) t[i] = (7 * i) % 50;
  const auto tokens = tokens_view(t);
  flow.tokens = tokens, flow.targets = tokens;
  (*model)(flow);
  (*model)(flow, Pass::backward);
  CHECK(model->activation_bytes() == model->activation_bytes_for(3, 10, 0));
  CHECK(std::isfinite(flow.loss));
  CHECK(flow.loss == doctest::Approx(std::log(50.0)).epsilon(0.05));  // near-uniform at init
  const double loss = flow.loss;

  // Activation checkpointing: the recomputing blocks share one set, and the formula still holds; the
  // loss is bitwise unchanged.
  const auto checkpointed = make_model(deck.model);
  for (Module* b : checkpointed->block_modules()) b->set_recompute_in_backward(true);
  checkpointed->to_empty();
  checkpointed->reset_parameters(3);
  (*checkpointed)(flow);
  (*checkpointed)(flow, Pass::backward);
  CHECK(checkpointed->recomputing_blocks() == 2);
  CHECK(checkpointed->activation_bytes() == checkpointed->activation_bytes_for(3, 10, 2));
  CHECK(checkpointed->activation_bytes() < model->activation_bytes());
  CHECK(flow.loss == loss);
}

TEST_CASE("llama: gradients through the whole model match central differences (f32, tied and untied)") {
  for (bool tied : {true, false}) {
    CAPTURE(tied);
    Llama model(tiny_config(tied));
    model.to_empty();
    model.reset_parameters(7);
    for (Parameter* p : model.parameters()) {
      auto v = to_host(p->value());
      std::mt19937 rng(static_cast<unsigned>(name_hash(p->name())));
      std::normal_distribution<float> noise(0.0f, 0.3f);
      for (auto& x : v) x += noise(rng);
      Kokkos::deep_copy(p->value(), HostView1<float>(v.data(), v.size()));
    }
    Flow flow;
    flow.B = 2, flow.T = 6;
    const auto tokens = tokens_view({1, 5, 2, 12, 0, 7, 3, 3, 9, 4, 11, 6});
    const auto targets = tokens_view({5, 2, 12, 0, 7, 8, 3, 9, 4, 11, 6, 1});
    flow.tokens = tokens, flow.targets = targets;
    model.zero_grad();
    flow.training = true;
    model(flow);
    model(flow, Pass::backward);

    for (Parameter* p : model.parameters()) {
      CAPTURE(p->name());
      const auto grad = to_host(p->grad());
      auto value = to_host(p->value());
      std::vector<std::size_t> order(grad.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + std::min<std::size_t>(3, order.size()), order.end(),
                        [&](std::size_t a, std::size_t b) { return std::fabs(grad[a]) > std::fabs(grad[b]); });
      for (std::size_t k = 0; k < std::min<std::size_t>(3, order.size()); ++k) {
        const std::size_t i = order[k];
        const float h = 1e-2f;
        const float saved = value[i];
        value[i] = saved + h;
        Kokkos::deep_copy(p->value(), HostView1<float>(value.data(), value.size()));
        const double up = loss_of(model, flow);
        value[i] = saved - h;
        Kokkos::deep_copy(p->value(), HostView1<float>(value.data(), value.size()));
        const double down = loss_of(model, flow);
        value[i] = saved;
        Kokkos::deep_copy(p->value(), HostView1<float>(value.data(), value.size()));
        const double numeric = (up - down) / (2.0 * h);
        CAPTURE(i);
        CHECK(std::fabs(numeric - grad[i]) <= 2e-3 + 3e-2 * std::fabs(grad[i]));
      }
    }
  }
}
