// Hugging Face Llama-family interchange (LlamaForCausalLM, Qwen2ForCausalLM): an imported model computes what an
// independent double-precision forward, written here from the HF tensors with HF's rotate_half RoPE (and, for
// Qwen2, transformers' q/k/v biases: Qwen2Attention's nn.Linear(..., bias=True)), computes (per-position losses
// within 1e-5); Meta's interleaved RoPE with HF's q/k row permutation is the same model; export -> import -> export
// is bitwise; packed documents with document masks (data.document_mask, with and without reset positions) compute
// what HF computes with a block-diagonal 4D attention mask and position_ids.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/hf_export.hpp"
#include "fsdpp/ckpt/hf_llama.hpp"
#include "fsdpp/ckpt/safetensors.hpp"
#include "fsdpp/nn/qwen2.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <unistd.h>

using namespace fsdpp;
namespace fs = std::filesystem;

// This file's names, apart from other test files' in a unity build (FSDPP_UNITY_BUILD).
namespace hf_llama_test {

namespace {

using fsdpp::test::write_safetensors;

constexpr int V = 13, T = 6, C = 16, L = 2, NH = 4, NKV = 2, F = 24, HS = C / NH;
constexpr double kTheta = 500.0, kEps = 1e-6;

ModelConfig config(bool tied = false, ModelArch arch = ModelArch::llama) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = V, c.context_length = T, c.n_embd = C, c.n_layer = L, c.n_head = NH, c.n_kv_head = NKV;
  c.ffn_hidden = F, c.rope_theta = kTheta, c.norm_eps = kEps, c.tie_embeddings = tied;
  return c;
}

using Tensors = fsdpp::test::NamedTensors;

// A random Llama (or, with `qwen`, Qwen2: q/k/v biases) in HF's names and layout, with an old-style rotary
// buffer HF files may carry.
Tensors random_hf_llama(bool tied = false, bool qwen = false) {
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.0f, 0.3f);
  Tensors t;
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape, float mean = 0.0f) {
    std::int64_t count = 1;
    for (auto d : shape) count *= d;
    std::vector<float> v(static_cast<std::size_t>(count));
    for (auto& x : v) x = mean + n(rng);
    t[name] = {shape, v};
  };
  add("model.embed_tokens.weight", {V, C});
  for (int l = 0; l < L; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    add(h + "input_layernorm.weight", {C}, 1.0f);
    add(h + "self_attn.q_proj.weight", {NH * HS, C});
    add(h + "self_attn.k_proj.weight", {NKV * HS, C});
    add(h + "self_attn.v_proj.weight", {NKV * HS, C});
    if (qwen) {
      add(h + "self_attn.q_proj.bias", {NH * HS});
      add(h + "self_attn.k_proj.bias", {NKV * HS});
      add(h + "self_attn.v_proj.bias", {NKV * HS});
    }
    add(h + "self_attn.o_proj.weight", {C, NH * HS});
    add(h + "self_attn.rotary_emb.inv_freq", {HS / 2});  // a buffer, not a parameter
    add(h + "post_attention_layernorm.weight", {C}, 1.0f);
    add(h + "mlp.gate_proj.weight", {F, C});
    add(h + "mlp.up_proj.weight", {F, C});
    add(h + "mlp.down_proj.weight", {C, F});
  }
  add("model.norm.weight", {C}, 1.0f);
  if (!tied) add("lm_head.weight", {V, C});
  return t;
}

using Rows = std::vector<std::vector<double>>;

// y = W x (+ b) for nn.Linear's [out, in] weight.
std::vector<double> linear(const std::vector<float>& w, const std::vector<double>& x, int out,
                           const std::vector<float>* b = nullptr) {
  std::vector<double> y(out, 0.0);
  const int in = static_cast<int>(x.size());
  for (int o = 0; o < out; ++o) {
    for (int i = 0; i < in; ++i) y[o] += w[static_cast<std::size_t>(o) * in + i] * x[i];
    if (b) y[o] += (*b)[o];
  }
  return y;
}

// HF config.json's rope_scaling with rope_type "llama3" (Llama 3.1+); factor 1 means none.
struct HfRopeScaling {
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4, original_max_position_embeddings = 8192;
};

// transformers' _compute_llama3_parameters, transcribed: the scaled inverse frequency of one pair.
double hf_llama3_inv_freq(double inv_freq, const HfRopeScaling& r) {
  if (r.factor == 1) return inv_freq;
  const double old_context_len = r.original_max_position_embeddings;
  const double low_freq_wavelen = old_context_len / r.low_freq_factor;
  const double high_freq_wavelen = old_context_len / r.high_freq_factor;
  const double wavelen = 2 * 3.141592653589793 / inv_freq;
  const double inv_freq_llama = wavelen > low_freq_wavelen ? inv_freq / r.factor : inv_freq;
  const double smooth_factor = (old_context_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const double smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / r.factor + smooth_factor * inv_freq_llama;
  const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
  return is_medium_freq ? smoothed_inv_freq : inv_freq_llama;
}

// RoPE on one head at position p: HF's rotate_half (pairs i, i + hs/2), or Meta's interleaved (2i, 2i+1).
void rotate(double* x, int p, bool interleaved, const HfRopeScaling& scaling = {}) {
  std::vector<double> out(HS);
  for (int i = 0; i < HS / 2; ++i) {
    const double inv_freq = hf_llama3_inv_freq(1.0 / std::pow(kTheta, 2.0 * i / HS), scaling);
    const double angle = p * inv_freq, c = std::cos(angle), s = std::sin(angle);
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + HS / 2;
    out[a] = x[a] * c - x[b] * s;
    out[b] = x[b] * c + x[a] * s;
  }
  std::copy(out.begin(), out.end(), x);
}

// What transformers takes for packed sequences: position_ids (1, T) and an explicit 4D attention mask (1, 1, T, T),
// here true where query p may attend to key r. Empty: positions 0..T-1 and the causal mask.
struct HfPacking {
  std::vector<int> position_ids;
  std::vector<std::vector<bool>> mask;
};

// Llama forward in double, from tensors with HF's names: the per-position cross-entropy losses. Biases of q_proj,
// k_proj and v_proj are added where the tensors have them (Qwen2).
std::vector<double> reference_losses(const Tensors& t, const std::vector<int>& tokens, const std::vector<int>& targets,
                                     bool interleaved_rope = false, const HfRopeScaling& scaling = {},
                                     const HfPacking& packing = {}) {
  auto position = [&](int p) { return packing.position_ids.empty() ? p : packing.position_ids[p]; };
  auto visible = [&](int p, int r) { return packing.mask.empty() ? r <= p : bool(packing.mask[p][r]); };
  auto W = [&](const std::string& n) -> const std::vector<float>& { return t.at(n).second; };
  auto bias = [&](const std::string& n) { return t.count(n) ? &t.at(n).second : nullptr; };
  const int n_pos = static_cast<int>(tokens.size());
  Rows x(n_pos, std::vector<double>(C));
  for (int p = 0; p < n_pos; ++p)
    for (int c = 0; c < C; ++c) x[p][c] = W("model.embed_tokens.weight")[tokens[p] * C + c];
  auto rmsnorm = [&](const std::vector<double>& v, const std::string& name) {
    double ms = 0;
    for (double a : v) ms += a * a / C;
    std::vector<double> out(C);
    for (int c = 0; c < C; ++c) out[c] = v[c] / std::sqrt(ms + kEps) * W(name)[c];
    return out;
  };
  for (int l = 0; l < L; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    Rows q(n_pos), k(n_pos), v(n_pos), y(n_pos, std::vector<double>(C, 0.0));
    for (int p = 0; p < n_pos; ++p) {
      const auto a = rmsnorm(x[p], h + "input_layernorm.weight");
      q[p] = linear(W(h + "self_attn.q_proj.weight"), a, NH * HS, bias(h + "self_attn.q_proj.bias"));
      k[p] = linear(W(h + "self_attn.k_proj.weight"), a, NKV * HS, bias(h + "self_attn.k_proj.bias"));
      v[p] = linear(W(h + "self_attn.v_proj.weight"), a, NKV * HS, bias(h + "self_attn.v_proj.bias"));
      for (int head = 0; head < NH; ++head) rotate(&q[p][head * HS], position(p), interleaved_rope, scaling);
      for (int head = 0; head < NKV; ++head) rotate(&k[p][head * HS], position(p), interleaved_rope, scaling);
    }
    for (int head = 0; head < NH; ++head) {
      const int kv = head / (NH / NKV);  // HF's repeat_kv
      for (int p = 0; p < n_pos; ++p) {
        std::vector<double> score(n_pos, 0.0);
        double mx = -1e300, sum = 0;
        for (int r = 0; r < n_pos; ++r) {
          if (!visible(p, r)) continue;  // HF: -inf in the additive mask, exp 0
          double s = 0;
          for (int i = 0; i < HS; ++i) s += q[p][head * HS + i] * k[r][kv * HS + i];
          mx = std::max(mx, score[r] = s / std::sqrt(double(HS)));
        }
        for (int r = 0; r < n_pos; ++r) sum += (score[r] = visible(p, r) ? std::exp(score[r] - mx) : 0.0);
        for (int r = 0; r < n_pos; ++r)
          for (int i = 0; i < HS; ++i) y[p][head * HS + i] += score[r] / sum * v[r][kv * HS + i];
      }
    }
    for (int p = 0; p < n_pos; ++p) {
      const auto o = linear(W(h + "self_attn.o_proj.weight"), y[p], C);
      for (int c = 0; c < C; ++c) x[p][c] += o[c];
      const auto a = rmsnorm(x[p], h + "post_attention_layernorm.weight");
      auto g = linear(W(h + "mlp.gate_proj.weight"), a, F);
      const auto u = linear(W(h + "mlp.up_proj.weight"), a, F);
      for (int i = 0; i < F; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const auto d = linear(W(h + "mlp.down_proj.weight"), g, C);
      for (int c = 0; c < C; ++c) x[p][c] += d[c];
    }
  }
  const auto& head = t.count("lm_head.weight") ? W("lm_head.weight") : W("model.embed_tokens.weight");
  std::vector<double> losses;
  for (int p = 0; p < n_pos; ++p) {
    const auto logits = linear(head, rmsnorm(x[p], "model.norm.weight"), V);
    double mx = -1e300, sum = 0;
    for (double lg : logits) mx = std::max(mx, lg);
    for (double lg : logits) sum += std::exp(lg - mx);
    losses.push_back(mx + std::log(sum) - logits[targets[p]]);
  }
  return losses;
}

// HF's convert_llama_weights_to_hf.py permute(): Meta's interleaved q/k rows -> rotate_half rows, per head:
// w.view(n_heads, hs/2, 2, C).transpose(1, 2).reshape(n_heads * hs, C).
std::vector<float> permute_for_rotate_half(const std::vector<float>& w, int heads) {
  std::vector<float> out(w.size());
  for (int h = 0; h < heads; ++h)
    for (int half = 0; half < 2; ++half)
      for (int i = 0; i < HS / 2; ++i)
        for (int c = 0; c < C; ++c)
          out[(static_cast<std::size_t>(h) * HS + half * (HS / 2) + i) * C + c] =
              w[(static_cast<std::size_t>(h) * HS + 2 * i + half) * C + c];
  return out;
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("fsdpp-hfl-" + std::to_string(::getpid()) + "-" + name)).string();
}

std::vector<float> model_losses(LanguageModel& model, const std::vector<int>& tokens, const std::vector<int>& targets) {
  std::vector<std::int32_t> in(tokens.begin(), tokens.end()), tg(targets.begin(), targets.end());
  View1<std::int32_t> tv("tokens", in.size()), gv("targets", tg.size());
  Kokkos::deep_copy(tv, HostView1<std::int32_t>(in.data(), in.size()));
  Kokkos::deep_copy(gv, HostView1<std::int32_t>(tg.data(), tg.size()));
  Flow flow;
  flow.B = 1, flow.T = static_cast<int>(tokens.size()), flow.tokens = tv, flow.targets = gv, flow.training = false;
  model(flow);
  std::vector<float> got(tokens.size());
  Kokkos::deep_copy(HostView1<float>(got.data(), got.size()), model.losses());
  return got;
}

const std::vector<int> kTokens = {3, 1, 12, 7, 0, 9}, kTargets = {1, 12, 7, 0, 5, 2};

}  // namespace

TEST_CASE("hf llama: an imported Llama or Qwen2 computes what an independent HF forward computes (GQA, RoPE, tied, "
          "Qwen2's q/k/v biases)") {
  for (ModelArch arch : {ModelArch::llama, ModelArch::qwen2}) {
    for (bool tied : {false, true}) {
      CAPTURE(to_string(arch));
      CAPTURE(tied);
      const bool qwen = arch == ModelArch::qwen2;
      const Tensors hf = random_hf_llama(tied, qwen);
      const std::string st = temp_path("model.safetensors"), weights = temp_path("weights.h5");
      write_safetensors(st, hf);
      import_hf_llama(st, weights, config(tied, arch));
      const auto want = reference_losses(hf, kTokens, kTargets);
      for (const std::string& source : {weights, st}) {  // via the weights file, and straight from safetensors
        CAPTURE(source);
        const auto model = make_model(config(tied, arch));
        model->to_empty();
        load_weights(MPI_COMM_WORLD, source, model->parameters());
        const auto got = model_losses(*model, kTokens, kTargets);
        double worst = 0;
        for (int p = 0; p < T; ++p) {
          CHECK(std::fabs(got[p] - want[p]) <= 1e-5 * std::max(1.0, std::fabs(want[p])));
          worst = std::max(worst, std::fabs(got[p] - want[p]) / std::max(1.0, std::fabs(want[p])));
        }
        MESSAGE(fmt::format("{} {} ({}): largest per-position loss difference from the f64 reference {:.2e}",
                            to_string(arch), tied ? "tied" : "untied", source == st ? "safetensors" : "weights file", worst));
      }
      if (qwen) {  // the biases matter: without them the reference is another model (the check has teeth)
        Tensors unbiased = hf;
        for (auto it = unbiased.begin(); it != unbiased.end();) it = it->first.find("_proj.bias") != std::string::npos ? unbiased.erase(it) : std::next(it);
        const auto other = reference_losses(unbiased, kTokens, kTargets);
        double diff = 0;
        for (int p = 0; p < T; ++p) diff = std::max(diff, std::fabs(other[p] - want[p]));
        CHECK(diff > 1e-3);
      }
      fs::remove(st);
      fs::remove(weights);
    }
  }
}

TEST_CASE("hf llama: Llama 3.1's RoPE scaling (rope_type llama3) matches transformers' formula") {
  // HS 4 has two pairs: wavelengths 2 pi and about 140. With original_max_position_embeddings 16 the first is
  // between 16/4 and 16/1 (blended) and the second above 16 (slowed by the factor): both scaled branches.
  const HfRopeScaling hf_scaling{8, 1, 4, 16};
  ModelConfig c = config();
  c.rope_scaling_factor = hf_scaling.factor, c.rope_low_freq_factor = hf_scaling.low_freq_factor;
  c.rope_high_freq_factor = hf_scaling.high_freq_factor;
  c.rope_original_context = static_cast<int>(hf_scaling.original_max_position_embeddings);
  const Tensors hf = random_hf_llama();
  const std::string st = temp_path("scaled.safetensors");
  write_safetensors(st, hf);
  const auto want = reference_losses(hf, kTokens, kTargets, false, hf_scaling);
  Llama model(c);
  model.to_empty();
  load_weights(MPI_COMM_WORLD, st, model.parameters());
  const auto got = model_losses(model, kTokens, kTargets);
  for (int p = 0; p < T; ++p) CHECK(std::fabs(got[p] - want[p]) <= 1e-5 * std::max(1.0, std::fabs(want[p])));
  // Scaling changes the model: unscaled losses differ (the check has teeth).
  const auto unscaled = reference_losses(hf, kTokens, kTargets);
  double diff = 0;
  for (int p = 1; p < T; ++p) diff = std::max(diff, std::fabs(unscaled[p] - want[p]));
  CHECK(diff > 1e-4);
  CHECK(model.describe().find("scaled x8 (llama3: low 1 high 4 original 16)") != std::string::npos);
  fs::remove(st);
}

TEST_CASE("hf llama: Meta's interleaved RoPE with HF's q/k row permutation is the rotate_half model") {
  // The reference run two ways: Meta-layout weights with interleaved pairs, and the same weights permuted as
  // HF's conversion does with rotate_half pairs. Equal losses: HF files need no permutation for fsdpp.
  Tensors meta = random_hf_llama();
  Tensors hf = meta;
  for (int l = 0; l < L; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".self_attn.";
    hf[h + "q_proj.weight"].second = permute_for_rotate_half(meta[h + "q_proj.weight"].second, NH);
    hf[h + "k_proj.weight"].second = permute_for_rotate_half(meta[h + "k_proj.weight"].second, NKV);
  }
  const auto interleaved = reference_losses(meta, kTokens, kTargets, true);
  const auto half_split = reference_losses(hf, kTokens, kTargets, false);
  for (int p = 0; p < T; ++p) CHECK(half_split[p] == doctest::Approx(interleaved[p]).epsilon(1e-12));
  // And the unpermuted weights under rotate_half are a different model (the check has teeth).
  const auto wrong = reference_losses(meta, kTokens, kTargets, false);
  double diff = 0;
  for (int p = 1; p < T; ++p) diff = std::max(diff, std::fabs(wrong[p] - interleaved[p]));
  CHECK(diff > 1e-3);
}

TEST_CASE("hf llama: export -> import -> export gives bitwise-identical tensors (Llama, Qwen2); mismatches are listed") {
  {  // Qwen2: the biases travel too, under Qwen2's name
    const std::string st = temp_path("q.safetensors"), weights = temp_path("qw.h5"), again = temp_path("q2.safetensors");
    write_safetensors(st, random_hf_llama(false, true));
    import_hf_llama(st, weights, config(false, ModelArch::qwen2));
    CHECK(std::string(export_hf(weights, again, "F32")) == "Qwen2");
    SafetensorsReader exported(again), original(st);
    CHECK(exported.tensors().size() == original.tensors().size() - L);  // the rotary buffers are not parameters
    for (const auto& t : exported.tensors()) {
      CAPTURE(t.name);
      CHECK(exported.read_f32(t) == original.read_f32(*original.find(t.name)));
    }
    CHECK(exported.find("model.layers.1.self_attn.k_proj.bias") != nullptr);
    // A Llama deck refuses Qwen2's file, naming the tensors it does not have.
    CHECK_THROWS_WITH_AS(import_hf_llama(st, weights, config()),
                         doctest::Contains("model.layers.0.self_attn.q_proj.bias"), UsageError);
    for (const auto& p : {st, weights, again}) fs::remove(p);
  }
  const std::string st = temp_path("a.safetensors"), weights = temp_path("w.h5"), again = temp_path("b.safetensors");
  const std::string weights2 = temp_path("w2.h5"), third = temp_path("c.safetensors");
  write_safetensors(st, random_hf_llama());
  import_hf_llama(st, weights, config());
  CHECK(std::string(export_hf(weights, again, "F32")) == "Llama");
  import_hf_llama(again, weights2, config());
  export_hf(weights2, third, "F32");
  SafetensorsReader first(again), second(third), original(st);
  CHECK(first.tensors().size() == original.tensors().size() - L);  // the rotary buffers are not parameters
  for (const auto& t : first.tensors()) {
    CAPTURE(t.name);
    const SafetensorInfo* u = second.find(t.name);
    REQUIRE(u != nullptr);
    CHECK(first.read_f32(t) == second.read_f32(*u));
    CHECK(first.read_f32(t) == original.read_f32(*original.find(t.name)));  // HF's names and layout, exactly
  }
  // A deck with fewer key/value heads: every mismatching tensor in one error, in HF's names.
  ModelConfig mqa = config();
  mqa.n_kv_head = 1;
  CHECK_THROWS_WITH_AS(import_hf_llama(st, weights, mqa),
                       doctest::Contains("model.layers.1.self_attn.v_proj.weight: file shape [8,16] (as [8,16]), "
                                         "model [4,16]"),
                       UsageError);
  // An untied file for a tied deck: its lm_head is not the embedding, so it is refused, saying what to set.
  CHECK_THROWS_WITH_AS(import_hf_llama(st, weights, config(true)),
                       doctest::Contains("lm_head.weight: the file's model has its own LM head, the deck's shares the "
                                         "embedding (set model.tie_embeddings: false)"),
                       UsageError);
  for (const auto& p : {st, weights, again, weights2, third}) fs::remove(p);
}

TEST_CASE("hf llama: packed documents with document masks compute what HF computes with a block-diagonal 4D mask "
          "and position_ids") {
  // Three documents of 5, 4 and 3 tokens, each ended by the end-of-text id 12 (the last one's end is the row's).
  constexpr int kEot = 12;
  const std::vector<int> lengths = {5, 4, 3};
  const std::vector<int> tokens = {3, 1, 7, 0, kEot, 9, 2, 5, kEot, 4, 11, 6};
  const std::vector<int> targets = {1, 7, 0, 5, 9, 2, 5, 3, 4, 11, 6, 8};
  const int n = static_cast<int>(tokens.size());
  // HF's inputs, from the document lengths: the block-diagonal causal mask; position_ids restarting per document
  // (reset) or 0..n-1.
  HfPacking reset, plain;
  reset.mask.assign(n, std::vector<bool>(n, false));
  for (int d = 0, begin = 0; d < static_cast<int>(lengths.size()); begin += lengths[d++])
    for (int p = begin; p < begin + lengths[d]; ++p) {
      reset.position_ids.push_back(p - begin);
      plain.position_ids.push_back(p);
      for (int r = begin; r <= p; ++r) reset.mask[p][r] = true;
    }
  plain.mask = reset.mask;
  ModelConfig c = config();
  c.context_length = n;
  const Tensors hf = random_hf_llama();
  const std::string st = temp_path("packed.safetensors");
  write_safetensors(st, hf);
  for (const bool reset_positions : {true, false}) {
    CAPTURE(reset_positions);
    const auto want = reference_losses(hf, tokens, targets, false, {}, reset_positions ? reset : plain);
    for (AttentionKind kind : {AttentionKind::reference, AttentionKind::batched, AttentionKind::fused}) {
      CAPTURE(to_string(kind));
      c.attention = kind;
      const auto model = make_model(c);
      model->set_document_masks(DocumentMasks{kEot, reset_positions});
      model->to_empty();
      load_weights(MPI_COMM_WORLD, st, model->parameters());
      const auto got = model_losses(*model, tokens, targets);
      double worst = 0;
      for (int p = 0; p < n; ++p) worst = std::max(worst, std::fabs(got[p] - want[p]));
      MESSAGE(fmt::format("reset_positions {} {}: largest per-token loss difference from the f64 HF reference {:.2e}",
                          reset_positions, to_string(kind), worst));
      CHECK(worst <= 1e-5);
    }
  }
  // Without the mask HF's plain causal forward is another computation (the check has teeth).
  const auto causal = reference_losses(hf, tokens, targets);
  const auto masked = reference_losses(hf, tokens, targets, false, {}, plain);
  double diff = 0;
  for (int p = 0; p < n; ++p) diff = std::max(diff, std::fabs(causal[p] - masked[p]));
  CHECK(diff > 1e-3);
  fs::remove(st);
}

}  // namespace hf_llama_test
