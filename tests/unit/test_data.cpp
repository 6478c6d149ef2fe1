// The data layer: token files (formats and every error text), the byte tokenizer, the synthetic corpus (its
// entropy rate against an empirical estimate) and the sampler (determinism, split disjointness, the same global
// batch at any data-parallel size, resumable state).
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "temp_dir.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/data/sampler.hpp"
#include "fsdpp/data/synthetic_corpus.hpp"
#include "fsdpp/data/token_file.hpp"
#include "fsdpp/data/tokenize.hpp"
#include "fsdpp/runtime/error.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

namespace fs = std::filesystem;
using namespace fsdpp;
using fsdpp::test::TempDir;

namespace {

using fsdpp::test::usage_error_of;
using fsdpp::test::write_bytes;

void put_le(std::vector<unsigned char>& out, std::uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

// A GPT-2 .bin by hand: header {magic, version, declared}, then `tokens` of elem bytes each.
std::vector<unsigned char> gpt2_file(std::int32_t magic, std::int32_t version, std::int32_t declared,
                                     const std::vector<std::uint32_t>& tokens, int elem = 2) {
  std::vector<unsigned char> out;
  put_le(out, static_cast<std::uint32_t>(magic), 4);
  put_le(out, static_cast<std::uint32_t>(version), 4);
  put_le(out, static_cast<std::uint32_t>(declared), 4);
  out.resize(1024, 0);
  for (std::uint32_t t : tokens) put_le(out, t, elem);
  return out;
}

std::vector<std::uint32_t> iota_tokens(std::size_t n, std::uint32_t mod) {
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint32_t>((i * 7919u) % mod);
  return t;
}

}  // namespace

TEST_CASE("token files: every format round-trips, by extension and explicitly") {
  TempDir dir("fsdpp_test_data");
  const auto small = iota_tokens(3000, 50257);
  for (const char* name : {"a.bin", "a.u16"}) {
    save_tokens(dir.file(name), small);
    CHECK(load_tokens(dir.file(name), 50257) == small);
  }
  CHECK(fs::file_size(dir.file("a.bin")) == 1024 + 2 * small.size());
  CHECK(fs::file_size(dir.file("a.u16")) == 2 * small.size());
  const std::vector<std::uint32_t> wide = {0, 65535, 65536, 128255, 4000000000u};
  save_tokens(dir.file("w.u32"), wide);
  CHECK(load_tokens(dir.file("w.u32"), 0) == wide);  // vocab 0: no check
  save_tokens(dir.file("x.dat"), small, TokenFormat::gpt2_bin);
  CHECK(load_tokens(dir.file("x.dat"), TokenFormat::gpt2_bin, 50257) == small);
  save_tokens(dir.file("e.bin"), {});
  CHECK(load_tokens(dir.file("e.bin"), 10).empty());
  // llm.c's Llama 3 files (magic 20240801, version 7, uint32 tokens) are read too, and written when a token needs it.
  const std::vector<std::uint32_t> llama = {1, 70000, 128000};
  write_bytes(dir.file("v7.bin"), gpt2_file(kLlama3Magic, kLlama3Version, 3, {1, 70000, 128000}, 4));
  CHECK(load_tokens(dir.file("v7.bin"), 128256) == llama);
  save_tokens(dir.file("wide.bin"), llama);
  CHECK(fs::file_size(dir.file("wide.bin")) == 1024 + 4 * llama.size());
  CHECK(load_tokens(dir.file("wide.bin"), 128256) == llama);
  CHECK(gpt2_header(5, 2) == gpt2_file(kGpt2Magic, kGpt2Version, 5, {}));
  CHECK(gpt2_header(5, 4) == gpt2_file(kLlama3Magic, kLlama3Version, 5, {}));
  CHECK(token_bytes_for("a.bin", TokenFormat::gpt2_bin, 65536) == 2);
  CHECK(token_bytes_for("a.bin", TokenFormat::gpt2_bin, 65537) == 4);
  CHECK(token_bytes_for("a.u32", TokenFormat::raw_u32, 256) == 4);
  CHECK(usage_error_of([] { token_bytes_for("a.u16", TokenFormat::raw_u16, 128256); }) ==
        "a.u16: a vocabulary of 128256 ids does not fit the 16-bit raw uint16 (.u16) format; write .bin (uint32 "
        "tokens under llm.c's Llama 3 header) or .u32");
}

TEST_CASE("token files: each malformed file gets an exact error naming the file") {
  TempDir dir("fsdpp_test_data");
  const std::string bad_magic = dir.file("magic.bin"), version = dir.file("version.bin");
  write_bytes(bad_magic, gpt2_file(1234, 1, 2, {1, 2}));
  CHECK(usage_error_of([&] { load_tokens(bad_magic, 50257); }) ==
        bad_magic + ": not a GPT-2 token file: magic 1234, expected 20240520 (or 20240801 for uint32 tokens; raw "
                    "token arrays need the extension .u16 or .u32)");
  write_bytes(version, gpt2_file(kGpt2Magic, 7, 2, {1, 2}));
  const std::string formats = " (llm.c's formats: magic 20240520 version 1 = uint16 tokens, magic 20240801 version 7 "
                              "= uint32 tokens); re-create the file with 'fsdpp tokenize' or llm.c's scripts";
  CHECK(usage_error_of([&] { load_tokens(version, 50257); }) ==
        version + ": unsupported GPT-2 token file version 7" + formats);
  write_bytes(version, gpt2_file(kLlama3Magic, 1, 2, {1, 2}, 4));
  CHECK(usage_error_of([&] { load_tokens(version, 50257); }) ==
        version + ": unsupported Llama 3 token file version 1" + formats);

  const std::string trunc = dir.file("trunc.bin"), longer = dir.file("long.bin"), stub = dir.file("stub.bin");
  write_bytes(trunc, gpt2_file(kGpt2Magic, 1, 10, {1, 2, 3, 4, 5, 6, 7}));
  CHECK(usage_error_of([&] { load_tokens(trunc, 50257); }) ==
        trunc + ": GPT-2 token file header says 10 tokens but the file holds 7 (truncated?; re-create the file)");
  auto odd = gpt2_file(kGpt2Magic, 1, 2, {1, 2});
  odd.push_back(9);
  write_bytes(longer, odd);
  CHECK(usage_error_of([&] { load_tokens(longer, 50257); }) ==
        longer + ": GPT-2 token file header says 2 tokens but the file holds 2 and 1 stray byte(s) (corrupt header?; "
                 "re-create the file)");
  auto header_only = gpt2_file(kGpt2Magic, 1, 0, {});
  header_only.resize(100);
  write_bytes(stub, header_only);
  CHECK(usage_error_of([&] { load_tokens(stub, 50257); }) ==
        stub + ": truncated GPT-2 token file: 100 bytes, shorter than its 1024-byte header");

  const std::string odd16 = dir.file("odd.u16"), odd32 = dir.file("odd.u32");
  write_bytes(odd16, std::vector<unsigned char>{1, 2, 3, 4, 5});
  CHECK(usage_error_of([&] { load_tokens(odd16, 0); }) ==
        odd16 + ": size 5 bytes is not a multiple of 2, so the file is not a raw uint16 token array (wrong "
                "extension, or a truncated file?)");
  write_bytes(odd32, std::vector<unsigned char>{1, 2, 3, 4, 5, 6});
  CHECK(usage_error_of([&] { load_tokens(odd32, 0); }).find("size 6 bytes is not a multiple of 4") !=
        std::string::npos);
}

TEST_CASE("token files: out-of-vocabulary tokens, missing files and bad names") {
  TempDir dir("fsdpp_test_data");
  const std::string big = dir.file("big.u32");
  auto tokens = iota_tokens(20, 50257);
  tokens[12] = 70000;
  save_tokens(big, tokens);
  CHECK(usage_error_of([&] { load_tokens(big, 50257); }) ==
        big + ": token 70000 at position 12 is outside the vocabulary (vocab_size 50257); the file was made for a "
              "larger vocabulary: raise the model's vocab_size above 70000 or re-tokenize the data");
  CHECK(load_tokens(big, 70001) == tokens);

  const std::string missing = dir.file("missing.bin");
  CHECK(usage_error_of([&] { load_tokens(missing, 256); }) ==
        missing + ": cannot open token file: No such file or directory (check the path; 'fsdpp tokenize <text> "
                  "<out.bin>' makes a token file from any text)");
  CHECK(usage_error_of([&] { load_tokens(dir.path.string() + "/", TokenFormat::raw_u16, 256); })
            .find("is a directory, not a token file") != std::string::npos);
  CHECK(usage_error_of([&] { load_tokens(dir.file("data.txt"), 256); }) ==
        dir.file("data.txt") + ": unknown token file extension '.txt': use .bin (GPT-2/llm.c, with header), .u16 or "
                               ".u32 (raw little-endian arrays)");
  CHECK(usage_error_of([&] { save_tokens(dir.file("w.u16"), {1, 2, 70000}); }) ==
        dir.file("w.u16") + ": token 70000 at position 2 does not fit the 16-bit raw uint16 (.u16) format; use .u32");
  CHECK(!fs::exists(dir.file("w.u16")));
}

TEST_CASE("tokenize: text becomes byte tokens in a .bin file, and back") {
  TempDir dir("fsdpp_test_data");
  const std::string text = "Hello, fsdpp!\nCaf\xc3\xa9 \x01\xff bytes of any kind.\n";
  write_bytes(dir.file("in.txt"), std::vector<unsigned char>(text.begin(), text.end()));
  CHECK(tokenize_file(dir.file("in.txt"), dir.file("out.bin")) == static_cast<std::int64_t>(text.size()));
  const auto tokens = load_tokens(dir.file("out.bin"), kByteVocabSize);
  CHECK(tokens.size() == text.size());
  CHECK(tokens[0] == 'H');
  CHECK(bytes_from_tokens(tokens) == text);
  write_bytes(dir.file("empty.txt"), std::vector<unsigned char>{});
  CHECK(usage_error_of([&] { tokenize_file(dir.file("empty.txt"), dir.file("e.bin")); }) ==
        dir.file("empty.txt") + ": the text file is empty; there is nothing to tokenize");
  CHECK(usage_error_of([&] { tokenize_file(dir.file("nope.txt"), dir.file("e.bin")); }) ==
        dir.file("nope.txt") + ": cannot open text file: No such file or directory");
}

TEST_CASE("synthetic corpus: deterministic by seed, with the entropy rate it claims") {
  const SyntheticCorpus a(1, 256), b(1, 256), c(2, 256);
  CHECK(a.generate(5000) == b.generate(5000));
  CHECK(a.generate(5000) != c.generate(5000));
  CHECK(a.entropy_rate_nats() == b.entropy_rate_nats());
  const auto long_stream = a.generate(6000);
  CHECK(std::equal(long_stream.begin(), long_stream.begin() + 5000, a.generate(5000).begin()));  // prefix-stable

  for (int V : {64, 256, 4096}) {
    const SyntheticCorpus corpus(1, V);
    double pi_sum = 0;
    for (double p : corpus.stationary()) pi_sum += p;
    CHECK(pi_sum == doctest::Approx(1.0).epsilon(1e-12));
    double row = 0;
    for (int t = 0; t < V; ++t) row += corpus.transition_prob(7, static_cast<std::uint32_t>(t));
    CHECK(row == doctest::Approx(1.0).epsilon(1e-12));

    const auto tokens = corpus.generate(100000);
    CHECK(*std::max_element(tokens.begin(), tokens.end()) < static_cast<std::uint32_t>(V));
    double nll = 0;
    for (std::size_t t = 0; t + 1 < tokens.size(); ++t)
      nll -= std::log(corpus.transition_prob(tokens[t], tokens[t + 1]));
    nll /= static_cast<double>(tokens.size() - 1);
    const double rate = corpus.entropy_rate_nats();
    MESSAGE(fmt::format("synthetic corpus seed 1, V {}: entropy rate {:.6f} nats (empirical {:.6f}, ln V {:.4f})", V,
                        rate, nll, std::log(V)));
    CHECK(std::fabs(nll - rate) < 0.02 * rate);
    CHECK(rate < 0.5 * std::log(static_cast<double>(V)));
    CHECK(rate > 0.5);
  }
  CHECK(usage_error_of([] { SyntheticCorpus(1, 8, 9); }) ==
        "synthetic corpus: successors per token must be between 2 and vocab_size (8), got 9");
}

TEST_CASE("sampler: deterministic windows inside the training split, validation disjoint from training") {
  const auto tokens = SyntheticCorpus(3, 64).generate(20000);
  const std::int64_t T = 32, G = 16;
  const WindowSampler s(tokens, T, 0.1, 42), same(tokens, T, 0.1, 42), other(tokens, T, 0.1, 43);
  CHECK(s.val_begin() == 18000);
  CHECK(s.val_windows() == (2000 - 1) / T);
  CHECK(s.window_offsets(Split::train, 5, G, 0, G) == same.window_offsets(Split::train, 5, G, 0, G));
  CHECK(s.window_offsets(Split::train, 5, G, 0, G) != other.window_offsets(Split::train, 5, G, 0, G));
  CHECK(s.window_offsets(Split::train, 5, G, 0, G) != s.window_offsets(Split::train, 6, G, 0, G));

  std::set<std::int64_t> distinct;
  for (std::int64_t step = 0; step < 200; ++step)
    for (std::int64_t o : s.window_offsets(Split::train, step, G, 0, G)) {
      CHECK(o >= 0);
      CHECK(o + T + 1 <= s.val_begin());  // the window's last target is still a training token
      distinct.insert(o);
    }
  // 3200 draws with replacement from 17968 offsets: N (1 - exp(-3200 / N)) = 2932 distinct expected.
  CHECK(distinct.size() > 2850);
  CHECK(distinct.size() < 3010);
  for (std::int64_t e = 0; e < 10; ++e)
    for (std::int64_t o : s.window_offsets(Split::val, e, G, 0, G)) {
      CHECK(o >= s.val_begin());
      CHECK(o + T + 1 <= s.num_tokens());
      CHECK((o - s.val_begin()) % T == 0);
    }

  std::vector<std::int32_t> in(4 * T), tg(4 * T);
  s.fill_batch(Split::train, 9, G, 3, 4, in.data(), tg.data());
  const auto offs = s.window_offsets(Split::train, 9, G, 3, 4);
  for (std::int64_t b = 0; b < 4; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      CHECK(in[b * T + t] == static_cast<std::int32_t>(tokens[offs[b] + t]));
      CHECK(tg[b * T + t] == static_cast<std::int32_t>(tokens[offs[b] + t + 1]));
    }
  CHECK(usage_error_of([&] { WindowSampler(tokens, T, 0.0, 1).window_offsets(Split::val, 0, G, 0, 1); }) ==
        "validation batches were requested but there is no validation split (validation fraction 0)");
  CHECK(usage_error_of([&] { WindowSampler(std::vector<std::uint32_t>(100), T, 0.9, 1); }) ==
        "the training split has 10 tokens, fewer than one window of sequence length + 1 = 33; use more data, a "
        "shorter sequence length or a smaller validation fraction");
}

TEST_CASE("sampler: a global batch is the same sequences on 1, 2 or 4 data-parallel ranks") {
  const WindowSampler s(SyntheticCorpus(5, 128).generate(50000), 16, 0.05, 7);
  const std::int64_t G = 32, m = 4;
  for (Split split : {Split::train, Split::val})
    for (std::int64_t step : {0, 1, 17}) {
      const auto whole = s.window_offsets(split, step, G, 0, G);
      for (int R : {1, 2, 4}) {
        std::vector<std::int64_t> joined;  // rank parts in rank order, each walked micro-step by micro-step
        for (int r = 0; r < R; ++r)
          for (std::int64_t a = 0; a < grad_accum_steps(G, m, R); ++a) {
            const auto part = s.window_offsets(split, step, G, micro_batch_first_sequence(G, m, R, r, a), m);
            joined.insert(joined.end(), part.begin(), part.end());
          }
        CHECK(joined == whole);
      }
    }
  // The deck's one batch-split rule (config/deck_rules.hpp), which the sampler walks.
  CHECK(grad_accum_steps(32, 4, 4) == 2);
  CHECK(usage_error_of([] { micro_batch_first_sequence(32, 3, 2, 0, 0); }) ==
        "train.global_batch (32) must be a multiple of train.micro_batch (3) x 2 data-parallel ranks = 6; change "
        "train.global_batch or train.micro_batch, or the number of ranks");
}

TEST_CASE("sampler: saving and restoring the state reproduces the next batch exactly") {
  const auto tokens = SyntheticCorpus(9, 256).generate(30000);
  const std::int64_t T = 24, G = 8;
  WindowSampler run(tokens, T, 0.1, 11);
  std::vector<std::int32_t> in(G * T), tg(G * T), in2(G * T), tg2(G * T);
  for (int i = 0; i < 5; ++i) run.advance();
  const SamplerState saved = run.state();
  CHECK(saved.next_step == 5);
  run.fill_train_batch(G, 0, G, in.data(), tg.data());

  WindowSampler resumed(tokens, T, 0.1, 999);  // a different seed: the restored state must win
  resumed.set_state(saved);
  resumed.fill_train_batch(G, 0, G, in2.data(), tg2.data());
  CHECK(in == in2);
  CHECK(tg == tg2);
  run.advance();
  resumed.advance();
  CHECK(run.window_offsets(Split::train, run.next_step(), G, 0, G) ==
        resumed.window_offsets(Split::train, resumed.next_step(), G, 0, G));

  WindowSampler shorter(std::vector<std::uint32_t>(tokens.begin(), tokens.end() - 1), T, 0.1, 11);
  CHECK(usage_error_of([&] { shorter.set_state(saved); }) ==
        "the saved data loader state is for 30000 tokens with sequence length 24, but this run has 29999 tokens with "
        "sequence length 24; resume with the same data and model.seq_len, or start a new run");
}

TEST_CASE("data: sequential order takes consecutive windows at stride T, the same on 1, 2 and 3 ranks, and wraps") {
  const std::int64_t T = 4, G = 6;
  std::vector<std::uint32_t> tokens(200);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(i);
  fsdpp::WindowSampler sampler(tokens, T, 0.0, 7, fsdpp::SampleOrder::sequential);
  // 200 tokens: windows k = 0..48 start at 4k and need 5 tokens (k*4 + 4 <= 199).
  CHECK(sampler.sequential_windows() == 49);
  for (int R : {1, 2, 3}) {
    CAPTURE(R);
    const std::int64_t m = G / R;
    for (std::int64_t step = 0; step < 3; ++step)
      for (int r = 0; r < R; ++r) {
        const std::int64_t first = fsdpp::micro_batch_first_sequence(G, m, R, r, 0);
        std::vector<std::int32_t> in(static_cast<std::size_t>(m * T)), tg(in.size());
        sampler.fill_batch(fsdpp::Split::train, step, G, first, m, in.data(), tg.data());
        for (std::int64_t b = 0; b < m; ++b)
          for (std::int64_t t = 0; t < T; ++t) {
            const std::int64_t window = step * G + first + b;  // the global order: consecutive windows
            REQUIRE(in[static_cast<std::size_t>(b * T + t)] == window * T + t);
            REQUIRE(tg[static_cast<std::size_t>(b * T + t)] == window * T + t + 1);
          }
      }
  }
  // Global batch 8 holds windows 48..53: window 49 wraps to the start.
  std::vector<std::int32_t> in(static_cast<std::size_t>(G * T)), tg(in.size());
  sampler.fill_batch(fsdpp::Split::train, 8, G, 0, G, in.data(), tg.data());
  CHECK(in[0] == 48 * T);
  CHECK(in[static_cast<std::size_t>(T)] == 0);
  CHECK(sampler.epoch_of(8, G) == 0);
  CHECK(sampler.epoch_of(9, G) == 1);
}
