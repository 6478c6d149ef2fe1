// The mixture-of-experts feed-forward (nn/moe.hpp) against an independent double-precision loop over tokens:
// forward outputs, the load-balancing and z-losses, and every gradient (input, router, the stacked experts) against
// the loop's central differences of J = sum(out * R) + aux_coef aux + z_coef z. Cases: renormalised and plain top-k,
// every expert per token, a router of zeros that sends every token to expert 0 (the other experts get no rows),
// and a capacity that drops rows (counted, contributing nothing).
#include "mpi_test.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

using namespace fsdpp;

// This file's names, apart from other test files' in a unity build (FSDPP_UNITY_BUILD).
namespace moe_test {

namespace {

constexpr int N = 10, C = 6, F = 5;

struct Case {
  const char* name;
  int E, k;
  bool normalize;
  double capacity;
  bool zero_router;
};

// The parameters and the input in double, on the host.
struct Weights {
  std::vector<double> router, gate, up, down, x;
};

struct Reference {
  std::vector<double> out;
  double aux = 0, z = 0;
  std::vector<std::int64_t> rows;  // per expert, after the capacity
  std::int64_t dropped = 0;
};

double silu(double a) { return a / (1 + std::exp(-a)); }

// Hugging Face's routing and transformers' losses, token by token; a capacity keeps each expert's first rows in
// token order (then choice order), as the layer's counting sort does.
Reference reference(const Case& c, const Weights& w) {
  const int E = c.E, k = c.k;
  const std::int64_t capacity =
      c.capacity > 0 ? static_cast<std::int64_t>(std::ceil(c.capacity * N * k / E)) : std::int64_t{N} * k;
  Reference r;
  r.out.assign(sz(N * C), 0.0);
  r.rows.assign(sz(E), 0);
  std::vector<double> f(sz(E), 0.0), P(sz(E), 0.0);
  for (int t = 0; t < N; ++t) {
    std::vector<double> z(sz(E)), p(sz(E));
    for (int e = 0; e < E; ++e)
      for (int i = 0; i < C; ++i) z[sz(e)] += w.router[sz(e * C + i)] * w.x[sz(t * C + i)];
    const double m = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(z[sz(e)] - m);
    for (int e = 0; e < E; ++e) p[sz(e)] = std::exp(z[sz(e)] - m) / s, P[sz(e)] += p[sz(e)] / N;
    r.z += std::pow(m + std::log(s), 2) / N;
    std::vector<int> order(sz(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[sz(a)] > p[sz(b)]; });
    double chosen = 0;
    for (int j = 0; j < k; ++j) chosen += p[sz(order[sz(j)])];
    for (int j = 0; j < k; ++j) {
      const int e = order[sz(j)];
      f[sz(e)] += 1.0 / N;
      if (r.rows[sz(e)] == capacity) {
        ++r.dropped;
        continue;
      }
      ++r.rows[sz(e)];
      const double weight = c.normalize ? p[sz(e)] / chosen : p[sz(e)];
      std::vector<double> h(sz(F));
      for (int o = 0; o < F; ++o) {
        double g = 0, u = 0;
        for (int i = 0; i < C; ++i) {
          g += w.gate[sz((e * F + o) * C + i)] * w.x[sz(t * C + i)];
          u += w.up[sz((e * F + o) * C + i)] * w.x[sz(t * C + i)];
        }
        h[sz(o)] = silu(g) * u;
      }
      for (int i = 0; i < C; ++i) {
        double y = 0;
        for (int o = 0; o < F; ++o) y += w.down[sz((e * C + i) * F + o)] * h[sz(o)];
        r.out[sz(t * C + i)] += weight * y;
      }
    }
  }
  for (int e = 0; e < E; ++e) r.aux += E * f[sz(e)] * P[sz(e)];
  return r;
}

// A module to own the layer's parameters.
class Owner : public Module {
 public:
  Owner(const ModelConfig& c) : Module("Owner"), moe(*this, c, MoeNames::qwen3_moe(), 0.3f, 0.3f) {
    add_child(moe.experts, "mlp.experts");
  }
  MoeFeedForward moe;

 protected:
  void forward(Flow&) override {}
  void backward(Flow&) override {}
};

std::vector<double> host_of(const View1<float>& v) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

void set(const View1<float>& v, const std::vector<double>& values) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = static_cast<float>(values[i]);
  Kokkos::deep_copy(v, h);
}

double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double scale = 1e-3, err = 0;
  for (double v : b) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]));
  return err / scale;
}

}  // namespace

MPI_TEST_CASE("moe: the layer against a double-precision loop over tokens, forward, losses and every gradient", 1) {
  const Case cases[] = {{"top 2 of 4, renormalised", 4, 2, true, 0, false},
                        {"top 2 of 4, plain", 4, 2, false, 0, false},
                        {"every expert per token", 3, 3, true, 0, false},
                        {"a router of zeros: every token to expert 0", 4, 1, true, 0, true},
                        {"capacity 0.5 drops rows", 4, 2, true, 0.5, false}};
  const double aux_coef = 0.05, z_coef = 0.01;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    ModelConfig mc;
    mc.arch = ModelArch::qwen3_moe;
    mc.n_embd = C;
    mc.moe.num_experts = c.E;
    mc.moe.top_k = c.k;
    mc.moe.expert_ffn_hidden = F;
    mc.moe.norm_topk_prob = c.normalize;
    mc.moe.capacity_factor = c.capacity;
    mc.moe.aux_loss_coef = aux_coef;
    mc.moe.router_z_loss_coef = z_coef;
    Owner owner(mc);
    owner.to_empty();
    std::mt19937 rng(7);
    std::normal_distribution<double> normal(0.0, 0.5);
    auto draw = [&](std::size_t n) {
      std::vector<double> v(n);
      for (double& x : v) x = normal(rng);
      return v;
    };
    Weights w{draw(sz(c.E * C)), draw(sz(c.E * F * C)), draw(sz(c.E * F * C)), draw(sz(c.E * C * F)), draw(sz(N * C))};
    if (c.zero_router) std::fill(w.router.begin(), w.router.end(), 0.0);
    const std::vector<double> R = draw(sz(N * C));  // J = sum(out * R) + the losses
    MoeFeedForward& moe = owner.moe;
    set(moe.router.value(), w.router), set(moe.experts.gate.value(), w.gate), set(moe.experts.up.value(), w.up);
    set(moe.experts.down.value(), w.down);
    View1<float> x("x", sz(N * C)), out("out", sz(N * C)), dout("dout", sz(N * C)), dx("dx", sz(N * C));
    set(x, w.x), set(dout, R);
    MoeActivations a;
    MoeScratch s;
    a.ensure("test", moe, N);
    s.buffers.ensure("test", N, 1, [&] { return moe.scratch_table(s, N); });
    RouterStatistics stats(mc.moe, 1);
    stats.begin();
    moe.forward(out, x, N, a, s, &stats, 0);
    stats.finish(1.0f);

    const Reference ref = reference(c, w);
    CHECK(max_relative(host_of(out), ref.out) < 1e-5);
    CHECK(stats.aux_loss() == doctest::Approx(ref.aux).epsilon(1e-5));
    CHECK(stats.z_loss() == doctest::Approx(ref.z).epsilon(1e-5));
    CHECK(moe.expert_rows() == ref.rows);
    CHECK(moe.dropped() == ref.dropped);
    if (c.zero_router) CHECK(ref.rows == std::vector<std::int64_t>{N, 0, 0, 0});
    if (c.capacity > 0) CHECK(ref.dropped > 0);

    moe.backward(dx, dout, x, N, a, s, &stats, 1.0f);
    // Central differences of the loop's J in each input: the layer's analytic gradients must match them.
    const auto objective = [&](const Weights& v) {
      const Reference r = reference(c, v);
      double j = aux_coef * r.aux + z_coef * r.z;
      for (std::size_t i = 0; i < r.out.size(); ++i) j += r.out[i] * R[i];
      return j;
    };
    const auto differences = [&](std::vector<double> Weights::*member) {
      std::vector<double> g((w.*member).size());
      for (std::size_t i = 0; i < g.size(); ++i) {
        Weights plus = w, minus = w;
        const double h = 1e-6;
        (plus.*member)[i] += h, (minus.*member)[i] -= h;
        g[i] = (objective(plus) - objective(minus)) / (2 * h);
      }
      return g;
    };
    CHECK(max_relative(host_of(dx), differences(&Weights::x)) < 1e-4);
    CHECK(max_relative(host_of(moe.experts.gate.grad()), differences(&Weights::gate)) < 1e-4);
    CHECK(max_relative(host_of(moe.experts.up.grad()), differences(&Weights::up)) < 1e-4);
    CHECK(max_relative(host_of(moe.experts.down.grad()), differences(&Weights::down)) < 1e-4);
    // Moving a router of exact ties changes which experts win: its differences are not a gradient.
    if (!c.zero_router) CHECK(max_relative(host_of(moe.router.grad()), differences(&Weights::router)) < 1e-4);
  }
}

TEST_CASE("moe: balance bias moves the routing bias toward the mean load and steers the choice, not the weights") {
  constexpr int N = 6, C = 4, F = 3, E = 4;
  ModelConfig mc;
  mc.arch = ModelArch::qwen3_moe;
  mc.n_embd = C;
  mc.moe.num_experts = E;
  mc.moe.top_k = 1;
  mc.moe.expert_ffn_hidden = F;
  mc.moe.balance = MoeBalance::bias;
  mc.moe.norm_topk_prob = false;  // the weight is the probability itself
  Owner owner(mc);
  owner.to_empty();
  MoeFeedForward& moe = owner.moe;
  REQUIRE(moe.routing_bias != nullptr);
  CHECK(moe.routing_bias->name() == "mlp.gate.e_score_correction_bias");
  CHECK_FALSE(moe.routing_bias->trainable());
  // A router of zeros: every probability 1/E, ties go to expert 0.
  View1<float> x("x", sz(N * C)), out("out", sz(N * C));
  Kokkos::deep_copy(x, 1.0f);
  MoeActivations a;
  MoeScratch s;
  a.ensure("test", moe, N);
  s.buffers.ensure("test", N, 1, [&] { return moe.scratch_table(s, N); });
  moe.forward(out, x, N, a, s, nullptr, 0);
  CHECK(moe.expert_rows() == std::vector<std::int64_t>{N, 0, 0, 0});
  // The step's load: expert 0 over the mean (down), 1 and 3 under (up), 2 at the mean (stays).
  const std::vector<double> tokens = {10, 1, 4, 1};
  moe.balance_load(tokens.data(), 0.25);
  CHECK(host_of(moe.routing_bias->value()) == std::vector<double>{-0.25, 0.25, 0, 0.25});
  moe.balance_load(tokens.data(), 0.25);
  // Experts 1 and 3 now lead by 0.5 on every token: the first of them (1) wins, with its unbiased probability 1/E
  // as its weight (the bias chooses, it does not weigh).
  moe.forward(out, x, N, a, s, nullptr, 0);
  CHECK(moe.expert_rows() == std::vector<std::int64_t>{0, N, 0, 0});
  const std::vector<double> weights = host_of(Kokkos::subview(a.weights, std::make_pair(0, N)));
  for (double w : weights) CHECK(w == 0.25);
}

}  // namespace moe_test
