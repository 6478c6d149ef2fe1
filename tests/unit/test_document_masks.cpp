// Document masks in packed sequences (data.document_mask, data.reset_positions; kernels/document.hpp): for every
// attention kernel (reference, batched, fused), a packed row of several documents gives each document's tokens
// the losses, and the model the gradients, of the documents run alone (Llama with reset positions); a document's
// losses do not depend on the other documents of its row (GPT-2, whose positions are not reset); the masked
// model's gradients are its loss's central differences; and with masks on but no end-of-text token in the batch
// the losses are bitwise those of a model without masks.
#include "model_shapes.hpp"
#include "mpi_test.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/nn/kernels/document.hpp"
#include "fsdpp/nn/make_model.hpp"

#include <algorithm>
#include <cmath>
#include <random>

using namespace fsdpp;
using namespace fsdpp::test;

// This file's names, apart from other test files' in a unity build (FSDPP_UNITY_BUILD).
namespace document_masks_test {

namespace {

constexpr int V = 13, T = 64, kEot = 0;
constexpr AttentionKind kKinds[] = {AttentionKind::reference, AttentionKind::batched, AttentionKind::fused};

// Two rows of T: documents of these lengths, each ended by kEot (the last one's end is the row's end). Row 0 puts
// a document start exactly at the fused kernel's second 32-row tile (its first key tile is skipped); row 1 has
// a tile whose first query's document starts inside the tile before it (masked element-wise).
const std::vector<std::vector<int>> kDocuments = {{32, 7, 25}, {20, 20, 24}};

struct Packed {
  std::vector<std::int32_t> tokens, targets;
  std::vector<std::pair<int, int>> documents;  // [begin, end) in the flattened (B*T) rows
};

Packed packed(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(1, V - 1);
  Packed p;
  for (std::size_t b = 0; b < kDocuments.size(); ++b) {
    int at = static_cast<int>(b) * T;
    for (int len : kDocuments[b]) {
      for (int i = 0; i < len; ++i) p.tokens.push_back(i == len - 1 ? kEot : token(rng));
      p.documents.emplace_back(at, at + len);
      at += len;
    }
  }
  for (std::size_t n = 0; n < p.tokens.size(); ++n) p.targets.push_back(token(rng));
  return p;
}

std::unique_ptr<LanguageModel> model_for(ModelArch arch, AttentionKind kind, bool masks, bool reset) {
  ModelConfig c = model_config(arch, V, T, 16, 2, 2, false, 24);
  c.attention = kind;
  auto model = make_model(c);
  if (masks) model->set_document_masks(DocumentMasks{kEot, reset});
  model->to_empty();
  model->reset_parameters(11);
  // Larger weights than the init's, so that attention is far from uniform and a leak across documents shows.
  for (Parameter* p : model->parameters()) {
    auto v = to_host(p->value());
    std::mt19937 rng(static_cast<unsigned>(name_hash(p->name())));
    std::normal_distribution<float> noise(0.0f, 0.3f);
    for (auto& x : v) x += noise(rng);
    to_device(p->value(), v);
  }
  return model;
}

// Per-token losses of a forward (training: also prepares gradients, which backward then adds).
std::vector<float> run(LanguageModel& model, const std::vector<std::int32_t>& tokens,
                       const std::vector<std::int32_t>& targets, int B, bool backward, float loss_scale = 1.0f) {
  const auto tv = tokens_view(tokens), gv = tokens_view(targets);
  Flow flow;
  flow.B = B, flow.T = static_cast<int>(tokens.size()) / B, flow.tokens = tv, flow.targets = gv;
  flow.training = backward, flow.loss_scale = loss_scale;
  model(flow);
  if (backward) model(flow, Pass::backward);
  return to_host(model.losses());
}

std::vector<std::vector<float>> gradients(LanguageModel& model) {
  std::vector<std::vector<float>> out;
  for (Parameter* p : model.parameters()) out.push_back(to_host(p->grad()));
  return out;
}

}  // namespace

TEST_CASE("document masks: the document starts of packed rows") {
  const Packed p = packed(1);
  View1<std::int32_t> starts("starts", p.tokens.size());
  kernels::document_starts(starts, tokens_view(p.tokens), 2, T, kEot);
  std::vector<std::int32_t> got(p.tokens.size());
  Kokkos::deep_copy(HostView1<std::int32_t>(got.data(), got.size()), starts);
  for (const auto& [begin, end] : p.documents)
    for (int n = begin; n < end; ++n) {
      CAPTURE(n);
      CHECK(got[n] == begin % T);
    }
}

TEST_CASE("document masks: Llama with reset positions gives each packed document its losses and gradients alone") {
  const Packed p = packed(2);
  const int N = static_cast<int>(p.tokens.size());
  for (AttentionKind kind : kKinds) {
    CAPTURE(to_string(kind));
    const auto model = model_for(ModelArch::llama, kind, true, true);
    model->zero_grad();
    const auto losses = run(*model, p.tokens, p.targets, 2, true);
    const auto packed_grads = gradients(*model);
    // Each document alone (positions from 0, no masks needed), its loss weighted as in the packed mean (1/N per
    // token): their gradients add up to the packed row's.
    const auto alone = model_for(ModelArch::llama, kind, false, false);
    alone->zero_grad();
    double worst = 0;
    for (const auto& [begin, end] : p.documents) {
      const std::vector<std::int32_t> tokens(p.tokens.begin() + begin, p.tokens.begin() + end);
      const std::vector<std::int32_t> targets(p.targets.begin() + begin, p.targets.begin() + end);
      const auto want = run(*alone, tokens, targets, 1, true, static_cast<float>(end - begin) / N);
      for (int n = begin; n < end; ++n) worst = std::max(worst, double(std::fabs(losses[n] - want[n - begin])));
    }
    MESSAGE(to_string(kind), ": largest |packed - alone| per-token loss ", worst);
    CHECK(worst <= 1e-5);
    const auto want_grads = gradients(*alone);
    double worst_grad = 0, largest = 0;
    for (std::size_t i = 0; i < want_grads.size(); ++i)
      for (std::size_t j = 0; j < want_grads[i].size(); ++j) {
        worst_grad = std::max(worst_grad, double(std::fabs(packed_grads[i][j] - want_grads[i][j])));
        largest = std::max(largest, double(std::fabs(want_grads[i][j])));
      }
    MESSAGE(to_string(kind), ": largest |packed - alone| gradient ", worst_grad, " (largest gradient ", largest, ")");
    CHECK(worst_grad <= 1e-5 * std::max(1.0, largest));
  }
}

TEST_CASE("document masks: a document's losses do not depend on the other documents of its row (GPT-2, Llama "
          "without reset positions)") {
  const Packed p = packed(3);
  for (ModelArch arch : {ModelArch::gpt2, ModelArch::llama}) {
    for (AttentionKind kind : kKinds) {
      CAPTURE(to_string(arch));
      CAPTURE(to_string(kind));
      const auto masked = model_for(arch, kind, true, false);
      const auto plain = model_for(arch, kind, false, false);
      const auto losses = run(*masked, p.tokens, p.targets, 2, false);
      const auto plain_losses = run(*plain, p.tokens, p.targets, 2, false);
      std::mt19937 rng(4);
      std::uniform_int_distribution<int> token(1, V - 1);
      double worst = 0, leak = 0;  // leak: the same change without masks, so that the test can fail
      for (const auto& [begin, end] : p.documents) {
        std::vector<std::int32_t> other = p.tokens;  // every other document's tokens changed, the ends kept
        for (int n = 0; n < static_cast<int>(other.size()); ++n)
          if ((n < begin || n >= end) && other[n] != kEot) other[n] = token(rng);
        const auto got = run(*masked, other, p.targets, 2, false);
        const auto got_plain = run(*plain, other, p.targets, 2, false);
        for (int n = begin; n < end; ++n) {
          worst = std::max(worst, double(std::fabs(got[n] - losses[n])));
          leak = std::max(leak, double(std::fabs(got_plain[n] - plain_losses[n])));
        }
      }
      CHECK(worst <= 1e-5);
      CHECK(leak > 1e-2);
    }
  }
}

TEST_CASE("document masks: with no end-of-text token in the batch, the losses are bitwise those without masks") {
  std::vector<std::int32_t> tokens(2 * T), targets(2 * T);
  for (int n = 0; n < 2 * T; ++n) tokens[n] = 1 + (5 * n) % (V - 1), targets[n] = (3 * n) % V;
  for (ModelArch arch : {ModelArch::gpt2, ModelArch::llama})
    for (AttentionKind kind : kKinds) {
      CAPTURE(to_string(arch));
      CAPTURE(to_string(kind));
      const auto masked = model_for(arch, kind, true, arch != ModelArch::gpt2);
      const auto plain = model_for(arch, kind, false, false);
      CHECK(run(*masked, tokens, targets, 2, false) == run(*plain, tokens, targets, 2, false));
    }
}

TEST_CASE("document masks: the masked model's gradients are its loss's central differences") {
  // Short rows: three documents in each of two rows of 8.
  std::vector<std::int32_t> tokens = {3, kEot, 5, 7, kEot, 2, 9, 4, 6, 6, 1, kEot, 8, kEot, 11, 12};
  std::vector<std::int32_t> targets = {1, 5, 7, 2, 2, 9, 4, 8, 6, 1, 3, 8, 10, 11, 12, 3};
  for (ModelArch arch : {ModelArch::gpt2, ModelArch::llama}) {
    for (AttentionKind kind : {AttentionKind::reference, AttentionKind::fused}) {
      CAPTURE(to_string(arch));
      CAPTURE(to_string(kind));
      const auto model = model_for(arch, kind, true, arch != ModelArch::gpt2);
      const auto tv = tokens_view(tokens), gv = tokens_view(targets);
      Flow flow;
      flow.B = 2, flow.T = 8, flow.tokens = tv, flow.targets = gv, flow.training = true;
      model->zero_grad();
      (*model)(flow);
      (*model)(flow, Pass::backward);
      for (Parameter* p : model->parameters()) {
        CAPTURE(p->name());
        const auto grad = to_host(p->grad());
        auto value = to_host(p->value());
        const std::size_t i = static_cast<std::size_t>(
            std::max_element(grad.begin(), grad.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
            grad.begin());
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
        CHECK(std::fabs(numeric - grad[i]) <= 2e-3 + 3e-2 * std::fabs(grad[i]));
      }
    }
  }
}

}  // namespace document_masks_test
