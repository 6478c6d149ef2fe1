// The optimizer layer: AdamW and SGD against steps computed by hand in double, the decay rules per parameter
// role, the stale-parameter guard, checkpointable state, the gradient norm and clipping (locally and summed
// over ranks), and the learning-rate schedule.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/comm/mpi_communicator.hpp"
#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/optim/deck_optimizer.hpp"
#include "fsdpp/optim/grad_norm.hpp"
#include "fsdpp/optim/lr_schedule.hpp"
#include "fsdpp/optim/sgd.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace fsdpp;

namespace {

using fsdpp::test::to_vec;
using fsdpp::test::usage_error_of;

void from_host(const View1<float>& v, const std::vector<double>& x) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) h(i) = static_cast<float>(x[i]);
  Kokkos::deep_copy(v, h);
}

// Values exactly representable in f32, so the double reference starts from the same numbers as the kernel.
std::vector<double> pattern(std::size_t n, int salt) {
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i + 1) + 1.3 * salt) * (1.0 + 0.25 * salt));
  return x;
}

struct Params {
  std::vector<std::unique_ptr<Parameter>> owned;
  std::vector<Parameter*> list;
  Parameter& add(const std::string& name, std::vector<std::int64_t> shape, ParamRole role) {
    owned.push_back(std::make_unique<Parameter>(name, std::move(shape), InitRule::zeros(), role));
    Parameter& p = *owned.back();
    p.adopt(View1<float>(name, static_cast<std::size_t>(p.numel())),
            View1<float>(name + ".grad", static_cast<std::size_t>(p.numel())));
    from_host(p.value(), pattern(p.numel(), static_cast<int>(owned.size())));
    list.push_back(&p);
    return p;
  }
};

// One of each role, as a GPT block has them.
Params one_of_each_role() {
  Params ps;
  ps.add("h.0.attn.c_attn.weight", {2, 3}, ParamRole::weight);
  ps.add("h.0.attn.c_attn.bias", {3}, ParamRole::bias);
  ps.add("h.0.ln_1.weight", {3}, ParamRole::norm);
  ps.add("wte.weight", {4, 2}, ParamRole::embedding);
  return ps;
}

// The gradient of parameter i at step s: different per step, so momentum and moments are exercised.
std::vector<double> grad_at(const Parameter& p, std::size_t i, int s) { return pattern(p.numel(), 10 + 3 * s + static_cast<int>(i)); }

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t j = 0; j < got.size(); ++j) {
    INFO(what << " element " << j);
    CHECK(std::fabs(got[j] - want[j]) <= tol * (1.0 + std::fabs(want[j])));
  }
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// Reference AdamW in double over every parameter, for `steps` steps with the learning rates `lrs`.
void run_adamw(const AdamWConfig& c, std::vector<bool> decays) {
  Params ps = one_of_each_role();
  AdamW opt(ps.list, c);
  const std::vector<float> lrs = {1e-2f, 2e-2f, 5e-3f};
  std::vector<std::vector<double>> x, m, v;
  for (Parameter* p : ps.list) {
    x.push_back(to_vec(p->value()));
    m.emplace_back(p->numel(), 0.0);
    v.emplace_back(p->numel(), 0.0);
  }
  for (int s = 0; s < 3; ++s) {
    const double t = s + 1, lr = lrs[s], b1 = c.beta1, b2 = c.beta2;
    for (std::size_t i = 0; i < ps.list.size(); ++i) {
      const std::vector<double> g = grad_at(*ps.list[i], i, s);
      from_host(ps.list[i]->grad(), g);
      const double wd = decays[i] ? c.weight_decay : 0.0;
      for (std::size_t j = 0; j < g.size(); ++j) {
        m[i][j] = b1 * m[i][j] + (1 - b1) * g[j];
        v[i][j] = b2 * v[i][j] + (1 - b2) * g[j] * g[j];
        const double m_hat = m[i][j] / (1 - std::pow(b1, t)), v_hat = v[i][j] / (1 - std::pow(b2, t));
        x[i][j] -= lr * wd * x[i][j];  // decoupled: torch's param *= 1 - lr wd, before the Adam update
        x[i][j] -= lr * m_hat / (std::sqrt(v_hat) + c.eps);
      }
    }
    opt.step(lrs[s]);
    CHECK(opt.steps() == s + 1);
    for (std::size_t i = 0; i < ps.list.size(); ++i) {
      const std::string what = ps.list[i]->name() + " after step " + std::to_string(s + 1);
      check_close(to_vec(ps.list[i]->value()), x[i], 2e-6, what);
      check_close(to_vec(opt.exp_avg(*ps.list[i])), m[i], 1e-6, what + " exp_avg");
      check_close(to_vec(opt.exp_avg_sq(*ps.list[i])), v[i], 1e-6, what + " exp_avg_sq");
    }
  }
}

void run_sgd(const SgdConfig& c, std::vector<bool> decays) {
  Params ps = one_of_each_role();
  Sgd opt(ps.list, c);
  const std::vector<float> lrs = {1e-1f, 5e-2f, 2e-1f};
  std::vector<std::vector<double>> x, buf;
  for (Parameter* p : ps.list) {
    x.push_back(to_vec(p->value()));
    buf.emplace_back(p->numel(), 0.0);
  }
  for (int s = 0; s < 3; ++s) {
    for (std::size_t i = 0; i < ps.list.size(); ++i) {
      const std::vector<double> grad = grad_at(*ps.list[i], i, s);
      from_host(ps.list[i]->grad(), grad);
      const double wd = decays[i] ? c.weight_decay : 0.0;
      for (std::size_t j = 0; j < grad.size(); ++j) {
        const double g = grad[j] + wd * x[i][j];
        buf[i][j] = s == 0 ? g : c.momentum * buf[i][j] + g;
        x[i][j] -= lrs[s] * buf[i][j];
      }
    }
    opt.step(lrs[s]);
    CHECK(opt.steps() == s + 1);
    for (std::size_t i = 0; i < ps.list.size(); ++i) {
      const std::string what = ps.list[i]->name() + " after step " + std::to_string(s + 1);
      check_close(to_vec(ps.list[i]->value()), x[i], 2e-6, what);
      if (c.momentum != 0.0f) check_close(to_vec(opt.momentum_buffer(*ps.list[i])), buf[i], 2e-6, what + " buffer");
    }
  }
}

}  // namespace

TEST_CASE("optim: the deck's optimizer keeps the state copies optimizer_state_copies counts (the planner's rule)") {
  struct Case { OptimizerKind kind; double momentum; int copies; int passes; };
  for (const Case& k : {Case{OptimizerKind::adamw, 0.9, 2, 8}, Case{OptimizerKind::sgd, 0.9, 1, 6},
                        Case{OptimizerKind::sgd, 0.0, 0, 4}}) {
    OptimConfig o;
    o.name = k.kind;
    o.momentum = k.momentum;
    Params ps;
    ps.add("w", {3, 2}, ParamRole::weight);
    const std::unique_ptr<Optimizer> opt = make_optimizer(o, ps.list);
    CAPTURE(opt->kind());
    CAPTURE(k.momentum);
    std::size_t state_tensors = 0;
    for (const auto& [name, view] : opt->state_tensors(*ps.list[0])) state_tensors += view.extent(0) > 0 ? 1 : 0;
    CHECK(static_cast<int>(state_tensors) == k.copies);
    CHECK(optimizer_state_copies(o) == k.copies);
    CHECK(optimizer_passes(o) == k.passes);
    CHECK(optimizer_update_passes(o) == k.passes - 1);  // without the gradient norm's read
  }
}

TEST_CASE("optim: AdamW matches three hand-computed steps; only weights decay by default") {
  AdamWConfig c;
  c.weight_decay = 0.5f;  // large enough that a wrongly applied decay shows
  run_adamw(c, {true, false, false, false});
}

TEST_CASE("optim: AdamW decays biases, norms and embeddings when the config says so") {
  AdamWConfig c;
  c.weight_decay = 0.5f;
  c.beta1 = 0.8f;
  c.beta2 = 0.99f;
  c.eps = 1e-6f;
  c.decay_biases = c.decay_norms = c.decay_embeddings = true;
  run_adamw(c, {true, true, true, true});
  c.decay_biases = c.decay_embeddings = false;
  run_adamw(c, {true, false, true, false});
}

TEST_CASE("optim: decay rule per role, isolated with zero gradients") {
  // With g = 0 the Adam term is exactly 0, so the only change is the decay: p * (1 - lr wd) or nothing.
  for (int flags = 0; flags < 8; ++flags) {
    AdamWConfig c;
    c.decay_biases = flags & 1;
    c.decay_norms = flags & 2;
    c.decay_embeddings = flags & 4;
    Params ps = one_of_each_role();
    AdamW opt(ps.list, c);
    const std::vector<bool> expect = {true, c.decay_biases, c.decay_norms, c.decay_embeddings};
    std::vector<std::vector<double>> before;
    for (Parameter* p : ps.list) before.push_back(to_vec(p->value()));
    opt.step(0.5f);
    for (std::size_t i = 0; i < ps.list.size(); ++i) {
      CHECK(opt.decays(*ps.list[i]) == expect[i]);
      std::vector<double> want = before[i];
      for (double& w : want) w = static_cast<float>(w * (expect[i] ? 1.0f - 0.5f * c.weight_decay : 1.0f));
      check_close(to_vec(ps.list[i]->value()), want, 1e-7, ps.list[i]->name() + " flags " + std::to_string(flags));
    }
  }
}

TEST_CASE("optim: SGD with momentum and coupled weight decay matches three hand-computed steps") {
  SgdConfig c;
  c.momentum = 0.9f;
  c.weight_decay = 0.3f;
  run_sgd(c, {true, false, false, false});
  c.decay_norms = c.decay_embeddings = c.decay_biases = true;
  run_sgd(c, {true, true, true, true});
  c.momentum = 0.0f;  // plain SGD keeps no buffer
  run_sgd(c, {true, true, true, true});
}

TEST_CASE("optim: the stale-parameter guard names the parameter whose storage changed") {
  const std::string prefix =
      "optimizer holds stale parameter 'h.0.attn.c_attn.bias': its storage changed after the optimizer was built "
      "(was the model sharded with fully_shard after building the optimizer? build the optimizer from "
      "model.parameters() after sharding)";
  SUBCASE("new storage (what fully_shard does)") {
    Params ps = one_of_each_role();
    AdamW adamw(ps.list, AdamWConfig{});
    Sgd sgd(ps.list, SgdConfig{});
    ps.list[1]->adopt(View1<float>("shard", 1), ps.list[1]->grad());
    const std::vector<double> weight_before = to_vec(ps.list[0]->value());
    CHECK(starts_with(usage_error_of([&] { adamw.step(1e-2f); }), prefix));
    CHECK(starts_with(usage_error_of([&] { sgd.step(1e-2f); }), prefix));
    // Checked before any update: nothing moved, no step counted.
    check_close(to_vec(ps.list[0]->value()), weight_before, 0.0, "weight");
    CHECK(adamw.steps() == 0);
    CHECK(sgd.steps() == 0);
  }
  SUBCASE("same pointer, smaller extent") {
    Params ps = one_of_each_role();
    AdamW adamw(ps.list, AdamWConfig{});
    ps.list[1]->adopt(Unmanaged1<float>(ps.list[1]->value().data(), 2), ps.list[1]->grad());
    CHECK(starts_with(usage_error_of([&] { adamw.step(1e-2f); }), prefix));
  }
  SUBCASE("a parameter without gradient storage") {
    Params ps = one_of_each_role();
    ps.list[2]->adopt(ps.list[2]->value(), View1<float>());
    AdamW adamw(ps.list, AdamWConfig{});
    const std::string msg = usage_error_of([&] { adamw.step(1e-2f); });
    CHECK(msg.find("'h.0.ln_1.weight' has no gradient storage") != std::string::npos);
  }
  SUBCASE("misuse at construction") {
    Params ps = one_of_each_role();
    std::vector<Parameter*> twice = {ps.list[0], ps.list[0]};
    CHECK(usage_error_of([&] { AdamW(twice, AdamWConfig{}); }).find("more than once") != std::string::npos);
    AdamWConfig bad;
    bad.beta2 = 1.0f;
    CHECK(usage_error_of([&] { AdamW(ps.list, bad); }).find("beta2") != std::string::npos);
    AdamW adamw({ps.list[0]}, AdamWConfig{});
    CHECK(usage_error_of([&] { adamw.exp_avg(*ps.list[1]); }).find("not one of") != std::string::npos);
  }
}

TEST_CASE("optim: AdamW state restored into a new optimizer continues identically") {
  Params a = one_of_each_role(), b = one_of_each_role();
  AdamWConfig c;
  AdamW first(a.list, c);
  for (int s = 0; s < 2; ++s) {
    for (std::size_t i = 0; i < a.list.size(); ++i) from_host(a.list[i]->grad(), grad_at(*a.list[i], i, s));
    first.step(1e-2f);
  }
  // A checkpoint: values, both moments and the step count (bias correction depends on it).
  AdamW second(b.list, c);
  for (std::size_t i = 0; i < a.list.size(); ++i) {
    Kokkos::deep_copy(b.list[i]->value(), a.list[i]->value());
    Kokkos::deep_copy(second.exp_avg(*b.list[i]), first.exp_avg(*a.list[i]));
    Kokkos::deep_copy(second.exp_avg_sq(*b.list[i]), first.exp_avg_sq(*a.list[i]));
  }
  second.set_steps(first.steps());
  for (std::size_t i = 0; i < a.list.size(); ++i) {
    from_host(a.list[i]->grad(), grad_at(*a.list[i], i, 2));
    from_host(b.list[i]->grad(), grad_at(*b.list[i], i, 2));
  }
  first.step(1e-2f);
  second.step(1e-2f);
  for (std::size_t i = 0; i < a.list.size(); ++i)
    check_close(to_vec(b.list[i]->value()), to_vec(a.list[i]->value()), 0.0, a.list[i]->name());
}

TEST_CASE("optim: gradient norm is exact and deterministic; clipping scales to max_norm") {
  Params ps = one_of_each_role();
  double want = 0.0;
  for (std::size_t i = 0; i < ps.list.size(); ++i) {
    const std::vector<double> g = grad_at(*ps.list[i], i, 0);
    from_host(ps.list[i]->grad(), g);
    for (double x : g) want += x * x;  // already f32 values: the double sum is the kernel's
  }
  const double first = grad_norm_squared_local(ps.list);
  CHECK(first == doctest::Approx(want).epsilon(1e-14));
  const double again = grad_norm_squared_local(ps.list);
  CHECK(std::memcmp(&first, &again, sizeof first) == 0);
  CHECK(global_grad_norm(ps.list) == doctest::Approx(std::sqrt(want)).epsilon(1e-14));

  SUBCASE("below max_norm: untouched") {
    std::vector<std::vector<double>> before;
    for (Parameter* p : ps.list) before.push_back(to_vec(p->grad()));
    CHECK(clip_grad_norm(ps.list, std::sqrt(want) * 2.0) == doctest::Approx(std::sqrt(want)).epsilon(1e-14));
    for (std::size_t i = 0; i < ps.list.size(); ++i) check_close(to_vec(ps.list[i]->grad()), before[i], 0.0, "grad");
  }
  SUBCASE("above max_norm: scaled by max_norm / (norm + 1e-6), pre-clip norm returned") {
    const double norm = std::sqrt(want), max_norm = 0.5;
    std::vector<std::vector<double>> expect;
    for (Parameter* p : ps.list) {
      expect.push_back(to_vec(p->grad()));
      for (double& g : expect.back()) g *= max_norm / (norm + 1e-6);
    }
    CHECK(clip_grad_norm(ps.list, max_norm) == doctest::Approx(norm).epsilon(1e-14));
    for (std::size_t i = 0; i < ps.list.size(); ++i) check_close(to_vec(ps.list[i]->grad()), expect[i], 1e-6, "grad");
    CHECK(global_grad_norm(ps.list) == doctest::Approx(max_norm).epsilon(1e-5));
  }
  SUBCASE("max_norm must be positive") {
    CHECK(usage_error_of([&] { clip_grad_norm(ps.list, 0.0); }).find("max_norm") != std::string::npos);
  }
}

// Shards of one gradient on each rank: the norm summed over ranks is the norm of the whole.
static void check_sharded_norm(int rank, int size, MPI_Comm comm) {
  MpiCommunicator group(comm);
  const int n = 5;
  std::vector<double> whole(static_cast<std::size_t>(n * size));
  for (std::size_t k = 0; k < whole.size(); ++k) whole[k] = static_cast<float>(0.1 * static_cast<double>(k) - 0.7);
  double want = 0.0;
  for (double x : whole) want += x * x;
  Params ps;
  Parameter& p = ps.add("h.0.mlp.c_fc.weight", {n * size}, ParamRole::weight);
  p.adopt(View1<float>("shard", n), View1<float>("shard.grad", n));
  from_host(p.grad(), std::vector<double>(whole.begin() + rank * n, whole.begin() + (rank + 1) * n));
  CHECK(global_grad_norm(ps.list, &group) == doctest::Approx(std::sqrt(want)).epsilon(1e-14));
  const double before = clip_grad_norm(ps.list, 0.1, &group);
  CHECK(before == doctest::Approx(std::sqrt(want)).epsilon(1e-14));
  CHECK(global_grad_norm(ps.list, &group) == doctest::Approx(0.1).epsilon(1e-5));
}

MPI_TEST_CASE("optim: gradient norm summed over one rank", 1) { check_sharded_norm(test_rank, test_nb_procs, test_comm); }
MPI_TEST_CASE("optim: gradient norm summed over two ranks", 2) { check_sharded_norm(test_rank, test_nb_procs, test_comm); }

TEST_CASE("optim: learning-rate schedule, llm.c's warmup then cosine") {
  LrSchedule cos;
  cos.kind = LrSchedule::cosine;
  cos.lr = 1e-3f;
  cos.min_lr = 1e-4f;
  cos.warmup_steps = 10;
  cos.total_steps = 110;
  cos.validate();
  CHECK(cos.at(0) == doctest::Approx(1e-4));  // lr * 1 / 10: the first step already trains
  CHECK(cos.at(4) == doctest::Approx(5e-4));
  CHECK(cos.at(9) == doctest::Approx(1e-3));
  CHECK(cos.at(10) == doctest::Approx(1e-3));  // decay starts from the peak
  CHECK(cos.at(60) == doctest::Approx(5.5e-4));  // halfway: (lr + min_lr) / 2
  CHECK(cos.at(35) == doctest::Approx(1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(3.14159265358979323846 * 0.25))));
  CHECK(cos.at(110) == doctest::Approx(1e-4));
  CHECK(cos.at(500) == doctest::Approx(1e-4));
  for (std::int64_t s = 11; s <= 110; ++s) CHECK(cos.at(s) <= cos.at(s - 1));

  LrSchedule flat;
  flat.lr = 3e-4f;
  CHECK(flat.at(0) == 3e-4f);
  CHECK(flat.at(1000) == 3e-4f);
  flat.warmup_steps = 4;
  CHECK(flat.at(0) == doctest::Approx(0.75e-4));
  CHECK(flat.at(3) == 3e-4f);
  CHECK(flat.at(1000) == 3e-4f);

  LrSchedule bad = cos;
  bad.total_steps = 5;
  CHECK(usage_error_of([&] { bad.validate(); }).find("total_steps") != std::string::npos);
}
