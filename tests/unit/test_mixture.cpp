// Weighted mixtures of data sources (data/mixture.hpp, data.sources): the source choice's closed-form count against
// counting, each source's share against its weight in every prefix, one source equal to the single-source sampler
// bit for bit, the same global batch on 1, 2 and 3 data-parallel ranks, a resume at another rank count through
// DataFeed's state dict, corpora as sources, and the deck's data.sources errors.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "input_decks.hpp"
#include "temp_dir.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/data/corpus_index.hpp"
#include "fsdpp/data/mixture.hpp"
#include "fsdpp/data/token_file.hpp"
#include "fsdpp/train/data_feed.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>

namespace fs = std::filesystem;
using namespace fsdpp;
using fsdpp::test::TempDir;

namespace {

using fsdpp::test::usage_error_of;

// Source k's tokens are all in [100 k, 100 k + 99], so a window's tokens name the source it came from; within a
// source, token t at position p is 100 k + p mod 100, so a window's first token gives its offset mod 100.
std::vector<std::uint32_t> marked_tokens(int k, std::size_t n) {
  std::vector<std::uint32_t> t(n);
  for (std::size_t p = 0; p < n; ++p) t[p] = static_cast<std::uint32_t>(100 * k + p % 100);
  return t;
}

std::vector<MixtureInput> marked_sources(const std::vector<double>& weights, std::size_t n) {
  std::vector<MixtureInput> in;
  for (std::size_t k = 0; k < weights.size(); ++k)
    in.push_back({fmt::format("source{}.bin", k), marked_tokens(static_cast<int>(k), n + 37 * k), weights[k]});
  return in;
}

// A corpus folder of two shards (data/corpus_index.hpp) holding `tokens`, split in the middle.
void write_corpus(const std::string& folder, const std::vector<std::uint32_t>& tokens, std::int64_t vocab) {
  fs::create_directories(folder);
  CorpusIndex index;
  index.tokenizer = "test";
  index.vocab_size = vocab;
  index.eot_id = vocab - 1;
  const std::size_t half = tokens.size() / 2;
  for (int s = 0; s < 2; ++s) {
    const std::vector<std::uint32_t> part(tokens.begin() + (s ? half : 0), s ? tokens.end() : tokens.begin() + half);
    CorpusShard shard;
    shard.path = fmt::format("shard-{:05}.bin", s);
    shard.source = "test";
    shard.byte_end = 1;
    shard.documents = 1;
    shard.tokens = static_cast<std::int64_t>(part.size());
    shard.bytes = shard.tokens;
    save_tokens(folder + "/" + shard.path, part, TokenFormat::gpt2_bin);
    index.shards.push_back(shard);
  }
  write_corpus_index(folder, index);
}

}  // namespace

TEST_CASE("mixture: the closed-form count of sequences per source equals counting them one by one") {
  for (const std::vector<double>& weights : {std::vector<double>{0.7, 0.3}, {0.5, 0.3, 0.2}, {1, 1e-3, 5, 2}}) {
    for (const std::uint64_t seed : {0ull, 1337ull, 0xFFFFFFFFFFFFFFFFull}) {
      const SourceChoice choice(weights, seed);
      std::vector<std::uint64_t> counted(weights.size(), 0);
      for (std::uint64_t n = 0; n <= 3000; ++n) {
        if (n % 97 == 0 || n < 40)
          for (int k = 0; k < choice.sources(); ++k) REQUIRE(choice.chosen_before(k, n) == counted[k]);
        ++counted[static_cast<std::size_t>(choice.source_of(n))];
      }
    }
  }
  // Far into a run (2^40 sequences), the counts still add up and match a count over the window that follows.
  const SourceChoice choice({0.5, 0.3, 0.2}, 7);
  const std::uint64_t far = std::uint64_t{1} << 40;
  std::vector<std::uint64_t> counted(3, 0);
  for (std::uint64_t i = far; i < far + 500; ++i) ++counted[static_cast<std::size_t>(choice.source_of(i))];
  std::uint64_t total = 0;
  for (int k = 0; k < 3; ++k) {
    CHECK(choice.chosen_before(k, far + 500) - choice.chosen_before(k, far) == counted[static_cast<std::size_t>(k)]);
    total += choice.chosen_before(k, far);
  }
  CHECK(total == far);
}

TEST_CASE("mixture: over 20000 sequences every prefix's counts stay within a few sequences of weight x n") {
  // Measured (seed 1337): the largest |count - w n| over all prefixes up to 20000 is 1.9 to 2.7 sequences for these
  // weights (O(log n), Weyl's sequence), and at 20000 every share is within 0.17% of its weight (relative; 0.005
  // percentage points); independent draws would drift by about sqrt(w (1-w) n), 65 sequences at n = 20000.
  // Asserted: at most 4 sequences in every prefix, and at 20000 sequences each share within 1% of its weight
  // (relative, 0.01 w), which 4 sequences keep for any w >= 0.02.
  for (const std::vector<double>& weights : {std::vector<double>{0.7, 0.3}, {0.5, 0.3, 0.2}, {0.9, 0.07, 0.03}}) {
    CAPTURE(weights.size());
    const SourceChoice choice(weights, 1337);
    std::vector<double> counted(weights.size(), 0), worst(weights.size(), 0);
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
      ++counted[static_cast<std::size_t>(choice.source_of(static_cast<std::uint64_t>(i)))];
      for (std::size_t k = 0; k < weights.size(); ++k)
        worst[k] = std::max(worst[k], std::abs(counted[k] - choice.weight(static_cast<int>(k)) * (i + 1)));
    }
    for (std::size_t k = 0; k < weights.size(); ++k) {
      CAPTURE(k);
      MESSAGE(fmt::format("weights {}: source {} share {:.5f} (weight {:.5f}), worst prefix deviation {:.2f} sequences",
                          fmt::join(weights, "/"), k, counted[k] / n, choice.weight(static_cast<int>(k)), worst[k]));
      CHECK(worst[k] <= 4.0);
      CHECK(std::abs(counted[k] / n - choice.weight(static_cast<int>(k))) <= 0.01 * choice.weight(static_cast<int>(k)));
    }
  }
}

TEST_CASE("mixture: one source draws the single-source sampler's windows bit for bit") {
  const std::vector<std::uint32_t> tokens = marked_tokens(0, 5000);
  for (const SampleOrder order : {SampleOrder::shuffled, SampleOrder::sequential}) {
    const WindowSampler single(tokens, 16, 0.1, 42, order);
    const MixtureSampler mixture({{"a.bin", tokens, 3.0}}, 16, 0.1, 42, order);
    for (const Split split : {Split::train, Split::val})
      for (std::int64_t step : {0, 1, 7, 1000}) {
        const std::vector<std::int64_t> want = single.window_offsets(split, step, 12, 0, 12);
        const std::vector<MixtureSampler::Window> got = mixture.windows(split, step, 12, 0, 12);
        for (std::size_t b = 0; b < want.size(); ++b) {
          CHECK(got[b].source == 0);
          CHECK(got[b].offset == want[b]);
        }
      }
  }
}

TEST_CASE("mixture: a global batch is the same sequences on 1, 2 and 3 ranks, each from its own source") {
  const std::int64_t T = 8, G = 12;
  for (const SampleOrder order : {SampleOrder::shuffled, SampleOrder::sequential}) {
    const MixtureSampler mixture(marked_sources({0.6, 0.3, 0.1}, 4000), T, 0.1, 5, order);
    for (const std::int64_t step : {0, 3, 250}) {
      std::vector<std::int32_t> whole_in(G * T), whole_tg(G * T);
      mixture.fill_batch(Split::train, step, G, 0, G, whole_in.data(), whole_tg.data());
      for (const int ranks : {2, 3}) {
        std::vector<std::int32_t> in(G * T), tg(G * T);
        for (int r = 0; r < ranks; ++r) {
          const std::int64_t first = micro_batch_first_sequence(G, G / ranks, ranks, r, 0);
          mixture.fill_batch(Split::train, step, G, first, G / ranks, in.data() + first * T, tg.data() + first * T);
        }
        CHECK(in == whole_in);
        CHECK(tg == whole_tg);
      }
      // Each window lies inside its source's training split and holds that source's tokens.
      const auto windows = mixture.windows(Split::train, step, G, 0, G);
      for (std::size_t b = 0; b < windows.size(); ++b) {
        const WindowSampler& s = mixture.source(windows[b].source);
        CHECK(windows[b].offset + T < s.val_begin());
        CHECK(whole_in[b * T] / 100 == windows[b].source);
      }
    }
  }
}

TEST_CASE("mixture: sequential order walks each source's windows in turn; validation takes every source's split") {
  const std::int64_t T = 8, G = 10;
  const MixtureSampler mixture(marked_sources({0.75, 0.25}, 3000), T, 0.1, 9, SampleOrder::sequential);
  std::vector<std::int64_t> next(2, 0);
  for (std::int64_t step = 0; step < 40; ++step)
    for (const auto& w : mixture.windows(Split::train, step, G, 0, G)) {
      auto& j = next[static_cast<std::size_t>(w.source)];
      CHECK(w.offset == (j % mixture.source(w.source).sequential_windows()) * T);
      ++j;
    }
  CHECK(next[0] + next[1] == 400);  // 400 sequences at 0.75 / 0.25, within the bound of the share test
  CHECK(std::abs(static_cast<double>(next[0]) - 300.0) <= 4.0);
  // Validation: the same windows every evaluation, each inside its source's validation split, both sources used.
  std::vector<int> val_from(2, 0);
  for (std::int64_t batch = 0; batch < 4; ++batch) {
    const auto a = mixture.windows(Split::val, batch, G, 0, G);
    const auto b = mixture.windows(Split::val, batch, G, 0, G);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].offset == b[i].offset);
      CHECK(a[i].offset >= mixture.source(a[i].source).val_begin());
      ++val_from[static_cast<std::size_t>(a[i].source)];
    }
  }
  CHECK(std::abs(val_from[0] - 30) <= 4);
  CHECK(std::abs(val_from[1] - 10) <= 4);
}

TEST_CASE("mixture: DataFeed saves at step 5 on 2 ranks, resumes on 3, and continues the uninterrupted stream") {
  TempDir dir("fsdpp_test_mixture");
  write_corpus(dir.file("web"), marked_tokens(0, 6000), 400);
  save_tokens(dir.file("code.bin"), marked_tokens(1, 3000), TokenFormat::gpt2_bin);
  write_corpus(dir.file("books"), marked_tokens(2, 4000), 400);
  const std::string sources = fmt::format("data:\n  sources:\n    - {{path: {}, weight: 5}}\n    - {{path: {}, weight: 3}}\n"
                                          "    - {{path: {}/index.json, weight: 2}}\n",
                                          dir.file("web"), dir.file("code.bin"), dir.file("books"));
  const Deck deck = parse_deck("run: {seed: 3}\nmodel: {vocab_size: 400, context_length: 8, n_embd: 8, n_layer: 1, "
                               "n_head: 1}\ntrain: {steps: 20, global_batch: 6, micro_batch: 1}\n" + sources, "deck.yaml");
  // The uninterrupted run, on one rank.
  DataFeed whole(deck, 1, 0);
  CHECK(whole.description().find("a mixture of 3 sources") == 0);
  std::vector<std::vector<std::int32_t>> expected;
  Flow flow;
  for (int step = 0; step < 10; ++step) {
    std::vector<std::int32_t> batch;
    for (int m = 0; m < 6; ++m) {
      whole.load_train(m, flow);
      auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), flow.tokens);
      batch.insert(batch.end(), host.data(), host.data() + host.size());
    }
    expected.push_back(batch);
    whole.advance();
  }
  // Five steps on 2 ranks (each takes its half), the state saved from rank 0.
  DataFeed two_rank0(deck, 2, 0), two_rank1(deck, 2, 1);
  for (int step = 0; step < 5; ++step) {
    two_rank0.advance();
    two_rank1.advance();
  }
  StateDict saved;
  two_rank0.state_dict(saved);
  StateDict other_rank;
  two_rank1.state_dict(other_rank);
  CHECK(scalars_as_text(saved.scalars) == scalars_as_text(other_rank.scalars));  // every rank saves the same state
  // Resumed on 3 ranks: steps 5..9 are the uninterrupted run's.
  for (int step = 5; step < 10; ++step) {
    std::vector<std::int32_t> batch;
    for (int r = 0; r < 3; ++r) {
      DataFeed feed(deck, 3, r);
      feed.load_state_dict(saved);
      for (int s = 5; s < step; ++s) feed.advance();
      for (int m = 0; m < 2; ++m) {
        feed.load_train(m, flow);
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), flow.tokens);
        batch.insert(batch.end(), host.data(), host.data() + host.size());
      }
    }
    CHECK(batch == expected[static_cast<std::size_t>(step)]);
  }
  // The shares of the whole run survive the resume: after 10 steps, 60 sequences, the counts of the uninterrupted run.
  DataFeed resumed(deck, 3, 0);
  resumed.load_state_dict(saved);
  for (int s = 5; s < 10; ++s) resumed.advance();
  CHECK(resumed.sampler().sequences_drawn() == whole.sampler().sequences_drawn());
  CHECK(*resumed.mixture_note() == *whole.mixture_note());
  std::int64_t drawn = 0;
  for (const std::int64_t n : whole.sampler().sequences_drawn()) drawn += n;
  CHECK(drawn == 60);

  // Other weights or other sources are refused, naming the source.
  const Deck reweighted = parse_deck(
      "model: {vocab_size: 400, context_length: 8, n_embd: 8, n_layer: 1, n_head: 1}\ntrain: {steps: 20, global_batch: "
      "6, micro_batch: 1}\n" + fmt::format("data:\n  sources:\n    - {{path: {}, weight: 5}}\n    - {{path: {}, weight: "
      "4}}\n    - {{path: {}/index.json, weight: 2}}\n", dir.file("web"), dir.file("code.bin"), dir.file("books")),
      "deck.yaml");
  CHECK(usage_error_of([&] { DataFeed(reweighted, 1, 0).load_state_dict(saved); }) ==
        fmt::format("data source 1 ({}) has 6000 tokens and weight 0.454545, but the checkpoint trained on it with "
                    "6000 tokens and weight 0.5; resume with the same data and weights, or start a new run",
                    dir.file("web")));
  const Deck swapped = parse_deck(
      "model: {vocab_size: 400, context_length: 8, n_embd: 8, n_layer: 1, n_head: 1}\ntrain: {steps: 20, global_batch: "
      "6, micro_batch: 1}\n" + fmt::format("data:\n  sources:\n    - {{path: {}, weight: 5}}\n    - {{path: {}/index.json,"
      " weight: 3}}\n    - {{path: {}, weight: 2}}\n", dir.file("web"), dir.file("books"), dir.file("code.bin")),
      "deck.yaml");
  CHECK(usage_error_of([&] { DataFeed(swapped, 1, 0).load_state_dict(saved); }) ==
        fmt::format("data source 2 ({}/index.json) is not the checkpoint's source 2: its path differs from the one "
                    "trained on; resume with the same data.sources in the same order, or start a new run",
                    dir.file("books")));
}

TEST_CASE("mixture: a corpus folder or its index.json is a data.source; its vocabulary must fit the model's") {
  TempDir dir("fsdpp_test_mixture");
  const std::vector<std::uint32_t> tokens = marked_tokens(0, 2000);
  write_corpus(dir.file("corpus"), tokens, 128);
  for (const std::string& path : {dir.file("corpus"), dir.file("corpus") + "/index.json"}) {
    const Deck deck = fsdpp::test::input_deck("tiny.yaml", {"data.source=" + path, "model.vocab_size=128"});
    DataFeed feed(deck, 1, 0);
    CHECK(feed.sampler().num_tokens() == 2000);
    CHECK(feed.sampler().source(0).tokens() == tokens);
    CHECK(!feed.mixture_note());
  }
  const Deck small = fsdpp::test::input_deck("tiny.yaml", {"data.source=" + dir.file("corpus")});
  CHECK(usage_error_of([&] { DataFeed(small, 1, 0); }) ==
        fmt::format("{}/index.json: the corpus was tokenized with a vocabulary of 128 ids, but model.vocab_size is 64; "
                    "set model.vocab_size to at least 128", dir.file("corpus")));
}

TEST_CASE("mixture: a source too short for a window is named") {
  std::vector<MixtureInput> in = marked_sources({0.5, 0.5}, 2000);
  in[1].tokens.resize(60);
  CHECK(usage_error_of([&] { MixtureSampler(in, 8, 0.1, 1, SampleOrder::shuffled); }) ==
        "data source 2 (source1.bin): the validation split has 6 tokens, fewer than one window of sequence length + 1 "
        "= 9; raise the validation fraction or use more data");
}

TEST_CASE("mixture: data.sources in the deck, its errors at file:line:col, and the resolved deck reads back") {
  using fsdpp::test::deck_error;
  const std::string head = "train: {steps: 5}\ndata:\n";
  const Deck d = parse_deck(head + "  sources:\n    - {path: web/, weight: 0.7}\n    - path: code.bin\n      weight: 3\n",
                            "deck.yaml");
  REQUIRE(d.data.sources.size() == 2);
  CHECK(d.data.sources[0].path == "web/");
  CHECK(d.data.sources[0].weight == 0.7);
  CHECK(d.data.sources[1].path == "code.bin");
  CHECK(d.data.sources[1].weight == 3.0);
  CHECK(d.data.source.empty());  // the mixture replaces the default
  const std::string echo = resolved_deck_yaml(d);
  CHECK(echo.find("  sources: [{path: web/, weight: 0.7}, {path: code.bin, weight: 3.0}]\n") != std::string::npos);
  CHECK(echo.find("  source:") == std::string::npos);
  const Deck again = parse_deck(echo, "resolved.yaml");
  REQUIRE(again.data.sources.size() == 2);
  CHECK(again.data.sources[1].path == "code.bin");
  CHECK(again.data.source.empty());

  CHECK(deck_error(head + "  source: a.bin\n  sources:\n    - {path: web/, weight: 1}\n") ==
        "deck.yaml:5:5: data.source (a.bin) and data.sources are both given: a run trains on one source or on a "
        "mixture; remove data.source to train on the mixture, or data.sources to train on a.bin alone");
  // An override of data.source replaces the file's mixture (fsdpp eval --tokens on a mixture's checkpoint).
  const Deck overridden = parse_deck(head + "  sources:\n    - {path: web/, weight: 1}\n", "deck.yaml", {"data.source=b.bin"});
  CHECK(overridden.data.source == "b.bin");
  CHECK(overridden.data.sources.empty());
  CHECK(deck_error(head + "  sources: web/\n") ==
        "deck.yaml:3:12: data.sources: expected a list of {path, weight} entries, e.g. [{path: web/, weight: 0.7}, "
        "{path: code.bin, weight: 0.3}], got 'web/'");
  CHECK(deck_error(head + "  sources: []\n") ==
        "deck.yaml:3:12: data.sources: expected a list of {path, weight} entries, e.g. [{path: web/, weight: 0.7}, "
        "{path: code.bin, weight: 0.3}], got a sequence");
  CHECK(deck_error(head + "  sources:\n    - {path: web/, weight: 1}\n    - {path: code.bin}\n") ==
        "deck.yaml:5:7: data.sources entry 2: missing weight: an entry has a path and a weight, e.g. {path: corpus/, "
        "weight: 0.5}");
  CHECK(deck_error(head + "  sources:\n    - {path: web/, weight: 1}\n    - {path: code.bin, weight: 0}\n") ==
        "deck.yaml:5:32: data.sources entry 2 weight: expected a number > 0 (the weights are normalised), got '0'");
  CHECK(deck_error(head + "  sources:\n    - {path: web/, weight: lots}\n") ==
        "deck.yaml:4:28: data.sources entry 1 weight: expected a number > 0 (the weights are normalised), got 'lots'");
  CHECK(deck_error(head + "  sources:\n    - {path: web/, wieght: 1}\n") ==
        "deck.yaml:4:20: data.sources entry 1: unknown key 'wieght' (did you mean 'weight'?): an entry has a path and "
        "a weight");
  CHECK(deck_error(head + "  sources:\n    - web/\n") ==
        "deck.yaml:4:7: data.sources entry 1: expected a map {path: ..., weight: ...}, got 'web/'");
  CHECK(deck_error(head + "  sources:\n    - {path: web/, weight: 1}\n    - {path: web/, weight: 2}\n") ==
        "deck.yaml:5:7: data.sources entry 2: web/ is already entry 1: give each source one entry (with the weights "
        "summed)");
  CHECK(deck_error(head + "  source:\n") == "deck.yaml:3:3: data.source: expected a string, got nothing");
  CHECK(deck_error(head, {"data.sources=web/"}) ==
        "override 'data.sources=web/': expected a list of {path, weight} entries, e.g. [{path: web/, weight: 0.7}, "
        "{path: code.bin, weight: 0.3}], got 'web/'");
}
