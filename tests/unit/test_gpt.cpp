// The GPT-2 model as a whole: GPT-2's parameter names and count, the counter-based init (split-invariant,
// with GPT-2's scales), the hook door fully_shard will use, and a gradient check through the whole model.
#include "mpi_test.hpp"

#include "fsdpp/nn/gpt.hpp"

#include <cmath>
#include <random>
#include <set>

using namespace fsdpp;

namespace {

GptConfig small_config() {
  GptConfig c;
  c.vocab_size = 4096, c.context_length = 256, c.n_embd = 256, c.n_layer = 4, c.n_head = 4;
  return c;
}

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

double loss_of(Gpt& model, Flow flow) {
  flow.training = false;
  model(flow);
  return flow.loss;
}

}  // namespace

TEST_CASE("gpt: small.yaml's model has GPT-2's parameter names and 4.27M parameters, on meta") {
  Gpt model(small_config());
  const auto params = model.parameters();
  std::int64_t total = 0;
  std::set<std::string> names;
  for (Parameter* p : params) {
    total += p->numel();
    names.insert(p->name());
    CHECK(p->is_meta());  // no storage until to_empty
  }
  CHECK(total == 4'273'664);
  CHECK(model.config().parameter_count() == total);
  for (const char* n : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
                        "h.0.attn.c_proj.weight", "h.2.ln_2.bias", "h.3.mlp.c_fc.weight", "h.3.mlp.c_proj.bias",
                        "ln_f.weight", "ln_f.bias"})
    CHECK_MESSAGE(names.count(n) == 1, n);
  CHECK(names.count("lm_head.weight") == 0);  // tied
  CHECK(params.front()->shape_string() == "[4096, 256]");
  CHECK(model.blocks().size() == 4);
  CHECK(model.blocks()[1]->path() == "h.1");
  CHECK(model.blocks()[1]->c_fc_weight.shape() == std::vector<std::int64_t>{1024, 256});

  GptConfig untied = small_config();
  untied.tie_embeddings = false;
  Gpt with_head(untied);
  CHECK(with_head.lm_head != nullptr);
  CHECK(with_head.lm_head->name() == "lm_head.weight");
  CHECK(untied.parameter_count() == total + 4096 * 256);
}

TEST_CASE("gpt: initial values depend only on (seed, name, index): a split tensor gets the same values") {
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

TEST_CASE("gpt: GPT-2 init scales: 0.02, residual projections 0.02/sqrt(2L), biases 0, LayerNorm weights 1") {
  Gpt model(small_config());
  model.to_empty();
  model.reset_parameters(1337);
  auto stddev = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    const double mean = s / v.size();
    return std::sqrt(s2 / v.size() - mean * mean);
  };
  Block& b = *model.blocks()[0];
  CHECK(stddev(to_host(b.c_attn_weight.value())) == doctest::Approx(0.02).epsilon(0.02));
  CHECK(stddev(to_host(model.wte.value())) == doctest::Approx(0.02).epsilon(0.02));
  CHECK(stddev(to_host(b.mlp_proj_weight.value())) == doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.02));
  CHECK(stddev(to_host(b.attn_proj_weight.value())) == doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.03));
  for (float x : to_host(b.c_fc_bias.value())) REQUIRE(x == 0.0f);
  for (float x : to_host(model.ln_f_weight.value())) REQUIRE(x == 1.0f);
}

TEST_CASE("gpt: hooks run around every pass, through each module's one door, nested like scopes") {
  GptConfig c;
  c.vocab_size = 11, c.context_length = 4, c.n_embd = 8, c.n_layer = 2, c.n_head = 2;
  Gpt model(c);
  model.to_empty();
  model.reset_parameters(1);
  struct Recorder : ModuleHooks {
    std::vector<std::string>* log;
    void before(Module& m, Pass p, Flow&) override { log->push_back((p == Pass::forward ? "F>" : "B>") + m.display_name()); }
    void after(Module& m, Pass p, Flow&) override { log->push_back((p == Pass::forward ? "F<" : "B<") + m.display_name()); }
  };
  std::vector<std::string> log;
  for (Module* m : model.modules()) {
    auto r = std::make_shared<Recorder>();
    r->log = &log;
    m->add_hooks(r);
  }
  Flow flow;
  flow.B = 1, flow.T = 4;
  const auto tokens = tokens_view({1, 2, 3, 4}), targets = tokens_view({2, 3, 4, 5});
  flow.tokens = tokens, flow.targets = targets;
  model(flow);
  model(flow, Pass::backward);
  const std::vector<std::string> expected = {"F>GPT (root)", "F>h.0", "F<h.0", "F>h.1", "F<h.1", "F<GPT (root)",
                                             "B>GPT (root)", "B>h.1", "B<h.1", "B>h.0", "B<h.0", "B<GPT (root)"};
  CHECK(log == expected);
}

TEST_CASE("gpt: gradients through the whole model match central differences (f32, tied and untied)") {
  for (bool tied : {true, false}) {
    CAPTURE(tied);
    GptConfig c;
    c.vocab_size = 13, c.context_length = 8, c.n_embd = 16, c.n_layer = 2, c.n_head = 2, c.tie_embeddings = tied;
    Gpt model(c);
    model.to_empty();
    model.reset_parameters(7);
    // Larger weights than GPT-2's init, so every gradient is well above f32 round-off.
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
      // The three largest gradients of each tensor, where f32 differences resolve best.
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
