// Hugging Face GPT-2 interchange: an imported model computes what an independent double-precision GPT-2
// forward, written here straight from the HF-layout tensors, computes (also packed documents with document masks,
// against an explicit block-diagonal 4D mask); export -> import -> export is bitwise.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/hf_gpt2.hpp"
#include "fsdpp/ckpt/safetensors.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <unistd.h>

using namespace fsdpp;
namespace fs = std::filesystem;

// This file's names, apart from other test files' in a unity build (FSDPP_UNITY_BUILD).
namespace hf_gpt2_test {

namespace {

using fsdpp::test::write_safetensors;

constexpr int V = 13, T = 5, C = 8, L = 2, NH = 2;

ModelConfig config() {
  ModelConfig c;
  c.vocab_size = V, c.context_length = T, c.n_embd = C, c.n_layer = L, c.n_head = NH;
  return c;
}

using Tensors = fsdpp::test::NamedTensors;

// A random GPT-2 in HF's layout and names (Conv1D weights [in, out]), with a mask buffer HF files carry.
Tensors random_hf_gpt2() {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 0.3f);
  Tensors t;
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape, float mean = 0.0f) {
    std::int64_t count = 1;
    for (auto d : shape) count *= d;
    std::vector<float> v(static_cast<std::size_t>(count));
    for (auto& x : v) x = mean + n(rng);
    t[name] = {shape, v};
  };
  add("transformer.wte.weight", {V, C});
  add("transformer.wpe.weight", {T, C});
  for (int l = 0; l < L; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C}, 1.0f);
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {C, 3 * C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C}, 1.0f);
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {C, 4 * C});
    add(h + "mlp.c_fc.bias", {4 * C});
    add(h + "mlp.c_proj.weight", {4 * C, C});
    add(h + "mlp.c_proj.bias", {C});
    add(h + "attn.bias", {1, 1, T, T});  // HF's causal-mask buffer: not a parameter
  }
  add("transformer.ln_f.weight", {C}, 1.0f);
  add("transformer.ln_f.bias", {C});
  return t;
}

// GPT-2 forward in double, straight from HF tensors: the per-position cross-entropy losses. `mask`: transformers'
// explicit 4D attention mask (1, 1, T, T), true where query p may attend to key q; empty: causal.
std::vector<double> reference_losses(const Tensors& t, const std::vector<int>& tokens, const std::vector<int>& targets,
                                     const std::vector<std::vector<bool>>& mask = {}) {
  auto visible = [&](int p, int q) { return mask.empty() ? q <= p : bool(mask[p][q]); };
  auto W = [&](const std::string& n) -> const std::vector<float>& { return t.at("transformer." + n).second; };
  const int n_pos = static_cast<int>(tokens.size());
  std::vector<std::vector<double>> x(n_pos, std::vector<double>(C));
  for (int p = 0; p < n_pos; ++p)
    for (int c = 0; c < C; ++c) x[p][c] = W("wte.weight")[tokens[p] * C + c] + W("wpe.weight")[p * C + c];
  auto layernorm = [&](const std::vector<double>& v, const std::string& prefix) {
    double mean = 0, var = 0;
    for (double a : v) mean += a;
    mean /= C;
    for (double a : v) var += (a - mean) * (a - mean);
    var /= C;
    std::vector<double> out(C);
    for (int c = 0; c < C; ++c)
      out[c] = (v[c] - mean) / std::sqrt(var + 1e-5) * W(prefix + ".weight")[c] + W(prefix + ".bias")[c];
    return out;
  };
  auto conv1d = [&](const std::vector<double>& v, const std::string& prefix, int in, int out_dim) {  // v @ W + b
    std::vector<double> out(out_dim);
    for (int o = 0; o < out_dim; ++o) {
      double s = W(prefix + ".bias")[o];
      for (int i = 0; i < in; ++i) s += v[i] * W(prefix + ".weight")[i * out_dim + o];
      out[o] = s;
    }
    return out;
  };
  const int hs = C / NH;
  for (int l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    std::vector<std::vector<double>> qkv(n_pos), y(n_pos, std::vector<double>(C, 0.0));
    for (int p = 0; p < n_pos; ++p) qkv[p] = conv1d(layernorm(x[p], h + "ln_1"), h + "attn.c_attn", C, 3 * C);
    for (int head = 0; head < NH; ++head)
      for (int p = 0; p < n_pos; ++p) {
        std::vector<double> score(p + 1, 0.0);
        double mx = -1e300, sum = 0;
        for (int q = 0; q <= p; ++q) {
          if (!visible(p, q)) continue;
          double s = 0;
          for (int i = 0; i < hs; ++i) s += qkv[p][head * hs + i] * qkv[q][C + head * hs + i];
          score[q] = s / std::sqrt(double(hs));
          mx = std::max(mx, score[q]);
        }
        for (int q = 0; q <= p; ++q) sum += (score[q] = visible(p, q) ? std::exp(score[q] - mx) : 0.0);
        for (int q = 0; q <= p; ++q)
          for (int i = 0; i < hs; ++i) y[p][head * hs + i] += score[q] / sum * qkv[q][2 * C + head * hs + i];
      }
    for (int p = 0; p < n_pos; ++p) {
      const auto o = conv1d(y[p], h + "attn.c_proj", C, C);
      for (int c = 0; c < C; ++c) x[p][c] += o[c];
      auto f = conv1d(layernorm(x[p], h + "ln_2"), h + "mlp.c_fc", C, 4 * C);
      for (auto& a : f) a = 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
      const auto m = conv1d(f, h + "mlp.c_proj", 4 * C, C);
      for (int c = 0; c < C; ++c) x[p][c] += m[c];
    }
  }
  std::vector<double> losses;
  for (int p = 0; p < n_pos; ++p) {
    const auto xf = layernorm(x[p], "ln_f");
    std::vector<double> logits(V);
    double mx = -1e300, sum = 0;
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += xf[c] * W("wte.weight")[v * C + c];  // tied head
      mx = std::max(mx, logits[v] = s);
    }
    for (double l : logits) sum += std::exp(l - mx);
    losses.push_back(mx + std::log(sum) - logits[targets[p]]);
  }
  return losses;
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("fsdpp-hf-" + std::to_string(::getpid()) + "-" + name)).string();
}

}  // namespace

TEST_CASE("hf gpt2: an imported model computes what an independent GPT-2 forward on the HF tensors computes") {
  const Tensors hf = random_hf_gpt2();
  const std::string st = temp_path("model.safetensors"), weights = temp_path("weights.h5");
  write_safetensors(st, hf);
  import_hf_gpt2(st, weights, config());

  const std::vector<int> tokens = {3, 1, 12, 7, 0}, targets = {1, 12, 7, 0, 5};
  const auto want = reference_losses(hf, tokens, targets);
  for (const std::string& source : {weights, st}) {  // via the weights file, and straight from safetensors
    CAPTURE(source);
    Gpt model(config());
    model.to_empty();
    load_weights(MPI_COMM_WORLD, source, model.parameters());
    std::vector<std::int32_t> in(tokens.begin(), tokens.end()), tg(targets.begin(), targets.end());
    View1<std::int32_t> tv("tokens", in.size()), gv("targets", tg.size());
    Kokkos::deep_copy(tv, HostView1<std::int32_t>(in.data(), in.size()));
    Kokkos::deep_copy(gv, HostView1<std::int32_t>(tg.data(), tg.size()));
    Flow flow;
    flow.B = 1, flow.T = T, flow.tokens = tv, flow.targets = gv, flow.training = false;
    model(flow);
    std::vector<float> got(T);
    Kokkos::deep_copy(HostView1<float>(got.data(), got.size()), model.losses());
    for (int p = 0; p < T; ++p) CHECK(got[p] == doctest::Approx(want[p]).epsilon(1e-5));
  }
  fs::remove(st);
  fs::remove(weights);
}

TEST_CASE("hf gpt2: packed documents with document masks compute what HF computes with a block-diagonal 4D mask") {
  // Two documents, [3, 1] and [12, 7, 0]: the end-of-text id 1 ends the first. GPT-2's positions stay 0..T-1.
  const std::vector<int> tokens = {3, 1, 12, 7, 0}, targets = {1, 12, 7, 0, 5};
  std::vector<std::vector<bool>> mask(T, std::vector<bool>(T, false));
  for (int p = 0; p < T; ++p)
    for (int q = p < 2 ? 0 : 2; q <= p; ++q) mask[p][q] = true;
  const Tensors hf = random_hf_gpt2();
  const std::string st = temp_path("packed.safetensors");
  write_safetensors(st, hf);
  const auto want = reference_losses(hf, tokens, targets, mask);
  const auto causal = reference_losses(hf, tokens, targets);
  CHECK(std::fabs(causal[4] - want[4]) > 1e-4);  // the mask matters (the check has teeth)
  for (AttentionKind kind : {AttentionKind::reference, AttentionKind::batched, AttentionKind::fused}) {
    CAPTURE(to_string(kind));
    ModelConfig c = config();
    c.attention = kind;
    Gpt model(c);
    model.set_document_masks(DocumentMasks{1, false});
    model.to_empty();
    load_weights(MPI_COMM_WORLD, st, model.parameters());
    std::vector<std::int32_t> in(tokens.begin(), tokens.end()), tg(targets.begin(), targets.end());
    View1<std::int32_t> tv("tokens", in.size()), gv("targets", tg.size());
    Kokkos::deep_copy(tv, HostView1<std::int32_t>(in.data(), in.size()));
    Kokkos::deep_copy(gv, HostView1<std::int32_t>(tg.data(), tg.size()));
    Flow flow;
    flow.B = 1, flow.T = T, flow.tokens = tv, flow.targets = gv, flow.training = false;
    model(flow);
    std::vector<float> got(T);
    Kokkos::deep_copy(HostView1<float>(got.data(), got.size()), model.losses());
    for (int p = 0; p < T; ++p) CHECK(std::fabs(got[p] - want[p]) <= 1e-5);
  }
  fs::remove(st);
}

TEST_CASE("hf gpt2: export -> import -> export gives bitwise-identical tensors; mismatches are listed") {
  const std::string st = temp_path("a.safetensors"), weights = temp_path("w.h5"), again = temp_path("b.safetensors");
  const std::string weights2 = temp_path("w2.h5"), third = temp_path("c.safetensors");
  write_safetensors(st, random_hf_gpt2());
  import_hf_gpt2(st, weights, config());
  export_hf_gpt2(weights, again, "F32");
  import_hf_gpt2(again, weights2, config());
  export_hf_gpt2(weights2, third, "F32");
  SafetensorsReader first(again), second(third), original(st);
  REQUIRE(first.tensors().size() == second.tensors().size());
  for (const auto& t : first.tensors()) {
    CAPTURE(t.name);
    const SafetensorInfo* u = second.find(t.name);
    REQUIRE(u);
    CHECK(first.read_f32(t) == second.read_f32(*u));
    CHECK(first.read_f32(t) == original.read_f32(*original.find(t.name)));  // HF layout restored exactly
  }
  CHECK(first.metadata().at("format") == "pt");
  // A deck with another width: every mismatching tensor in one error.
  ModelConfig wider = config();
  wider.n_embd = 12;
  CHECK_THROWS_WITH_AS(import_hf_gpt2(st, weights, wider),
                       doctest::Contains("transformer.h.0.mlp.c_fc.weight: file shape [8,32] (as [32,8]), model [48,12]"),
                       UsageError);
  for (const auto& p : {st, weights, again, weights2, third}) fs::remove(p);
}

TEST_CASE("hf gpt2: import and init_from refuse non-finite weights, naming the tensor and the first bad element") {
  const std::string weights = temp_path("nonfinite.h5");
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    const std::string st = temp_path("nonfinite.safetensors");
    Tensors t = random_hf_gpt2();
    t["transformer.h.1.mlp.c_fc.weight"].second[2 * 4 * C + 5] = bad;  // row 2, column 5 of [C, 4C]
    write_safetensors(st, t);
    const std::string value = std::isnan(bad) ? "nan" : "inf";
    const std::string expected = "tensor 'transformer.h.1.mlp.c_fc.weight' element " + std::to_string(2 * 4 * C + 5) +
                                 " ([2, 5]) is " + value;
    CHECK_THROWS_WITH_AS(import_hf_gpt2(st, weights, config()), doctest::Contains(expected.c_str()), UsageError);
    CHECK(!fs::exists(weights));
    // checkpoint.init_from with the same file: the same error on every rank, nothing loaded.
    Gpt model(config());
    model.to_empty();
    CHECK_THROWS_WITH_AS(load_weights(MPI_COMM_WORLD, st, model.parameters()), doctest::Contains(expected.c_str()),
                         UsageError);
    fs::remove(st);
  }
}

}  // namespace hf_gpt2_test
