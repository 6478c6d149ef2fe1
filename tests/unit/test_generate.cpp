// Generation with a KV cache: a decode forward gives the logits the training forward gives at the same
// position (prefill of prompts of different lengths in one ragged batch, then one token at a time), for every
// architecture; greedy decoding is batch-independent and sampling repeats with its seed; the sampling rules
// (temperature, top-k, top-p) give their distributions over many draws; bad prompts are refused.
#include "model_shapes.hpp"
#include "mpi_test.hpp"

#include "fsdpp/infer/generator.hpp"
#include "fsdpp/infer/sampling.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/parallel/build_model.hpp"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <random>

using namespace fsdpp;
using namespace fsdpp::test;

namespace {

constexpr int kV = 13, kT = 10;

std::unique_ptr<CausalLM> noisy_model(ModelArch arch, bool tied) {
  ModelConfig c = model_config(arch, kV, kT, 16, 2, 4, tied, 24);
  if (arch == ModelArch::gpt2) c.n_head = 2;
  auto model = make_model(c);
  model->to_empty();
  model->reset_parameters(11);
  for (Parameter* p : model->parameters()) {  // weights well away from the init, so logits differ clearly
    auto v = to_host(p->value());
    std::mt19937 rng(static_cast<unsigned>(name_hash(p->name())));
    std::normal_distribution<float> noise(0.0f, 0.3f);
    for (auto& x : v) x += noise(rng);
    to_device(p->value(), v);
  }
  return std::unique_ptr<CausalLM>(static_cast<CausalLM*>(model.release()));
}

// The training forward's (T, V) logits of one sequence.
std::vector<float> full_logits(CausalLM& model, const std::vector<std::int32_t>& tokens) {
  Flow flow;
  flow.B = 1, flow.T = static_cast<int>(tokens.size());
  const auto t = tokens_view(tokens);
  flow.tokens = t, flow.targets = t, flow.training = false;
  model(flow);
  return to_host(model.logits());
}

DecodeStep decode(CausalLM& model, KvCache& cache, const std::vector<std::int32_t>& tokens,
                  const std::vector<std::int32_t>& sequence, const std::vector<std::int32_t>& position,
                  const std::vector<std::int32_t>& last_row) {
  DecodeStep step;
  step.N = static_cast<int>(tokens.size());
  step.tokens = tokens_view(tokens), step.sequence = tokens_view(sequence), step.position = tokens_view(position);
  step.last_row = tokens_view(last_row);
  step.cache = &cache;
  Flow flow;
  flow.training = false;
  flow.decode = &step;
  model(flow);
  return step;
}

double worst_difference(const float* got, const float* want, int n) {
  double worst = 0;
  for (int i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / std::max(1.0, std::fabs(double(want[i]))));
  return worst;
}

}  // namespace

TEST_CASE("generate: a decode forward gives the training forward's logits, prefill and step by step, every architecture") {
  const std::vector<std::vector<std::int32_t>> sequences = {{3, 1, 12, 7, 0, 9, 4, 4, 2, 11}, {5, 5, 8, 2, 10, 1, 6, 3, 0, 7}};
  const std::vector<int> prompt = {6, 3};  // ragged: the two prompts in one prefill batch
  for (ModelArch arch : kArchs) {
    for (bool tied : {false, true}) {
      CAPTURE(to_string(arch));
      CAPTURE(tied);
      const auto model = noisy_model(arch, tied);
      std::vector<std::vector<float>> want;
      for (const auto& s : sequences) want.push_back(full_logits(*model, s));
      KvCache cache = model->make_kv_cache(2, kT);
      std::vector<std::int32_t> tokens, sequence, position, last_row(2);
      for (int s = 0; s < 2; ++s)
        for (int p = 0; p < prompt[s]; ++p) {
          last_row[s] = static_cast<std::int32_t>(tokens.size());
          tokens.push_back(sequences[s][p]), sequence.push_back(s), position.push_back(p);
        }
      DecodeStep step = decode(*model, cache, tokens, sequence, position, last_row);
      double worst = 0;
      for (int s = 0; s < 2; ++s)
        worst = std::max(worst, worst_difference(step.logits.data() + s * kV, want[s].data() + (prompt[s] - 1) * kV, kV));
      // Then one token at a time, teacher-forced, up to the end of each sequence.
      for (int pos0 = prompt[0], pos1 = prompt[1]; pos1 < kT; ++pos0, ++pos1) {
        std::vector<std::int32_t> tok, seq, pos;
        if (pos0 < kT) tok.push_back(sequences[0][pos0]), seq.push_back(0), pos.push_back(pos0);
        tok.push_back(sequences[1][pos1]), seq.push_back(1), pos.push_back(pos1);
        const std::vector<std::int32_t> last = {0, static_cast<std::int32_t>(tok.size()) - 1};
        step = decode(*model, cache, tok, seq, pos, last);
        if (pos0 < kT) worst = std::max(worst, worst_difference(step.logits.data(), want[0].data() + pos0 * kV, kV));
        worst = std::max(worst, worst_difference(step.logits.data() + kV, want[1].data() + pos1 * kV, kV));
      }
      CHECK(worst <= 1e-5);
      MESSAGE(fmt::format("{} {}: largest logit difference, decode vs training forward {:.2e}", to_string(arch),
                          tied ? "tied" : "untied", worst));
    }
  }
}

TEST_CASE("generate: greedy continuations do not depend on the batch; a seed repeats its samples") {
  for (ModelArch arch : kArchs) {
    CAPTURE(to_string(arch));
    const auto model = noisy_model(arch, false);
    const std::vector<int> a = {3, 1, 12}, b = {5, 5, 8, 2, 10};
    GenerationOptions greedy;
    greedy.max_new_tokens = 5;
    const Generation both = generate(*model, {a, b}, greedy);
    CHECK(generate(*model, {a}, greedy).tokens[0] == both.tokens[0]);
    CHECK(generate(*model, {b}, greedy).tokens[0] == both.tokens[1]);
    CHECK(both.prefill_tokens == 8);
    CHECK(both.decode_tokens == 2 * 4);
    CHECK(both.tokens[0].size() == 5);
    // A prefill in forwards of 3 rows (the second prompt split across them) continues alike.
    GenerationOptions chunked = greedy;
    chunked.prefill_rows = 3;
    CHECK(generate(*model, {a, b}, chunked).tokens == both.tokens);
    // The greedy tokens are the argmax of the training forward's logits on the growing sequence.
    std::vector<std::int32_t> seq(b.begin(), b.end());
    for (int t : both.tokens[1]) {
      const auto logits = full_logits(*model, seq);
      const float* last = logits.data() + (seq.size() - 1) * kV;
      CHECK(t == std::max_element(last, last + kV) - last);
      seq.push_back(t);
    }
    // Sampling: the same seed twice gives the same tokens; another seed other tokens (over 2 x 5 draws).
    GenerationOptions sampled = greedy;
    sampled.sampling.temperature = 1.5, sampled.sampling.seed = 7;
    const Generation first = generate(*model, {a, b}, sampled);
    CHECK(generate(*model, {a, b}, sampled).tokens == first.tokens);
    sampled.sampling.seed = 8;
    CHECK(generate(*model, {a, b}, sampled).tokens != first.tokens);
    // A stop token ends its sequence (and is kept), not the other.
    GenerationOptions stop = greedy;
    stop.stop_tokens = {both.tokens[0][1]};
    const Generation stopped = generate(*model, {a, b}, stop);
    CHECK(stopped.tokens[0] == std::vector<int>(both.tokens[0].begin(), both.tokens[0].begin() + 2));
  }
}

TEST_CASE("generate: prompts that do not fit, empty prompts and bad sampling options are refused, naming them") {
  const auto model = noisy_model(ModelArch::llama, false);
  GenerationOptions o;
  o.max_new_tokens = 4;
  CHECK_THROWS_WITH_AS(generate(*model, {{1, 2}, std::vector<int>(8, 1)}, o),
                       "prompt 2 has 8 tokens; with --max-new-tokens 4 that is 12, more than the model's context of 10 "
                       "(model.context_length): shorten the prompt or ask for at most 2 new tokens", UsageError);
  CHECK_THROWS_WITH_AS(generate(*model, {{1}, {}}, o), doctest::Contains("prompt 2 is empty"), UsageError);
  CHECK_THROWS_WITH_AS(generate(*model, {{1, 13}}, o), "prompt 1 has token id 13, outside the model's vocabulary of 13",
                       UsageError);
  o.sampling.top_p = 0;
  CHECK_THROWS_WITH_AS(generate(*model, {{1}}, o), "--top-p is 0; it must be in (0, 1] (1: off)", UsageError);
}

TEST_CASE("sampling: greedy is the first argmax; top-k 1 is greedy; temperature, top-k and top-p give their distributions") {
  const std::vector<float> logits = {1.0f, 3.0f, 0.5f, 3.0f, 2.0f, -1.0f};
  const int V = static_cast<int>(logits.size());
  Sampling greedy;
  CHECK(sample_token(logits.data(), V, greedy, 0, 0) == 1);  // the first of two equal maxima, as torch.argmax
  Sampling k1;
  k1.temperature = 0.7, k1.top_k = 1;
  // top-k 1 keeps both tied maxima (ties at the boundary stay, as HF's TopKLogitsWarper): draws from {1, 3} only.
  auto frequencies = [&](const Sampling& s, int draws) {
    std::vector<double> f(V, 0.0);
    for (int i = 0; i < draws; ++i) f[sample_token(logits.data(), V, s, i % 7, i / 7)] += 1.0 / draws;
    return f;
  };
  auto softmax = [&](double temperature, const std::vector<int>& keep) {
    std::vector<double> p(V, 0.0);
    double total = 0;
    for (int i : keep) total += (p[i] = std::exp(logits[i] / temperature));
    for (double& x : p) x /= total;
    return p;
  };
  const int draws = 40000;
  auto close = [&](const std::vector<double>& got, const std::vector<double>& want) {
    for (int i = 0; i < V; ++i) {
      CAPTURE(i);
      // 5 standard deviations of a binomial frequency, and exact zeros where the rule removes a token.
      if (want[i] == 0) CHECK(got[i] == 0);
      else CHECK(std::fabs(got[i] - want[i]) <= 5 * std::sqrt(want[i] * (1 - want[i]) / draws) + 1e-12);
    }
  };
  close(frequencies(k1, draws), softmax(0.7, {1, 3}));
  Sampling t;
  t.temperature = 1.3;
  close(frequencies(t, draws), softmax(1.3, {0, 1, 2, 3, 4, 5}));
  Sampling k3 = t;
  k3.top_k = 3;  // 3.0, 3.0, 2.0
  close(frequencies(k3, draws), softmax(1.3, {1, 3, 4}));
  // top-p: at temperature 1 the probabilities are 0.052 0.384 0.032 0.384 0.141 0.007; 0.6 keeps the two maxima
  // (0.768 >= 0.6 after the second), 0.8 adds the 2.0 (0.909 after it).
  Sampling p6;
  p6.temperature = 1.0, p6.top_p = 0.6;
  close(frequencies(p6, draws), softmax(1.0, {1, 3}));
  Sampling p8 = p6;
  p8.top_p = 0.8;
  close(frequencies(p8, draws), softmax(1.0, {1, 3, 4}));
}
